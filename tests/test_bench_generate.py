"""``bench generate``'s store: laid out as a store filled over time would be (bench/HISTORY.md,
forty-first session, item 4)."""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path

import pytest

from bench import generate


# Seed 1's sizes fall 86 messages short of the total (one more each for conversations drawn at
# random makes it up); seed 7's reach it as drawn.
@pytest.mark.parametrize("seed", [1, 7])
def test_messages_are_numbered_in_time_order_across_conversations(
    tmp_path: Path, seed: int
) -> None:
    data = tmp_path / "store"
    args = argparse.Namespace(
        data=str(data), conversations=300, messages=3000, channels=3, operators=4, seed=seed
    )
    assert generate.run(args) == 0
    conn = sqlite3.connect(data / "inboxd.db")
    assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 3000
    assert conn.execute("SELECT count(*) FROM conversations").fetchone()[0] == 300
    # A message's pk (which orders the table and its id) follows its time, whatever its
    # conversation: no message comes before the one numbered just ahead of it.
    assert not conn.execute(
        "SELECT count(*) FROM messages a JOIN messages b ON b.pk = a.pk + 1"
        " WHERE b.created_at < a.created_at OR b.id < a.id"
    ).fetchone()[0]
    # So conversations' messages lie among each other's: numbered one conversation after
    # another, every conversation's messages would be consecutive (none apart). So few
    # conversations over two years seldom overlap (a message every few hours each); ten
    # million messages put about two thousand others between two of one conversation's.
    apart = conn.execute(
        "SELECT count(*) FROM (SELECT pk - lag(pk) OVER (PARTITION BY conversation_pk"
        " ORDER BY pk) AS gap FROM messages) WHERE gap > 1"
    ).fetchone()[0]
    assert apart >= 100
    # Each conversation's last message is its newest, and its list fields say so.
    assert not conn.execute(
        "SELECT count(*) FROM conversations c JOIN messages m ON m.pk = c.last_message_pk"
        " WHERE m.conversation_pk <> c.pk OR m.created_at <> c.last_message_at"
        " OR m.direction <> c.last_message_direction"
        " OR c.last_message_pk <> (SELECT max(pk) FROM messages WHERE conversation_pk = c.pk)"
    ).fetchone()[0]
    assert not conn.execute(
        "SELECT count(*) FROM conversations c WHERE NOT EXISTS"
        " (SELECT 1 FROM messages m WHERE m.pk = c.last_message_pk)"
    ).fetchone()[0]
    # The maintained counters and the wire rows cover every conversation.
    assert conn.execute("SELECT sum(n) FROM conversation_counts").fetchone()[0] == 300
    assert conn.execute("SELECT count(*) FROM conversation_wire").fetchone()[0] == 300
    conn.close()


def test_the_history_row_reads_full_pages_that_no_write_row_changes(tmp_path: Path) -> None:
    """``bench http``'s history row (and ``bench ab``'s and ``bench app``'s) reads the largest
    channel's most recent conversations that hold more than 50 messages other than SYSTEM ones
    and that no write row changes, so that its pages hold 50 messages in every run on a store
    (bench/HISTORY.md, forty-second session, item 1); on a store with too few of them, the
    fullest of the rest follow."""
    from bench.http import pick  # (the store is made first: pick reads it)

    data = tmp_path / "store"
    args = argparse.Namespace(
        data=str(data), conversations=2300, messages=40000, channels=1, operators=3, seed=3
    )
    assert generate.run(args) == 0
    ids = pick(data)
    history = ids["history_conversations"]
    written = set(ids["conversations"][:1000]) | set(ids["open_conversations"])
    conn = sqlite3.connect(data / "inboxd.db")
    held = {
        conversation: n
        for conversation, n in conn.execute(
            "SELECT c.id, count(m.pk) FROM conversations c JOIN messages m"
            " ON m.conversation_pk = c.pk AND m.is_system = 0 GROUP BY c.pk"
        )
    }
    by_recency = [r[0] for r in conn.execute("SELECT id FROM conversations ORDER BY sort_at DESC")]
    conn.close()
    full = [c for c in by_recency if held.get(c, 0) > 50 and c not in written]
    assert 0 < len(full) < 500  # (this store has some, and too few: both ways are met)
    assert len(history) == len(set(history)) == 500
    assert not set(history) & written
    assert history[: len(full)] == full  # the full ones first, the most recent first
    rest = [held.get(c, 0) for c in history[len(full) :]]
    assert rest == sorted(rest, reverse=True)  # then the fullest of the others
    assert min(rest) >= max(
        held.get(c, 0) for c in by_recency if c not in written and c not in history
    )
