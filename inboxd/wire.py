"""The JSON shapes of the spec's resources, built from model values.

Every field of a resource is always present (null when unset), so clients never have to tell
"absent" from "null"; the spec's exceptions are honoured: a Conversation carries ``contact`` on reads
(single read, list, search) and not on writes.
"""

from __future__ import annotations

from typing import Any

from inboxd.model import (
    ApiKeyInfo,
    Assignee,
    Channel,
    Contact,
    Conversation,
    Counts,
    Message,
    QuotedMessage,
    UserRef,
)
from inboxd.timeutil import format_opt, format_us

JSON = dict[str, Any]


def user_ref(u: UserRef | None) -> JSON | None:
    return None if u is None else {"id": u.id, "name": u.name, "avatar": u.avatar}


def channel(c: Channel) -> JSON:
    return {"id": c.id, "name": c.name, "status": c.status, "type": c.type}


def assignee(a: Assignee) -> JSON:
    return {"id": a.id, "name": a.name, "avatar": a.avatar, "role": a.role}


def contact(c: Contact) -> JSON:
    return {"id": c.id, "phoneNumber": c.phone_number, "name": c.name, "avatar": c.avatar}


def conversation(c: Conversation, *, with_contact: bool) -> JSON:
    out: JSON = {
        "id": c.id,
        "channelId": c.channel_id,
        "contactId": c.contact.id,
        "status": c.status,
        "assignedTo": None if c.assigned_user is None else c.assigned_user.id,
        "assignedUser": user_ref(c.assigned_user),
        "lastMessageAt": format_opt(c.last_message_at),
        "isUnread": c.unread_count > 0,
        "tags": list(c.tags),
        "lastMessagePreview": c.last_message_preview,
        "lastMessageType": c.last_message_type,
        "lastMessageDirection": c.last_message_direction,
        "lastMessageStatus": c.last_message_status,
        "unreadCount": c.unread_count,
        "isBlocked": c.is_blocked,
        "title": c.title,
        "lastCustomerMessageAt": format_opt(c.last_customer_message_at),
        "createdAt": format_us(c.created_at),
        "updatedAt": format_us(c.updated_at),
        "channelType": c.channel_type,
        "customerPhone": c.contact.phone_number,
    }
    if with_contact:
        out["contact"] = contact(c.contact)
    return out


def quoted(q: QuotedMessage | None) -> JSON | None:
    if q is None:
        return None
    return {
        "id": q.id,
        "content": q.content,
        "type": q.type,
        "direction": q.direction,
        "contactName": q.contact_name,
        "contactPhone": q.contact_phone,
        "mediaUrl": q.media_url,
        "fileName": q.file_name,
    }


def message(m: Message) -> JSON:
    return {
        "id": m.id,
        "conversationId": m.conversation_id,
        "channelId": m.channel_id,
        "direction": m.direction,
        "type": m.type,
        "content": m.content,
        "mediaUrl": m.media_url,
        "mediaType": m.media_type,
        "fileName": m.file_name,
        "fileSize": m.file_size,
        "mediaDuration": m.media_duration,
        "thumbnailUrl": m.thumbnail_url,
        "templateName": m.template_name,
        "templateLanguage": m.template_language,
        "status": m.status,
        "externalId": m.external_id,
        "sentAt": format_opt(m.sent_at),
        "deliveredAt": format_opt(m.delivered_at),
        "readAt": format_opt(m.read_at),
        "createdAt": format_us(m.created_at),
        "systemEventSource": m.system_event_source,
        "systemEventOperatorName": m.system_event_operator_name,
        "systemEventOperatorEmail": m.system_event_operator_email,
        "assignmentEvent": m.assignment_event,
        "author": user_ref(m.author),
        "quotedMessage": quoted(m.quoted_message),
        "latitude": m.latitude,
        "longitude": m.longitude,
    }


def counts(c: Counts) -> JSON:
    return {"mine_open": c.mine_open, "unassigned": c.unassigned, "all": c.all}


def api_key(k: ApiKeyInfo) -> JSON:
    return {
        "keyId": k.id,
        "prefix": k.prefix,
        "userId": k.user_id,
        "createdAt": format_us(k.created_at),
        "lastUsedAt": format_opt(k.last_used_at),
        "revokedAt": format_opt(k.revoked_at),
    }
