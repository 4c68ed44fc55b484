"""Message search indexes of their own for large channels (schema v20).

A search walks its channel's part of ``messages_fts`` with the channel's token beside the text's
trigrams (conversations.search): the token keeps the walk inside the channel, but its list holds
a row for each of the channel's messages, and in a channel of 1.5 million messages it was about
40 % of the walk for a phrase that matches nothing there. A channel past ``SHARD_MESSAGES``
indexed messages gets an FTS5 table of its own, ``message_shard_<channel pk>``, holding its
messages alone: its searches walk the text's trigrams and nothing else. On the generated store's
largest channel (1.54 million messages) the p99 of ``bench http``'s ten search queries went from
28.4 to 17.0 ms, and from 40.7 to 23.9 ms on a store that benchmark writes had grown (both ways
in one run at the store, timed by hand; the same answers, checked on the way).

An index of its own is made while the daemon serves, a step at a time, each step a write of its
own (in the daemon, a savepoint of a batch it may share with the API's writes: it commits or
fails whole):

1. ``start``: the table, and a trigger that puts the channel's messages into it from the next
   message pk on (``indexed_from``). ``messages_fts`` still takes them too, and searches still
   read it.
2. ``step``, repeated: the channel's older messages go in, newest first, up to ``STEP_ROWS`` at
   a time (``filled_below`` counts down). A stop between two steps, or inside one, loses
   nothing: the next start goes on from ``filled_below``.
3. The last step finds no older message: the index is ``ready``. In the same transaction
   ``messages_fts``'s trigger is made anew without the channel, and from then on searches read
   the channel's own index.

The channel's rows already in ``messages_fts`` stay there, read by no search (no other channel's
walk meets them: each stays in its own range of rowids). Deleting them from a contentless FTS5
index would write a delete entry for each of their trigrams, which takes room of its own until
merges meet them, and its largest segment is seldom merged again.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Final

from inboxd.store.db import run_in_transaction
from inboxd.store.schema import (
    SEARCH_CHANNEL_SHIFT,
    SEARCH_PK_MASK,
    message_fts_trigger,
    message_shard_fill_sql,
    message_shard_sql,
    message_shard_step_sql,
)

# A channel gets an index of its own once messages_fts holds this many of its messages: a phrase
# that matches nothing costs about 18 ms a million messages there with the token, 11 without
# (timed by hand, quiet machine); below it, the shared index keeps every search well under the
# 50 ms target, and the schema small (an FTS5 table is five schema objects).
SHARD_MESSAGES: Final = 1_000_000
# Messages a step puts in (the daemon filled the largest channel's 1.54 million in 3,898 steps,
# 112 s with its 10 ms pauses, idle otherwise: about 19 ms a step, commit included; an API write
# batched with a step waits for it) and message pks it looks through at most (a channel whose
# messages are sparse among the others' costs a scan of this many rows a step, not of all).
STEP_ROWS: Final = 400
STEP_PKS: Final = 20_000


def ready_channels(conn: sqlite3.Connection) -> tuple[int, ...]:
    """The channels whose searches read an index of their own."""
    return tuple(
        r[0]
        for r in conn.execute(
            "SELECT channel_pk FROM message_shards WHERE ready_at IS NOT NULL ORDER BY channel_pk"
        )
    )


def count_by_state(conn: sqlite3.Connection) -> dict[str, int]:
    """How many channels' own indexes are filling and ready (``/metrics``)."""
    row = conn.execute(
        "SELECT count(*) - count(ready_at), count(ready_at) FROM message_shards"
    ).fetchone()
    return {"filling": int(row[0]), "ready": int(row[1])}


def has_ready_shard(conn: sqlite3.Connection, channel_pk: int) -> bool:
    return (
        conn.execute(
            "SELECT 1 FROM message_shards WHERE channel_pk = ? AND ready_at IS NOT NULL",
            (channel_pk,),
        ).fetchone()
        is not None
    )


def channel_id(conn: sqlite3.Connection, channel_pk: int) -> str:
    return str(conn.execute("SELECT id FROM channels WHERE pk = ?", (channel_pk,)).fetchone()[0])


def candidates(conn: sqlite3.Connection) -> list[int]:
    """The channels with no index of their own."""
    return [
        r[0]
        for r in conn.execute(
            "SELECT pk FROM channels WHERE pk NOT IN (SELECT channel_pk FROM message_shards)"
            " ORDER BY pk"
        )
    ]


def held(conn: sqlite3.Connection, channel_pk: int, up_to: int) -> int:
    """How many of the channel's messages messages_fts holds, counted up to ``up_to`` in its
    row sizes table (about 50 ns a row from the page cache: 55 ms for a million, timed by hand;
    one read a channel stays well inside a read's deadline)."""
    first = channel_pk << SEARCH_CHANNEL_SHIFT
    return int(
        conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM messages_fts_docsize"
            " WHERE id BETWEEN ? AND ? LIMIT ?)",
            (first, first | SEARCH_PK_MASK, up_to),
        ).fetchone()[0]
    )


def due(conn: sqlite3.Connection, threshold: int = SHARD_MESSAGES) -> list[int]:
    """The channels with no index of their own whose part of messages_fts holds at least
    ``threshold`` messages."""
    return [pk for pk in candidates(conn) if held(conn, pk, threshold) >= threshold]


def unfinished(conn: sqlite3.Connection) -> list[int]:
    """The channels whose own index is still being filled."""
    return [
        r[0]
        for r in conn.execute(
            "SELECT channel_pk FROM message_shards WHERE ready_at IS NULL ORDER BY channel_pk"
        )
    ]


def start(conn: sqlite3.Connection, channel_pk: int, now: int) -> bool:
    """Make the channel's own index and its trigger (step 1 above); False if it has one."""
    if conn.execute("SELECT 1 FROM message_shards WHERE channel_pk = ?", (channel_pk,)).fetchone():
        return False
    indexed_from = conn.execute("SELECT coalesce(max(pk), 0) + 1 FROM messages").fetchone()[0]
    # Nothing is written into the new table in this write (its first message comes in a write
    # of its own): SQLite 3.40 fails the next SAVEPOINT with "SQL logic error" after a write
    # whose savepoint created an FTS5 table, wrote to it and was rolled back (the review's
    # finding, twenty-fourth session), which would fail the rest of the batch.
    for statement in message_shard_sql(channel_pk, indexed_from):
        conn.execute(statement)
    conn.execute(
        "INSERT INTO message_shards (channel_pk, indexed_from, filled_below, created_at)"
        " VALUES (?, ?, ?, ?)",
        (channel_pk, indexed_from, indexed_from, now),
    )
    return True


def step(
    conn: sqlite3.Connection,
    channel_pk: int,
    now: int,
    rows: int = STEP_ROWS,
    pks: int = STEP_PKS,
) -> bool:
    """Put up to ``rows`` more of the channel's older messages into its own index, looking
    through at most ``pks`` message pks; when none is left below, make the index ready (step 3
    above). Returns whether there is more to do."""
    shard = conn.execute(
        "SELECT filled_below, ready_at FROM message_shards WHERE channel_pk = ?", (channel_pk,)
    ).fetchone()
    if shard is None or shard[1] is not None:
        return False
    below = int(shard[0])
    floor = max(below - pks, 0)
    nth = conn.execute(message_shard_step_sql(channel_pk), (below, floor, rows)).fetchone()
    low = floor if nth is None else int(nth[0])
    conn.execute(message_shard_fill_sql(channel_pk), (below, low))
    more = conn.execute("SELECT EXISTS (SELECT 1 FROM messages WHERE pk < ?)", (low,)).fetchone()
    if more[0]:
        conn.execute(
            "UPDATE message_shards SET filled_below = ? WHERE channel_pk = ?", (low, channel_pk)
        )
        return True
    conn.execute(
        "UPDATE message_shards SET filled_below = ?, ready_at = ? WHERE channel_pk = ?",
        (low, now, channel_pk),
    )
    conn.execute("DROP TRIGGER messages_fts_insert")
    conn.execute(message_fts_trigger(ready_channels(conn)))
    return False


def bring_up_to_date(
    conn: sqlite3.Connection,
    now: Callable[[], int],
    threshold: int = SHARD_MESSAGES,
    progress: Callable[[int, int, int], None] | None = None,
    rows: int = 50_000,
) -> list[int]:
    """Give every channel due one its own index and fill it, in transactions of ``rows``
    messages, on a connection of its own (``bench generate``, ``bench http``: nothing else
    writing); ``progress(channel_pk, filled_below, indexed_from)`` after each. Returns the
    channels it made ready."""
    made: list[int] = []
    for channel_pk in run_in_transaction(conn, "BEGIN IMMEDIATE", due, threshold):
        run_in_transaction(conn, "BEGIN IMMEDIATE", start, channel_pk, now())
    for channel_pk in unfinished(conn):
        more = True
        while more:
            more = run_in_transaction(
                conn, "BEGIN IMMEDIATE", step, channel_pk, now(), rows, rows * 50
            )
            if progress is not None:
                below, top = conn.execute(
                    "SELECT filled_below, indexed_from FROM message_shards WHERE channel_pk = ?",
                    (channel_pk,),
                ).fetchone()
                progress(channel_pk, below, top)
        made.append(channel_pk)
    return made
