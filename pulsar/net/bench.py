"""Micro-benchmark of the transport: one-way throughput between two local transports.

Both transports run in this process and on one event loop over 127.0.0.1, so the figure is
the cost of the transport itself (framing, queues, syscalls, both ends) on one core, not a
network measurement. Run it with ``python -m pulsar.net.bench [frames] [size]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from dag import Identity, PeerId

from .config import TransportConfig
from .transport import Transport

__all__ = ["bench_transport"]


async def bench_transport(frames: int = 50000, size: int = 300) -> dict[str, float]:
    """Send ``frames`` payloads of ``size`` bytes from one transport to another and time it
    from the first send (connection already up) to the last delivery.

    Returns ``frames``, ``size``, ``seconds``, ``frames_per_s`` and ``mb_per_s`` (payload
    megabytes, 10^6 bytes, per second)."""
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

    config = TransportConfig(send_queue=4096)
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
        seconds = time.perf_counter() - start
    return {
        "frames": frames,
        "size": size,
        "seconds": seconds,
        "frames_per_s": frames / seconds,
        "mb_per_s": frames * size / seconds / 1e6,
    }


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    frames = int(args[0]) if args else 50000
    size = int(args[1]) if len(args) > 1 else 300
    print(json.dumps(asyncio.run(bench_transport(frames, size))))


if __name__ == "__main__":
    main()
