"""Token buckets and throttled logging: how a node says no to a flood without falling over.

Both take the current time as an argument (monotonic seconds) so they are plain state
machines, testable without sleeping.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["KeyedLimiter", "LogThrottle", "TokenBucket"]


class TokenBucket:
    """Classic token bucket: ``rate`` tokens per second, at most ``burst`` saved up."""

    __slots__ = ("_last", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._last = now

    def take(self, amount: float, now: float) -> bool:
        """Spend ``amount`` tokens if available; False (and nothing spent) otherwise."""
        elapsed = max(0.0, now - self._last)
        self._tokens = min(self.burst, self._tokens + elapsed * self.rate)
        self._last = now
        if self._tokens >= amount:
            self._tokens -= amount
            return True
        return False


class KeyedLimiter:
    """One token bucket per key (a peer address) plus a global one.

    Per-key buckets are kept in LRU order and capped at ``max_keys``, so a sender forging
    many source addresses costs memory only up to the cap (and still drains the global
    bucket)."""

    def __init__(self, rate: float, burst: float, global_rate: float, global_burst: float,
                 *, max_keys: int = 4096) -> None:
        self._rate = rate
        self._burst = burst
        self._max_keys = max_keys
        self._buckets: OrderedDict[Hashable, TokenBucket] = OrderedDict()
        self._global: TokenBucket | None = None
        self._global_rate = global_rate
        self._global_burst = global_burst

    def allow(self, key: Hashable, amount: float, now: float) -> bool:
        """True when ``key`` may spend ``amount`` now; the global bucket is charged only if
        the key's own bucket allows it."""
        if self._global is None:
            self._global = TokenBucket(self._global_rate, self._global_burst, now)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = TokenBucket(self._rate, self._burst, now)
            self._buckets[key] = bucket
            while len(self._buckets) > self._max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket.take(amount, now) and self._global.take(amount, now)


class LogThrottle:
    """Log at most one line per category per ``interval`` seconds, counting the rest.

    Untrusted input can make a node log on every datagram; this keeps the log readable and
    cheap while still reporting how much was suppressed."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self._logger = logger
        self._interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def log(self, level: int, category: str, now: float, msg: str, *args: object) -> None:
        last = self._last.get(category)
        if last is not None and now - last < self._interval:
            self._suppressed[category] = self._suppressed.get(category, 0) + 1
            return
        self._last[category] = now
        suppressed = self._suppressed.pop(category, 0)
        if suppressed:
            msg += " (%d similar suppressed)"
            args = (*args, suppressed)
        self._logger.log(level, msg, *args)
