"""Wall-clock time for the daemon, and sleeping until a wall-clock instant.

Deadlines that must survive a restart (channel webhook retries and probes) are stored as wall-clock
microseconds; tasks sleep on trio's clock until them. ``SystemClock`` is the real one.
``TrioClock`` derives wall time from trio's clock (anchored when created), so that under
``trio.testing.MockClock`` stored times, timestamps and sleeps all move together in virtual time.
"""

from __future__ import annotations

import time
from typing import Protocol

import trio


class Clock(Protocol):
    def now_us(self) -> int:
        """Wall-clock microseconds since the epoch."""

    async def sleep_until(self, wall_us: int) -> None:
        """Return at (or just after) the wall-clock instant ``wall_us``."""


class SystemClock:
    def now_us(self) -> int:
        return time.time_ns() // 1000

    async def sleep_until(self, wall_us: int) -> None:
        # Re-check after waking: the system clock may have been stepped while we slept.
        while (remaining := wall_us - self.now_us()) > 0:  # noqa: ASYNC110
            await trio.sleep(remaining / 1_000_000)


class TrioClock:
    """Wall time that advances exactly with trio's clock (for tests on MockClock)."""

    def __init__(self) -> None:
        self._wall0 = time.time_ns() // 1000
        self._trio0 = trio.current_time()

    def now_us(self) -> int:
        return self._wall0 + round((trio.current_time() - self._trio0) * 1_000_000)

    async def sleep_until(self, wall_us: int) -> None:
        await trio.sleep_until(self._trio0 + (wall_us - self._wall0) / 1_000_000)
