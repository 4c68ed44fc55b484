"""Arranging state that the API of this issue cannot set yet (assignment, status, block).

Each helper writes through a real store connection to the test's SQLite file; the daemon reads it
like any other committed change.
"""

from __future__ import annotations

import sqlite3

from inboxd.store import messages
from inboxd.store.db import Store


def inbound_text(
    channel_id: str, phone: str, content: str = "hi", name: str | None = None
) -> messages.NewMessage:
    """An inbound text message for ``messages.ingest``, from ``phone`` (and ``name``)."""
    return messages.NewMessage(
        channel_id=channel_id,
        direction="INBOUND",
        phone_number=phone,
        contact_name=name,
        contact_avatar=None,
        type="TEXT",
        content=content,
    )


def _user_pk(conn: sqlite3.Connection, user_id: str) -> int:
    return int(conn.execute("SELECT pk FROM users WHERE id = ?", (user_id,)).fetchone()[0])


def assign(store: Store, conversation_id: str, user_id: str | None) -> None:
    def fn(conn: sqlite3.Connection) -> None:
        pk = None if user_id is None else _user_pk(conn, user_id)
        conn.execute(
            "UPDATE conversations SET assigned_to_pk = ? WHERE id = ?", (pk, conversation_id)
        )

    store.write_sync(fn)


def set_status(store: Store, conversation_id: str, status: str) -> None:
    store.write_sync(
        lambda conn: conn.execute(
            "UPDATE conversations SET status = ? WHERE id = ?", (status, conversation_id)
        )
    )


def block(store: Store, conversation_id: str) -> None:
    store.write_sync(
        lambda conn: conn.execute(
            "UPDATE conversations SET is_blocked = 1 WHERE id = ?", (conversation_id,)
        )
    )


def event_types(store: Store) -> list[str]:
    return [
        r[0]
        for r in store.read_sync(
            lambda c: c.execute("SELECT type FROM events ORDER BY seq").fetchall()
        )
    ]
