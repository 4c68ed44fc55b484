"""The schemas of the OpenAPI document (openapi.py): the resources of wire.py, the API's own
response shapes, and the events of the webhooks and the feed.

Conventions, encoded by the helpers: a response object lists every field, all required (wire.py
always sends them, null when unset) and nothing else (``additionalProperties: false``), so an
undocumented field is caught; a request body allows fields it does not list, because the server
ignores unknown fields (CONTRACT section 2). Timestamps carry the contract's exact form as a
pattern, so a timestamp in another form is caught as well.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from inboxd.api.http import MAX_LIMIT
from inboxd.model import DIRECTIONS, ROLE_OPERATOR, ROLES, SETTABLE_STATUSES
from inboxd.store import events as ev
from inboxd.store.team import INVITE_STATUSES
from inboxd.webhooks import catalog
from inboxd.webhooks.channel import PROBE_TYPE
from inboxd.webhooks.policy import URL_STATES

Schema = dict[str, Any]

# CONTRACT section 2: microseconds and Z. Cursors carry 13 more fractional digits (cursors.py).
TIMESTAMP_PATTERN: Final = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$"
CURSOR_PATTERN: Final = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{19}Z$"
SECRET_PATTERN: Final = r"^whsec_[A-Za-z0-9_-]{43,}$"

CONVERSATION_STATUSES: Final = ("OPEN", "CLOSED", "ASSIGNED", "RESOLVED", "BLOCKED")

# -- schema helpers ------------------------------------------------------------------------------


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    """``schema`` or null: how every unset field goes on the wire."""
    if "type" not in schema:  # a $ref
        return {"oneOf": [schema, {"type": "null"}]}
    out = {**schema, "type": [schema["type"], "null"]}
    if "enum" in schema:
        out["enum"] = [*schema["enum"], None]
    return out


def string(description: str | None = None, **keywords: Any) -> Schema:
    return _described({"type": "string", **keywords}, description)


def integer(description: str | None = None, **keywords: Any) -> Schema:
    return _described({"type": "integer", **keywords}, description)


def number(description: str | None = None, **keywords: Any) -> Schema:
    return _described({"type": "number", **keywords}, description)


def boolean(description: str | None = None) -> Schema:
    return _described({"type": "boolean"}, description)


def enum(*values: str, description: str | None = None) -> Schema:
    return _described({"type": "string", "enum": list(values)}, description)


def array(items: Schema, description: str | None = None) -> Schema:
    return _described({"type": "array", "items": items}, description)


def date_time(description: str | None = None) -> Schema:
    return _described(
        {"type": "string", "format": "date-time", "pattern": TIMESTAMP_PATTERN}, description
    )


def _described(schema: Schema, description: str | None) -> Schema:
    return schema if description is None else {**schema, "description": description}


def record(
    properties: Mapping[str, Schema],
    *,
    optional: Iterable[str] = (),
    description: str | None = None,
) -> Schema:
    """A response object: exactly these fields, each required unless named in ``optional``."""
    skip = set(optional)
    return _described(
        {
            "type": "object",
            "required": [name for name in properties if name not in skip],
            "properties": dict(properties),
            "additionalProperties": False,
        },
        description,
    )


def request_object(
    properties: Mapping[str, Schema],
    *,
    required: Iterable[str] = (),
    description: str | None = None,
) -> Schema:
    """A request body object: the server ignores fields it does not know, so they are allowed."""
    return _described(
        {"type": "object", "required": list(required), "properties": dict(properties)},
        description,
    )


# -- resources (spec "Resources and their fields", wire.py) ---------------------------------------


def _user_ref() -> Schema:
    return record(
        {"id": string("user id"), "name": string(), "avatar": nullable(string())},
        description="A user reference (assignedUser, author, actor, target).",
    )


def _conversation_fields() -> dict[str, Schema]:
    return {
        "id": string(),
        "channelId": string(),
        "contactId": string(),
        "status": enum(
            *CONVERSATION_STATUSES,
            description="The API sets only OPEN or CLOSED; the others appear on older rows.",
        ),
        "assignedTo": nullable(string("user id of the assignee")),
        "assignedUser": nullable(ref("UserRef")),
        "lastMessageAt": nullable(date_time()),
        "isUnread": boolean(),
        "tags": array(string()),
        "lastMessagePreview": nullable(string()),
        "lastMessageType": nullable(string()),
        "lastMessageDirection": nullable(enum(*DIRECTIONS)),
        "lastMessageStatus": nullable(string()),
        "unreadCount": integer(minimum=0),
        "isBlocked": boolean(),
        "title": nullable(string("custom title; null until renamed")),
        "lastCustomerMessageAt": nullable(date_time("the last inbound message")),
        "createdAt": date_time(),
        "updatedAt": date_time(),
        "channelType": string(),
        "customerPhone": string("the contact's phone digits"),
    }


def _message() -> Schema:
    return record(
        {
            "id": string(),
            "conversationId": string(),
            "channelId": string(),
            "direction": enum(*DIRECTIONS, description="SYSTEM rows are OUTBOUND."),
            "type": string("TEXT, IMAGE, ... as reported; SYSTEM marks the inbox's own events"),
            "content": nullable(string()),
            "mediaUrl": nullable(string()),
            "mediaType": nullable(string()),
            "fileName": nullable(string()),
            "fileSize": nullable(integer(minimum=0)),
            "mediaDuration": nullable(number(minimum=0)),
            "thumbnailUrl": nullable(string()),
            "templateName": nullable(string()),
            "templateLanguage": nullable(string()),
            "status": nullable(string("RECEIVED, PENDING, SENT, DELIVERED, READ, FAILED, ...")),
            "externalId": nullable(string("the messaging API's id; unique per channel")),
            "sentAt": nullable(date_time()),
            "deliveredAt": nullable(date_time()),
            "readAt": nullable(date_time()),
            "createdAt": date_time("sentAt when the message was reported with one"),
            "systemEventSource": nullable(string("API or INBOUND_MESSAGE on SYSTEM rows")),
            "systemEventOperatorName": nullable(string()),
            "systemEventOperatorEmail": nullable(string()),
            "assignmentEvent": nullable(ref("AssignmentEvent")),
            "author": nullable(ref("UserRef")),
            "quotedMessage": nullable(ref("QuotedMessage")),
            "latitude": nullable(number(minimum=-90, maximum=90)),
            "longitude": nullable(number(minimum=-180, maximum=180)),
        },
        description="A row of a conversation's history.",
    )


def _inbox_webhook_fields() -> dict[str, Schema]:
    return {
        "url": nullable(string("null when none is saved")),
        "secretPrefix": nullable(string(minLength=12, maxLength=12)),
        "createdAt": nullable(date_time()),
        "updatedAt": nullable(date_time()),
        "lastDeliveryAt": nullable(date_time("when the last attempt finished")),
        "lastDeliveryStatus": nullable(integer("HTTP status; null when no response came")),
        "lastDeliveryError": nullable(string()),
        "events": array(ref("WebhookEventDescription"), "every event the webhook can send"),
        "envelope": record(
            {
                "id": string("the event id; receivers dedupe on it"),
                "type": string("the event type"),
                "createdAt": date_time("when the change was committed"),
                "data": {"type": "object", "description": "the fields of the event type"},
            },
            description="The shape of the body that is posted: the first event's example.",
        ),
    }


def _channel_webhook_settings_fields() -> dict[str, Schema]:
    return {
        "channelId": string(),
        "notifications": record({"email": boolean("the owner's notice emails")}),
        "secretPrefix": nullable(
            string("null until the channel has a secret", minLength=12, maxLength=12)
        ),
        "webhooks": array(ref("ChannelWebhookUrl")),
    }


def _secret(description: str) -> Schema:
    return string(description, pattern=SECRET_PATTERN)


def _shown_once(schema: Schema) -> Schema:
    """A new key or secret: null when an Idempotency-Key repeat answers with this response
    again (it is shown once; the stored response keeps no copy)."""
    out = nullable(schema)
    out["description"] = (
        f"{schema.get('description', '')}; null in a replay for a repeated Idempotency-Key"
    ).lstrip("; ")
    return out


def resource_schemas() -> dict[str, Schema]:
    fields = _conversation_fields()
    conversation_page = record(
        {
            "data": array(ref("Conversation")),
            "pagination": record(
                {
                    "hasMore": boolean(),
                    "nextCursor": nullable(
                        ref("Cursor") | {"description": "null only for an empty page"}
                    ),
                    "limit": integer(minimum=1, maximum=MAX_LIMIT),
                }
            ),
        }
    )
    webhook = _inbox_webhook_fields()
    settings = _channel_webhook_settings_fields()
    return {
        "Error": record(
            {
                "error": record(
                    {
                        "code": string("snake_case, CONTRACT section 3"),
                        "message": string("one sentence for a person", minLength=1),
                    }
                )
            },
            description="Every error response.",
        ),
        "Cursor": string(
            "An ISO 8601 date-time: the row's instant plus 13 fractional digits that place it"
            " among rows of the same microsecond. Pass it back verbatim as `cursor`.",
            format="date-time",
            pattern=CURSOR_PATTERN,
        ),
        "UserRef": _user_ref(),
        "Contact": record(
            {
                "id": string(),
                "phoneNumber": string("digits", pattern=r"^[0-9]+$"),
                "name": string("defaults to the phone digits"),
                "avatar": string("empty when unknown"),
            }
        ),
        "Channel": record(
            {
                "id": string(),
                "name": string(),
                "status": string("ACTIVE is seen"),
                "type": string("e.g. WHATSAPP"),
            }
        ),
        "Assignee": record(
            {
                "id": string("usable as userId when assigning"),
                "name": string(),
                "avatar": nullable(string()),
                "role": enum(*ROLES),
            }
        ),
        "Conversation": record(
            {**fields, "contact": ref("Contact")},
            description="A conversation as reads return it (single read, list, search).",
        ),
        "UpdatedConversation": record(
            fields,
            description="A conversation as writes return it: the same fields without `contact`.",
        ),
        "ConversationPage": conversation_page,
        "SearchResult": record(
            {
                "contacts": array(ref("Conversation"), "matched by contact name or phone"),
                "messages": array(ref("Conversation"), "matched by message text, not repeated"),
            }
        ),
        "Counts": record(
            {
                "mine_open": integer(minimum=0),
                "unassigned": integer(minimum=0),
                "all": integer(minimum=0),
            }
        ),
        "AssignmentEvent": record(
            {
                "kind": enum("assign", "unassign"),
                "actor": nullable(ref("UserRef")),
                "target": ref("UserRef"),
            }
        ),
        "QuotedMessage": record(
            {
                "id": string(),
                "content": nullable(string()),
                "type": string(),
                "direction": enum(*DIRECTIONS),
                "contactName": string(),
                "contactPhone": string(),
                "mediaUrl": nullable(string()),
                "fileName": nullable(string()),
            }
        ),
        "Message": _message(),
        "MessagePage": record(
            {
                "messages": array(ref("Message"), "newest first"),
                "nextCursor": nullable(ref("Cursor") | {"description": "null on the last page"}),
                "hasMore": boolean(),
            }
        ),
        "ApiKey": record(
            {
                "keyId": string(),
                "prefix": string("the key's first characters, to recognise it"),
                "userId": string(),
                "createdAt": date_time(),
                "lastUsedAt": nullable(date_time("recorded in batches")),
                "revokedAt": nullable(date_time()),
            }
        ),
        "NewApiKey": record(
            {
                "apiKey": _shown_once(string("shown only here")),
                "keyId": string(),
                "prefix": string(),
            }
        ),
        "RevokedApiKey": record({"keyId": string(), "revoked": {"const": True}}),
        "Invite": record(
            {
                "inviteId": string(),
                "email": string(),
                "channelIds": array(string()),
                "status": enum(*INVITE_STATUSES),
                "createdAt": date_time(),
                "expiresAt": date_time("7 days after creation"),
            }
        ),
        "Member": record(
            {
                "memberId": string(),
                "userId": string(),
                "email": string(),
                "name": string(),
                "avatar": nullable(string()),
                "role": enum(ROLE_OPERATOR),
                "channelIds": array(string()),
                "createdAt": date_time(),
            }
        ),
        "NewMember": record(
            {
                "memberId": string(),
                "userId": string(),
                "apiKey": _shown_once(string("shown only here")),
            }
        ),
        "RemovedMember": record({"memberId": string(), "removed": {"const": True}}),
        "InboxWebhook": record(webhook, description="The inbox webhook configuration."),
        "SavedInboxWebhook": record(
            {
                **webhook,
                "created": boolean("true when this call created the webhook"),
                "secret": _shown_once(_secret("only when the webhook was created")),
            },
            optional=["secret"],
        )
        | {  # the secret comes exactly when the webhook was created
            "if": {"properties": {"created": {"const": True}}},
            "then": {"required": ["secret"]},
            "else": {"not": {"required": ["secret"]}},
        },
        "RotatedInboxWebhook": record(
            {
                **webhook,
                "created": {"const": False},
                "secret": _shown_once(
                    _secret("the new secret; the old one stops verifying at once")
                ),
            }
        ),
        "DeletedInboxWebhook": record({"removed": boolean("false when none was saved")}),
        "WebhookEventDescription": {
            "oneOf": [
                record(
                    {
                        "type": {"const": type_},
                        "description": string(),
                        "example": ref(EVENT_DATA[type_]),
                    }
                )
                for type_, _, _ in catalog.EVENTS
            ]
        },
        "DeliveryAttempt": record(
            {
                "eventId": string(),
                "type": string("the event type"),
                "deliveryId": string("X-Svc-Delivery: the same on every retry of one event"),
                "attempt": integer(minimum=1),
                "outcome": enum("delivered", "failed", "given_up"),
                "status": nullable(integer("HTTP status; null when no response came")),
                "error": nullable(string()),
                "durationMs": number(minimum=0),
                "at": date_time(),
            }
        ),
        "DeliveryPage": record(
            {
                "deliveries": array(ref("DeliveryAttempt"), "newest first"),
                "nextCursor": nullable(ref("Cursor")),
                "hasMore": boolean(),
            }
        ),
        "QueuedRedelivery": record({"eventId": string(), "queued": {"const": True}}),
        "ChannelWebhookUrls": record({"urls": array(string())}),
        "ChannelWebhookUrl": record(
            {
                "url": string(),
                "state": enum(*URL_STATES),
                "failureCount": integer(minimum=0),
                "firstFailureAt": nullable(date_time()),
                "lastFailureAt": nullable(date_time()),
                "lastStatus": nullable(integer()),
                "lastError": nullable(string()),
                "lastSuccessAt": nullable(date_time()),
                "pausedAt": nullable(date_time()),
                "nextProbeAt": nullable(date_time()),
                "probesDone": integer(minimum=0),
                "disabledAt": nullable(date_time()),
                "backlog": integer("messages kept for this URL", minimum=0),
            }
        ),
        "ChannelWebhookSettings": record(settings),
        "SavedChannelWebhook": record(
            {
                **settings,
                "secret": _shown_once(_secret("only when this call created the channel's secret")),
            },
            optional=["secret"],
        ),
        "RotatedChannelWebhook": record(
            {**settings, "secret": _shown_once(_secret("the new secret"))}
        ),
        "EventPage": record(
            {
                "events": array(ref("FeedEvent"), "oldest first"),
                "nextAfter": integer("pass back as `after`", minimum=0),
                "hasMore": boolean(),
                "reset": boolean(
                    "true when events after `after` were pruned or are older than"
                    " feed.retention, or `after` is beyond every seq given (as the feed's"
                    " `feed.reset`): `events` is then empty and `nextAfter` the journal's end;"
                    " refetch the state you keep, then go on from `nextAfter`"
                ),
            },
        ),
        "FeedReset": record(
            {"type": {"const": "feed.reset"}},
            description="Sent first when `since` is older than feed.retention or beyond every seq"
            " given: refetch.",
        ),
        "Health": record({"status": {"const": "ok"}}),
        "Ready": record({"status": {"const": "ready"}, "schemaVersion": integer()}),
        "NotReady": {
            "oneOf": [
                record({"status": {"const": "unavailable"}, "schemaVersion": integer()}),
                record({"status": {"const": "unavailable"}, "error": string()}),
            ]
        },
    }


# -- events (spec "Event types and data fields", CONTRACT section 8) ------------------------------


def _event_data_schemas() -> tuple[dict[str, str], dict[str, Schema]]:
    """Each event type's data: (type -> schema name, schema name -> schema)."""
    actor = string("user id of who did it")
    conversation: dict[str, tuple[str, dict[str, Schema]]] = {
        ev.STATUS_CHANGED: (
            "StatusChangedData",
            {
                "status": enum(*SETTABLE_STATUSES),
                "previousStatus": enum(*CONVERSATION_STATUSES),
                "actorUserId": nullable(string("null when an inbound message reopened it")),
            },
        ),
        ev.ASSIGNED: (
            "AssignedData",
            {
                "assigneeUserId": string(),
                "previousAssigneeUserId": nullable(string()),
                "actorUserId": actor,
            },
        ),
        ev.UNASSIGNED: (
            "UnassignedData",
            {
                "assigneeUserId": {"type": "null"},
                "previousAssigneeUserId": string(),
                "actorUserId": nullable(string("null when inboxd unassigned it itself")),
            },
        ),
        ev.BLOCKED: ("BlockedData", {"actorUserId": actor}),
        ev.UNBLOCKED: ("UnblockedData", {"actorUserId": actor}),
        ev.TITLE_CHANGED: (
            "TitleChangedData",
            {"title": string(), "previousTitle": nullable(string()), "actorUserId": actor},
        ),
        ev.CONVERSATION_READ: ("ConversationReadData", {"actorUserId": actor}),
    }
    channel_ids = array(string())
    user: dict[str, tuple[str, dict[str, Schema]]] = {
        ev.USER_INVITED: (
            "UserInvitedData",
            {
                "inviteId": string(),
                "email": string(),
                "channelIds": channel_ids,
                "actorUserId": actor,
            },
        ),
        ev.USER_ADDED: (
            "UserAddedData",
            {
                "memberId": string(),
                "userId": string(),
                "email": string(),
                "channelIds": channel_ids,
            },
        ),
        ev.USER_REMOVED: (
            "UserRemovedData",
            {"memberId": string(), "userId": string(), "actorUserId": actor},
        ),
        ev.USER_CHANNELS_CHANGED: (
            "UserChannelsChangedData",
            {
                "memberId": string(),
                "userId": string(),
                "channelIds": channel_ids,
                "actorUserId": actor,
            },
        ),
        ev.USER_INVITE_REVOKED: (
            "UserInviteRevokedData",
            {"inviteId": string(), "email": string(), "actorUserId": actor},
        ),
    }
    names = {ev.MESSAGE_CREATED: "Message", ev.MESSAGE_STATUS_CHANGED: "Message"}
    schemas: dict[str, Schema] = {}
    for type_, (name, fields) in conversation.items():
        names[type_] = name
        schemas[name] = record({"conversationId": string(), "channelId": string(), **fields})
    for type_, (name, fields) in user.items():
        names[type_] = name
        schemas[name] = record(fields)
    return names, schemas


EVENT_DATA: Final = _event_data_schemas()[0]
CHANNEL_MESSAGE_TYPES: Final = tuple(
    t.removeprefix("inbox.") for t in (ev.MESSAGE_CREATED, ev.MESSAGE_STATUS_CHANGED)
)


def _envelope(type_: str, data: Schema, *, with_seq: bool) -> Schema:
    seq = {"seq": integer("grows in commit order", minimum=1)} if with_seq else {}
    return record(
        {
            **seq,
            "id": string("the event id; receivers dedupe on it"),
            "type": {"const": type_},
            "createdAt": date_time("when the change was committed"),
            "data": data,
        }
    )


def event_schemas() -> dict[str, Schema]:
    webhook_types = [t for t, _, _ in catalog.EVENTS]
    out = _event_data_schemas()[1]
    out["InboxWebhookEvent"] = {
        "description": "The body of an inbox webhook POST: the spec's eleven event types.",
        "oneOf": [_envelope(t, ref(EVENT_DATA[t]), with_seq=False) for t in webhook_types],
    }
    out["FeedEvent"] = {
        "description": "A feed frame and an item of GET /api/v1/inbox/events: the webhook"
        " envelope plus `seq`. Message events and inbox.conversation.read come here only.",
        "oneOf": [_envelope(t, ref(name), with_seq=True) for t, name in EVENT_DATA.items()],
    }
    out["ChannelWebhookEvent"] = {
        "description": "The body of a channel webhook POST.",
        "oneOf": [
            *(_envelope(t, ref("Message"), with_seq=False) for t in CHANNEL_MESSAGE_TYPES),
            _envelope(
                PROBE_TYPE,
                record({"channelId": string(), "url": string()}),
                with_seq=False,
            )
            | {"description": "A probe of a paused URL when no kept message is left to resend."},
        ],
    }
    return out


def schemas() -> dict[str, Schema]:
    """``components.schemas`` of the document."""
    return {**resource_schemas(), **event_schemas()}
