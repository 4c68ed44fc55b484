"""Merging search indexes' b-trees while the daemon runs: the contact index and the large
channels' own message indexes (store/shards.py).

FTS5 keeps an index as b-trees ("segments") on levels: each write adds a small one, and its
automatic merging (``automerge``, 4 by default) merges four or more of a level into one on the
next. It does that work a little at a time, about once per 64 leaf pages written, so small
b-trees pile up between (level 0 holds up to fifteen before a merge is forced at sixteen,
``crisismerge``), and a level above may keep three or four. Each of a query's terms is looked up
in each b-tree, seeking the channel's rows in each.

- ``contacts_fts``, which every search reads first (names and phone numbers), held ten b-trees
  on the generated store's million contacts (three of 8,300 pages, three of 2,100, four small)
  after ``bench generate``'s import, as steady arrivals leave it too.
- The largest channel's own index held eleven as its fill's steps left them.

On that store, two copies with queries alternating and the same answers (timed by hand, the
twenty-fifth session):

- The contact index merged (ten b-trees -> four): a name or a number took 0.5-1.0 ms in the
  median and the smallest channel, against 1.3-1.9 ms ("Hopper" 1.32 -> 0.49 ms). The p50 of
  ``bench http``'s ten search queries went from 1.60 to 1.03 ms and from 1.91 to 1.19 ms there,
  and from 1.30 to 1.12 ms in the largest channel.
- The largest channel's own index merged as well (eleven -> one): that channel's p50 0.72 ->
  0.40 ms, its rare phrases 5-6 % faster (16.3 -> 15.2 ms); the other channels as before.
- Queries that match no contact, and the other channels' phrases, whose walk through the
  messages is their cost, took as long as before.

``step`` does a little of FTS5's own incremental merge, the ``'merge'`` command, with
``usermerge`` set to 2: any level holding two b-trees or more is merged into one on the next,
so right after a pass an index holds at most one a level. A step writes about ``STEP_PAGES``
pages: a merge stops only at the end of a term, so a step that meets a frequent term's long
list writes all of it (up to 447 pages, 24-28 ms, in a review's test on an index shaped like the
contact index). The contact index took 489 steps, 3.2 s of steps (a step 5.6 ms on the median,
23.5 ms at most; with the daemon's 10 ms pauses about 8 s); the own index (1.54 million
messages) 1,242 steps, 10.4 s (6.7 ms, 67.8 ms at most; about 23 s with the pauses).

The merges then run like a binary counter: the b-trees made of later rows are merged level by
level, and the largest is rewritten when the one made of the rows since reaches its level,
which takes twice as long each time. In a review's model of hourly passes with steady arrivals
the whole index was rewritten at passes 1, 3, 7, 15 and 31: about a dozen times in a year, where
merging it all into one at each pass (``'optimize'``) would rewrite it every hour.

The shared message index is not merged: on the same store, merging ``messages_fts``'s fourteen
b-trees into one (60 s, 2.2 GB written) left the median and smallest channels' message searches
as they were (3.3-3.8 ms for a phrase of frequent words in the median channel, timed before and
after), since a search there costs its walk through the channel's rows, not its lookups.

A stop between two steps, or inside one, loses nothing: each step is a write of its own (in the
daemon, a savepoint of a batch it may share with the API's writes: it commits or fails whole),
and the next pass goes on with a merge left half done (FTS5 keeps it in its structure record).
"""

from __future__ import annotations

import re
import sqlite3
from typing import Final

from inboxd.store.schema import message_shard_table
from inboxd.store.shards import ready_channels

# Leaf pages a step writes, about (FTS5 pages, ``pgsz`` 4,050 bytes; more where a term's list is
# longer, above): a step took 5.6-6.7 ms on the median, 67.8 ms at most, on the generated store;
# an API write batched with a step waits for it.
STEP_PAGES: Final = 64
# Merge any level holding this many b-trees (FTS5 allows 2-16; its default is 4).
USERMERGE: Final = 2
# The most steps the daemon takes on one index in one pass (about 5 GB of pages; the million
# contacts' index is 125 MB, the largest channel's own 310 MB), so that rows arriving all the
# time cannot keep a pass going.
PASS_STEPS: Final = 20_000
CONTACTS: Final = "contacts_fts"
_INDEX_NAME: Final = re.compile(r"contacts_fts|message_shard_[0-9]+")


def indexes(conn: sqlite3.Connection) -> list[str]:
    """The indexes kept merged: the contact index, then each ready own index of a channel."""
    return [CONTACTS, *(message_shard_table(pk) for pk in ready_channels(conn))]


def _checked(index: str) -> str:
    if not _INDEX_NAME.fullmatch(index):
        raise ValueError(f"not a search index kept merged: {index!r}")
    return index


def btrees(conn: sqlite3.Connection, index: str) -> int:
    """How many b-trees ``index`` is in: each has its first leaf page's first term in the
    index's ``_idx`` table (a row for each leaf page that starts a term: 31,000 rows for a
    million contacts, read in a few ms)."""
    table = _checked(index)
    return int(conn.execute(f"SELECT count(DISTINCT segid) FROM {table}_idx").fetchone()[0])


def step(conn: sqlite3.Connection, index: str, pages: int = STEP_PAGES) -> bool:
    """Merge about ``pages`` pages of ``index``'s b-trees (more to finish a term's list); returns whether it did any work
    (False: nothing was left to merge). The ``usermerge`` setting goes into the index's config
    table on the first step (it changes what the ``'merge'`` command merges, and nothing else:
    writes keep their automatic merging)."""
    table = _checked(index)
    setting = conn.execute(f"SELECT v FROM {table}_config WHERE k = 'usermerge'").fetchone()
    if setting is None or setting[0] != USERMERGE:
        conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('usermerge', ?)", (USERMERGE,))
    before = conn.total_changes
    conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('merge', ?)", (pages,))
    # FTS5's own test of whether the command merged anything: two changes or more.
    return conn.total_changes - before >= 2
