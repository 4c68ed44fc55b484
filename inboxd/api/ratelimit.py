"""Per-key token buckets ([limits] in the config; CONTRACT section 3, 429 rate_limited)."""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs


@attrs.define
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """``requests_per_second`` refill, ``burst`` capacity, one bucket per key, in memory."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._buckets: dict[int, _Bucket] = {}

    def take(self, key: int) -> float:
        """Take one token; returns 0 when allowed, else the seconds until a token is there."""
        if self._rate <= 0 or self._burst < 1:  # either at 0 turns it off (README)
            return 0.0
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(tokens=self._burst, updated=now)
        bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.updated) * self._rate)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self._rate


def retry_after_seconds(wait: float) -> int:
    return max(1, math.ceil(wait))
