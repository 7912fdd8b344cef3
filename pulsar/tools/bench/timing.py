"""Small timing helpers shared by the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def rate(fn: Callable[[T], object], items: Sequence[T], *, min_seconds: float = 1.0) -> float:
    """Operations per second of ``fn`` over ``items``, cycling through them for at least
    ``min_seconds`` (one core, no concurrency)."""
    done = 0
    start = time.perf_counter()
    elapsed = 0.0
    while elapsed < min_seconds:
        for item in items:
            fn(item)
        done += len(items)
        elapsed = time.perf_counter() - start
    return done / elapsed


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty sample."""
    ordered = sorted(samples)
    if not ordered:
        raise ValueError("no samples")
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]
