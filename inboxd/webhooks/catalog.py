"""What the inbox webhook can send: the ``events`` and ``envelope`` of GET /webhook.

The examples are the data fields of the spec's "Event types and data fields" table, and the
delivered envelopes carry exactly those fields (tests compare the two).
"""

from __future__ import annotations

from typing import Any, Final

from inboxd.store import events as ev
from inboxd.timeutil import format_us

_CONV: Final = "conv_5v2ka7cgbd4mmvnq3xzs"
_CHAN: Final = "ch_3nd7h2wq6ykhbyqy2ulr"
_ACTOR: Final = "usr_k2b6hjd4pq3oj2xr7wmn"
_USER: Final = "usr_q7l2fvy3mmuxc5ra2bsd"
_MEMBER: Final = "mem_x4kz3n7yhw2sadqe6bfo"
_INVITE: Final = "inv_p6c3lvm2ds7rzy4bqh5e"

EVENTS: Final[tuple[tuple[str, str, dict[str, Any]], ...]] = (
    (
        ev.STATUS_CHANGED,
        "A conversation was opened or closed; status is OPEN or CLOSED.",
        {
            "conversationId": _CONV,
            "channelId": _CHAN,
            "status": "CLOSED",
            "previousStatus": "OPEN",
            "actorUserId": _ACTOR,
        },
    ),
    (
        ev.ASSIGNED,
        "The conversation's assignee was set; assigneeUserId is the new assignee.",
        {
            "conversationId": _CONV,
            "channelId": _CHAN,
            "assigneeUserId": _USER,
            "previousAssigneeUserId": None,
            "actorUserId": _ACTOR,
        },
    ),
    (
        ev.UNASSIGNED,
        "The conversation's assignee was cleared; assigneeUserId is null.",
        {
            "conversationId": _CONV,
            "channelId": _CHAN,
            "assigneeUserId": None,
            "previousAssigneeUserId": _USER,
            "actorUserId": _ACTOR,
        },
    ),
    (
        ev.BLOCKED,
        "The conversation's contact was blocked; its incoming messages are rejected.",
        {"conversationId": _CONV, "channelId": _CHAN, "actorUserId": _ACTOR},
    ),
    (
        ev.UNBLOCKED,
        "The conversation's contact was unblocked.",
        {"conversationId": _CONV, "channelId": _CHAN, "actorUserId": _ACTOR},
    ),
    (
        ev.TITLE_CHANGED,
        "The conversation was renamed.",
        {
            "conversationId": _CONV,
            "channelId": _CHAN,
            "title": "Refund for order 1042",
            "previousTitle": None,
            "actorUserId": _ACTOR,
        },
    ),
    (
        ev.USER_INVITED,
        "The owner invited a person; they are not a member until they accept.",
        {
            "inviteId": _INVITE,
            "email": "ann@example.com",
            "channelIds": [_CHAN],
            "actorUserId": _ACTOR,
        },
    ),
    (
        ev.USER_ADDED,
        "An invited person accepted and is now an operator.",
        {
            "memberId": _MEMBER,
            "userId": _USER,
            "email": "ann@example.com",
            "channelIds": [_CHAN],
        },
    ),
    (
        ev.USER_REMOVED,
        "An operator was removed from the account.",
        {"memberId": _MEMBER, "userId": _USER, "actorUserId": _ACTOR},
    ),
    (
        ev.USER_CHANNELS_CHANGED,
        "The channels an operator can open were replaced.",
        {"memberId": _MEMBER, "userId": _USER, "channelIds": [_CHAN], "actorUserId": _ACTOR},
    ),
    (
        ev.USER_INVITE_REVOKED,
        "A pending invite was cancelled before it was accepted.",
        {"inviteId": _INVITE, "email": "ann@example.com", "actorUserId": _ACTOR},
    ),
)

WEBHOOK_TYPES: Final = frozenset(t for t, _, _ in EVENTS)

# The shape of the JSON body that is posted, with the spec's types (id: string, type: string,
# createdAt: date-time, data: object): the first event's example as it would be delivered.
ENVELOPE: Final = {
    "id": "evt_5v2kb3qkyqmfzt7wj4ha",
    "type": EVENTS[0][0],
    "createdAt": format_us(1_768_473_000_000_000),
    "data": EVENTS[0][2],
}


def describe() -> list[dict[str, Any]]:
    return [{"type": t, "description": d, "example": e} for t, d, e in EVENTS]
