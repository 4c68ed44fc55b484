"""inboxd/heap.py: the collector's settings once start-up is done. Run in a child process, since
freezing is for the whole process and the test process must keep collecting normally."""

from __future__ import annotations

import subprocess
import sys

_CHILD = """
import gc, weakref
from inboxd import heap

gc.collect()
assert gc.get_freeze_count() == 0
heap.settle()
print(gc.get_freeze_count(), gc.get_threshold()[0])

class Node:
    pass

# A cycle made after start-up is garbage the collector must still find.
a, b = Node(), Node()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
print(gone() is None)
"""


def test_settle_freezes_startup_and_still_collects_later_cycles() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True
    ).stdout.split()
    frozen, threshold, collected = int(out[0]), int(out[1]), out[2]
    assert frozen > 1_000  # the imports' objects
    assert threshold == 10_000
    assert collected == "True"
