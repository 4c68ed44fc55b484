"""SQL for channel webhooks: settings, the URL list, each URL's state and cursor, notices."""

from __future__ import annotations

import secrets
import sqlite3
from typing import Final

import attrs

from inboxd import ids
from inboxd.errors import NotFound
from inboxd.store import mail
from inboxd.store.db import journal_end
from inboxd.store.events import JOURNAL_COLUMNS, JournalEvent, journal_event
from inboxd.webhooks import notices
from inboxd.webhooks.policy import DELIVERING, Decision, Policy, UrlState, reenabled

SECRET_PREFIX_LEN: Final = 12

_STATE_COLS: Final = (
    "state, failure_count, first_failure_at, last_failure_at, last_status, last_error,"
    " last_success_at, warned, paused_at, next_probe_at, probes_done, disabled_at,"
    " next_attempt_at"
)


def _state(r: sqlite3.Row) -> UrlState:
    return UrlState(
        state=r["state"],
        failure_count=r["failure_count"],
        first_failure_at=r["first_failure_at"],
        last_failure_at=r["last_failure_at"],
        last_status=r["last_status"],
        last_error=r["last_error"],
        last_success_at=r["last_success_at"],
        warned=bool(r["warned"]),
        paused_at=r["paused_at"],
        next_probe_at=r["next_probe_at"],
        probes_done=r["probes_done"],
        disabled_at=r["disabled_at"],
        next_attempt_at=r["next_attempt_at"],
    )


def _state_values(s: UrlState) -> tuple[object, ...]:
    return (
        s.state,
        s.failure_count,
        s.first_failure_at,
        s.last_failure_at,
        s.last_status,
        s.last_error,
        s.last_success_at,
        int(s.warned),
        s.paused_at,
        s.next_probe_at,
        s.probes_done,
        s.disabled_at,
        s.next_attempt_at,
    )


@attrs.frozen
class UrlRow:
    pk: int
    channel_pk: int
    channel_id: str
    url: str
    generation: int
    delivered_seq: int
    state: UrlState


def get_url(conn: sqlite3.Connection, pk: int) -> UrlRow | None:
    r = conn.execute(
        f"SELECT u.pk, u.channel_pk, ch.id AS channel_id, u.url, u.generation, u.delivered_seq,"
        f" {', '.join('u.' + c.strip() for c in _STATE_COLS.split(','))}"
        " FROM channel_webhook_urls u JOIN channels ch ON ch.pk = u.channel_pk WHERE u.pk = ?",
        (pk,),
    ).fetchone()
    if r is None:
        return None
    return UrlRow(
        pk=r["pk"],
        channel_pk=r["channel_pk"],
        channel_id=r["channel_id"],
        url=r["url"],
        generation=r["generation"],
        delivered_seq=r["delivered_seq"],
        state=_state(r),
    )


def all_urls(conn: sqlite3.Connection) -> dict[int, int]:
    """Every URL's pk -> generation (what the hub should be running)."""
    return {r[0]: r[1] for r in conn.execute("SELECT pk, generation FROM channel_webhook_urls")}


# The settings row of a channel whose owner changed the notification setting before saving any
# URL holds no secret yet: NOT_ISSUED. The first URL list saved issues it and returns it, as
# CONTRACT section 7 says (it used to be created unseen, and only a rotation could reveal it).
NOT_ISSUED: Final = ""


def secret_of(conn: sqlite3.Connection, channel_pk: int) -> str | None:
    """The channel's signing secret; None before the first URL list is saved."""
    row = conn.execute(
        "SELECT secret FROM channel_webhook_settings WHERE channel_pk = ?", (channel_pk,)
    ).fetchone()
    return None if row is None or row[0] == NOT_ISSUED else str(row[0])


def kept_since(state: str, min_created_at: int) -> int:
    """The oldest ``created_at`` a URL in ``state`` is still owed: a paused or disabled URL
    keeps messages for ``backlog_retention`` (``min_created_at``); a delivering one is owed
    everything after its cursor (the journal's pruning keeps that for it), also across a long
    stop in the middle of a failure episode."""
    return 0 if state == DELIVERING else min_created_at


def head_event(
    conn: sqlite3.Connection, channel_pk: int, after_seq: int, min_created_at: int
) -> JournalEvent | None:
    """The oldest event this URL still owes created at ``min_created_at`` or later (see
    ``kept_since``)."""
    r = conn.execute(
        f"SELECT {JOURNAL_COLUMNS} FROM events"
        " WHERE channel_pk = ? AND for_channel_webhooks = 1 AND seq > ? AND created_at >= ?"
        " ORDER BY seq LIMIT 1",
        (channel_pk, after_seq, min_created_at),
    ).fetchone()
    return None if r is None else journal_event(r)


def backlog(conn: sqlite3.Connection, channel_pk: int, after_seq: int, min_created_at: int) -> int:
    return int(
        conn.execute(
            "SELECT count(*) FROM events WHERE channel_pk = ? AND for_channel_webhooks = 1"
            " AND seq > ? AND created_at >= ?",
            (channel_pk, after_seq, min_created_at),
        ).fetchone()[0]
    )


@attrs.frozen
class NoticeContext:
    """What the supervisor knows that the notices need."""

    base_url: str
    min_created_at: int
    policy: Policy  # what the warning says will happen next


def record(
    conn: sqlite3.Connection,
    pk: int,
    generation: int,
    decision: Decision,
    advance_to: int | None,
    now: int,
    ctx: NoticeContext,
) -> bool:
    """Store a decision, and queue its email in the same transaction. False if the URL was
    removed or saved again since the supervisor read it (then nothing is written)."""
    row = get_url(conn, pk)
    if row is None or row.generation != generation:
        return False
    conn.execute(
        f"UPDATE channel_webhook_urls SET ({_STATE_COLS}) = ({', '.join('?' * 13)}),"
        " delivered_seq = max(delivered_seq, ?), updated_at = ? WHERE pk = ?",
        (*_state_values(decision.state), advance_to or 0, now, pk),
    )
    if row.state.state != DELIVERING and decision.state.state == DELIVERING:
        _drop_stale(conn, pk, row.channel_pk, ctx.min_created_at)
    if decision.warn or decision.stopped:
        _queue_notice(conn, row, decision, now, ctx)
    return True


def _drop_stale(conn: sqlite3.Connection, pk: int, channel_pk: int, min_created_at: int) -> None:
    """A paused or disabled URL delivers again: what it kept beyond the backlog retention is
    not sent (CONTRACT section 7), so its cursor moves past those messages now, before the
    delivering state would make them owed again."""
    conn.execute(
        "UPDATE channel_webhook_urls SET delivered_seq = max(delivered_seq, coalesce("
        " (SELECT max(seq) FROM events WHERE channel_pk = ? AND for_channel_webhooks = 1"
        "  AND seq > channel_webhook_urls.delivered_seq AND created_at < ?), 0))"
        " WHERE pk = ?",
        (channel_pk, min_created_at, pk),
    )


def _queue_notice(
    conn: sqlite3.Connection, row: UrlRow, decision: Decision, now: int, ctx: NoticeContext
) -> None:
    info = conn.execute(
        "SELECT ch.name, ch.account_pk, s.notify_email, s.unsubscribe_token,"
        " (SELECT email FROM users WHERE account_pk = ch.account_pk AND role = 'OWNER'"
        "  ORDER BY pk LIMIT 1) AS owner_email"
        " FROM channels ch JOIN channel_webhook_settings s ON s.channel_pk = ch.pk"
        " WHERE ch.pk = ?",
        (row.channel_pk,),
    ).fetchone()
    if info is None or not info["notify_email"] or not info["owner_email"]:
        return  # the owner unsubscribed
    link = notices.unsubscribe_url(ctx.base_url, row.channel_id, info["unsubscribe_token"])
    s = decision.state
    if decision.stopped:
        assert s.disabled_at is not None
        undelivered = backlog(conn, row.channel_pk, row.delivered_seq, ctx.min_created_at)
        notice = notices.stopped(
            info["name"], row.channel_id, row.url, undelivered, s.disabled_at, s.last_error, link
        )
    else:
        notice = notices.warning(
            info["name"], row.channel_id, row.url, s.failure_count, s.last_error, link, ctx.policy
        )
    mail.queue(
        conn,
        info["account_pk"],
        info["owner_email"],
        notice.subject,
        notice.body,
        now,
        notice.headers,
        channel_pk=row.channel_pk,
    )


# -- settings and the URL list (API) -------------------------------------------------------------


@attrs.frozen
class UrlView:
    url: str
    state: UrlState
    backlog: int


@attrs.frozen
class Settings:
    channel_id: str
    notify_email: bool
    secret_prefix: str | None
    urls: list[UrlView]


def settings(
    conn: sqlite3.Connection, channel_pk: int, channel_id: str, min_created_at: int
) -> Settings:
    s = conn.execute(
        "SELECT secret, notify_email FROM channel_webhook_settings WHERE channel_pk = ?",
        (channel_pk,),
    ).fetchone()
    rows = conn.execute(
        f"SELECT pk, url, delivered_seq, {_STATE_COLS} FROM channel_webhook_urls"
        " WHERE channel_pk = ? ORDER BY position",
        (channel_pk,),
    ).fetchall()
    return Settings(
        channel_id=channel_id,
        notify_email=True if s is None else bool(s["notify_email"]),
        secret_prefix=(
            None if s is None or s["secret"] == NOT_ISSUED else s["secret"][:SECRET_PREFIX_LEN]
        ),
        urls=[
            UrlView(
                url=r["url"],
                state=_state(r),
                backlog=backlog(
                    conn, channel_pk, r["delivered_seq"], kept_since(r["state"], min_created_at)
                ),
            )
            for r in rows
        ],
    )


def _ensure_settings(
    conn: sqlite3.Connection, channel_pk: int, now: int, *, issue_secret: bool
) -> str | None:
    """Create the channel's settings if missing and, with ``issue_secret``, its signing secret
    if it has none yet; the secret this call issued, or None."""
    row = conn.execute(
        "SELECT secret FROM channel_webhook_settings WHERE channel_pk = ?", (channel_pk,)
    ).fetchone()
    secret = ids.new_webhook_secret() if issue_secret else NOT_ISSUED
    if row is None:
        conn.execute(
            "INSERT INTO channel_webhook_settings (channel_pk, secret, unsubscribe_token,"
            " created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
            (channel_pk, secret, secrets.token_urlsafe(24), now, now),
        )
    elif issue_secret and row[0] == NOT_ISSUED:
        conn.execute(
            "UPDATE channel_webhook_settings SET secret = ?, updated_at = ? WHERE channel_pk = ?",
            (secret, now, channel_pk),
        )
    else:
        return None
    return secret or None


def replace_urls(
    conn: sqlite3.Connection, channel_pk: int, urls: list[str], now: int, min_created_at: int
) -> str | None:
    """Make ``urls`` the channel's whole list: omitted URLs are removed, new ones start at the
    journal's end, listed paused or disabled ones are re-enabled (what they kept since
    ``min_created_at`` follows). Returns the signing secret when this call created it."""
    secret = _ensure_settings(conn, channel_pk, now, issue_secret=True)
    existing = {
        r["url"]: r
        for r in conn.execute(
            f"SELECT pk, url, {_STATE_COLS} FROM channel_webhook_urls WHERE channel_pk = ?",
            (channel_pk,),
        )
    }
    keep = dict.fromkeys(urls)
    for url, r in existing.items():
        if url not in keep:
            conn.execute("DELETE FROM channel_webhook_urls WHERE pk = ?", (r["pk"],))
    end = journal_end(conn)
    for position, url in enumerate(keep):
        r = existing.get(url)
        if r is None:
            conn.execute(
                "INSERT INTO channel_webhook_urls (channel_pk, url, position, state,"
                " delivered_seq, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (channel_pk, url, position, DELIVERING, end, now, now),
            )
        elif r["state"] != DELIVERING:
            conn.execute(
                f"UPDATE channel_webhook_urls SET ({_STATE_COLS}) = ({', '.join('?' * 13)}),"
                " position = ?, generation = generation + 1, updated_at = ? WHERE pk = ?",
                (*_state_values(reenabled(_state(r))), position, now, r["pk"]),
            )
            _drop_stale(conn, r["pk"], channel_pk, min_created_at)
        else:
            conn.execute(
                "UPDATE channel_webhook_urls SET position = ? WHERE pk = ?", (position, r["pk"])
            )
    return secret


def list_urls(conn: sqlite3.Connection, channel_pk: int) -> list[str]:
    return [
        r[0]
        for r in conn.execute(
            "SELECT url FROM channel_webhook_urls WHERE channel_pk = ? ORDER BY position",
            (channel_pk,),
        )
    ]


def rotate_secret(conn: sqlite3.Connection, channel_pk: int, now: int) -> str:
    if secret_of(conn, channel_pk) is None:
        raise NotFound("this channel has no webhook URLs saved yet", code="webhook_not_found")
    secret = ids.new_webhook_secret()
    conn.execute(
        "UPDATE channel_webhook_settings SET secret = ?, updated_at = ? WHERE channel_pk = ?",
        (secret, now, channel_pk),
    )
    return secret


def set_notify_email(conn: sqlite3.Connection, channel_pk: int, enabled: bool, now: int) -> None:
    _ensure_settings(conn, channel_pk, now, issue_secret=False)
    conn.execute(
        "UPDATE channel_webhook_settings SET notify_email = ?, updated_at = ? WHERE channel_pk = ?",
        (int(enabled), now, channel_pk),
    )
    if not enabled:  # also what is queued and not sent yet (CONTRACT section 7)
        mail.withdraw_channel_notices(conn, channel_pk)


def unsubscribe(conn: sqlite3.Connection, channel_id: str, token: str, now: int) -> bool:
    """The owner's one-click unsubscribe; False for an unknown channel or token."""
    row = conn.execute(
        "SELECT s.channel_pk, s.unsubscribe_token FROM channel_webhook_settings s"
        " JOIN channels ch ON ch.pk = s.channel_pk WHERE ch.id = ?",
        (channel_id,),
    ).fetchone()
    # As bytes: compare_digest raises on str with non-ASCII characters (a mangled link was a 500).
    if row is None or not secrets.compare_digest(
        str(row["unsubscribe_token"]).encode(), token.encode()
    ):
        return False
    set_notify_email(conn, row["channel_pk"], False, now)
    return True


def count_by_state(conn: sqlite3.Connection) -> dict[str, int]:
    """URLs per delivery state (for /metrics)."""
    return {
        str(r[0]): int(r[1])
        for r in conn.execute("SELECT state, count(*) FROM channel_webhook_urls GROUP BY state")
    }
