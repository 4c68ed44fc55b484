"""Routes under /api/v1/messaging: how the messaging API reports messages (CONTRACT section 5).

Owner key only. Ingestion appends the message, updates the conversation and journals the events in
one transaction; forwarding to webhooks and the live feed reads them from the journal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from quart import Blueprint, Response

from inboxd import wire
from inboxd.api.app import authenticate, now_us, owner_only, principal, state
from inboxd.api.http import field, field_instant, json_body, json_response
from inboxd.errors import InvalidRequest
from inboxd.model import DIRECTIONS, SYSTEM
from inboxd.store import messages

blueprint = Blueprint("messaging", __name__, url_prefix="/api/v1/messaging")
blueprint.before_request(authenticate)

# The request's limits (the OpenAPI document states the same ones from here).
PHONE_CHARS: Final = re.compile(r"^\+?[0-9 ()\-.]+$")
MIN_PHONE_DIGITS: Final = 3
MAX_PHONE_DIGITS: Final = 20
MAX_PHONE_FIELD: Final = 64
STATUS_WORD: Final = re.compile(r"[A-Za-z][A-Za-z_]{0,31}")
MAX_SHORT: Final = 256
MAX_URL: Final = 2048
MAX_TYPE: Final = 32
MAX_TEMPLATE_LANGUAGE: Final = 32
MAX_MEDIA_DURATION: Final = 10**9


blueprint.before_request(owner_only("report messages"))


def _phone_digits(raw: str) -> str:
    digits = re.sub(r"[^0-9]", "", raw)
    if not PHONE_CHARS.match(raw) or not MIN_PHONE_DIGITS <= len(digits) <= MAX_PHONE_DIGITS:
        raise InvalidRequest(
            f"contact.phoneNumber must be a phone number of {MIN_PHONE_DIGITS} to "
            f"{MAX_PHONE_DIGITS} digits (spaces, dashes, dots, parentheses and a leading + are "
            "ignored)"
        )
    return digits


def _range(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = field(body, name, (int, float))
    if value is not None and not low <= value <= high:
        raise InvalidRequest(f"{name} must be between {low:g} and {high:g}")
    return None if value is None else float(value)


def parse_new_message(body: dict[str, Any]) -> messages.NewMessage:
    channel_id = field(body, "channelId", str, required=True, max_len=MAX_SHORT)
    direction = field(body, "direction", str, required=True)
    if direction not in DIRECTIONS:
        raise InvalidRequest("direction must be INBOUND or OUTBOUND")
    contact = field(body, "contact", dict, required=True)
    phone = _phone_digits(
        field(contact, "phoneNumber", str, required=True, max_len=MAX_PHONE_FIELD)
    )
    type_ = field(body, "type", str, required=True, max_len=MAX_TYPE)
    if not type_.strip():
        raise InvalidRequest("type must not be empty")
    if type_.upper() == SYSTEM:
        raise InvalidRequest("type SYSTEM is reserved for the inbox's own system events")
    file_size = field(body, "fileSize", int)
    if file_size is not None and file_size < 0:
        raise InvalidRequest("fileSize must not be negative")
    return messages.NewMessage(
        channel_id=channel_id,
        direction=direction,
        phone_number=phone,
        contact_name=field(contact, "name", str, max_len=MAX_SHORT) or None,
        contact_avatar=field(contact, "avatar", str, max_len=MAX_URL),
        type=type_,
        content=field(body, "content", str),
        media_url=field(body, "mediaUrl", str, max_len=MAX_URL),
        media_type=field(body, "mediaType", str, max_len=MAX_SHORT),
        file_name=field(body, "fileName", str, max_len=MAX_SHORT),
        file_size=file_size,
        media_duration=_range(body, "mediaDuration", 0, MAX_MEDIA_DURATION),
        thumbnail_url=field(body, "thumbnailUrl", str, max_len=MAX_URL),
        template_name=field(body, "templateName", str, max_len=MAX_SHORT),
        template_language=field(body, "templateLanguage", str, max_len=MAX_TEMPLATE_LANGUAGE),
        external_id=_external_id(body),
        sent_at=field_instant(body, "sentAt"),
        quoted_message_id=field(body, "quotedMessageId", str, max_len=MAX_SHORT),
        latitude=_range(body, "latitude", -90, 90),
        longitude=_range(body, "longitude", -180, 180),
    )


def _external_id(body: Mapping[str, Any]) -> str | None:
    """The messaging API's id of the message, which deduplicates it: an empty one would make
    every later message of the channel that also sends "" a repeat of the first."""
    external_id: str | None = field(body, "externalId", str, max_len=MAX_SHORT)
    if external_id == "":
        raise InvalidRequest("externalId must not be empty (leave it out when there is none)")
    return external_id


@blueprint.post("/messages")
async def ingest_message() -> Response:
    new = parse_new_message(await json_body())
    result = await state().store.write(messages.ingest, principal(), new, now_us())
    return json_response(wire.message(result.message), 201 if result.created else 200)


@blueprint.post("/messages/<message_id>/status")
async def set_message_status(message_id: str) -> Response:
    body = await json_body()
    raw = field(body, "status", str, required=True)
    if not STATUS_WORD.fullmatch(raw):  # checked before upper(), which turns "ß" into "SS"
        raise InvalidRequest("status must be a word like SENT, DELIVERED, READ or FAILED")
    status = raw.upper()
    message = await state().store.write(
        messages.set_status, principal(), message_id, status, now_us()
    )
    return json_response(wire.message(message))
