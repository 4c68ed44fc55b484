"""SQL for the team: invites, members and their channels, and API keys over the API.

Each change journals its ``inbox.user.*`` event in the same transaction. An operator who loses a
channel (or the account) has their conversations there unassigned, each with its SYSTEM row and
``inbox.conversation.unassigned`` event.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Final

import attrs

from inboxd import ids
from inboxd.errors import Conflict, Forbidden, NotFound
from inboxd.model import ROLE_OPERATOR, Principal
from inboxd.store import accounts, actions, events, mail

INVITE_TTL_US: Final = 7 * 24 * 3600 * 1_000_000


@attrs.frozen
class Invite:
    id: str
    email: str
    channel_ids: list[str]
    status: str  # PENDING, ACCEPTED, REVOKED, EXPIRED
    created_at: int
    expires_at: int


@attrs.frozen
class Member:
    member_id: str
    user_id: str
    email: str
    name: str
    avatar: str | None
    role: str
    channel_ids: list[str]
    created_at: int


PENDING: Final = "PENDING"
ACCEPTED: Final = "ACCEPTED"
REVOKED: Final = "REVOKED"
EXPIRED: Final = "EXPIRED"
INVITE_STATUSES: Final = (PENDING, ACCEPTED, REVOKED, EXPIRED)


def _invite(row: sqlite3.Row, now: int) -> Invite:
    if row["accepted_at"] is not None:
        status = ACCEPTED
    elif row["revoked_at"] is not None:
        status = REVOKED
    elif row["expires_at"] <= now:
        status = EXPIRED
    else:
        status = PENDING
    return Invite(
        id=row["id"],
        email=row["email"],
        channel_ids=json.loads(row["channel_ids"]),
        status=status,
        created_at=row["created_at"],
        expires_at=row["expires_at"],
    )


def _owner_only(who: Principal) -> None:
    if not who.is_owner:
        raise Forbidden("only the account owner's key may manage the team")


@attrs.frozen
class NewInvite:
    invite: Invite
    token: str


def invite(
    conn: sqlite3.Connection, who: Principal, email: str, channel_ids: list[str], now: int
) -> NewInvite:
    _owner_only(who)
    accounts.channel_pks_by_id(conn, who.account_pk, channel_ids)
    channel_ids = list(dict.fromkeys(channel_ids))
    if accounts.active_user_with_email(conn, who.account_pk, email):
        raise Conflict(f"{email} is already a member of the account", code="already_member")
    token = "inv_" + ids.new_api_key().removeprefix(ids.API_KEY_PREFIX)
    invite_id = ids.new_id("inv")
    conn.execute(
        "INSERT INTO invites (id, account_pk, email, channel_ids, token_hash, invited_by_pk,"
        " created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            invite_id,
            who.account_pk,
            email,
            json.dumps(channel_ids),
            ids.hash_api_key(token),
            who.user_pk,
            now,
            now + INVITE_TTL_US,
        ),
    )
    inviter = actions.actor_of(conn, who.user_pk)
    mail.queue(
        conn,
        who.account_pk,
        email,
        f"{inviter.name} invited you to their inbox",
        (
            f"{inviter.name} ({inviter.email}) invited you to work in their shared inbox.\n\n"
            "To accept, send your name with this invitation token to the inbox API:\n\n"
            "  POST /api/v1/inbox/team/invites/accept\n"
            f'  {{"token": "{token}", "name": "Your Name"}}\n\n'
            "The response holds your API key. The invitation expires in 7 days.\n"
        ),
        now,
    )
    events.append(
        conn,
        who.account_pk,
        None,
        events.USER_INVITED,
        {
            "inviteId": invite_id,
            "email": email,
            "channelIds": channel_ids,
            "actorUserId": who.user_id,
        },
        now,
    )
    row = conn.execute("SELECT * FROM invites WHERE id = ?", (invite_id,)).fetchone()
    return NewInvite(invite=_invite(row, now), token=token)


def list_invites(conn: sqlite3.Connection, who: Principal, now: int) -> list[Invite]:
    _owner_only(who)
    rows = conn.execute(
        "SELECT * FROM invites WHERE account_pk = ? ORDER BY pk", (who.account_pk,)
    ).fetchall()
    return [_invite(r, now) for r in rows]


def revoke_invite(conn: sqlite3.Connection, who: Principal, invite_id: str, now: int) -> Invite:
    _owner_only(who)
    row = conn.execute(
        "SELECT * FROM invites WHERE id = ? AND account_pk = ?", (invite_id, who.account_pk)
    ).fetchone()
    if row is None:
        raise NotFound(f"invite {invite_id} does not exist")
    current = _invite(row, now)
    if current.status != PENDING:
        raise Conflict(
            f"the invite is {current.status.lower()}, not pending", code="invite_not_pending"
        )
    _revoke(conn, who, row, now)
    return attrs.evolve(current, status=REVOKED)


def _revoke(conn: sqlite3.Connection, who: Principal, row: sqlite3.Row, now: int) -> None:
    """Revoke a pending invite (a row of ``invites``), with its event."""
    conn.execute("UPDATE invites SET revoked_at = ? WHERE pk = ?", (now, row["pk"]))
    events.append(
        conn,
        who.account_pk,
        None,
        events.USER_INVITE_REVOKED,
        {"inviteId": row["id"], "email": row["email"], "actorUserId": who.user_id},
        now,
    )


def accept_invite(conn: sqlite3.Connection, token: str, name: str, now: int) -> accounts.NewUser:
    row = conn.execute(
        "SELECT * FROM invites WHERE token_hash = ?", (ids.hash_api_key(token),)
    ).fetchone()
    if row is None or _invite(row, now).status != PENDING:
        raise NotFound("the invitation does not exist, was used, revoked or has expired")
    invite_ = _invite(row, now)
    account_pk = int(row["account_pk"])
    if accounts.active_user_with_email(conn, account_pk, invite_.email):
        raise Conflict(f"{invite_.email} is already a member of the account", code="already_member")
    # Channels deleted since the invite are skipped rather than failing the acceptance.
    channel_ids = [
        c
        for c in invite_.channel_ids
        if conn.execute(
            "SELECT 1 FROM channels WHERE id = ? AND account_pk = ?", (c, account_pk)
        ).fetchone()
    ]
    new = accounts.create_operator(conn, account_pk, invite_.email, name, channel_ids, now)
    user_pk = accounts.find_user_pk(conn, account_pk, new.user_id)
    conn.execute(
        "UPDATE invites SET accepted_at = ?, user_pk = ? WHERE pk = ?", (now, user_pk, row["pk"])
    )
    events.append(
        conn,
        account_pk,
        None,
        events.USER_ADDED,
        {
            "memberId": new.member_id,
            "userId": new.user_id,
            "email": invite_.email,
            "channelIds": channel_ids,
        },
        now,
    )
    return new


# -- members -------------------------------------------------------------------------------------


def _member_rows(conn: sqlite3.Connection, account_pk: int, member_id: str | None) -> list[Member]:
    sql = (
        "SELECT u.pk, u.id, u.member_id, u.email, u.name, u.avatar, u.role, u.created_at"
        " FROM users u WHERE u.account_pk = ? AND u.role = ? AND u.removed_at IS NULL"
    )
    params: list[object] = [account_pk, ROLE_OPERATOR]
    if member_id is not None:
        sql += " AND u.member_id = ?"
        params.append(member_id)
    out = []
    for r in conn.execute(sql + " ORDER BY u.pk", params).fetchall():
        channel_ids = [
            c[0]
            for c in conn.execute(
                "SELECT ch.id FROM channel_access a JOIN channels ch ON ch.pk = a.channel_pk"
                " WHERE a.user_pk = ? ORDER BY ch.pk",
                (r["pk"],),
            )
        ]
        out.append(
            Member(
                member_id=r["member_id"],
                user_id=r["id"],
                email=r["email"],
                name=r["name"],
                avatar=r["avatar"],
                role=r["role"],
                channel_ids=channel_ids,
                created_at=r["created_at"],
            )
        )
    return out


def list_members(conn: sqlite3.Connection, who: Principal) -> list[Member]:
    _owner_only(who)
    return _member_rows(conn, who.account_pk, None)


def _member(conn: sqlite3.Connection, account_pk: int, member_id: str) -> tuple[Member, int]:
    found = _member_rows(conn, account_pk, member_id)
    if not found:
        raise NotFound(f"member {member_id} does not exist")
    user_pk = accounts.find_user_pk(conn, account_pk, found[0].user_id)
    return found[0], user_pk


def set_member_channels(
    conn: sqlite3.Connection, who: Principal, member_id: str, channel_ids: list[str], now: int
) -> Member:
    _owner_only(who)
    member, user_pk = _member(conn, who.account_pk, member_id)
    channel_pks = accounts.channel_pks_by_id(conn, who.account_pk, channel_ids)
    conn.execute("DELETE FROM channel_access WHERE user_pk = ?", (user_pk,))
    conn.executemany(
        "INSERT INTO channel_access (user_pk, channel_pk) VALUES (?, ?)",
        [(user_pk, pk) for pk in channel_pks],
    )
    new_ids = list(dict.fromkeys(channel_ids))
    events.append(
        conn,
        who.account_pk,
        None,
        events.USER_CHANNELS_CHANGED,
        {
            "memberId": member.member_id,
            "userId": member.user_id,
            "channelIds": new_ids,
            "actorUserId": who.user_id,
        },
        now,
    )
    actions.unassign_where_no_access(
        conn, who.account_pk, user_pk, actions.actor_of(conn, who.user_pk), now
    )
    return _member(conn, who.account_pk, member_id)[0]


def remove_member(conn: sqlite3.Connection, who: Principal, member_id: str, now: int) -> None:
    _owner_only(who)
    member, user_pk = _member(conn, who.account_pk, member_id)
    conn.execute("UPDATE users SET removed_at = ? WHERE pk = ?", (now, user_pk))
    conn.execute("DELETE FROM channel_access WHERE user_pk = ?", (user_pk,))
    conn.execute(
        "UPDATE api_keys SET revoked_at = ? WHERE user_pk = ? AND revoked_at IS NULL",
        (now, user_pk),
    )
    # An invite to the same address still pending (sent before they joined another way) would
    # let a removed member back in: it is revoked with them, with its own event.
    pending = conn.execute(
        "SELECT * FROM invites WHERE account_pk = ? AND email = ? COLLATE NOCASE"
        " AND accepted_at IS NULL AND revoked_at IS NULL AND expires_at > ? ORDER BY pk",
        (who.account_pk, member.email, now),
    ).fetchall()
    for row in pending:
        _revoke(conn, who, row, now)
    events.append(
        conn,
        who.account_pk,
        None,
        events.USER_REMOVED,
        {"memberId": member.member_id, "userId": member.user_id, "actorUserId": who.user_id},
        now,
    )
    actions.unassign_where_no_access(
        conn, who.account_pk, user_pk, actions.actor_of(conn, who.user_pk), now
    )


# -- keys over the API ---------------------------------------------------------------------------


def create_key_for(
    conn: sqlite3.Connection, who: Principal, user_id: str | None, now: int
) -> accounts.NewKey:
    if user_id is None or user_id == who.user_id:
        return accounts.create_key(conn, who.account_pk, who.user_pk, now)
    if not who.is_owner:
        raise Forbidden("only the account owner may create keys for other users")
    row = conn.execute(
        "SELECT pk FROM users WHERE id = ? AND account_pk = ? AND removed_at IS NULL",
        (user_id, who.account_pk),
    ).fetchone()
    if row is None:
        raise NotFound(f"user {user_id} does not exist")
    return accounts.create_key(conn, who.account_pk, row["pk"], now)


def revoke_key_as(conn: sqlite3.Connection, who: Principal, key_id: str, now: int) -> int:
    """Revoke one of the caller's keys (the owner: any key of the account); returns its pk."""
    row = conn.execute(
        "SELECT pk, user_pk FROM api_keys WHERE id = ? AND account_pk = ?",
        (key_id, who.account_pk),
    ).fetchone()
    if row is None or (not who.is_owner and row["user_pk"] != who.user_pk):
        raise NotFound(f"no API key {key_id}")
    accounts.revoke_key(conn, who.account_pk, key_id, now)
    return int(row["pk"])
