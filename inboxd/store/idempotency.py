"""SQL for Idempotency-Key records (CONTRACT section 6).

A request with a key first claims it (status NULL), runs, then stores its response. A repeat with
the same key and the same request gets the stored response; with another request it is refused.
A claim whose request never finished (the daemon died mid-request) is abandoned after a minute
and may be claimed again.
"""

from __future__ import annotations

import sqlite3
from typing import Final

import attrs

from inboxd.errors import Conflict, Unprocessable

TTL_US: Final = 24 * 3600 * 1_000_000
# status 0: the change committed (in its own transaction) but the response was not stored yet.
APPLIED: Final = 0
ABANDONED_US: Final = 60 * 1_000_000


@attrs.frozen
class Stored:
    status: int
    body: bytes


def claim(
    conn: sqlite3.Connection, user_pk: int, key: str, fingerprint: bytes, now: int
) -> Stored | None:
    """None when this request may run (the key is now claimed); the first response otherwise."""
    row = conn.execute(
        "SELECT fingerprint, created_at, status, body FROM idempotency_keys"
        " WHERE user_pk = ? AND key = ?",
        (user_pk, key),
    ).fetchone()
    if row is not None and row["created_at"] > now - TTL_US:
        if bytes(row["fingerprint"]) != fingerprint:
            raise Unprocessable(
                "this Idempotency-Key was used with another request", code="idempotency_key_reused"
            )
        running = row["status"] in (None, APPLIED)
        if running and row["created_at"] > now - ABANDONED_US:
            raise Conflict(
                "a request with this Idempotency-Key is still running; retry in a moment",
                code="idempotency_in_progress",
            )
        if row["status"] == APPLIED:
            raise Conflict(
                "the first request with this Idempotency-Key was applied, but its response was"
                " lost in a restart; read the current state instead of retrying",
                code="idempotency_key_applied",
            )
        if row["status"] is not None:
            return Stored(status=row["status"], body=bytes(row["body"]))
        # A claim abandoned before it changed anything (status NULL, older than a minute):
        # this request may run.
    conn.execute(
        "INSERT OR REPLACE INTO idempotency_keys (user_pk, key, fingerprint, created_at)"
        " VALUES (?, ?, ?, ?)",
        (user_pk, key, fingerprint, now),
    )
    return None


def complete(conn: sqlite3.Connection, user_pk: int, key: str, status: int, body: bytes) -> None:
    conn.execute(
        "UPDATE idempotency_keys SET status = ?, body = ? WHERE user_pk = ? AND key = ?",
        (status, body, user_pk, key),
    )


def release(conn: sqlite3.Connection, user_pk: int, key: str) -> None:
    """Forget a claim whose request failed on the server's side before changing anything, so
    a retry can run."""
    conn.execute(
        "DELETE FROM idempotency_keys WHERE user_pk = ? AND key = ? AND status IS NULL",
        (user_pk, key),
    )


def prune(conn: sqlite3.Connection, now: int) -> int:
    return conn.execute(
        "DELETE FROM idempotency_keys WHERE created_at < ?", (now - TTL_US,)
    ).rowcount
