"""SQL for the inbox actions (spec endpoints 8-12): assign, open/close, block/unblock, rename.

Each real change updates the conversation, writes exactly one SYSTEM row and journals exactly one
event, all in the caller's one transaction. Assigning the current assignee again writes nothing
(the spec's no-op); every rename writes, also to the current title (the spec makes no exception).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import attrs
import orjson

from inboxd import wire
from inboxd.errors import Conflict, Unprocessable
from inboxd.model import Conversation, Principal, UserRef
from inboxd.store import conversations, events
from inboxd.store.messages import SOURCE_API, Actor, write_system_message


@attrs.frozen(eq=False)  # (each is one of the names below: equal only to itself)
class Answered:
    """A write returning a conversation, made to return it as the API answers it: its wire
    JSON without the contact, encoded where the write ran. In the daemon that is the writer
    process, which spares the trio thread rebuilding the row from its pickle and encoding it
    (bench/HISTORY.md, tenth session); the child has a core to spare. The routes use the ones
    at the end of this module."""

    fn: Callable[..., Conversation]
    name: str  # its name in this module: it pickles as a reference, as a function does

    def __call__(self, conn: sqlite3.Connection, *args: Any) -> bytes:
        return orjson.dumps(wire.conversation(self.fn(conn, *args), with_contact=False))

    def __reduce__(self) -> str:
        # (attrs' own state pickling took 5-6 us more of the trio thread per write)
        return self.name


def actor_of(conn: sqlite3.Connection, user_pk: int) -> Actor:
    row = conn.execute(
        "SELECT pk, id, name, email, avatar FROM users WHERE pk = ?", (user_pk,)
    ).fetchone()
    return Actor(
        pk=row["pk"], id=row["id"], name=row["name"], email=row["email"], avatar=row["avatar"]
    )


def _ref(actor: Actor | None) -> dict[str, Any] | None:
    if actor is None:
        return None
    return {"id": actor.id, "name": actor.name, "avatar": actor.avatar}


def _change(
    conn: sqlite3.Connection,
    conv: Conversation,
    account_pk: int,
    actor: Actor | None,
    sets: dict[str, object],
    becomes: dict[str, Any],
    content: str,
    event_type: str,
    data: dict[str, object],
    now: int,
    assignment_event: dict[str, object] | None = None,
) -> Conversation:
    """Update the columns in ``sets``; ``becomes`` is the same change in the model's terms, so
    the updated conversation is returned without reading it back (a test holds the two equal)."""
    assignments = ", ".join(f"{column} = ?" for column in sets)
    conn.execute(
        f"UPDATE conversations SET {assignments}, updated_at = ? WHERE pk = ?",
        [*sets.values(), now, conv.pk],
    )
    write_system_message(
        conn,
        account_pk=account_pk,
        conversation_pk=conv.pk,
        conversation_id=conv.id,
        channel_pk=conv.channel_pk,
        channel_id=conv.channel_id,
        content=content,
        source=SOURCE_API,
        actor=actor,
        now=now,
        assignment_event=assignment_event,
    )
    events.append(
        conn,
        account_pk,
        conv.channel_pk,
        event_type,
        {"conversationId": conv.id, "channelId": conv.channel_id, **data},
        now,
    )
    return attrs.evolve(conv, **becomes, updated_at=now)


def _can_open(conn: sqlite3.Connection, user_pk: int, channel_pk: int) -> bool:
    row = conn.execute(
        "SELECT 1 FROM users u WHERE u.pk = ? AND u.removed_at IS NULL AND (u.role = 'OWNER'"
        " OR EXISTS (SELECT 1 FROM channel_access a WHERE a.user_pk = u.pk AND a.channel_pk = ?))",
        (user_pk, channel_pk),
    ).fetchone()
    return row is not None


def assign(
    conn: sqlite3.Connection, who: Principal, conversation_id: str, user_id: str | None, now: int
) -> Conversation:
    conv = conversations.get(conn, who, conversation_id)
    current = None if conv.assigned_user is None else conv.assigned_user.id
    if user_id == current:
        return conv  # the spec's no-op: no SYSTEM row, no event
    actor = actor_of(conn, who.user_pk)
    if user_id is None:
        return unassign_as(conn, conv, who.account_pk, actor, now)
    row = conn.execute(
        "SELECT pk FROM users WHERE id = ? AND account_pk = ?", (user_id, who.account_pk)
    ).fetchone()
    if row is None or not _can_open(conn, row["pk"], conv.channel_pk):
        raise Unprocessable(
            f"user {user_id} cannot open this conversation's channel", code="assignee_not_allowed"
        )
    target = actor_of(conn, row["pk"])
    return _change(
        conn,
        conv,
        who.account_pk,
        actor,
        {"assigned_to_pk": target.pk},
        {"assigned_user": UserRef(id=target.id, name=target.name, avatar=target.avatar)},
        f"{actor.name} assigned the conversation to {target.name}",
        events.ASSIGNED,
        {
            "assigneeUserId": target.id,
            "previousAssigneeUserId": current,
            "actorUserId": actor.id,
        },
        now,
        assignment_event={"kind": "assign", "actor": _ref(actor), "target": _ref(target)},
    )


def unassign_as(
    conn: sqlite3.Connection,
    conv: Conversation,
    account_pk: int,
    actor: Actor | None,
    now: int,
    reason: str | None = None,
) -> Conversation:
    """Clear the assignee (also used when an operator loses access to the channel)."""
    assert conv.assigned_user is not None
    previous = conv.assigned_user
    who_did = actor.name if actor is not None else "inboxd"
    content = reason or f"{who_did} unassigned the conversation from {previous.name}"
    return _change(
        conn,
        conv,
        account_pk,
        actor,
        {"assigned_to_pk": None},
        {"assigned_user": None},
        content,
        events.UNASSIGNED,
        {
            "assigneeUserId": None,
            "previousAssigneeUserId": previous.id,
            "actorUserId": None if actor is None else actor.id,
        },
        now,
        assignment_event={
            "kind": "unassign",
            "actor": _ref(actor),
            "target": wire.user_ref(previous),
        },
    )


def set_status(
    conn: sqlite3.Connection, who: Principal, conversation_id: str, status: str, now: int
) -> Conversation:
    conv = conversations.get(conn, who, conversation_id)
    if conv.status == status:
        raise Conflict(f"the conversation is already {status}", code="status_unchanged")
    actor = actor_of(conn, who.user_pk)
    verb = "closed" if status == "CLOSED" else "reopened"
    return _change(
        conn,
        conv,
        who.account_pk,
        actor,
        {"status": status},
        {"status": status},
        f"{actor.name} {verb} the conversation",
        events.STATUS_CHANGED,
        {"status": status, "previousStatus": conv.status, "actorUserId": actor.id},
        now,
    )


def set_blocked(
    conn: sqlite3.Connection, who: Principal, conversation_id: str, blocked: bool, now: int
) -> Conversation:
    conv = conversations.get(conn, who, conversation_id)
    if conv.is_blocked == blocked:
        if blocked:
            raise Conflict("the contact is already blocked", code="already_blocked")
        raise Conflict("the contact is not blocked", code="not_blocked")
    actor = actor_of(conn, who.user_pk)
    return _change(
        conn,
        conv,
        who.account_pk,
        actor,
        {"is_blocked": int(blocked)},
        {"is_blocked": blocked},
        f"{actor.name} {'blocked' if blocked else 'unblocked'} the contact",
        events.BLOCKED if blocked else events.UNBLOCKED,
        {"actorUserId": actor.id},
        now,
    )


def rename(
    conn: sqlite3.Connection, who: Principal, conversation_id: str, title: str, now: int
) -> Conversation:
    conv = conversations.get(conn, who, conversation_id)
    # Also to the title it has: the spec's rename "replaces the title, writes one SYSTEM message,
    # emits inbox.conversation.title_changed" with no exception (unlike the assignee's no-op);
    # previousTitle then equals title. An Idempotency-Key keeps a retried rename from repeating.
    actor = actor_of(conn, who.user_pk)
    return _change(
        conn,
        conv,
        who.account_pk,
        actor,
        {"title": title},
        {"title": title},
        f'{actor.name} renamed the conversation to "{title}"',
        events.TITLE_CHANGED,
        {"title": title, "previousTitle": conv.title, "actorUserId": actor.id},
        now,
    )


@attrs.frozen
class Unassigned:
    conversation_ids: list[str]


def unassign_where_no_access(
    conn: sqlite3.Connection, account_pk: int, user_pk: int, actor: Actor | None, now: int
) -> Unassigned:
    """Unassign a user's conversations in channels the user can no longer open."""
    rows = conn.execute(
        "SELECT c.pk FROM conversations c JOIN users u ON u.pk = c.assigned_to_pk"
        " WHERE c.assigned_to_pk = ? AND c.account_pk = ? AND (u.removed_at IS NOT NULL OR"
        " (u.role <> 'OWNER' AND NOT EXISTS (SELECT 1 FROM channel_access a"
        "  WHERE a.user_pk = u.pk AND a.channel_pk = c.channel_pk)))",
        (user_pk, account_pk),
    ).fetchall()
    done = []
    for conv in conversations.load(conn, [r["pk"] for r in rows]):
        assert conv.assigned_user is not None
        unassign_as(
            conn,
            conv,
            account_pk,
            actor,
            now,
            reason=f"{conv.assigned_user.name} lost access to the channel; the conversation is unassigned",
        )
        done.append(conv.id)
    return Unassigned(conversation_ids=done)


# -- as the routes call them (Answered) ------------------------------------------------------

ASSIGN_ANSWERED = Answered(assign, "ASSIGN_ANSWERED")
SET_STATUS_ANSWERED = Answered(set_status, "SET_STATUS_ANSWERED")
SET_BLOCKED_ANSWERED = Answered(set_blocked, "SET_BLOCKED_ANSWERED")
RENAME_ANSWERED = Answered(rename, "RENAME_ANSWERED")
MARK_READ_ANSWERED = Answered(conversations.mark_read, "MARK_READ_ANSWERED")
