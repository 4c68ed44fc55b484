"""SQL for the append-only event journal.

Each change appends its event inside the transaction that makes the change, so an event exists if
and only if its change committed. The envelope ``{id, type, createdAt, data}`` is serialised here,
once; deliveries and the feed send those bytes (CONTRACT section 6).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Final

import attrs
import orjson

from inboxd import ids
from inboxd.store.db import Appended
from inboxd.timeutil import format_us

# Event types (spec "Event types and data fields", CONTRACT section 8).
STATUS_CHANGED: Final = "inbox.conversation.status_changed"
ASSIGNED: Final = "inbox.conversation.assigned"
UNASSIGNED: Final = "inbox.conversation.unassigned"
BLOCKED: Final = "inbox.conversation.blocked"
UNBLOCKED: Final = "inbox.conversation.unblocked"
TITLE_CHANGED: Final = "inbox.conversation.title_changed"
CONVERSATION_READ: Final = "inbox.conversation.read"
MESSAGE_CREATED: Final = "inbox.message.created"
MESSAGE_STATUS_CHANGED: Final = "inbox.message.status_changed"
USER_INVITED: Final = "inbox.user.invited"
USER_ADDED: Final = "inbox.user.added"
USER_REMOVED: Final = "inbox.user.removed"
USER_CHANNELS_CHANGED: Final = "inbox.user.channels_changed"
USER_INVITE_REVOKED: Final = "inbox.user.invite_revoked"

# The events the inbox webhook delivers: the spec's table. Message events and "read" go to the
# feed (and message events to channel webhooks) only. Keep in step with the partial index
# events_webhook in schema.py.
WEBHOOK_TYPES_SQL: Final = "type NOT LIKE 'inbox.message.%' AND type <> 'inbox.conversation.read'"


@attrs.frozen
class JournalEvent:
    seq: int
    id: str
    type: str
    channel_pk: int | None
    created_at: int
    body: bytes


def encode_envelope(
    event_id: str, type_: str, created_at: int, data: Mapping[str, object]
) -> bytes:
    envelope = {"id": event_id, "type": type_, "createdAt": format_us(created_at), "data": data}
    return orjson.dumps(envelope)


def append(
    conn: sqlite3.Connection,
    account_pk: int,
    channel_pk: int | None,
    type_: str,
    data: Mapping[str, object],
    now: int,
    *,
    for_channel_webhooks: bool = False,
) -> int:
    """Append one event; returns its seq. ``for_channel_webhooks`` marks the messaging events
    that the channel's webhook URLs receive (not the inbox's own SYSTEM rows)."""
    event_id = ids.new_id("evt")
    body = encode_envelope(event_id, type_, now, data)
    cur = conn.execute(
        "INSERT INTO events (id, account_pk, channel_pk, type, created_at, body,"
        " for_channel_webhooks) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (event_id, account_pk, channel_pk, type_, now, body, int(for_channel_webhooks)),
    )
    seq = int(cur.lastrowid or 0)
    appended = getattr(conn, "appended", None)
    if appended is not None:  # the store's writer: tell the store what to wake after commit
        appended.append(
            Appended(seq, account_pk, channel_pk, type_, for_channel_webhooks, now, body)
        )
    return seq


def last_seq(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0])


def read_after(
    conn: sqlite3.Connection, account_pk: int, after_seq: int, limit: int
) -> list[JournalEvent]:
    rows = conn.execute(
        "SELECT seq, id, type, channel_pk, created_at, body FROM events"
        " WHERE account_pk = ? AND seq > ? ORDER BY seq LIMIT ?",
        (account_pk, after_seq, limit),
    ).fetchall()
    return [journal_event(r) for r in rows]


JOURNAL_COLUMNS: Final = "seq, id, type, channel_pk, created_at, body"


def journal_event(r: sqlite3.Row) -> JournalEvent:
    """A row of ``SELECT {JOURNAL_COLUMNS} FROM events``."""
    return JournalEvent(
        seq=r["seq"],
        id=r["id"],
        type=r["type"],
        channel_pk=r["channel_pk"],
        created_at=r["created_at"],
        body=bytes(r["body"]),
    )
