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


def pruned_through(conn: sqlite3.Connection) -> int:
    """Every event with a seq up to this one has been pruned (0: none ever was)."""
    return int(conn.execute("SELECT through FROM journal_pruned").fetchone()[0])


_NO_BOUND: Final = 2**63 - 1


def prune(conn: sqlite3.Connection, before: int, limit: int) -> int:
    """Delete up to ``limit`` of the oldest events created before ``before`` (a time, in us),
    with their delivery-log rows; returns how many went.

    Never an event that something still owes: the oldest event an inbox webhook or a delivering
    channel webhook URL has not had yet, and queued redeliveries, bound what may go. Paused
    and disabled URLs keep only channel_webhooks.backlog_retention (shorter than the feed's).
    """
    # The last seq before the oldest event something still owes (a cursor itself can sit far
    # back: a quiet channel's URL or an account with only messages never moves it).
    bound = conn.execute(
        "SELECT min(s) FROM ("
        " SELECT (SELECT min(e.seq) FROM events e WHERE e.account_pk = w.account_pk"
        f"  AND e.seq > w.delivered_seq AND {WEBHOOK_TYPES_SQL}) - 1 AS s FROM inbox_webhooks w"
        " UNION ALL"
        " SELECT (SELECT min(e.seq) FROM events e WHERE e.channel_pk = u.channel_pk"
        "  AND e.for_channel_webhooks = 1 AND e.seq > u.delivered_seq) - 1"
        " FROM channel_webhook_urls u WHERE u.state = 'delivering'"
        " UNION ALL SELECT min(event_seq) - 1 FROM webhook_redeliveries)"
    ).fetchone()[0]
    # The first event at or after the cut-off (its index); everything before it is older.
    first_kept = conn.execute(
        "SELECT seq FROM events WHERE created_at >= ? ORDER BY created_at, seq LIMIT 1", (before,)
    ).fetchone()
    below = _NO_BOUND if first_kept is None else int(first_kept[0])
    if bound is not None:
        below = min(below, int(bound) + 1)
    rows = conn.execute(
        "SELECT seq FROM events WHERE seq < ? ORDER BY seq LIMIT ?", (below, limit)
    ).fetchall()
    if not rows:
        return 0
    through = int(rows[-1][0])
    conn.execute("DELETE FROM webhook_deliveries WHERE event_seq <= ?", (through,))
    deleted = conn.execute("DELETE FROM events WHERE seq <= ?", (through,)).rowcount
    conn.execute("UPDATE journal_pruned SET through = max(through, ?)", (through,))
    return int(deleted)


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
