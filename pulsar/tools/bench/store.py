"""Throughput of :class:`dag.store.BlockStore` on a real file.

``python -m pulsar.tools.bench.store``; kept out of ``dag/`` so the library holds only
what a node runs.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
from pathlib import Path

from dag.cid import CID, cid_of
from dag.store import BlockStore

__all__ = ["bench_store"]

_BLOCK_SIZE = 300
# A DAG-CBOR byte string of 297 bytes: major type 2, 2-byte length (0x59 0x01 0x29), 3 + 297.
_HEADER = bytes([0x59]) + (_BLOCK_SIZE - 3).to_bytes(2, "big")


def bench_store(path: str | os.PathLike[str], n: int = 20000, batch: int = 500) -> dict[str, float]:
    """Put ``n`` random 300-byte DAG-CBOR blocks with ``put_many`` in batches of ``batch``,
    then ``get`` each of them once in random order; return blocks per second of each.

    Only the store calls are timed: blocks and their CIDs are made beforehand. ``put_many``
    includes checking every block against its CID, as it always does. For the reads the store
    is closed and reopened first, which empties its LRU cache; as every block is then read
    exactly once, every ``get`` goes to SQLite (the OS page cache is still warm: this measures
    the store, not the disk). ``path`` must not exist yet; it is a new database file.
    """
    if n <= 0 or batch <= 0:
        raise ValueError("n and batch must be positive")
    if os.path.exists(path):
        raise FileExistsError(f"{os.fspath(path)} exists; give a path for a new database")
    rng = random.Random(0x5EED)
    blocks: list[tuple[CID, bytes]] = []
    for _ in range(n):
        block = _HEADER + rng.randbytes(_BLOCK_SIZE - 3)
        blocks.append((cid_of(block), block))
    batches = [blocks[i : i + batch] for i in range(0, n, batch)]

    with BlockStore(path) as store:
        start = time.perf_counter()
        for items in batches:
            store.put_many(items)
        put_s = time.perf_counter() - start

    order = [cid for cid, _ in blocks]
    rng.shuffle(order)
    with BlockStore(path) as store:
        start = time.perf_counter()
        for cid in order:
            if store.get(cid) is None:
                raise RuntimeError(f"block {cid} went missing")
        get_s = time.perf_counter() - start

    return {"store_put_per_s": n / put_s, "store_get_per_s": n / get_s}


def main(argv: list[str] | None = None) -> None:
    """Run :func:`bench_store` in a temporary directory and print the results."""
    args = sys.argv[1:] if argv is None else argv
    n = int(args[0]) if args else 20000
    with tempfile.TemporaryDirectory() as tmp:
        results = bench_store(Path(tmp) / "bench.sqlite3", n=n)
    for name, value in results.items():
        print(f"{name}: {value:,.0f}")


if __name__ == "__main__":
    main()
