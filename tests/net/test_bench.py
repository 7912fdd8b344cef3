"""The transport micro-benchmark runs and reports sane figures (small run)."""

from pulsar.tools.bench.net import bench_transport


async def test_bench_transport_small() -> None:
    result = await bench_transport(frames=2000, size=100, rounds=1)
    assert result["frames"] == 2000 and result["size"] == 100 and result["rounds"] == 1
    assert result["frames_per_s"] > 0 and result["mb_per_s"] > 0
    assert result["plaintext_frames_per_s"] > 0 and result["plaintext_mb_per_s"] > 0
    assert result["seconds"] > 0
    ratio = result["frames_per_s"] / result["plaintext_frames_per_s"]
    assert abs(result["encrypted_ratio"] - ratio) < 1e-9
