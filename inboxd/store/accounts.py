"""SQL for accounts, users, channel access, API keys and channels."""

from __future__ import annotations

import hmac
import sqlite3
from collections.abc import Callable
from typing import Final, TypeVar

import attrs

from inboxd import ids
from inboxd.errors import Forbidden, InvalidRequest, NotFound, StoreError, Unauthorized
from inboxd.model import (
    ROLE_OPERATOR,
    ROLE_OWNER,
    ApiKeyInfo,
    Assignee,
    Channel,
    Principal,
)
from inboxd.store.schema import SEARCH_MAX_CHANNEL_PK


@attrs.frozen
class NewAccount:
    account_id: str
    owner_user_id: str
    api_key: str


@attrs.frozen
class NewKey:
    api_key: str
    key_id: str
    prefix: str


@attrs.frozen
class NewUser:
    user_id: str
    member_id: str
    api_key: str


def account_exists(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM accounts LIMIT 1").fetchone() is not None


def the_account_pk(conn: sqlite3.Connection) -> int:
    """The store's account (the CLI manages the one account that ``init`` created)."""
    row = conn.execute("SELECT pk FROM accounts ORDER BY pk LIMIT 1").fetchone()
    if row is None:
        raise StoreError("the store has no account; run 'inboxd init'")
    return int(row["pk"])


def create_account(
    conn: sqlite3.Connection, owner_email: str, owner_name: str, now: int
) -> NewAccount:
    account_id = ids.new_id("acc")
    cur = conn.execute(
        "INSERT INTO accounts (id, name, created_at) VALUES (?, ?, ?)",
        (account_id, owner_name, now),
    )
    account_pk = int(cur.lastrowid or 0)
    owner_id = ids.new_id("usr")
    cur = conn.execute(
        "INSERT INTO users (id, account_pk, email, name, role, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (owner_id, account_pk, owner_email, owner_name, ROLE_OWNER, now),
    )
    key = create_key(conn, account_pk, int(cur.lastrowid or 0), now)
    return NewAccount(account_id=account_id, owner_user_id=owner_id, api_key=key.api_key)


def create_key(conn: sqlite3.Connection, account_pk: int, user_pk: int, now: int) -> NewKey:
    api_key = ids.new_api_key()
    key_id = ids.new_id("key")
    prefix = api_key[: ids.KEY_DISPLAY_PREFIX_LEN]
    conn.execute(
        "INSERT INTO api_keys (id, account_pk, user_pk, hash, prefix, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (key_id, account_pk, user_pk, ids.hash_api_key(api_key), prefix, now),
    )
    return NewKey(api_key=api_key, key_id=key_id, prefix=prefix)


def channel_pks_by_id(
    conn: sqlite3.Connection, account_pk: int, channel_ids: list[str]
) -> list[int]:
    """The account's channels by id, each once; NotFound naming the first unknown id."""
    pks = []
    for channel_id in dict.fromkeys(channel_ids):
        row = conn.execute(
            "SELECT pk FROM channels WHERE id = ? AND account_pk = ?", (channel_id, account_pk)
        ).fetchone()
        if row is None:
            raise NotFound(f"channel {channel_id} does not exist")
        pks.append(int(row["pk"]))
    return pks


def existing_channel_pks(
    conn: sqlite3.Connection, account_pk: int, channel_ids: list[str]
) -> frozenset[int]:
    """The pks of those of the account's channels with these ids that exist."""
    marks = ",".join("?" * len(channel_ids))
    return frozenset(
        int(r[0])
        for r in conn.execute(
            f"SELECT pk FROM channels WHERE account_pk = ? AND id IN ({marks})",
            (account_pk, *channel_ids),
        )
    )


def active_user_with_email(conn: sqlite3.Connection, account_pk: int, email: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM users WHERE account_pk = ? AND email = ? COLLATE NOCASE"
        " AND removed_at IS NULL",
        (account_pk, email),
    ).fetchone()
    return row is not None


def create_operator(
    conn: sqlite3.Connection,
    account_pk: int,
    email: str,
    name: str,
    channel_ids: list[str],
    now: int,
) -> NewUser:
    """Add an operator with access to ``channel_ids`` and a first API key."""
    if active_user_with_email(conn, account_pk, email):
        raise InvalidRequest(f"a user with email {email} already exists")
    channel_pks = channel_pks_by_id(conn, account_pk, channel_ids)
    user_id = ids.new_id("usr")
    member_id = ids.new_id("mem")
    cur = conn.execute(
        "INSERT INTO users (id, account_pk, member_id, email, name, role, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (user_id, account_pk, member_id, email, name, ROLE_OPERATOR, now),
    )
    user_pk = int(cur.lastrowid or 0)
    conn.executemany(
        "INSERT INTO channel_access (user_pk, channel_pk) VALUES (?, ?)",
        [(user_pk, pk) for pk in channel_pks],
    )
    key = create_key(conn, account_pk, user_pk, now)
    return NewUser(user_id=user_id, member_id=member_id, api_key=key.api_key)


def find_user_pk(conn: sqlite3.Connection, account_pk: int, id_or_email: str) -> int:
    row = conn.execute(
        "SELECT pk FROM users WHERE account_pk = ? AND removed_at IS NULL"
        " AND (id = ? OR email = ? COLLATE NOCASE)",
        (account_pk, id_or_email, id_or_email),
    ).fetchone()
    if row is None:
        raise NotFound(f"no user {id_or_email}")
    return int(row["pk"])


def list_keys(conn: sqlite3.Connection, account_pk: int, user_pk: int | None) -> list[ApiKeyInfo]:
    sql = (
        "SELECT k.id, k.prefix, u.id AS user_id, k.created_at, k.last_used_at, k.revoked_at"
        " FROM api_keys k JOIN users u ON u.pk = k.user_pk WHERE k.account_pk = ?"
    )
    params: list[object] = [account_pk]
    if user_pk is not None:
        sql += " AND k.user_pk = ?"
        params.append(user_pk)
    rows = conn.execute(sql + " ORDER BY k.pk", params).fetchall()
    return [
        ApiKeyInfo(
            id=r["id"],
            prefix=r["prefix"],
            user_id=r["user_id"],
            created_at=r["created_at"],
            last_used_at=r["last_used_at"],
            revoked_at=r["revoked_at"],
        )
        for r in rows
    ]


def revoke_key(conn: sqlite3.Connection, account_pk: int, key_id: str, now: int) -> bool:
    """Revoke a key; False if it was already revoked. NotFound if no such key."""
    row = conn.execute(
        "SELECT revoked_at FROM api_keys WHERE id = ? AND account_pk = ?", (key_id, account_pk)
    ).fetchone()
    if row is None:
        raise NotFound(f"no API key {key_id}")
    if row["revoked_at"] is not None:
        return False
    conn.execute("UPDATE api_keys SET revoked_at = ? WHERE id = ?", (now, key_id))
    return True


def authenticate(conn: sqlite3.Connection, api_key: str) -> Principal | None:
    """The principal of a live key, or None for an unknown, revoked or removed user's key."""
    digest = ids.hash_api_key(api_key)
    row = conn.execute(f"{_LIVE_KEY} WHERE k.hash = ? AND {_LIVE}", (digest,)).fetchone()
    # The index lookup finds the row by hash; compare_digest keeps the final check constant-time.
    if row is None or not hmac.compare_digest(bytes(row["hash"]), digest):
        return None
    return _principal(conn, row)


def auth_epoch(conn: sqlite3.Connection) -> int:
    """Moves whenever a key's principal may have changed (schema v6 triggers)."""
    return int(conn.execute("SELECT n FROM auth_epoch").fetchone()[0])


def principal_of_key(conn: sqlite3.Connection, key_pk: int) -> Principal | None:
    """A key's principal as it is now (None once revoked or its user removed): the feed asks
    again when access may have changed."""
    row = conn.execute(f"{_LIVE_KEY} WHERE k.pk = ? AND {_LIVE}", (key_pk,)).fetchone()
    return None if row is None else _principal(conn, row)


def live_args(conn: sqlite3.Connection, args: tuple[object, ...]) -> tuple[object, ...]:
    """A write's arguments with each principal read again in the write's own transaction.

    A request's principal is read as it starts (and cached): by the time its write runs, after
    its body came in or behind a batch that committed first, the key may have been revoked, its
    member removed or a channel taken away. A write acts for the key as it is now: Unauthorized
    (401) once the key or member is gone, and the channels it has now (404 outside them)."""
    if not any(isinstance(a, Principal) for a in args):
        return args
    live: list[object] = []
    for a in args:
        if isinstance(a, Principal):
            now = principal_of_key(conn, a.key_pk)
            if now is None:
                raise Unauthorized("the API key was revoked or its member removed")
            a = now
        live.append(a)
    return tuple(live)


T = TypeVar("T")


def as_owner(conn: sqlite3.Connection, who: Principal, fn: Callable[..., T], *args: object) -> T:
    """``fn(conn, *args)``, a write of the owner's that takes the account or a channel rather
    than the principal (the inbox and channel webhooks' settings), for the owner's key as it is
    when the write runs: ``who`` comes here through ``live_args``, so a key revoked after the
    request began changes nothing (401). Without it such a request went through, and a revoked
    key could point the webhook at its own URL and be handed the new signing secret."""
    if not who.is_owner:
        raise Forbidden("only the account owner's key may change this")
    return fn(conn, *args)


_LIVE_KEY: Final = (
    "SELECT k.pk AS key_pk, k.id AS key_id, k.hash, k.account_pk, u.pk AS user_pk,"
    " u.id AS user_id, u.role FROM api_keys k JOIN users u ON u.pk = k.user_pk"
)
_LIVE: Final = "k.revoked_at IS NULL AND u.removed_at IS NULL"


def _principal(conn: sqlite3.Connection, row: sqlite3.Row) -> Principal:
    is_owner = row["role"] == ROLE_OWNER
    channel_pks: frozenset[int] | None = None
    if not is_owner:
        channel_pks = frozenset(
            r[0]
            for r in conn.execute(
                "SELECT channel_pk FROM channel_access WHERE user_pk = ?", (row["user_pk"],)
            )
        )
    return Principal(
        key_pk=row["key_pk"],
        key_id=row["key_id"],
        account_pk=row["account_pk"],
        user_pk=row["user_pk"],
        user_id=row["user_id"],
        is_owner=is_owner,
        channel_pks=channel_pks,
    )


def dead_keys(conn: sqlite3.Connection, key_pks: list[int]) -> list[int]:
    """Which of these keys no longer work (revoked, or their user removed)."""
    marks = ",".join("?" * len(key_pks))
    return [
        r[0]
        for r in conn.execute(
            f"SELECT k.pk FROM api_keys k JOIN users u ON u.pk = k.user_pk WHERE k.pk IN ({marks})"
            " AND (k.revoked_at IS NOT NULL OR u.removed_at IS NOT NULL)",
            key_pks,
        )
    ]


def touch_keys(conn: sqlite3.Connection, used: dict[int, int]) -> None:
    """Record lastUsedAt for keys (key pk -> time), batched by the caller."""
    conn.executemany(
        "UPDATE api_keys SET last_used_at = max(coalesce(last_used_at, 0), ?) WHERE pk = ?",
        [(at, pk) for pk, at in used.items()],
    )


# -- channels ------------------------------------------------------------------------------------

_CHANNEL_COLS = "pk, id, name, type, status, created_at"


def _channel(row: sqlite3.Row) -> Channel:
    return Channel(
        pk=row["pk"],
        id=row["id"],
        name=row["name"],
        type=row["type"],
        status=row["status"],
        created_at=row["created_at"],
    )


def create_channel(
    conn: sqlite3.Connection, account_pk: int, name: str, type_: str, now: int
) -> Channel:
    channel_id = ids.new_id("ch")
    cur = conn.execute(
        "INSERT INTO channels (id, account_pk, name, type, created_at) VALUES (?, ?, ?, ?, ?)",
        (channel_id, account_pk, name, type_, now),
    )
    pk = int(cur.lastrowid or 0)
    if pk > SEARCH_MAX_CHANNEL_PK:  # (the caller's transaction rolls the row back)
        raise StoreError(
            f"this store has no room for another channel: message search keys hold channel"
            f" numbers up to {SEARCH_MAX_CHANNEL_PK:,}"
        )
    return Channel(
        pk=pk,
        id=channel_id,
        name=name,
        type=type_,
        status="ACTIVE",
        created_at=now,
    )


def list_channels(conn: sqlite3.Connection, who: Principal) -> list[Channel]:
    rows = conn.execute(
        f"SELECT {_CHANNEL_COLS} FROM channels WHERE account_pk = ? ORDER BY pk",
        (who.account_pk,),
    ).fetchall()
    return [_channel(r) for r in rows if who.can_open(r["pk"])]


def visible_channel(conn: sqlite3.Connection, who: Principal, channel_id: str) -> Channel:
    """The channel, if the principal can open it; NotFound otherwise (CONTRACT section 4)."""
    row = conn.execute(
        f"SELECT {_CHANNEL_COLS} FROM channels WHERE id = ? AND account_pk = ?",
        (channel_id, who.account_pk),
    ).fetchone()
    if row is None or not who.can_open(row["pk"]):
        raise NotFound(f"channel {channel_id} does not exist")
    return _channel(row)


def list_assignees(conn: sqlite3.Connection, who: Principal, channel_id: str) -> list[Assignee]:
    """The account owner, then the operators who can open the channel, by name."""
    channel = visible_channel(conn, who, channel_id)
    rows = conn.execute(
        "SELECT id, name, avatar, role FROM users WHERE account_pk = ? AND removed_at IS NULL"
        " AND (role = 'OWNER' OR pk IN (SELECT user_pk FROM channel_access WHERE channel_pk = ?))"
        " ORDER BY role = 'OWNER' DESC, name COLLATE NOCASE, pk",
        (who.account_pk, channel.pk),
    ).fetchall()
    return [Assignee(id=r["id"], name=r["name"], avatar=r["avatar"], role=r["role"]) for r in rows]
