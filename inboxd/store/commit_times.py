"""How long the write batches' COMMITs took, kept as a histogram in plain numbers: counted in the
process that made them (the writer process, or the daemon's own) and exported to ``/metrics``
(``inboxd_store_commit_seconds``) when scraped."""

from __future__ import annotations

import bisect
from typing import Final

import attrs

# The upper bounds (seconds) of the buckets of ``inboxd_store_commit_seconds``, each write
# batch's COMMIT: its pages appended to the WAL and the fsync that makes them durable. Under a
# millisecond on a quiet disk; hundreds of milliseconds where the disk stalls (bench/HISTORY.md,
# thirty-fifth session), which every write of the batch, and every write queued behind it,
# waits out.
COMMIT_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


@attrs.define
class CommitTimes:
    """How long each COMMIT took, as a histogram: a count per bucket of ``COMMIT_BUCKETS`` (the
    last one past them all) and the sum. Only one batch commits at a time (the store's write
    limiter), so one observes at a time."""

    counts: list[int] = attrs.Factory(lambda: [0] * (len(COMMIT_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(COMMIT_BUCKETS, seconds)] += 1  # (a bound is "le")
        self.total += seconds

    def __add__(self, other: CommitTimes) -> CommitTimes:
        counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        return CommitTimes(counts, self.total + other.total)
