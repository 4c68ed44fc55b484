"""Messaging ingestion (CONTRACT section 5): contacts, conversations, counters, idempotency."""

from __future__ import annotations

import json

import httpx

from inboxd.store.db import Store
from tests import arrange
from tests.conftest import Seed, ingest


async def get_conversation(client: httpx.AsyncClient, conversation_id: str) -> dict[str, object]:
    response = await client.get(f"/api/v1/inbox/conversations/{conversation_id}")
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


async def test_first_inbound_creates_contact_and_open_unassigned_conversation(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    msg = await ingest(
        owner,
        seeded.sales_id,
        "+44 (20) 7946-0958",
        contact={"name": "Grace Hopper", "avatar": "https://img.example/g.png"},
        content="Hello, is anyone there?",
    )
    assert msg["direction"] == "INBOUND"
    assert msg["channelId"] == seeded.sales_id
    assert msg["content"] == "Hello, is anyone there?"
    conv = await get_conversation(owner, msg["conversationId"])
    assert conv["status"] == "OPEN"
    assert conv["assignedTo"] is None and conv["assignedUser"] is None
    assert conv["contact"] == {
        "id": conv["contactId"],
        "phoneNumber": "442079460958",
        "name": "Grace Hopper",
        "avatar": "https://img.example/g.png",
    }
    assert conv["customerPhone"] == "442079460958"
    assert conv["channelType"] == "WHATSAPP"
    assert conv["unreadCount"] == 1 and conv["isUnread"] is True
    assert conv["lastMessageAt"] == msg["createdAt"]
    assert conv["lastCustomerMessageAt"] == msg["createdAt"]
    assert conv["lastMessagePreview"] == "Hello, is anyone there?"
    assert conv["lastMessageDirection"] == "INBOUND"
    assert conv["lastMessageType"] == "TEXT"
    assert conv["isBlocked"] is False and conv["title"] is None and conv["tags"] == []


async def test_same_phone_reuses_contact_and_conversation(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    a = await ingest(owner, seeded.sales_id, "15550001", content="one")
    b = await ingest(owner, seeded.sales_id, "+1 555 0001", content="two")
    c = await ingest(owner, seeded.support_id, "15550001", content="other channel")
    assert a["conversationId"] == b["conversationId"]
    assert c["conversationId"] != a["conversationId"]
    conv = await get_conversation(owner, a["conversationId"])
    assert conv["unreadCount"] == 2
    assert conv["lastMessagePreview"] == "two"


async def test_outbound_does_not_raise_unread_or_customer_time(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    inbound = await ingest(owner, seeded.sales_id, "15550001", content="hi")
    out = await ingest(owner, seeded.sales_id, "15550001", direction="OUTBOUND", content="hello!")
    assert out["status"] == "PENDING"
    conv = await get_conversation(owner, inbound["conversationId"])
    assert conv["unreadCount"] == 1
    assert conv["lastCustomerMessageAt"] == inbound["createdAt"]
    assert conv["lastMessageAt"] == out["createdAt"]
    assert conv["lastMessageDirection"] == "OUTBOUND"


async def test_same_external_id_returns_stored_message_with_200_and_changes_nothing(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    body = {
        "channelId": seeded.sales_id,
        "direction": "INBOUND",
        "contact": {"phoneNumber": "15550001"},
        "type": "TEXT",
        "content": "first",
        "externalId": "wamid.123",
    }
    first = await owner.post("/api/v1/messaging/messages", json=body)
    assert first.status_code == 201
    retry = await owner.post("/api/v1/messaging/messages", json={**body, "content": "changed"})
    assert retry.status_code == 200
    assert retry.json() == first.json()
    conv = await get_conversation(owner, first.json()["conversationId"])
    assert conv["unreadCount"] == 1
    assert arrange.event_types(store) == ["inbox.message.created"]
    # The same externalId on another channel is another message.
    other = await owner.post(
        "/api/v1/messaging/messages", json={**body, "channelId": seeded.support_id}
    )
    assert other.status_code == 201
    # An empty one is refused: stored, it made every later "" of the channel (another
    # contact's message too) a repeat of the first, answered with the first.
    empty = await owner.post("/api/v1/messaging/messages", json={**body, "externalId": ""})
    assert empty.status_code == 400
    assert empty.json()["error"]["message"].startswith("externalId must not be empty")


async def test_sent_at_sets_created_at_and_late_older_message_never_moves_last_message_back(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    new = await ingest(
        owner, seeded.sales_id, "15550001", content="newer", sentAt="2026-01-02T10:00:00+02:00"
    )
    assert new["createdAt"] == "2026-01-02T08:00:00.000000Z"
    assert new["sentAt"] == "2026-01-02T08:00:00.000000Z"
    old = await ingest(
        owner, seeded.sales_id, "15550001", content="older", sentAt="2026-01-01T08:00:00Z"
    )
    conv = await get_conversation(owner, new["conversationId"])
    assert conv["lastMessageAt"] == "2026-01-02T08:00:00.000000Z"
    assert conv["lastMessagePreview"] == "newer"
    assert conv["lastCustomerMessageAt"] == "2026-01-02T08:00:00.000000Z"
    assert conv["unreadCount"] == 2
    history = (
        await owner.get(f"/api/v1/inbox/conversations/{new['conversationId']}/messages")
    ).json()
    assert [m["id"] for m in history["messages"]] == [new["id"], old["id"]]


async def test_inbound_for_blocked_contact_is_422_and_stores_nothing(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    msg = await ingest(owner, seeded.sales_id, "15550001", content="hi")
    arrange.block(store, msg["conversationId"])
    before = arrange.event_types(store)
    response = await owner.post(
        "/api/v1/messaging/messages",
        json={
            "channelId": seeded.sales_id,
            "direction": "INBOUND",
            "contact": {"phoneNumber": "15550001", "name": "Renamed"},
            "type": "TEXT",
            "content": "let me in",
        },
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "contact_blocked"
    conv = await get_conversation(owner, msg["conversationId"])
    assert conv["unreadCount"] == 1 and conv["isBlocked"] is True
    assert conv["contact"]["name"] == "15550001"  # the rejected message changed nothing
    assert arrange.event_types(store) == before
    count = store.read_sync(lambda c: c.execute("SELECT count(*) FROM messages").fetchone()[0])
    assert count == 1


async def test_inbound_into_closed_conversation_reopens_it_with_system_row_and_event(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    first = await ingest(owner, seeded.sales_id, "15550001", content="hi")
    arrange.set_status(store, first["conversationId"], "CLOSED")
    second = await ingest(owner, seeded.sales_id, "15550001", content="me again")
    conv = await get_conversation(owner, first["conversationId"])
    assert conv["status"] == "OPEN"
    system = (
        await owner.get(
            f"/api/v1/inbox/conversations/{first['conversationId']}/messages",
            params={"kind": "system"},
        )
    ).json()["messages"]
    assert len(system) == 1
    assert system[0]["type"] == "SYSTEM"
    assert system[0]["systemEventSource"] == "INBOUND_MESSAGE"
    # A SYSTEM row does not become the conversation's last message.
    assert conv["lastMessagePreview"] == "me again"
    assert conv["lastMessageAt"] == second["createdAt"]
    events = store.read_sync(
        lambda c: c.execute("SELECT type, body FROM events ORDER BY seq").fetchall()
    )
    status_events = [
        json.loads(r[1]) for r in events if r[0] == "inbox.conversation.status_changed"
    ]
    assert len(status_events) == 1
    assert status_events[0]["data"] == {
        "conversationId": first["conversationId"],
        "channelId": seeded.sales_id,
        "status": "OPEN",
        "previousStatus": "CLOSED",
        "actorUserId": None,
    }
    # An outbound message does not reopen.
    arrange.set_status(store, first["conversationId"], "CLOSED")
    await ingest(owner, seeded.sales_id, "15550001", direction="OUTBOUND", content="bye")
    assert (await get_conversation(owner, first["conversationId"]))["status"] == "CLOSED"


async def test_status_updates_set_times_and_never_go_backwards(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    out = await ingest(owner, seeded.sales_id, "15550001", direction="OUTBOUND", content="hi")
    url = f"/api/v1/messaging/messages/{out['id']}/status"
    delivered = (await owner.post(url, json={"status": "DELIVERED"})).json()
    assert delivered["status"] == "DELIVERED"
    assert delivered["deliveredAt"] is not None and delivered["readAt"] is None
    read = (await owner.post(url, json={"status": "read"})).json()
    assert read["status"] == "READ" and read["readAt"] is not None
    assert read["deliveredAt"] == delivered["deliveredAt"]
    late = (await owner.post(url, json={"status": "DELIVERED"})).json()
    assert late["status"] == "READ"
    conv = await get_conversation(owner, out["conversationId"])
    assert conv["lastMessageStatus"] == "READ"
    types = arrange.event_types(store)
    assert types.count("inbox.message.status_changed") == 2  # the late DELIVERED changed nothing
    failed = (await owner.post(url, json={"status": "FAILED"})).json()
    assert failed["status"] == "FAILED"


async def test_a_status_report_sets_sent_at_only_for_an_outbound_message_sent_now(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    """CONTRACT section 5: a report sets the status and the matching deliveredAt / readAt. An
    inbound message's sentAt is the customer's: READ used to stamp it with the read time."""
    inbound = await ingest(owner, seeded.sales_id, "15550001", content="hi")
    read = await owner.post(
        f"/api/v1/messaging/messages/{inbound['id']}/status", json={"status": "READ"}
    )
    assert read.status_code == 200
    assert read.json()["sentAt"] is None and read.json()["readAt"] is not None
    outbound = await ingest(owner, seeded.sales_id, "15550001", direction="OUTBOUND", content="yo")
    url = f"/api/v1/messaging/messages/{outbound['id']}/status"
    delivered = (await owner.post(url, json={"status": "DELIVERED"})).json()
    assert delivered["sentAt"] is None  # when it was sent is not known
    later = await ingest(owner, seeded.sales_id, "15550001", direction="OUTBOUND", content="yo")
    sent = (
        await owner.post(
            f"/api/v1/messaging/messages/{later['id']}/status", json={"status": "SENT"}
        )
    ).json()
    assert sent["sentAt"] is not None and sent["deliveredAt"] is None


async def test_read_clears_unread_and_journals_once(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    msg = await ingest(owner, seeded.sales_id, "15550001", content="hi")
    await ingest(owner, seeded.sales_id, "15550001", content="hi again")
    url = f"/api/v1/inbox/conversations/{msg['conversationId']}/read"
    response = await owner.post(url)
    assert response.status_code == 200
    body = response.json()
    assert body["unreadCount"] == 0 and body["isUnread"] is False
    assert "contact" not in body
    assert (await owner.post(url)).status_code == 200
    assert arrange.event_types(store).count("inbox.conversation.read") == 1


async def test_quoted_message_is_resolved(owner: httpx.AsyncClient, seeded: Seed) -> None:
    first = await ingest(
        owner, seeded.sales_id, "15550001", contact={"name": "Ada"}, content="What's the price?"
    )
    reply = await ingest(
        owner,
        seeded.sales_id,
        "15550001",
        direction="OUTBOUND",
        content="10 EUR",
        quotedMessageId=first["id"],
    )
    assert reply["quotedMessage"] == {
        "id": first["id"],
        "content": "What's the price?",
        "type": "TEXT",
        "direction": "INBOUND",
        "contactName": "Ada",
        "contactPhone": "15550001",
        "mediaUrl": None,
        "fileName": None,
    }


async def test_every_message_field_round_trips(owner: httpx.AsyncClient, seeded: Seed) -> None:
    fields = {
        "type": "DOCUMENT",
        "content": "see attached",
        "mediaUrl": "https://cdn.example/f.pdf",
        "mediaType": "application/pdf",
        "fileName": "f.pdf",
        "fileSize": 12345,
        "mediaDuration": 1.5,
        "thumbnailUrl": "https://cdn.example/f.png",
        "templateName": "invoice",
        "templateLanguage": "en",
        "externalId": "ext-1",
        "latitude": 52.52,
        "longitude": 13.405,
    }
    msg = await ingest(owner, seeded.sales_id, "15550001", **dict(fields))
    for key, value in fields.items():
        assert msg[key] == value, key
    history = (
        await owner.get(f"/api/v1/inbox/conversations/{msg['conversationId']}/messages")
    ).json()["messages"]
    assert history == [msg]
