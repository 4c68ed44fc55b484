"""The service's values: frozen attrs classes built by the store and turned into JSON by wire.py."""

from __future__ import annotations

import re
from typing import Final

import attrs

# An email address as the invite endpoint and the CLI take it: something@domain, one "@", no
# white space or control characters. The domain may be a single label: a self-hosted daemon
# mails through a local server, and its own default owner is owner@localhost.
EMAIL: Final = re.compile(r"^[^@\s\x00-\x1f\x7f]+@[^@\s\x00-\x1f\x7f]+$")
MAX_EMAIL: Final = 320
MAX_NAME: Final = 200  # a member's or a channel's name, once trimmed


def email_address(text: str) -> str | None:
    """``text`` without the white space around it if it is an email address of at most
    MAX_EMAIL characters (the spaces around it do not count, as for names), else None. The
    invite endpoint and the CLI (``init --owner-email``, ``user add --email``) both take emails
    through this."""
    email = text.strip()
    if len(email) > MAX_EMAIL or not EMAIL.match(email):
        return None
    return email


OPEN: Final = "OPEN"
CLOSED: Final = "CLOSED"
SETTABLE_STATUSES: Final = (OPEN, CLOSED)
INBOUND: Final = "INBOUND"
OUTBOUND: Final = "OUTBOUND"
DIRECTIONS: Final = (INBOUND, OUTBOUND)
SYSTEM: Final = "SYSTEM"
ROLE_OWNER: Final = "OWNER"
ROLE_OPERATOR: Final = "OPERATOR"
ROLES: Final = (ROLE_OWNER, ROLE_OPERATOR)


@attrs.frozen
class Principal:
    """Who a request acts as: the key's user, and the channels that user can open."""

    key_pk: int
    key_id: str
    account_pk: int
    user_pk: int
    user_id: str
    is_owner: bool
    # None for the owner (every channel of the account); else the channel pks the user can open.
    channel_pks: frozenset[int] | None

    def can_open(self, channel_pk: int) -> bool:
        return self.channel_pks is None or channel_pk in self.channel_pks


@attrs.frozen
class UserRef:
    id: str
    name: str
    avatar: str | None


@attrs.frozen
class Assignee:
    id: str
    name: str
    avatar: str | None
    role: str


@attrs.frozen
class Channel:
    pk: int
    id: str
    name: str
    type: str
    status: str
    created_at: int


@attrs.frozen
class Contact:
    id: str
    phone_number: str
    name: str
    avatar: str


@attrs.frozen
class Conversation:
    pk: int
    id: str
    channel_pk: int
    channel_id: str
    channel_type: str
    contact: Contact
    status: str
    assigned_user: UserRef | None
    is_blocked: bool
    title: str | None
    tags: tuple[str, ...]
    unread_count: int
    last_message_at: int | None
    last_message_preview: str | None
    last_message_type: str | None
    last_message_direction: str | None
    last_message_status: str | None
    last_customer_message_at: int | None
    sort_at: int
    created_at: int
    updated_at: int


@attrs.frozen
class QuotedMessage:
    id: str
    content: str | None
    type: str
    direction: str
    contact_name: str
    contact_phone: str
    media_url: str | None
    file_name: str | None


@attrs.frozen
class Message:
    pk: int
    id: str
    conversation_id: str
    channel_id: str
    direction: str
    type: str
    content: str | None
    media_url: str | None
    media_type: str | None
    file_name: str | None
    file_size: int | None
    media_duration: float | None
    thumbnail_url: str | None
    template_name: str | None
    template_language: str | None
    status: str | None
    external_id: str | None
    sent_at: int | None
    delivered_at: int | None
    read_at: int | None
    created_at: int
    system_event_source: str | None
    system_event_operator_name: str | None
    system_event_operator_email: str | None
    # Stored as JSON when the row was written: {kind, actor, target}.
    assignment_event: dict[str, object] | None
    author: UserRef | None
    quoted_message: QuotedMessage | None
    latitude: float | None
    longitude: float | None


@attrs.frozen
class Counts:
    mine_open: int
    unassigned: int
    all: int


@attrs.frozen
class ApiKeyInfo:
    id: str
    prefix: str
    user_id: str
    created_at: int
    last_used_at: int | None
    revoked_at: int | None
