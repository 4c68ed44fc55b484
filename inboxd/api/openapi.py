"""The OpenAPI 3.1 document of the HTTP API, served at ``GET /api/v1/openapi.json`` (CONTRACT
section 9); its schemas live in openapi_schemas.py.

Written by hand beside the routes rather than generated from them: the routes read requests with
the small helpers of http.py, so there is nothing declarative to introspect, and only a person can
say which of the contract's error codes a route can answer. It is held to the server from the
outside instead: the test suite checks every response its HTTP clients get, every webhook request
its receivers get and every feed frame it reads against this document (tests/openapi_check.py),
and tests/test_openapi.py compares its paths with the app's routes. A field, status or route that
drifts fails a test.

``operation()`` derives the errors a route can answer from what the route is (keyed, owner-only,
has a path id, reads a JSON body, takes an Idempotency-Key) and adds the route's own codes; each
error response narrows ``error.code`` to an enum, so a code the document does not name is caught.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal

import orjson

from inboxd import __version__
from inboxd.api import inbox, messaging, team
from inboxd.api.app import IDEMPOTENCY_KEY
from inboxd.api.channels import MAX_URLS
from inboxd.api.feed import SEQ_MAX
from inboxd.api.http import DEFAULT_LIMIT, MAX_LIMIT
from inboxd.api.openapi_schemas import (
    CHANNEL_MESSAGE_TYPES,
    Schema,
    array,
    boolean,
    enum,
    integer,
    nullable,
    number,
    ref,
    request_object,
    schemas,
    string,
)
from inboxd.model import DIRECTIONS, MAX_EMAIL, MAX_NAME, SETTABLE_STATUSES
from inboxd.store import conversations, messages
from inboxd.store.db import STORAGE_CODES
from inboxd.timeutil import ISO_DATE_TIME_SCHEMA
from inboxd.webhooks import catalog
from inboxd.webhooks.channel import PROBE_TYPE

OPENAPI_PATH: Final = "/api/v1/openapi.json"
BEARER: Final = "bearerAuth"
WRITE_METHODS: Final = frozenset({"post", "put", "patch", "delete"})
SIGNATURE_PATTERN: Final = r"^sha256=[0-9a-f]{64}$"

Access = Literal["key", "owner", "public"]
Response = dict[str, Any]
Parameter = dict[str, Any]
Entry = tuple[str, str, dict[str, Any]]  # (path, method, operation)

# -- responses -----------------------------------------------------------------------------------


def ok(schema: str | Schema, description: str, status: int = 200) -> dict[int, Response]:
    """A JSON success response; a string names a component schema."""
    body = ref(schema) if isinstance(schema, str) else schema
    return {status: {"description": description, "content": {"application/json": {"schema": body}}}}


def ok_text(media_type: str, description: str) -> dict[int, Response]:
    return {200: {"description": description, "content": {media_type: {"schema": string()}}}}


_ERROR_WORDS: Final = {
    400: "Bad request",
    401: "Missing, malformed, unknown or revoked key",
    403: "The key's user may not do this",
    404: "Not found, or not visible to the key",
    409: "Conflict",
    413: "Body over server.max_body_bytes",
    415: "A body that is not application/json",
    422: "Unprocessable",
    429: "Over the key's rate",
    503: (
        "Not served just now: a read ran past the store's deadline (narrow it down), the writer"
        " process stopped under the write, or the store's disk refused the write (full,"
        " read-only, failing, or locked by another process; Retry-After says when to retry)"
    ),
}
_ERROR_HEADERS: Final = {
    401: {"WWW-Authenticate": {"$ref": "#/components/headers/WWWAuthenticate"}},
    413: {"Connection": {"$ref": "#/components/headers/ConnectionClose"}},
    429: {"Retry-After": {"$ref": "#/components/headers/RetryAfter"}},
    503: {"Retry-After": {"$ref": "#/components/headers/RetryLater"}},
}


def error_response(status: int, codes: Iterable[str]) -> Response:
    """The Error schema with ``error.code`` narrowed to the codes this route can answer."""
    listed = sorted(set(codes))
    response: Response = {
        "description": f"{_ERROR_WORDS.get(status, 'Error')}: " + ", ".join(listed),
        "content": {
            "application/json": {
                "schema": {
                    "$ref": "#/components/schemas/Error",
                    "properties": {"error": {"properties": {"code": {"enum": listed}}}},
                }
            }
        },
    }
    if status in _ERROR_HEADERS:
        response["headers"] = dict(_ERROR_HEADERS[status])
    return response


# -- parameters ----------------------------------------------------------------------------------

PATH_PARAMETERS: Final = {
    "conversationId": "A conversation id.",
    "channelId": "A channel id.",
    "messageId": "A message id.",
    "inviteId": "An invite id.",
    "memberId": "A member id.",
    "keyId": "An API key id.",
    "eventId": "An inbox webhook event id (the envelope's `id`).",
}
_PATH_PARAMETER: Final = re.compile(r"\{(\w+)\}")


def path_parameter(name: str) -> Parameter:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": PATH_PARAMETERS[name],
        "schema": string(),
    }


def query(name: str, schema: Schema, description: str, *, required: bool = False) -> Parameter:
    out: Parameter = {"name": name, "in": "query", "description": description, "schema": schema}
    if required:
        out["required"] = True
    return out


LIMIT: Final = query(
    "limit",
    integer(minimum=1, maximum=MAX_LIMIT, default=DEFAULT_LIMIT),
    f"Page size, 1 to {MAX_LIMIT}; anything else is 400.",
)
CURSOR: Final = query(
    "cursor",
    string(pattern=ISO_DATE_TIME_SCHEMA),
    "The previous page's `nextCursor`, or any ISO 8601 date-time with an offset: rows older than"
    " that instant.",
)
CHANNEL_FILTER: Final = query("channelId", string(), "Only this channel (404 if not visible).")
NO_BODY: Final = request_object({}, description="No fields; an empty body is fine too.")

# -- operations ----------------------------------------------------------------------------------


def _merge(*sources: Mapping[int, Iterable[str]]) -> dict[int, set[str]]:
    merged: dict[int, set[str]] = {}
    for source in sources:
        for status, codes in source.items():
            merged.setdefault(status, set()).update(codes)
    return merged


def _implied_errors(
    access: Access, method: str, has_path_ids: bool, reads_json: bool
) -> dict[int, set[str]]:
    """The errors that follow from what a route is (app.py, http.py, CONTRACT section 3)."""
    implied: list[Mapping[int, Iterable[str]]] = []
    if has_path_ids:
        implied.append({404: ["not_found"]})
    if access != "public":  # authenticate(): key, rate limit, and its read of the key
        implied.append({401: ["unauthorized"], 429: ["rate_limited"], 503: ["query_timeout"]})
    if access == "owner":
        implied.append({403: ["forbidden"]})
    if method in WRITE_METHODS:  # its change, or the Idempotency-Key claim (store/writer.py)
        implied.append({503: ["writer_stopped", *STORAGE_CODES]})
    if access != "public" and method in WRITE_METHODS:  # the Idempotency-Key claim
        implied.append(
            {
                400: ["invalid_request"],
                409: ["idempotency_in_progress", "idempotency_key_applied"],
                413: ["payload_too_large"],
                422: ["idempotency_key_reused"],
            }
        )
    if reads_json:  # http.json_body()
        implied.append(
            {400: ["invalid_request"], 413: ["payload_too_large"], 415: ["unsupported_media_type"]}
        )
    return _merge(*implied)


def operation(
    route: str,
    operation_id: str,
    summary: str,
    responses: Mapping[int, Response],
    *,
    tag: str,
    access: Access = "key",
    description: str | None = None,
    parameters: Sequence[Parameter] = (),
    body: Schema | None = None,
    body_optional: bool = False,
    form: Schema | None = None,
    looks_up_path_ids: bool = True,
    errors: Mapping[int, Iterable[str]] | None = None,
) -> Entry:
    """One operation of ``route`` (``"GET /path"``), with the errors that follow from what it
    is added to its own ``errors``.

    ``body`` is a JSON body (``body_optional``: an empty one is fine too), ``form`` an optional
    form body; ``looks_up_path_ids`` is false for a route that never looks its path id up.
    """
    method, path = route.split(" ", 1)
    method = method.lower()
    path_ids = _PATH_PARAMETER.findall(path)
    params = [path_parameter(name) for name in path_ids]
    idempotent = access != "public" and method in WRITE_METHODS
    if idempotent:
        params.append({"$ref": "#/components/parameters/IdempotencyKey"})
    params += parameters
    out: dict[str, Any] = {"operationId": operation_id, "summary": summary, "tags": [tag]}
    if description:
        out["description"] = description
    if access == "public":
        out["security"] = []
    if params:
        out["parameters"] = params
    if body is not None:
        out["requestBody"] = {
            "required": not body_optional,
            "content": {"application/json": {"schema": body}},
        }
    elif form is not None:
        out["requestBody"] = {
            "required": False,
            "content": {"application/x-www-form-urlencoded": {"schema": form}},
        }
    implied = _implied_errors(
        access, method, bool(path_ids) and looks_up_path_ids, body is not None
    )
    all_responses = {str(s): copy.deepcopy(r) for s, r in responses.items()}
    for status, codes in sorted(_merge(implied, errors or {}).items()):
        all_responses[str(status)] = error_response(status, codes)
    if idempotent:
        # A repeat gets the stored response back, errors too; not 5xx (never stored), nor 401
        # and 429, which come before the key is looked at.
        for key, response in all_responses.items():
            if not key.startswith("5") and key not in ("401", "429"):
                response.setdefault("headers", {})["Idempotent-Replayed"] = {
                    "$ref": "#/components/headers/IdempotentReplayed"
                }
    out["responses"] = dict(sorted(all_responses.items()))
    return path, method, out


def conversation_operations() -> list[Entry]:
    """Spec endpoints 1-12 and marking a conversation read."""
    op = functools.partial(operation, tag="conversations")
    conv = "/api/v1/inbox/conversations/{conversationId}"
    updated = ok("UpdatedConversation", "The updated conversation, without `contact`.")
    return [
        op(
            "GET /api/v1/inbox/channels",
            "listChannels",
            "List the channels the key can open (spec 1)",
            ok(array(ref("Channel")), "The channels, oldest first."),
            tag="channels",
        ),
        op(
            "GET /api/v1/inbox/channels/{channelId}/assignees",
            "listAssignees",
            "List who the channel's conversations can be assigned to (spec 2)",
            ok(array(ref("Assignee")), "The owner, then the operators who can open it."),
            tag="channels",
        ),
        op(
            "GET /api/v1/inbox/conversations",
            "listConversations",
            "A page of conversations, newest lastMessageAt first (spec 3)",
            ok("ConversationPage", "A page; walk it with `pagination.nextCursor`."),
            parameters=[
                LIMIT,
                CURSOR,
                CHANNEL_FILTER,
                query("status", enum(*SETTABLE_STATUSES), "Only this status."),
                query("unread", boolean(), "true or 1: only unread; false, 0 or absent: all."),
                query(
                    "tab",
                    enum(*conversations.TABS) | {"default": "all"},
                    "mine_open: open and assigned to the key's user; unassigned: open and nobody"
                    " assigned; all: no extra filter.",
                ),
                query("assigneeId", string(), "Only this assignee (unknown: an empty page)."),
            ],
            errors={400: ["invalid_request"], 404: ["not_found"]},
        ),
        op(
            "GET /api/v1/inbox/conversations/search",
            "searchConversations",
            "Search one channel by contact name, phone or message text (spec 4)",
            ok("SearchResult", "Both lists newest first; empty for a query under 3 characters."),
            parameters=[
                query(
                    "query",
                    string(),
                    f"A case-insensitive substring, trimmed, then at most {inbox.MAX_QUERY}"
                    " characters (the spaces around it do not count, so no maxLength here);"
                    " no NUL characters. Accented"
                    " letters match composed or decomposed (NFC or NFD), in the text or in"
                    " the query.",
                    required=True,
                ),
                query("channelId", string(), "The channel to search.", required=True),
                LIMIT,
            ],
            errors={400: ["invalid_request"], 404: ["not_found"]},
        ),
        op(
            "GET /api/v1/inbox/conversations/counts",
            "countConversations",
            "Counters for the inbox tabs (spec 5)",
            ok("Counts", "mine_open and unassigned count OPEN conversations only."),
            parameters=[CHANNEL_FILTER],
            errors={404: ["not_found"]},
        ),
        op(
            f"GET {conv}",
            "getConversation",
            "Read one conversation (spec 6)",
            ok("Conversation", "The conversation with its contact."),
        ),
        op(
            f"GET {conv}/messages",
            "listMessages",
            "A page of the conversation's history, newest first (spec 7)",
            ok("MessagePage", "A page; walk it with `nextCursor`."),
            parameters=[
                LIMIT,
                CURSOR,
                query(
                    "kind",
                    enum(*messages.KINDS) | {"default": "all"},
                    "messages hides SYSTEM rows; system returns only them.",
                ),
            ],
            errors={400: ["invalid_request"]},
        ),
        op(
            f"POST {conv}/read",
            "markConversationRead",
            "Clear unreadCount and isUnread (no SYSTEM row, no webhook event)",
            updated,
            body=NO_BODY,
            body_optional=True,
        ),
        op(
            f"PATCH {conv}/assignee",
            "assignConversation",
            "Assign the conversation, or clear its assignee (spec 8)",
            updated,
            description="The current assignee again is a no-op: 200, no SYSTEM row, no event.",
            body=request_object(
                {"userId": nullable(string("a user who can open the channel; null clears"))},
                required=["userId"],
            ),
            errors={422: ["assignee_not_allowed"]},
        ),
        op(
            f"PATCH {conv}/status",
            "setConversationStatus",
            "Open or close the conversation (spec 9)",
            updated,
            body=request_object({"status": enum(*SETTABLE_STATUSES)}, required=["status"]),
            errors={409: ["status_unchanged"]},
        ),
        op(
            f"POST {conv}/block",
            "blockContact",
            "Block the contact: its incoming messages are rejected (spec 10)",
            updated,
            body=NO_BODY,
            body_optional=True,
            errors={409: ["already_blocked"]},
        ),
        op(
            f"POST {conv}/unblock",
            "unblockContact",
            "Unblock the contact (spec 11)",
            updated,
            body=NO_BODY,
            body_optional=True,
            errors={409: ["not_blocked"]},
        ),
        op(
            f"PATCH {conv}/title",
            "renameConversation",
            "Rename the conversation (spec 12)",
            updated,
            description="Every rename writes one SYSTEM row and emits title_changed, also to"
            " the current title (previousTitle then equals title).",
            body=request_object(
                {"title": string(f"1 to {inbox.MAX_TITLE} characters after trimming", minLength=1)},
                required=["title"],
            ),
        ),
    ]


def messaging_operations() -> list[Entry]:
    """CONTRACT section 5: how the messaging API reports messages (owner key)."""
    op = functools.partial(operation, tag="messaging", access="owner")
    short: dict[str, Any] = {"maxLength": messaging.MAX_SHORT}
    url: dict[str, Any] = {"maxLength": messaging.MAX_URL}
    contact = request_object(
        {
            "phoneNumber": string(
                f"{messaging.MIN_PHONE_DIGITS} to {messaging.MAX_PHONE_DIGITS} digits; spaces,"
                " dashes, dots, parentheses and a leading + are ignored",
                maxLength=messaging.MAX_PHONE_FIELD,
                pattern=messaging.PHONE_CHARS.pattern,
            ),
            "name": nullable(string("defaults to the phone digits", **short)),
            "avatar": nullable(string(**url)),
        },
        required=["phoneNumber"],
    )
    optional = {
        "content": string(),
        "mediaUrl": string(**url),
        "mediaType": string(**short),
        "fileName": string(**short),
        "fileSize": integer(minimum=0),
        "mediaDuration": number(minimum=0, maximum=messaging.MAX_MEDIA_DURATION),
        "thumbnailUrl": string(**url),
        "templateName": string(**short),
        "templateLanguage": string(maxLength=messaging.MAX_TEMPLATE_LANGUAGE),
        "externalId": string("the same one again returns the stored message", minLength=1, **short),
        "sentAt": string("any ISO 8601 date-time with an offset", pattern=ISO_DATE_TIME_SCHEMA),
        "quotedMessageId": string("a message of the same channel", **short),
        "latitude": number(minimum=-90, maximum=90),
        "longitude": number(minimum=-180, maximum=180),
    }
    message = request_object(
        {
            "channelId": string(**short),
            "direction": enum(*DIRECTIONS),
            "contact": contact,
            "type": string(
                "TEXT, IMAGE, ...; SYSTEM is reserved", minLength=1, maxLength=messaging.MAX_TYPE
            ),
            **{name: nullable(schema) for name, schema in optional.items()},
        },
        required=["channelId", "direction", "contact", "type"],
    )
    status_word = string(
        "a word like SENT, DELIVERED, READ or FAILED; stored upper-cased",
        pattern=f"^{messaging.STATUS_WORD.pattern}$",
    )
    return [
        op(
            "POST /api/v1/messaging/messages",
            "ingestMessage",
            "Report a message",
            {
                **ok("Message", "Stored; the Message carries its conversationId.", 201),
                **ok("Message", "That externalId was stored already: the stored message."),
            },
            description="Finds or creates the contact and its conversation, appends the message"
            " and forwards it to the channel's webhook URLs and the feed. An INBOUND message into"
            " a CLOSED conversation reopens it.",
            body=message,
            errors={404: ["not_found"], 422: ["contact_blocked"]},
        ),
        op(
            "POST /api/v1/messaging/messages/{messageId}/status",
            "setMessageStatus",
            "Report a delivery status",
            ok("Message", "The message."),
            body=request_object({"status": status_word}, required=["status"]),
        ),
    ]


def inbox_webhook_operations() -> list[Entry]:
    """Spec endpoints 13-16, the delivery log and redelivery."""
    op = functools.partial(operation, tag="inbox webhook", access="owner")
    hook = "/api/v1/inbox/webhook"
    url = string("https, no credentials, a public host, at most 2048 characters", format="uri")
    return [
        op(
            f"GET {hook}",
            "getInboxWebhook",
            "Read the inbox webhook configuration (spec 13; any key)",
            ok("InboxWebhook", "url and secretPrefix are null when none is saved."),
            access="key",
        ),
        op(
            f"PUT {hook}",
            "putInboxWebhook",
            "Create or update the inbox webhook (spec 14)",
            ok("SavedInboxWebhook", "Saved; the secret only when this call created it."),
            body=request_object({"url": url}, required=["url"]),
            errors={422: ["invalid_url"]},
        ),
        op(
            f"DELETE {hook}",
            "deleteInboxWebhook",
            "Remove the inbox webhook (spec 15)",
            ok("DeletedInboxWebhook", "Whether one was removed."),
        ),
        op(
            f"POST {hook}/secret",
            "rotateInboxWebhookSecret",
            "Rotate the signing secret (spec 16)",
            ok("RotatedInboxWebhook", "The new secret, shown once."),
            body=NO_BODY,
            body_optional=True,
            errors={404: ["webhook_not_found"]},
        ),
        op(
            f"GET {hook}/deliveries",
            "listInboxWebhookDeliveries",
            "List delivery attempts, newest first",
            ok("DeliveryPage", "A page of attempts."),
            parameters=[LIMIT, CURSOR],
            errors={400: ["invalid_request"]},
        ),
        op(
            f"POST {hook}/deliveries/{{eventId}}/redeliver",
            "redeliverInboxWebhookEvent",
            "Queue one event again",
            ok("QueuedRedelivery", "Queued behind the events waiting in commit order.", 202),
            body=NO_BODY,
            body_optional=True,
            errors={404: ["webhook_not_found"]},
        ),
    ]


def team_operations() -> list[Entry]:
    """CONTRACT sections 4 and 6: invites, members and API keys."""
    op = functools.partial(operation, tag="team", access="owner")
    channel_ids = array(string(), "the channels the person may open")
    return [
        op(
            "POST /api/v1/inbox/team/invites",
            "createInvite",
            "Invite a person by email",
            ok("Invite", "The invite; the email to the person carries the accept token.", 201),
            body=request_object(
                {
                    "email": string(f"At most {MAX_EMAIL} characters once trimmed.", minLength=1),
                    "channelIds": channel_ids,
                },
                required=["email", "channelIds"],
            ),
            errors={404: ["not_found"], 409: ["already_member"]},
        ),
        op(
            "GET /api/v1/inbox/team/invites",
            "listInvites",
            "List invites",
            ok(array(ref("Invite")), "Every invite, oldest first."),
        ),
        op(
            "DELETE /api/v1/inbox/team/invites/{inviteId}",
            "revokeInvite",
            "Revoke a pending invite",
            ok("Invite", "The invite, now REVOKED."),
            errors={409: ["invite_not_pending"]},
        ),
        op(
            "POST /api/v1/inbox/team/invites/accept",
            "acceptInvite",
            "Accept an invite (no key: the token is the secret)",
            ok("NewMember", "The new member and their API key, shown once.", 201),
            access="public",
            body=request_object(
                {
                    "token": string("from the invite email", maxLength=team.MAX_TOKEN),
                    "name": string(f"1 to {MAX_NAME} characters after trimming", minLength=1),
                },
                required=["token", "name"],
            ),
            errors={404: ["not_found"], 409: ["already_member"]},
        ),
        op(
            "GET /api/v1/inbox/team/members",
            "listMembers",
            "List the operators (the owner is not a member)",
            ok(array(ref("Member")), "The operators, oldest first."),
        ),
        op(
            "PUT /api/v1/inbox/team/members/{memberId}/channels",
            "setMemberChannels",
            "Replace the channels an operator can open",
            ok("Member", "The member."),
            body=request_object({"channelIds": channel_ids}, required=["channelIds"]),
        ),
        op(
            "DELETE /api/v1/inbox/team/members/{memberId}",
            "removeMember",
            "Remove an operator; their keys stop working",
            ok("RemovedMember", "Removed."),
        ),
        op(
            "GET /api/v1/inbox/keys",
            "listKeys",
            "List the key's user's API keys (never the keys themselves)",
            ok(array(ref("ApiKey")), "The keys, oldest first, revoked ones too."),
            tag="keys",
            access="key",
        ),
        op(
            "POST /api/v1/inbox/keys",
            "createKey",
            "Create an API key, shown once",
            ok("NewApiKey", "The new key.", 201),
            tag="keys",
            access="key",
            body=request_object({"userId": nullable(string("owner key only: a teammate"))}),
            body_optional=True,
            errors={403: ["forbidden"], 404: ["not_found"]},
        ),
        op(
            "DELETE /api/v1/inbox/keys/{keyId}",
            "revokeKey",
            "Revoke a key (an operator: only their own); its websockets close",
            ok("RevokedApiKey", "Revoked."),
            tag="keys",
            access="key",
        ),
    ]


def channel_webhook_operations() -> list[Entry]:
    """CONTRACT section 7 (owner key) and the unsubscribe link of the owner's notice emails."""
    op = functools.partial(operation, tag="channel webhooks", access="owner")
    base = "/api/v1/channels/{channelId}"
    token = query("token", string(), "The token from the email's link.")
    urls = array(string("checked like the inbox webhook URL")) | {"maxItems": MAX_URLS}
    notifications = request_object({"email": boolean()}, required=["email"])
    return [
        op(
            f"GET {base}/webhook",
            "getChannelWebhookUrls",
            "The channel's webhook URLs",
            ok("ChannelWebhookUrls", "The URLs in order."),
        ),
        op(
            f"POST {base}/webhook",
            "replaceChannelWebhookUrls",
            "Replace the whole URL list",
            ok("SavedChannelWebhook", "The settings; the secret when this call created it."),
            description="URLs left out are removed; a paused or disabled URL in the list is"
            " re-enabled and what it kept follows.",
            body=request_object({"urls": urls}, required=["urls"]),
            errors={422: ["invalid_url"]},
        ),
        op(
            f"POST {base}/webhook/secret",
            "rotateChannelWebhookSecret",
            "Rotate the channel's signing secret",
            ok("RotatedChannelWebhook", "The settings and the new secret, shown once."),
            body=NO_BODY,
            body_optional=True,
            errors={404: ["webhook_not_found"]},
        ),
        op(
            f"GET {base}/settings",
            "getChannelWebhookSettings",
            "Each URL's state, counters, deadlines and backlog",
            ok("ChannelWebhookSettings", "The settings."),
        ),
        op(
            f"PATCH {base}/settings",
            "patchChannelWebhookSettings",
            "Turn the owner's notice emails on or off",
            ok("ChannelWebhookSettings", "The settings."),
            body=request_object({"notifications": notifications}, required=["notifications"]),
        ),
        op(
            f"GET {base}/unsubscribe",
            "unsubscribePage",
            "The unsubscribe link of a notice email: a page whose button POSTs (changes nothing)",
            ok_text("text/html", "The page."),
            access="public",
            parameters=[token],
            looks_up_path_ids=False,
        ),
        op(
            f"POST {base}/unsubscribe",
            "unsubscribe",
            "Unsubscribe from the channel's notice emails",
            ok_text("text/html", "Unsubscribed."),
            access="public",
            description="The token comes in the query or as the form field `token`.",
            parameters=[token],
            form=request_object({"token": string()}),
            errors={413: ["payload_too_large"]},
        ),
    ]


FEED_DESCRIPTION: Final = """\
The live feed (CONTRACT section 8) is a websocket. OpenAPI cannot describe a websocket
conversation, so this operation documents only the upgrade request; the protocol is:

- **Auth**: `Authorization: Bearer <key>` on the upgrade (a bad one is refused with 401 before the
  upgrade), or, for browsers, the first text frame `{"type": "auth", "token": "<key>"}` within
  10 s; without a valid one the server closes with 1008.
- **Rate limit**: opening the feed counts as one request against the key's rate: over it, the
  upgrade is refused with 429 and `Retry-After` (or, with first-frame auth, the server closes
  with 1013).
- **Frames** from the server are JSON text: `FeedEvent` (the webhook envelope plus `seq`, which
  grows in commit order), and, first, `FeedReset` (`{"type": "feed.reset"}`) when `since` is older
  than `feed.retention` or beyond the journal: refetch the state you keep.
- **Types**: every `inbox.conversation.*` and `inbox.user.*` event, plus `inbox.message.created`,
  `inbox.message.status_changed` and `inbox.conversation.read`. Only events of channels the key can
  open; `inbox.user.*` to owner keys only.
- **Resume**: `?since=<seq>` replays every later event, then goes live, with no gap and no
  duplicate.
- The server pings every 20 s and ignores what the client sends after auth. Close codes: 1008
  (auth failed, key revoked, member removed), 1013 (the client did not keep up: reconnect with
  `since`; or over the key's rate at first-frame auth), 1001 (the server is shutting down).
- A request to this path that is not a websocket upgrade is answered 400 (`invalid_request`,
  with `Upgrade: websocket`).
- Idempotency-Key does not apply."""


def feed_operations() -> list[Entry]:
    """CONTRACT sections 6 and 8: the events for REST clients, and the websocket."""
    op = functools.partial(operation, tag="feed")
    path, method, feed = op(
        "GET /api/v1/inbox/feed",
        "openFeed",
        "Open the live feed (a websocket)",
        {101: {"description": "Switching Protocols: the websocket is open (see above)."}},
        access="public",
        description=FEED_DESCRIPTION,
        parameters=[
            query(
                "since", integer(minimum=0, maximum=SEQ_MAX), "Replay the events after this `seq`."
            )
        ],
        errors={
            400: ["invalid_request"],
            401: ["unauthorized"],
            429: ["rate_limited"],
            503: ["query_timeout"],
        },
    )
    feed["security"] = [{BEARER: []}, {}]  # the key comes on the upgrade or in the first frame
    return [
        op(
            "GET /api/v1/inbox/events",
            "listEvents",
            "The feed's events for REST clients, oldest first",
            ok("EventPage", "The events after `after` that the key may see."),
            parameters=[
                query(
                    "after",
                    integer(minimum=0, maximum=SEQ_MAX, default=0),
                    "A `seq`: the previous page's `nextAfter`.",
                ),
                LIMIT,
            ],
            errors={400: ["invalid_request"]},
        ),
        (path, method, feed),
    ]


def ops_operations() -> list[Entry]:
    """CONTRACT section 9: no key, no rate limit."""
    op = functools.partial(operation, tag="operations", access="public")
    return [
        op("GET /healthz", "healthz", "Liveness: the process is up", ok("Health", "Up.")),
        op(
            "GET /readyz",
            "readyz",
            "Readiness: the store is open and migrated",
            {**ok("Ready", "Ready."), **ok("NotReady", "Not ready, and why.", 503)},
        ),
        op(
            "GET /metrics",
            "metrics",
            "Prometheus metrics",
            ok_text("text/plain", "Prometheus text format 0.0.4."),
            errors={503: ["query_timeout"]},
        ),
        op(
            f"GET {OPENAPI_PATH}",
            "openapi",
            "This document",
            ok({"type": "object"}, "The OpenAPI 3.1 document."),
        ),
    ]


# -- what the server sends: OpenAPI 3.1 ``webhooks`` ----------------------------------------------


def _header(name: str, schema: Schema, description: str) -> Parameter:
    return {
        "name": name,
        "in": "header",
        "required": True,
        "description": description,
        "schema": schema,
    }


def _webhook(summary: str, description: str, body: str, types: Sequence[str]) -> dict[str, Any]:
    signature = (
        "`sha256=` and the lowercase hex HMAC-SHA256 of the exact body bytes, keyed with the"
        " secret string as it was returned (`whsec_...`, its UTF-8 bytes). Reject a mismatch."
    )
    return {
        "post": {
            "operationId": body[0].lower() + body[1:],
            "summary": summary,
            "description": description,
            "security": [],
            "parameters": [
                _header("X-Svc-Event", enum(*types), "The event type (the body's `type`)."),
                _header("X-Svc-Delivery", string(), "The same on every retry of one event."),
                _header("X-Svc-Signature", string(pattern=SIGNATURE_PATTERN), signature),
                _header("User-Agent", string(pattern=r"^inboxd/"), "`inboxd/<version>`."),
            ],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref(body)}},
            },
            "responses": {
                "2XX": {"description": "Delivered."},
                "default": {"description": "Not delivered: see the description."},
            },
        }
    }


def webhooks() -> dict[str, Any]:
    return {
        "inboxEvent": _webhook(
            "An inbox event, POSTed to the account's inbox webhook URL",
            "One event at a time per account, in commit order. A non-2xx, a timeout or a network"
            " error is retried on `inbox_webhook.retry_schedule` (up to 20 % jitter; at least a"
            " 429's or 503's Retry-After) while later events wait; after the last retry the event"
            " is given up. At-least-once: dedupe on the envelope's `id`. Every attempt sends the"
            " same body bytes; redirects are not followed.",
            "InboxWebhookEvent",
            [t for t, _, _ in catalog.EVENTS],
        ),
        "channelMessage": _webhook(
            "A message or delivery status, POSTed to each webhook URL of its channel",
            "Each URL independently, in order, one request at a time. A failure (timeout,"
            " network error, 5xx, 401, 403, 404, 410, 429) is retried at +10 s, +30 s, +2 m,"
            " +5 m, +10 m; a URL still failing `channel_webhooks.pause_after` into its failure"
            " episode is paused, probed 15 min, 1 h and 6 h after the pause, then disabled. Any"
            " other status ends that message's delivery without a retry.",
            "ChannelWebhookEvent",
            [*CHANNEL_MESSAGE_TYPES, PROBE_TYPE],
        ),
    }


# -- the document --------------------------------------------------------------------------------

DESCRIPTION: Final = """\
The inbox management service's HTTP API: conversations, assignment, the inbox webhook, channel
webhooks, the team and the live feed. The product contract (CONTRACT.md) fixes what the
specification leaves open; this document describes what the server does.

- **Auth**: `Authorization: Bearer <API key>` on every route except the ones marked with no
  security (health, readiness, metrics, this document, accepting an invite, the unsubscribe link).
  Each key has its own rate limit (429 with `Retry-After`).
- **Errors** are always `{"error": {"code", "message"}}` (schema `Error`); each response lists the
  codes that route can answer. A path no route matches is 404 `not_found`; a known path with a
  method it does not serve is 405 `method_not_allowed` with an `Allow` header (both not listed per
  route). An unexpected failure is 500 `internal_error` (a bug: it is logged).
- **Fields**: every field of a response object is always present, `null` when unset. Unknown query
  parameters and unknown body fields are ignored.
- **Timestamps** are ISO 8601 UTC with microseconds and `Z`; inputs accept any ISO 8601 with an
  offset. Ids are opaque strings.
- **Idempotency-Key** on a keyed POST, PUT, PATCH or DELETE: a repeat with the same key and request
  within 24 h gets the first response again, with `Idempotent-Replayed: true`.
- Every path but the feed's websocket also answers OPTIONS without a key (200 with `Allow`), and
  HEAD where it answers GET; neither is listed."""

TAGS: Final = (
    "conversations",
    "channels",
    "messaging",
    "inbox webhook",
    "channel webhooks",
    "team",
    "keys",
    "feed",
    "operations",
)


def _components() -> dict[str, Any]:
    return {
        "schemas": schemas(),
        "securitySchemes": {
            BEARER: {
                "type": "http",
                "scheme": "bearer",
                "description": "An API key (`ibx_...`), shown once when it is created.",
            }
        },
        "parameters": {
            "IdempotencyKey": {
                "name": "Idempotency-Key",
                "in": "header",
                "description": "1 to 255 visible ASCII characters, scoped to the key's user. A"
                " repeat with the same method, path, query and body within 24 h gets the first"
                " response (5xx excepted) and changes nothing. The same key with another request"
                " is 422 idempotency_key_reused; a repeat while the first still runs is 409"
                " idempotency_in_progress; 409 idempotency_key_applied when the first was"
                " applied but its response was lost in a restart.",
                "schema": string(pattern=IDEMPOTENCY_KEY.pattern),
            }
        },
        "headers": {
            "WWWAuthenticate": {
                "required": True,
                "description": '`Bearer realm="inboxd"`.',
                "schema": string(pattern="^Bearer"),
            },
            "RetryAfter": {
                "required": True,
                "description": "Seconds until the key may send again.",
                "schema": string(pattern=r"^[0-9]+$"),
            },
            "RetryLater": {
                "description": "Seconds to wait before a retry (with the storage_* codes).",
                "schema": string(pattern=r"^[0-9]+$"),
            },
            "ConnectionClose": {
                "description": "The rest of the body is not read: the connection closes.",
                "schema": {"const": "close"},
            },
            "IdempotentReplayed": {
                "description": "`true` on the stored first response to an Idempotency-Key.",
                "schema": {"const": "true"},
            },
        },
    }


@functools.cache
def document() -> dict[str, Any]:
    """The OpenAPI document, built once. Callers must not change it."""
    paths: dict[str, dict[str, Any]] = {}
    for path, method, op in (
        *ops_operations(),
        *conversation_operations(),
        *messaging_operations(),
        *inbox_webhook_operations(),
        *team_operations(),
        *channel_webhook_operations(),
        *feed_operations(),
    ):
        paths.setdefault(path, {})[method] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "inboxd",
            "version": __version__,
            "description": DESCRIPTION,
            "license": {"name": "MIT", "identifier": "MIT"},
        },
        "security": [{BEARER: []}],
        "tags": [{"name": tag} for tag in TAGS],
        "paths": paths,
        "webhooks": webhooks(),
        "components": _components(),
    }


@functools.cache
def document_json() -> bytes:
    """The document as served, encoded once."""
    return orjson.dumps(document())
