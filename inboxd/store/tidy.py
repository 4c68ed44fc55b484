"""Merging the contact search index's b-trees while the daemon runs.

FTS5 keeps an index as b-trees ("segments") on levels: each write adds a small one, and its
automatic merging (``automerge``, 4 by default) merges four of a level into one on the next. So
a level keeps up to three, and ``contacts_fts`` on a million contacts held ten (three of 8,300
pages, three of 2,100 and four small) after ``bench generate``'s import, as steady arrivals
leave it too. Every search reads the contact index (conversations.search: names and phone
numbers first), and each of a query's terms is looked up in each b-tree, seeking the channel's
rows in each. On that store, with the ten b-trees against the four left by ``step`` (two copies,
queries alternating, the same answers; by hand, the twenty-fifth session), a name or a number
took 1.3-1.9 ms in the median and the smallest channel and 0.5-1.0 ms merged ("Hopper" 1.32 ->
0.49 ms); the p50 of ``bench http``'s ten search queries went from 1.60 to 1.03 ms and from 1.91
to 1.19 ms there, and from 1.30 to 1.12 ms in the largest channel. Queries that match no contact
and phrases whose walk through the messages dominates took as long as before.

``step`` does a little of FTS5's own incremental merge, the ``'merge'`` command, with
``usermerge`` set to 2: any level holding two b-trees or more is merged into one on the next,
so the index keeps at most one a level. That ten became four, one of them all but the whole
index, in 489 steps of ``STEP_PAGES``, 3.2 s (median 5.6 ms a step, the longest 23.5 ms, each
its own transaction). A b-tree is rewritten once each time it moves up a level, as automatic
merging does, so a large index is not rewritten for a few new contacts; merging it all into one
(``'optimize'``) would be.

The message indexes are not merged: on the same store, merging ``messages_fts``'s fourteen
b-trees into one (60 s, 2.2 GB written) left the median and smallest channels' message
searches as they were (3.3-3.8 ms for a phrase of frequent words in the median channel, timed
before and after), since a search there costs its walk through the channel's rows, not its
lookups.

A stop between two steps, or inside one, loses nothing: each step is a write of its own (in the
daemon, a savepoint of a batch it may share with the API's writes: it commits or fails whole),
and the next pass goes on with a merge left half done (FTS5 keeps it in its structure record).
"""

from __future__ import annotations

import sqlite3
from typing import Final

# Leaf pages a step writes at most (FTS5 pages, ``pgsz`` 4,050 bytes): a step took 5.6 ms on the
# median, 23.5 ms at most, on a million contacts (above); an API write batched with a step
# waits for it.
STEP_PAGES: Final = 64
# Merge any level holding this many b-trees (FTS5 allows 2-16; its default is 4).
USERMERGE: Final = 2
# The most steps the daemon takes in one pass (about 5 GB of pages; the million contacts' index
# is 125 MB), so that contacts arriving all the time cannot keep a pass going.
PASS_STEPS: Final = 20_000


def btrees(conn: sqlite3.Connection) -> int:
    """How many b-trees ``contacts_fts`` is in: each has its first leaf page's first term in
    the index's ``_idx`` table (a row for each leaf page that starts a term; 31,000 rows a
    million contacts, read in a few ms)."""
    return int(conn.execute("SELECT count(DISTINCT segid) FROM contacts_fts_idx").fetchone()[0])


def step(conn: sqlite3.Connection, pages: int = STEP_PAGES) -> bool:
    """Merge up to about ``pages`` pages of ``contacts_fts``'s b-trees; returns whether it did
    any work (False: nothing was left to merge). The ``usermerge`` setting goes into the index's
    config table on the first step (it changes what the ``'merge'`` command merges, and nothing
    else: writes keep their automatic merging)."""
    setting = conn.execute("SELECT v FROM contacts_fts_config WHERE k = 'usermerge'").fetchone()
    if setting is None or setting[0] != USERMERGE:
        conn.execute(
            "INSERT INTO contacts_fts(contacts_fts, rank) VALUES ('usermerge', ?)", (USERMERGE,)
        )
    before = conn.total_changes
    conn.execute("INSERT INTO contacts_fts(contacts_fts, rank) VALUES ('merge', ?)", (pages,))
    # FTS5's own test of whether the command merged anything: two changes or more.
    return conn.total_changes - before >= 2
