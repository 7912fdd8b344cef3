"""Micro-benchmark of the transport: one-way throughput between two local transports,
encrypted (as nodes run) and in plaintext (the cost of encryption), in the same run.

Both transports run in this process and on one event loop over 127.0.0.1, so the figure is
the cost of the transport itself (framing, encryption, queues, syscalls, both ends) on one
core, not a network measurement. Plaintext and encrypted runs alternate, ``rounds`` of each,
so both see the same machine; each figure is the median of its rounds. Run it with
``pulsarcast bench transport`` or ``python -m pulsar.tools.bench.net [frames] [size] [rounds]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time

from dag import Identity, PeerId
from pulsar.net.config import TransportConfig
from pulsar.net.transport import Transport
from pulsar.runtime.loop import run as run_loop

__all__ = ["bench_transport", "bench_transport_once"]


async def bench_transport_once(
    frames: int = 50000, size: int = 300, *, encrypt: bool = True
) -> float:
    """Send ``frames`` payloads of ``size`` bytes from one transport to another and time it
    from the first send (connection already up) to the last delivery; returns seconds."""
    if frames < 1 or size < 0:
        raise ValueError("frames must be positive and size non-negative")
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    received = 0

    def on_frame(peer: PeerId, payload: bytes) -> None:
        nonlocal received
        received += 1
        if received == frames + 1 and not done.done():
            done.set_result(None)

    config = TransportConfig(send_queue=4096, encrypt=encrypt)
    async with (
        Transport(Identity.generate(), config, on_frame=lambda peer, payload: None) as sender,
        Transport(Identity.generate(), config, on_frame=on_frame) as receiver,
    ):
        address = await receiver.listen("127.0.0.1", 0)
        payload = os.urandom(size)
        await sender.send(receiver.peer_id, address, payload)  # connect; not timed
        peer = receiver.peer_id
        start = time.perf_counter()
        for _ in range(frames):
            await sender.send(peer, None, payload)
        await done
        return time.perf_counter() - start


async def bench_transport(
    frames: int = 50000, size: int = 300, rounds: int = 5
) -> dict[str, float]:
    """``rounds`` plaintext and ``rounds`` encrypted runs of :func:`bench_transport_once`,
    alternating. Returns ``frames``, ``size``, ``rounds``; ``seconds``, ``frames_per_s`` and
    ``mb_per_s`` (payload megabytes, 10^6 bytes, per second) of the encrypted transport, the
    default; ``plaintext_frames_per_s`` and ``plaintext_mb_per_s``; and
    ``encrypted_ratio``, encrypted over plaintext frames/s (1.0: encryption is free)."""
    if rounds < 1:
        raise ValueError("rounds must be positive")
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for encrypt in (False, True):
            times[encrypt].append(await bench_transport_once(frames, size, encrypt=encrypt))
    plain = statistics.median(times[False])
    sealed = statistics.median(times[True])
    return {
        "frames": frames,
        "size": size,
        "rounds": rounds,
        "seconds": sealed,
        "frames_per_s": frames / sealed,
        "mb_per_s": frames * size / sealed / 1e6,
        "plaintext_frames_per_s": frames / plain,
        "plaintext_mb_per_s": frames * size / plain / 1e6,
        "encrypted_ratio": plain / sealed,
    }


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    frames = int(args[0]) if args else 50000
    size = int(args[1]) if len(args) > 1 else 300
    rounds = int(args[2]) if len(args) > 2 else 5
    print(json.dumps(run_loop(bench_transport(frames, size, rounds))))


if __name__ == "__main__":
    main()
