"""Routes under /api/v1/inbox: the spec's read endpoints 1-7 and marking a conversation read."""

from __future__ import annotations

from typing import Final

import orjson
from quart import Blueprint, Response

from inboxd import cursors, wire
from inboxd.api.app import authenticate, now_us, principal, state
from inboxd.api.http import (
    arg_bool,
    arg_choice,
    arg_cursor,
    arg_limit,
    arg_str,
    encoded_json,
    field,
    json_body,
    json_response,
    trimmed_field,
)
from inboxd.errors import InvalidRequest
from inboxd.model import SETTABLE_STATUSES
from inboxd.store import accounts, actions, conversations, messages

blueprint = Blueprint("inbox", __name__, url_prefix="/api/v1/inbox")
blueprint.before_request(authenticate)


@blueprint.get("/channels")
async def list_channels() -> Response:
    rows = await state().store.read(accounts.list_channels, principal())
    return json_response([wire.channel(c) for c in rows])


@blueprint.get("/channels/<channel_id>/assignees")
async def list_assignees(channel_id: str) -> Response:
    rows = await state().store.read(accounts.list_assignees, principal(), channel_id)
    return json_response([wire.assignee(a) for a in rows])


@blueprint.get("/conversations")
async def list_conversations() -> Response:
    query = conversations.ListQuery(
        limit=arg_limit(),
        cursor=arg_cursor(),
        channel_id=arg_str("channelId"),
        status=arg_choice("status", SETTABLE_STATUSES),
        unread=arg_bool("unread"),
        tab=arg_choice("tab", conversations.TABS, default="all") or "all",
        assignee_id=arg_str("assigneeId"),
    )
    page = await state().store.read(conversations.list_page_json, principal(), query)
    last = page.rows.last
    return json_response(
        {
            "data": orjson.Fragment(page.rows.json),
            "pagination": {
                "hasMore": page.has_more,
                # The spec types nextCursor as a date-time: on the last page it is still the last
                # row's cursor (which leads to an empty page); null only when the page is empty.
                "nextCursor": None if last is None else cursors.encode(*last),
                "limit": query.limit,
            },
        }
    )


MAX_QUERY: Final = 256


@blueprint.get("/conversations/search")
async def search_conversations() -> Response:
    # Trimmed first: the spaces around the query do not count against its length (README).
    query = (arg_str("query", required=True) or "").strip()
    if "\x00" in query:
        raise InvalidRequest("query must not contain a NUL character")
    if len(query) > MAX_QUERY:
        raise InvalidRequest(f"query must be text of at most {MAX_QUERY} characters")
    # (an empty one names no channel: as if it were missing)
    channel_id = arg_str("channelId", required=True, empty_allowed=False)
    limit = arg_limit()
    result = await state().store.read(conversations.search, principal(), channel_id, query, limit)
    return json_response(
        {
            "contacts": orjson.Fragment(result.contacts),
            "messages": orjson.Fragment(result.messages),
        }
    )


@blueprint.get("/conversations/counts")
async def conversation_counts() -> Response:
    result = await state().store.read(conversations.counts, principal(), arg_str("channelId"))
    return json_response(wire.counts(result))


@blueprint.get("/conversations/<conversation_id>")
async def get_conversation(conversation_id: str) -> Response:
    return encoded_json(
        await state().store.read(conversations.get_json, principal(), conversation_id)
    )


@blueprint.get("/conversations/<conversation_id>/messages")
async def list_messages(conversation_id: str) -> Response:
    kind = arg_choice("kind", messages.KINDS, default="all") or "all"
    limit = arg_limit()
    cursor = arg_cursor()
    page = await state().store.read(
        messages.history_json, principal(), conversation_id, kind, limit, cursor
    )
    return json_response(
        {
            "messages": orjson.Fragment(page.json),
            "nextCursor": (
                cursors.encode(*page.last) if page.has_more and page.last is not None else None
            ),
            "hasMore": page.has_more,
        }
    )


# -- actions (spec endpoints 8-12): each returns the updated Conversation without contact ---------

MAX_TITLE: Final = 200


@blueprint.post("/conversations/<conversation_id>/read")
async def mark_read(conversation_id: str) -> Response:
    await json_body(required=False)
    return encoded_json(
        await state().store.write(
            actions.MARK_READ_ANSWERED, principal(), conversation_id, now_us()
        )
    )


@blueprint.patch("/conversations/<conversation_id>/assignee")
async def patch_assignee(conversation_id: str) -> Response:
    body = await json_body()
    if "userId" not in body:
        raise InvalidRequest("userId is required (a user id, or null to unassign)")
    # No length rule: an id no user has (whatever its length) is 422 assignee_not_allowed.
    user_id = field(body, "userId", str, nullable=True)
    return encoded_json(
        await state().store.write(
            actions.ASSIGN_ANSWERED, principal(), conversation_id, user_id, now_us()
        )
    )


@blueprint.patch("/conversations/<conversation_id>/status")
async def patch_status(conversation_id: str) -> Response:
    body = await json_body()
    status = field(body, "status", str, required=True)
    if status not in SETTABLE_STATUSES:
        raise InvalidRequest("status must be OPEN or CLOSED")
    return encoded_json(
        await state().store.write(
            actions.SET_STATUS_ANSWERED, principal(), conversation_id, status, now_us()
        )
    )


async def _set_blocked(conversation_id: str, blocked: bool) -> Response:
    await json_body(required=False)
    return encoded_json(
        await state().store.write(
            actions.SET_BLOCKED_ANSWERED, principal(), conversation_id, blocked, now_us()
        )
    )


@blueprint.post("/conversations/<conversation_id>/block")
async def block(conversation_id: str) -> Response:
    return await _set_blocked(conversation_id, True)


@blueprint.post("/conversations/<conversation_id>/unblock")
async def unblock(conversation_id: str) -> Response:
    return await _set_blocked(conversation_id, False)


@blueprint.patch("/conversations/<conversation_id>/title")
async def patch_title(conversation_id: str) -> Response:
    body = await json_body()
    title = trimmed_field(body, "title", MAX_TITLE)
    return encoded_json(
        await state().store.write(
            actions.RENAME_ANSWERED, principal(), conversation_id, title, now_us()
        )
    )
