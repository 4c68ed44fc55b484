"""SQL for the mail outbox: queue in the deciding transaction, mark sent after sending."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Final

import attrs

from inboxd.store.db import wake

QUEUED: Final = "mail.queued"  # the Store.signal a commit that queued mail bumps


@attrs.frozen
class Mail:
    pk: int
    to_addr: str
    subject: str
    body: str
    headers: dict[str, str]
    attempts: int


def queue(
    conn: sqlite3.Connection,
    account_pk: int,
    to_addr: str,
    subject: str,
    body: str,
    now: int,
    headers: Mapping[str, str] | None = None,
    channel_pk: int | None = None,
) -> int:
    """Queue a mail, sent once this transaction commits. ``channel_pk``: the channel a channel
    webhook notice is about (``withdraw_channel_notices``)."""
    cur = conn.execute(
        "INSERT INTO mail_outbox"
        " (account_pk, to_addr, subject, body, headers, created_at, channel_pk)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (account_pk, to_addr, subject, body, json.dumps(dict(headers or {})), now, channel_pk),
    )
    wake(conn, QUEUED)
    return int(cur.lastrowid or 0)


def withdraw_channel_notices(conn: sqlite3.Connection, channel_pk: int) -> int:
    """The channel's owner unsubscribed: its webhook notices not sent yet never will be (they
    go from the outbox; nothing of them was sent). How many went."""
    return conn.execute(
        "DELETE FROM mail_outbox WHERE channel_pk = ? AND sent_at IS NULL", (channel_pk,)
    ).rowcount


def pending(conn: sqlite3.Connection, after_pk: int, limit: int) -> list[Mail]:
    rows = conn.execute(
        "SELECT pk, to_addr, subject, body, headers, attempts FROM mail_outbox"
        " WHERE sent_at IS NULL AND pk > ? ORDER BY pk LIMIT ?",
        (after_pk, limit),
    ).fetchall()
    return [
        Mail(
            pk=r["pk"],
            to_addr=r["to_addr"],
            subject=r["subject"],
            body=r["body"],
            headers=json.loads(r["headers"]),
            attempts=r["attempts"],
        )
        for r in rows
    ]


def mark_sent(conn: sqlite3.Connection, pk: int, now: int) -> None:
    """A mail went: its row stays (the outbox's record) without its body, which may hold an
    invite's token (stored otherwise only as a hash) and is never needed again."""
    conn.execute(
        "UPDATE mail_outbox SET sent_at = ?, attempts = attempts + 1, last_error = NULL,"
        " body = '' WHERE pk = ?",
        (now, pk),
    )


def mark_failed(conn: sqlite3.Connection, pk: int, error: str) -> None:
    conn.execute(
        "UPDATE mail_outbox SET attempts = attempts + 1, last_error = ? WHERE pk = ?",
        (error[:500], pk),
    )
