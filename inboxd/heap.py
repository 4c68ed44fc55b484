"""The garbage collector's settings for a long-running daemon, applied once start-up is done.

CPython's cyclic collector is tuned for short scripts. Measured on the 10M-message store under
32 connections (bench/HISTORY.md), with its defaults it took about 9 % of the daemon's CPU, and
every few seconds a full collection stopped the whole process for 50-65 ms: it walks every
object the imports and start-up created (a few hundred thousand), all of which live as long
as the process. Each such pause delays every request in flight, which is most of a p99.

- ``gc.freeze()`` once start-up is done moves those objects to the permanent generation: full
  collections then walk only what was created since (a 55 ms pause became about 2 ms).
- A young-generation threshold of ``GEN0_THRESHOLD`` instead of 700: with 32 requests in
  flight, their live objects were walked (and promoted) by a collection every 700
  allocations, about a hundred times a second. At 10,000, collections happen a few times a
  second or less, each one a few milliseconds.

Nothing is left uncollected by either: cyclic garbage created after start-up is found as
before, only less often (at most a few MB of it waits for the next collection).
"""

from __future__ import annotations

import gc
from typing import Final

GEN0_THRESHOLD: Final = 10_000


def settle() -> None:
    """Call once, when the daemon has started: collect start-up's garbage, freeze what is left,
    raise the young generation's threshold."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
