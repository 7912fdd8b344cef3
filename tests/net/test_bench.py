"""The transport micro-benchmark runs and reports sane figures (small run)."""

from pulsar.net.bench import bench_transport


async def test_bench_transport_small() -> None:
    result = await bench_transport(frames=2000, size=100)
    assert result["frames"] == 2000 and result["size"] == 100
    assert result["frames_per_s"] > 0 and result["mb_per_s"] > 0
    assert result["seconds"] > 0
