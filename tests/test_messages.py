"""Spec endpoint 7: message history with kind, newest first, cursor."""

from __future__ import annotations

import json

import httpx

from inboxd.store import accounts, conversations, messages
from inboxd.store.db import Store
from tests import arrange
from tests.conftest import Seed, ingest


async def test_history_kinds_and_order(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    a = await ingest(owner, seeded.sales_id, "1001", content="one", sentAt="2026-01-01T10:00:00Z")
    arrange.set_status(store, a["conversationId"], "CLOSED")
    b = await ingest(owner, seeded.sales_id, "1001", content="two", sentAt="2026-01-01T10:01:00Z")
    note = await ingest(
        owner, seeded.sales_id, "1001", direction="OUTBOUND", type="NOTE", content="internal note"
    )
    url = f"/api/v1/inbox/conversations/{a['conversationId']}/messages"
    everything = (await owner.get(url)).json()
    types = [m["type"] for m in everything["messages"]]
    # The reopen row is written at arrival time, after the imported texts, before the note.
    assert types == ["NOTE", "SYSTEM", "TEXT", "TEXT"]
    assert everything["hasMore"] is False and everything["nextCursor"] is None
    only_messages = (await owner.get(url, params={"kind": "messages"})).json()["messages"]
    assert [m["id"] for m in only_messages] == [note["id"], b["id"], a["id"]]
    system = (await owner.get(url, params={"kind": "system"})).json()["messages"]
    assert [m["type"] for m in system] == ["SYSTEM"]
    assert system[0]["conversationId"] == a["conversationId"]
    assert system[0]["direction"] == "OUTBOUND"
    bad = await owner.get(url, params={"kind": "notes"})
    assert bad.status_code == 400


async def test_history_cursor_keeps_the_kind_filter(owner: httpx.AsyncClient, seeded: Seed) -> None:
    conv_id = None
    for i in range(5):
        msg = await ingest(
            owner, seeded.sales_id, "1001", content=f"m{i}", sentAt=f"2026-01-01T10:0{i}:00Z"
        )
        conv_id = msg["conversationId"]
    url = f"/api/v1/inbox/conversations/{conv_id}/messages"
    first = (await owner.get(url, params={"limit": 2, "kind": "messages"})).json()
    assert [m["content"] for m in first["messages"]] == ["m4", "m3"]
    assert first["hasMore"] is True
    second = (
        await owner.get(url, params={"limit": 2, "kind": "messages", "cursor": first["nextCursor"]})
    ).json()
    assert [m["content"] for m in second["messages"]] == ["m2", "m1"]
    plain = (await owner.get(url, params={"cursor": "2026-01-01T10:02:00Z"})).json()
    assert [m["content"] for m in plain["messages"]] == ["m1", "m0"]


async def test_text_beyond_ascii_is_served_as_sent(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    """Accents, CJK, right-to-left text and 4-byte emoji come back exactly in the list page,
    read one and history, and search finds them. The stored and SQL-built JSON is read as the
    UTF-8 bytes SQLite holds and served as it is: the store functions return bytes (decoding
    into a str and encoding back took ten times as long for 50 rows with emoji, and a served
    list page about a sixth more: bench/HISTORY.md, twelfth session)."""
    name = "José Müller 王小明 محمد"
    content = "Olá! ¿Dónde está mi pedido? 🚚📦 お願いします 👍🏽"
    msg = await ingest(owner, seeded.sales_id, "1009", content=content, contact={"name": name})
    conv_id = msg["conversationId"]
    rename = await owner.patch(
        f"/api/v1/inbox/conversations/{conv_id}/title", json={"title": "Pedido 🎉 nº 7"}
    )
    assert rename.status_code == 200 and rename.json()["title"] == "Pedido 🎉 nº 7"

    page = await owner.get("/api/v1/inbox/conversations", params={"limit": 50})
    assert page.headers["content-type"] == "application/json"
    mine = next(c for c in page.json()["data"] if c["id"] == conv_id)
    assert mine["contact"]["name"] == name
    assert mine["lastMessagePreview"] == content
    assert mine["title"] == "Pedido 🎉 nº 7"
    assert name.encode() in page.content  # as UTF-8 (orjson never escapes it; held here too)

    one = (await owner.get(f"/api/v1/inbox/conversations/{conv_id}")).json()
    assert (one["contact"]["name"], one["title"]) == (name, "Pedido 🎉 nº 7")

    found = await owner.get(
        "/api/v1/inbox/conversations/search",
        params={"channelId": seeded.sales_id, "query": "pedido? 🚚"},
    )
    assert [c["id"] for c in found.json()["messages"]] == [conv_id]

    history = await owner.get(f"/api/v1/inbox/conversations/{conv_id}/messages")
    contents = [m["content"] for m in history.json()["messages"]]
    assert content in contents
    assert content.encode() in history.content

    who = store.read_sync(accounts.authenticate, seeded.owner_key)
    stored = store.read_sync(conversations.get_json, who, conv_id)
    page_json = store.read_sync(
        conversations.list_page_json, who, conversations.ListQuery(limit=50)
    ).rows.json
    history_json = store.read_sync(messages.history_json, who, conv_id, "all", 50, None).json
    assert all(type(b) is bytes for b in (stored, page_json, history_json))
    assert json.loads(stored)["contact"]["name"] == name
