"""Write batches of blocks into a BlockStore until killed: the victim of the crash test in
``tests/test_store.py``.

Usage: ``python store_writer.py DB_PATH FIRST_BATCH BATCH_SIZE``

Batch ``i`` is ``batch_blocks(i, BATCH_SIZE)``, so the test can recompute exactly what each
batch holds. ``committed i SECONDS`` is printed (and flushed) only after ``put_many`` of batch
``i`` has returned, i.e. after its transaction committed; SECONDS is how long put_many took.
Stops by itself after ``MAX_BATCHES`` so a test that fails to kill it does not fill the disk.
"""

from __future__ import annotations

import hashlib
import sys
import time

from dag.cid import CID, cid_of
from dag.store import BlockStore

MAX_BATCHES = 200


def batch_blocks(index: int, size: int) -> list[tuple[CID, bytes]]:
    """The blocks of batch ``index``: DAG-CBOR byte strings of 256 bytes (header 0x59 0x01
    0x00), unique per (index, position)."""
    items = []
    for j in range(size):
        seed = hashlib.sha256(f"{index}:{j}".encode()).digest()
        block = b"\x59\x01\x00" + seed * 8
        items.append((cid_of(block), block))
    return items


def main(argv: list[str]) -> None:
    path, first, size = argv[0], int(argv[1]), int(argv[2])
    with BlockStore(path) as store:
        batch = batch_blocks(first, size)
        for index in range(first, first + MAX_BATCHES):
            start = time.perf_counter()
            store.put_many(batch)
            took = time.perf_counter() - start
            # Make the next batch before reporting, so that right after the line the process is
            # inside put_many: a kill timed from the line then lands mid-write.
            batch = batch_blocks(index + 1, size)
            print(f"committed {index} {took:.6f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
