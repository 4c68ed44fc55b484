"""The per-key rate limit answers 429 rate_limited with Retry-After (CONTRACT section 3)."""

from __future__ import annotations

import httpx
import pytest

from inboxd.api.ratelimit import RateLimiter
from inboxd.config import Config, LimitsConfig
from tests.conftest import Seed, auth


@pytest.fixture
def config() -> Config:
    return Config(limits=LimitsConfig(requests_per_second=1, burst=3))


async def test_burst_then_429_per_key(owner: httpx.AsyncClient, seeded: Seed) -> None:
    statuses = [(await owner.get("/api/v1/inbox/channels")).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    limited = await owner.get("/api/v1/inbox/channels")
    assert limited.json()["error"]["code"] == "rate_limited"
    assert int(limited.headers["retry-after"]) >= 1
    # Another key has its own bucket.
    other = await owner.get("/api/v1/inbox/channels", headers=auth(seeded.bob_key))
    assert other.status_code == 200


def test_bucket_refills_at_the_configured_rate() -> None:
    now = [100.0]
    limiter = RateLimiter(rate=2, burst=2, clock=lambda: now[0])
    assert limiter.take(1) == 0 and limiter.take(1) == 0
    assert limiter.take(1) == pytest.approx(0.5)
    now[0] += 0.5
    assert limiter.take(1) == 0
    assert limiter.take(1) > 0


def test_zero_rate_disables_the_limit() -> None:
    limiter = RateLimiter(rate=0, burst=1, clock=lambda: 0.0)
    assert all(limiter.take(1) == 0 for _ in range(1000))


def test_zero_burst_disables_the_limit_too() -> None:
    """README: either at 0 turns it off. A burst of 0 with a rate used to refuse every request
    for good, each with a Retry-After that never came true."""
    limiter = RateLimiter(rate=50, burst=0, clock=lambda: 0.0)
    assert all(limiter.take(1) == 0 for _ in range(1000))
