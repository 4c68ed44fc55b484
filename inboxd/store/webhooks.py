"""SQL for the inbox webhook: its configuration, the delivery cursor, attempts and redeliveries."""

from __future__ import annotations

import sqlite3
from typing import Final

import attrs

from inboxd import ids
from inboxd.errors import NotFound
from inboxd.store.db import journal_end, wake
from inboxd.store.events import JOURNAL_COLUMNS, WEBHOOK_TYPES_SQL, JournalEvent, journal_event

SECRET_PREFIX_LEN: Final = 12


def config_changed(account_pk: int) -> str:
    """The ``Store.signal`` woken when the account's webhook is saved, rotated or deleted."""
    return f"inbox_webhook.config:{account_pk}"


def work_queued(account_pk: int) -> str:
    """The ``Store.signal`` woken when the deliverer may have new work (besides new events)."""
    return f"inbox_webhook.work:{account_pk}"


def _changed(conn: sqlite3.Connection, account_pk: int) -> None:
    wake(conn, config_changed(account_pk))
    wake(conn, work_queued(account_pk))


@attrs.frozen
class InboxWebhook:
    url: str
    secret: str
    created_at: int
    updated_at: int
    delivered_seq: int
    last_delivery_at: int | None
    last_delivery_status: int | None
    last_delivery_error: str | None

    @property
    def secret_prefix(self) -> str:
        return self.secret[:SECRET_PREFIX_LEN]


@attrs.frozen
class Saved:
    webhook: InboxWebhook
    created: bool
    secret: str | None  # only when created or rotated


def get(conn: sqlite3.Connection, account_pk: int) -> InboxWebhook | None:
    row = conn.execute(
        "SELECT url, secret, created_at, updated_at, delivered_seq, last_delivery_at,"
        " last_delivery_status, last_delivery_error FROM inbox_webhooks WHERE account_pk = ?",
        (account_pk,),
    ).fetchone()
    return None if row is None else InboxWebhook(**dict(row))


def put(conn: sqlite3.Connection, account_pk: int, url: str, now: int) -> Saved:
    """Create the webhook (new secret, created) or change its URL (secret kept)."""
    existing = get(conn, account_pk)
    if existing is None:
        secret = ids.new_webhook_secret()
        conn.execute(
            "INSERT INTO inbox_webhooks (account_pk, url, secret, created_at, updated_at,"
            " delivered_seq) VALUES (?, ?, ?, ?, ?, ?)",
            (account_pk, url, secret, now, now, journal_end(conn)),
        )
        _changed(conn, account_pk)
        hook = get(conn, account_pk)
        assert hook is not None
        return Saved(webhook=hook, created=True, secret=secret)
    conn.execute(
        "UPDATE inbox_webhooks SET url = ?, updated_at = ? WHERE account_pk = ?",
        (url, now, account_pk),
    )
    _changed(conn, account_pk)
    hook = get(conn, account_pk)
    assert hook is not None
    return Saved(webhook=hook, created=False, secret=None)


def rotate(conn: sqlite3.Connection, account_pk: int, now: int) -> Saved:
    if get(conn, account_pk) is None:
        raise NotFound("no inbox webhook URL is saved", code="webhook_not_found")
    secret = ids.new_webhook_secret()
    conn.execute(
        "UPDATE inbox_webhooks SET secret = ?, updated_at = ? WHERE account_pk = ?",
        (secret, now, account_pk),
    )
    _changed(conn, account_pk)
    hook = get(conn, account_pk)
    assert hook is not None
    return Saved(webhook=hook, created=False, secret=secret)


def delete(conn: sqlite3.Connection, account_pk: int) -> bool:
    removed = conn.execute("DELETE FROM inbox_webhooks WHERE account_pk = ?", (account_pk,))
    conn.execute("DELETE FROM webhook_redeliveries WHERE account_pk = ?", (account_pk,))
    _changed(conn, account_pk)
    return removed.rowcount > 0


def account_pks(conn: sqlite3.Connection) -> list[int]:
    return [r[0] for r in conn.execute("SELECT pk FROM accounts ORDER BY pk")]


# -- what to deliver next ------------------------------------------------------------------------


@attrs.frozen
class Work:
    event: JournalEvent
    redelivery_pk: int | None
    hook: InboxWebhook  # as it was when the work was picked (the first attempt uses it)


def _events(conn: sqlite3.Connection, where: str, params: tuple[object, ...]) -> list[JournalEvent]:
    rows = conn.execute(f"SELECT {JOURNAL_COLUMNS} FROM events WHERE {where}", params)
    return [journal_event(row) for row in rows]


def next_work(
    conn: sqlite3.Connection, account_pk: int, after: int = 0, limit: int = 1
) -> list[Work] | None:
    """What to deliver next, in order: up to ``limit`` journal events, else the oldest queued
    redelivery, else nothing; None when no webhook is saved. A redelivery goes out after the
    events that were waiting when it was asked for (``after_seq``), before later ones. ``after``
    is the deliverer's own cursor, ahead of the stored one while its last record is being
    written."""
    hook = get(conn, account_pk)
    if hook is None:
        return None
    redelivery = conn.execute(
        "SELECT pk, event_seq, after_seq FROM webhook_redeliveries WHERE account_pk = ?"
        " ORDER BY pk LIMIT 1",
        (account_pk,),
    ).fetchone()
    cursor = max(hook.delivered_seq, after)
    bound = _NO_SEQ_BOUND if redelivery is None else redelivery["after_seq"]
    if cursor < bound:
        events = _events(
            conn,
            f"account_pk = ? AND seq > ? AND seq <= ? AND {WEBHOOK_TYPES_SQL} ORDER BY seq LIMIT ?",
            (account_pk, cursor, bound, limit),
        )
        if events:
            return [Work(event=event, redelivery_pk=None, hook=hook) for event in events]
    if redelivery is None:
        return []
    [event] = _events(conn, "seq = ?", (redelivery["event_seq"],))
    return [Work(event=event, redelivery_pk=redelivery["pk"], hook=hook)]


_NO_SEQ_BOUND: Final = 2**63 - 1


def redelivery_queued(conn: sqlite3.Connection, redelivery_pk: int) -> bool:
    """Whether a redelivery is still queued (deleting the webhook drops them)."""
    row = conn.execute("SELECT 1 FROM webhook_redeliveries WHERE pk = ?", (redelivery_pk,))
    return row.fetchone() is not None


@attrs.frozen
class Attempt:
    event_seq: int
    delivery_id: str
    attempt: int
    outcome: str  # delivered | failed | given_up
    status: int | None
    error: str | None
    duration_ms: float
    at: int
    # The created_at of the webhook it went to: a webhook deleted and saved again meanwhile is
    # another one, whose lastDelivery fields this attempt must not fill.
    webhook_created_at: int
    retry_after: float | None = None  # seconds, from the answer's Retry-After


@attrs.frozen
class SeriesSoFar:
    """The attempts of an event's delivery made before the daemon last stopped."""

    attempts: int  # how many were made (the last one failed)
    last_at: int
    retry_after: float | None  # what the last one's answer asked for


def series_so_far(
    conn: sqlite3.Connection, account_pk: int, event_seq: int, delivery_id: str
) -> SeriesSoFar | None:
    """The attempt series ``delivery_id`` of the event when a stop cut it short: its last
    recorded attempt failed (neither delivered nor given up); else None. (Ids are made from the
    event and the redelivery: a redelivery's series is told from the event's own by its id.)"""
    r = conn.execute(
        "SELECT attempt, outcome, at, retry_after FROM webhook_deliveries"
        " WHERE event_seq = ? AND account_pk = ? AND delivery_id = ? ORDER BY pk DESC LIMIT 1",
        (event_seq, account_pk, delivery_id),
    ).fetchone()
    if r is None or r["outcome"] != "failed":
        return None
    return SeriesSoFar(int(r["attempt"]), int(r["at"]), r["retry_after"])


def record_attempt(
    conn: sqlite3.Connection, account_pk: int, a: Attempt, redelivery_pk: int | None
) -> None:
    """Log an attempt; on a final outcome move past the event (or drop its redelivery)."""
    conn.execute(
        "INSERT INTO webhook_deliveries (account_pk, event_seq, delivery_id, attempt, outcome,"
        " status, error, duration_ms, at, retry_after) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            account_pk,
            a.event_seq,
            a.delivery_id,
            a.attempt,
            a.outcome,
            a.status,
            a.error,
            a.duration_ms,
            a.at,
            a.retry_after,
        ),
    )
    final = a.outcome != "failed"
    conn.execute(
        "UPDATE inbox_webhooks SET last_delivery_at = ?, last_delivery_status = ?,"
        " last_delivery_error = ?,"
        " delivered_seq = CASE WHEN ? THEN max(delivered_seq, ?) ELSE delivered_seq END"
        " WHERE account_pk = ? AND created_at = ?",
        (
            a.at,
            a.status,
            a.error,
            final and redelivery_pk is None,
            a.event_seq,
            account_pk,
            a.webhook_created_at,
        ),
    )
    if final and redelivery_pk is not None:
        conn.execute("DELETE FROM webhook_redeliveries WHERE pk = ?", (redelivery_pk,))


def record_attempts(
    conn: sqlite3.Connection, account_pk: int, attempts: list[tuple[Attempt, int | None]]
) -> None:
    """``record_attempt`` for each (attempt, redelivery pk), in order, in one transaction."""
    for attempt, redelivery_pk in attempts:
        record_attempt(conn, account_pk, attempt, redelivery_pk)


def queue_redelivery(conn: sqlite3.Connection, account_pk: int, event_id: str, now: int) -> int:
    row = conn.execute(
        f"SELECT seq FROM events WHERE id = ? AND account_pk = ? AND {WEBHOOK_TYPES_SQL}",
        (event_id, account_pk),
    ).fetchone()
    if row is None:
        raise NotFound(f"no inbox webhook event {event_id}")
    if get(conn, account_pk) is None:
        raise NotFound("no inbox webhook URL is saved", code="webhook_not_found")
    # After the events waiting now: the journal's end (this transaction journals nothing).
    cur = conn.execute(
        "INSERT INTO webhook_redeliveries (account_pk, event_seq, requested_at, after_seq)"
        " VALUES (?, ?, ?, ?)",
        (account_pk, row["seq"], now, journal_end(conn)),
    )
    wake(conn, work_queued(account_pk))
    return int(cur.lastrowid or 0)


@attrs.frozen
class DeliveryRow:
    pk: int
    event_id: str
    event_type: str
    delivery_id: str
    attempt: int
    outcome: str
    status: int | None
    error: str | None
    duration_ms: float
    at: int


def list_deliveries(
    conn: sqlite3.Connection, account_pk: int, limit: int, cursor: tuple[int, int] | None
) -> tuple[list[DeliveryRow], bool]:
    """Attempts, newest first."""
    where, params = "d.account_pk = ?", [account_pk]
    if cursor is not None:
        where += " AND (d.at, d.pk) < (?, ?)"
        params += list(cursor)
    rows = conn.execute(
        "SELECT d.pk, e.id AS event_id, e.type AS event_type, d.delivery_id, d.attempt,"
        " d.outcome, d.status, d.error, d.duration_ms, d.at FROM webhook_deliveries d"
        f" JOIN events e ON e.seq = d.event_seq WHERE {where}"
        " ORDER BY d.at DESC, d.pk DESC LIMIT ?",
        [*params, limit + 1],
    ).fetchall()
    out = [DeliveryRow(**dict(r)) for r in rows[:limit]]
    return out, len(rows) > limit
