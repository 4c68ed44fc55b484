"""Spec endpoint 7: message history with kind, newest first, cursor."""

from __future__ import annotations

import httpx

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
