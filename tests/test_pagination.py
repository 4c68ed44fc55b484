"""Walking pages returns every row exactly once and in order (CONTRACT section 2).

Hypothesis drives the store's own query functions on a real SQLite file (fast enough for many
examples); the HTTP tests walk hundreds of rows that share one timestamp through the real API.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inboxd import cursors
from inboxd.model import Principal
from inboxd.store import accounts, conversations, messages
from inboxd.store.db import Store
from inboxd.timeutil import parse_instant
from tests import arrange
from tests.conftest import Seed, ingest, seed_store

BASE = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z in microseconds


def owner_principal(store: Store, key: str) -> Principal:
    who = store.read_sync(accounts.authenticate, key)
    assert who is not None
    return who


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    times=st.lists(st.integers(min_value=0, max_value=3), min_size=0, max_size=60),
    limit=st.integers(min_value=1, max_value=7),
    closed=st.sets(st.integers(min_value=0, max_value=59)),
    status=st.sampled_from([None, "OPEN", "CLOSED"]),
)
def test_conversation_walk_is_complete_and_ordered(
    times: list[int], limit: int, closed: set[int], status: str | None
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        seed = seed_store(Path(tmp) / "data")
        store = Store.open(seed.data_dir, readers=1)
        try:
            who = owner_principal(store, seed.owner_key)
            ids = []
            for i, t in enumerate(times):
                new = messages.NewMessage(
                    channel_id=seed.sales_id if i % 2 else seed.support_id,
                    direction="INBOUND",
                    phone_number=f"1000{i:03d}",
                    contact_name=None,
                    contact_avatar=None,
                    type="TEXT",
                    content="x",
                    sent_at=BASE + t,  # only four distinct instants: many ties
                )
                ids.append(
                    store.write_sync(messages.ingest, who, new, BASE).message.conversation_id
                )
                if i in closed:
                    arrange.set_status(store, ids[-1], "CLOSED")
            expected = {
                cid
                for i, cid in enumerate(ids)
                if status is None or (status == "CLOSED") == (i in closed)
            }
            seen: list[dict[str, Any]] = []
            cursor = None
            for _ in range(len(times) + 2):
                page = store.read_sync(
                    conversations.list_page_json,
                    who,
                    conversations.ListQuery(limit=limit, cursor=cursor, status=status),
                )
                rows = json.loads(page.rows.json)
                seen += rows
                assert len(rows) <= limit
                if not page.has_more:
                    break
                assert page.rows.last is not None
                # The cursor is handed to the client as a string and read back from one.
                cursor = cursors.decode(cursors.encode(*page.rows.last))
            else:
                raise AssertionError("the walk did not end")
            assert [c["id"] for c in seen if c["id"] in expected] == [c["id"] for c in seen]
            assert sorted(c["id"] for c in seen) == sorted(expected)
            stamps = [c["lastMessageAt"] for c in seen]  # same format: they sort as text
            assert stamps == sorted(stamps, reverse=True)
        finally:
            store.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=0, max_size=50),
    limit=st.integers(min_value=1, max_value=6),
    kind=st.sampled_from(messages.KINDS),
)
def test_history_walk_is_complete_and_ordered(
    rows: list[tuple[int, bool]], limit: int, kind: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        seed = seed_store(Path(tmp) / "data")
        store = Store.open(seed.data_dir, readers=1)
        try:
            who = owner_principal(store, seed.owner_key)
            first = messages.NewMessage(
                channel_id=seed.sales_id,
                direction="OUTBOUND",
                phone_number="100000",
                contact_name=None,
                contact_avatar=None,
                type="TEXT",
                sent_at=BASE,
            )
            conv_id = store.write_sync(messages.ingest, who, first, BASE).message.conversation_id
            conv_pk = store.read_sync(
                lambda c: c.execute(
                    "SELECT pk FROM conversations WHERE id = ?", (conv_id,)
                ).fetchone()[0]
            )
            expected_all = [(BASE, False)]
            for t, system in rows:
                if system:
                    store.write_sync(
                        lambda c, t=t: messages.write_system_message(
                            c,
                            account_pk=who.account_pk,
                            conversation_pk=conv_pk,
                            conversation_id=conv_id,
                            channel_pk=1,
                            channel_id=seed.sales_id,
                            content="status changed",
                            source=messages.SOURCE_API,
                            actor=None,
                            now=BASE + t,
                        )
                    )
                else:
                    new = messages.NewMessage(
                        channel_id=seed.sales_id,
                        direction="OUTBOUND",
                        phone_number="100000",
                        contact_name=None,
                        contact_avatar=None,
                        type="TEXT",
                        sent_at=BASE + t,
                    )
                    store.write_sync(messages.ingest, who, new, BASE)
                expected_all.append((BASE + t, system))
            want = [x for x in expected_all if kind == "all" or (kind == "system") == x[1]]
            seen: list[dict[str, Any]] = []
            cursor = None
            while True:
                page = store.read_sync(messages.history_json, who, conv_id, kind, limit, cursor)
                seen += json.loads(page.json)
                if not page.has_more:
                    break
                assert page.last is not None
                cursor = cursors.decode(cursors.encode(*page.last))
            assert len({m["id"] for m in seen}) == len(seen) == len(want)
            assert [parse_instant(m["createdAt"]) for m in seen] == sorted(
                (t for t, _ in want), reverse=True
            )
            assert all((m["type"] == "SYSTEM") == (kind == "system") for m in seen if kind != "all")
        finally:
            store.close()


async def test_http_walk_over_hundreds_of_equal_timestamps(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    same = "2026-03-01T12:00:00.000000Z"
    created = set()
    for i in range(230):
        msg = await ingest(owner, seeded.sales_id, f"3000{i:04d}", sentAt=same, content=f"m{i}")
        created.add(msg["conversationId"])
    seen: list[str] = []
    params: dict[str, Any] = {"limit": 37}
    while True:
        body = (await owner.get("/api/v1/inbox/conversations", params=params)).json()
        seen += [c["id"] for c in body["data"]]
        assert all(c["lastMessageAt"] == same for c in body["data"])
        if not body["pagination"]["hasMore"]:
            break
        params["cursor"] = body["pagination"]["nextCursor"]
    assert len(seen) == len(set(seen)) == 230
    assert set(seen) == created


async def test_http_history_walk_over_equal_timestamps(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    same = "2026-03-01T12:00:00Z"
    ids = [
        (await ingest(owner, seeded.sales_id, "300001", sentAt=same, content=f"m{i}"))["id"]
        for i in range(120)
    ]
    conv_id = (await ingest(owner, seeded.sales_id, "300001", content="x"))["conversationId"]
    url = f"/api/v1/inbox/conversations/{conv_id}/messages"
    seen: list[str] = []
    params: dict[str, Any] = {"limit": 50}
    pages = 0
    while True:
        body = (await owner.get(url, params=params)).json()
        pages += 1
        seen += [m["id"] for m in body["messages"]]
        if not body["hasMore"]:
            assert body["nextCursor"] is None
            break
        params["cursor"] = body["nextCursor"]
    assert pages == 3
    assert len(seen) == len(set(seen)) == 121
    # Equal times come newest-arrival first, the same order as they were stored, reversed.
    assert seen[1:] == list(reversed(ids))


async def test_http_cursors_in_any_iso_form_and_beyond_the_stored_range(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    """A cursor a client writes is any ISO 8601 date-time with an offset (CONTRACT section 2):
    week and ordinal dates too; one before 1970 is older than every row (an empty page), one
    past 9999 newer than every row (the first page); neither is a 400."""
    for i, day in enumerate(("2026-01-05", "2026-01-07")):
        await ingest(owner, seeded.sales_id, f"4000{i}", sentAt=f"{day}T00:00:00Z", content="m")
    conversations = "/api/v1/inbox/conversations"
    # 2026-W02-2 and 2026-006 are 2026-01-06: only the older conversation lies before it.
    for cursor in ("2026-W02-2T00:00:00Z", "2026W022T00Z", "2026-006T00:00:00Z", "2026006T00Z"):
        page = await owner.get(conversations, params={"cursor": cursor})
        assert page.status_code == 200, (cursor, page.text)
        assert [c["lastMessageAt"] for c in page.json()["data"]] == [
            "2026-01-05T00:00:00.000000Z"
        ], cursor
    before = await owner.get(conversations, params={"cursor": "1969-12-31T23:59:59Z"})
    assert before.status_code == 200, before.text
    assert before.json()["data"] == []
    for past_the_end in ("9999-12-31T23:59:59-01:00", "9999-W52-6T00Z"):
        after = await owner.get(conversations, params={"cursor": past_the_end})
        assert after.status_code == 200, after.text
        assert len(after.json()["data"]) == 2
    no_such_day = await owner.get(conversations, params={"cursor": "9999-366T00:00Z"})
    assert no_such_day.status_code == 400  # (it was a 500)
    conversation_id = after.json()["data"][0]["id"]
    history = f"{conversations}/{conversation_id}/messages"
    assert (await owner.get(history, params={"cursor": "1900-01-01T00:00:00Z"})).json() == {
        "messages": [],
        "nextCursor": None,
        "hasMore": False,
    }
    # sentAt still refuses an instant the store cannot hold.
    refused = await owner.post(
        "/api/v1/messaging/messages",
        json={
            "channelId": seeded.sales_id,
            "direction": "INBOUND",
            "contact": {"phoneNumber": "40009"},
            "type": "TEXT",
            "content": "m",
            "sentAt": "1969-12-31T23:59:59Z",
        },
    )
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["message"] == (
        "sentAt must lie between 1970-01-01 and 9999-12-31 UTC"
    )
