"""Spec endpoints 1-6: channels, assignees, the conversation list, search, counts, read one."""

from __future__ import annotations

import json
import sqlite3
import unicodedata
from pathlib import Path
from typing import Any

import httpx
import pytest

from inboxd import wire
from inboxd.store import conversations
from inboxd.store.db import Store
from tests import arrange
from tests.conftest import Seed, auth, ingest

LIST = "/api/v1/inbox/conversations"


async def ids(client: httpx.AsyncClient, key: str | None = None, **params: Any) -> list[str]:
    headers = auth(key) if key else None
    response = await client.get(LIST, params=params, headers=headers)
    assert response.status_code == 200, response.text
    return [c["id"] for c in response.json()["data"]]


async def conv(client: httpx.AsyncClient, channel: str, phone: str, at: str, **kw: Any) -> str:
    msg = await ingest(client, channel, phone, sentAt=at, content=kw.pop("content", "hi"), **kw)
    return str(msg["conversationId"])


async def test_channels_owner_sees_all_user_sees_own(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    everything = (await owner.get("/api/v1/inbox/channels")).json()
    assert [c["id"] for c in everything] == [seeded.sales_id, seeded.support_id]
    assert everything[0] == {
        "id": seeded.sales_id,
        "name": "Sales",
        "status": "ACTIVE",
        "type": "WHATSAPP",
    }
    bobs = (await owner.get("/api/v1/inbox/channels", headers=auth(seeded.bob_key))).json()
    assert [c["id"] for c in bobs] == [seeded.sales_id]
    eves = (await owner.get("/api/v1/inbox/channels", headers=auth(seeded.eve_key))).json()
    assert eves == []


async def test_assignees_are_owner_plus_operators_with_access(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    sales = (await owner.get(f"/api/v1/inbox/channels/{seeded.sales_id}/assignees")).json()
    assert [(a["id"], a["role"]) for a in sales] == [
        (seeded.owner_id, "OWNER"),
        (seeded.ann_id, "OPERATOR"),
        (seeded.bob_id, "OPERATOR"),
    ]
    assert sales[1] == {"id": seeded.ann_id, "name": "Ann", "avatar": None, "role": "OPERATOR"}
    support = (await owner.get(f"/api/v1/inbox/channels/{seeded.support_id}/assignees")).json()
    assert [a["id"] for a in support] == [seeded.owner_id, seeded.ann_id]
    hidden = await owner.get(
        f"/api/v1/inbox/channels/{seeded.support_id}/assignees", headers=auth(seeded.bob_key)
    )
    assert hidden.status_code == 404
    missing = await owner.get("/api/v1/inbox/channels/ch_nope/assignees")
    assert missing.status_code == 404


async def test_list_is_newest_first_with_contact_and_pagination_block(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    a = await conv(owner, seeded.sales_id, "1001", "2026-01-01T10:00:00Z")
    b = await conv(owner, seeded.support_id, "1002", "2026-01-03T10:00:00Z")
    c = await conv(owner, seeded.sales_id, "1003", "2026-01-02T10:00:00Z")
    response = (await owner.get(LIST)).json()
    assert [x["id"] for x in response["data"]] == [b, c, a]
    assert response["data"][0]["contact"]["phoneNumber"] == "1002"
    assert response["pagination"]["hasMore"] is False
    assert response["pagination"]["limit"] == 50
    page = (await owner.get(LIST, params={"limit": 2})).json()
    assert [x["id"] for x in page["data"]] == [b, c]
    assert page["pagination"] == {
        "hasMore": True,
        "nextCursor": page["pagination"]["nextCursor"],
        "limit": 2,
    }
    assert page["pagination"]["nextCursor"].startswith("2026-01-02T10:00:00.000000")
    rest = (
        await owner.get(LIST, params={"limit": 2, "cursor": page["pagination"]["nextCursor"]})
    ).json()
    assert [x["id"] for x in rest["data"]] == [a]
    assert rest["pagination"]["hasMore"] is False


async def test_a_plain_date_time_cursor_returns_strictly_older_rows(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    a = await conv(owner, seeded.sales_id, "1001", "2026-01-01T10:00:00Z")
    b = await conv(owner, seeded.sales_id, "1002", "2026-01-02T10:00:00Z")
    await conv(owner, seeded.sales_id, "1003", "2026-01-03T10:00:00Z")
    assert await ids(owner, cursor="2026-01-02T10:00:00Z") == [a]
    assert await ids(owner, cursor="2026-01-02T12:00:00+01:00") == [b, a]
    assert await ids(owner, cursor="2026-01-02T10:00:00.0000001Z") == [b, a]


async def test_filters_channel_status_unread(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    a = await conv(owner, seeded.sales_id, "1001", "2026-01-01T10:00:00Z")
    b = await conv(owner, seeded.sales_id, "1002", "2026-01-02T10:00:00Z")
    c = await conv(owner, seeded.support_id, "1003", "2026-01-03T10:00:00Z")
    arrange.set_status(store, b, "CLOSED")
    await owner.post(f"{LIST}/{a}/read")
    assert await ids(owner, channelId=seeded.sales_id) == [b, a]
    assert await ids(owner, status="CLOSED") == [b]
    assert await ids(owner, status="OPEN") == [c, a]
    assert await ids(owner, unread="true") == [c, b]
    assert await ids(owner, unread="false") == [c, b, a]
    assert await ids(owner, channelId=seeded.sales_id, status="OPEN", unread="true") == []


async def test_tabs_and_assignee_filter(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    mine = await conv(owner, seeded.sales_id, "1001", "2026-01-01T10:00:00Z")
    bobs = await conv(owner, seeded.sales_id, "1002", "2026-01-02T10:00:00Z")
    free = await conv(owner, seeded.sales_id, "1003", "2026-01-03T10:00:00Z")
    closed_free = await conv(owner, seeded.sales_id, "1004", "2026-01-04T10:00:00Z")
    closed_mine = await conv(owner, seeded.sales_id, "1005", "2026-01-05T10:00:00Z")
    arrange.assign(store, mine, seeded.ann_id)
    arrange.assign(store, closed_mine, seeded.ann_id)
    arrange.assign(store, bobs, seeded.bob_id)
    arrange.set_status(store, closed_free, "CLOSED")
    arrange.set_status(store, closed_mine, "CLOSED")
    assert await ids(owner, seeded.ann_key, tab="mine_open") == [mine]
    assert await ids(owner, seeded.bob_key, tab="mine_open") == [bobs]
    assert await ids(owner, tab="mine_open") == []
    assert await ids(owner, tab="unassigned") == [free]
    assert await ids(owner, tab="all") == [closed_mine, closed_free, free, bobs, mine]
    assert await ids(owner, assigneeId=seeded.ann_id) == [closed_mine, mine]
    assert await ids(owner, assigneeId="usr_nobody") == []
    listed = (await owner.get(LIST, params={"assigneeId": seeded.bob_id})).json()["data"][0]
    assert listed["assignedTo"] == seeded.bob_id
    assert listed["assignedUser"] == {"id": seeded.bob_id, "name": "Bob", "avatar": None}


async def test_user_key_sees_only_its_channels_everywhere(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    sales = await conv(owner, seeded.sales_id, "1001", "2026-01-01T10:00:00Z", content="alpha beta")
    support = await conv(
        owner, seeded.support_id, "1002", "2026-01-02T10:00:00Z", content="alpha beta"
    )
    assert await ids(owner, seeded.bob_key) == [sales]
    assert await ids(owner, seeded.ann_key) == [support, sales]
    assert await ids(owner, seeded.eve_key) == []
    bob = auth(seeded.bob_key)
    for path in (
        f"{LIST}/{support}",
        f"{LIST}/{support}/messages",
        f"/api/v1/inbox/channels/{seeded.support_id}/assignees",
    ):
        response = await owner.get(path, headers=bob)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found"
    assert (await owner.post(f"{LIST}/{support}/read", headers=bob)).status_code == 404
    for params in (
        {"channelId": seeded.support_id},
        {"channelId": seeded.support_id, "query": "alpha"},
    ):
        path = f"{LIST}/search" if "query" in params else LIST
        assert (await owner.get(path, params=params, headers=bob)).status_code == 404
    counts = await owner.get(f"{LIST}/counts", params={"channelId": seeded.support_id}, headers=bob)
    assert counts.status_code == 404
    assert (await owner.get(f"{LIST}/counts", headers=bob)).json()["all"] == 1
    assert (await owner.get(f"{LIST}/{sales}", headers=bob)).status_code == 200


async def test_counts(owner: httpx.AsyncClient, seeded: Seed, store: Store) -> None:
    a = await conv(owner, seeded.sales_id, "1001", "2026-01-01T10:00:00Z")
    b = await conv(owner, seeded.sales_id, "1002", "2026-01-02T10:00:00Z")
    c = await conv(owner, seeded.sales_id, "1003", "2026-01-03T10:00:00Z")
    d = await conv(owner, seeded.support_id, "1004", "2026-01-04T10:00:00Z")
    await conv(owner, seeded.support_id, "1005", "2026-01-05T10:00:00Z")
    arrange.assign(store, a, seeded.ann_id)
    arrange.assign(store, d, seeded.ann_id)
    arrange.assign(store, b, seeded.ann_id)
    arrange.set_status(store, b, "CLOSED")
    arrange.set_status(store, c, "CLOSED")
    counts = f"{LIST}/counts"
    assert (await owner.get(counts)).json() == {"mine_open": 0, "unassigned": 1, "all": 5}
    ann = auth(seeded.ann_key)
    assert (await owner.get(counts, headers=ann)).json() == {
        "mine_open": 2,
        "unassigned": 1,
        "all": 5,
    }
    assert (await owner.get(counts, params={"channelId": seeded.sales_id}, headers=ann)).json() == {
        "mine_open": 1,
        "unassigned": 0,
        "all": 3,
    }
    bob = auth(seeded.bob_key)
    assert (await owner.get(counts, headers=bob)).json() == {
        "mine_open": 0,
        "unassigned": 0,
        "all": 3,
    }
    # The counters follow changes.
    arrange.set_status(store, c, "OPEN")
    arrange.assign(store, a, None)
    assert (await owner.get(counts, params={"channelId": seeded.sales_id})).json() == {
        "mine_open": 0,
        "unassigned": 2,
        "all": 3,
    }


async def test_counters_match_a_full_recount(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    convs = [
        await conv(
            owner,
            seeded.sales_id if i % 3 else seeded.support_id,
            f"20{i:02d}",
            f"2026-01-01T10:{i:02d}:00Z",
        )
        for i in range(30)
    ]
    for i, cid in enumerate(convs):
        if i % 2:
            arrange.assign(store, cid, [seeded.ann_id, seeded.bob_id, seeded.owner_id][i % 3])
        if i % 5 == 0:
            arrange.set_status(store, cid, "CLOSED")
    kept = store.read_sync(
        lambda c: sorted(
            tuple(r)
            for r in c.execute(
                "SELECT channel_pk, status, assignee_pk, n FROM conversation_counts WHERE n > 0"
            )
        )
    )
    recount = store.read_sync(
        lambda c: sorted(
            tuple(r)
            for r in c.execute(
                "SELECT channel_pk, status, coalesce(assigned_to_pk, 0), count(*)"
                " FROM conversations GROUP BY 1, 2, 3"
            )
        )
    )
    assert kept == recount
    totals = store.read_sync(
        lambda c: sorted(
            tuple(r) for r in c.execute("SELECT * FROM channel_conversation_totals WHERE n > 0")
        )
    )
    per_channel = store.read_sync(
        lambda c: sorted(
            tuple(r) for r in c.execute("SELECT channel_pk, count(*) FROM conversations GROUP BY 1")
        )
    )
    assert totals == per_channel and sum(n for _, n in totals) == 30
    # A store from before the totals existed gets them from its counters when it migrates.
    from inboxd.store.schema import MIGRATIONS

    old = sqlite3.connect(store.path, isolation_level=None)
    old.executescript(
        "BEGIN IMMEDIATE; DROP TRIGGER conversations_total_insert;"
        " DROP TRIGGER conversations_total_move; DROP TRIGGER conversations_total_delete;"
        f" DROP TABLE channel_conversation_totals; {MIGRATIONS[6]} COMMIT;"
    )
    old.close()
    migrated = store.read_sync(
        lambda c: sorted(tuple(r) for r in c.execute("SELECT * FROM channel_conversation_totals"))
    )
    assert migrated == per_channel
    # The owner's counters per account (schema v10) hold the same figures, and a store from
    # before them gets them from its conversations when it migrates.
    per_account_sql = (
        "SELECT account_pk, status, coalesce(assigned_to_pk, 0), count(*)"
        " FROM conversations GROUP BY 1, 2, 3"
    )
    kept_sql = "SELECT * FROM account_conversation_counts WHERE n > 0"
    totals_sql = "SELECT * FROM account_conversation_totals"
    per_account = store.read_sync(lambda c: sorted(tuple(r) for r in c.execute(per_account_sql)))
    assert store.read_sync(lambda c: sorted(tuple(r) for r in c.execute(kept_sql))) == per_account
    account_total = store.read_sync(lambda c: [tuple(r) for r in c.execute(totals_sql)])
    assert account_total == [(per_account[0][0], 30)]
    old = sqlite3.connect(store.path, isolation_level=None)
    old.executescript(
        "BEGIN IMMEDIATE; DROP TRIGGER conversations_account_count_insert;"
        " DROP TRIGGER conversations_account_count_update;"
        " DROP TRIGGER conversations_account_count_delete;"
        " DROP TABLE account_conversation_counts; DROP TABLE account_conversation_totals;"
        f" {MIGRATIONS[9]} COMMIT;"
    )
    old.close()
    assert store.read_sync(lambda c: sorted(tuple(r) for r in c.execute(kept_sql))) == per_account
    assert store.read_sync(lambda c: [tuple(r) for r in c.execute(totals_sql)]) == account_total


async def test_read_one_has_contact_assignee_channel_type_and_phone(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    cid = await conv(
        owner, seeded.sales_id, "+1 (555) 010-9999", "2026-01-01T10:00:00Z", contact={"name": "Zed"}
    )
    arrange.assign(store, cid, seeded.bob_id)
    body = (await owner.get(f"{LIST}/{cid}")).json()
    assert body["id"] == cid
    assert body["contact"]["name"] == "Zed"
    assert body["customerPhone"] == "15550109999"
    assert body["assignedUser"]["name"] == "Bob"
    assert body["channelType"] == "WHATSAPP"
    assert body["createdAt"].endswith("Z") and body["updatedAt"].endswith("Z")
    assert (await owner.get(f"{LIST}/conv_missing")).status_code == 404


SEARCH = f"{LIST}/search"


async def test_search_splits_contacts_and_messages_without_repeats(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    by_name = await conv(
        owner,
        seeded.sales_id,
        "4915112345678",
        "2026-01-01T10:00:00Z",
        contact={"name": "Marta Schulz"},
        content="about the invoice",
    )
    by_text = await conv(
        owner,
        seeded.sales_id,
        "4915199999999",
        "2026-01-02T10:00:00Z",
        contact={"name": "Jon"},
        content="Please ask MARTA about my order",
    )
    by_phone = await conv(
        owner,
        seeded.sales_id,
        "4930555777",
        "2026-01-03T10:00:00Z",
        contact={"name": "Lee"},
        content="nothing",
    )
    await conv(
        owner,
        seeded.support_id,
        "4915100000000",
        "2026-01-04T10:00:00Z",
        contact={"name": "Marta Other"},
        content="marta",
    )
    result = (
        await owner.get(SEARCH, params={"channelId": seeded.sales_id, "query": "marta"})
    ).json()
    assert [c["id"] for c in result["contacts"]] == [by_name]
    assert [c["id"] for c in result["messages"]] == [by_text]
    assert result["contacts"][0]["contact"]["name"] == "Marta Schulz"
    # A contact match that also matches by text is listed once, under contacts.
    both = (
        await owner.get(SEARCH, params={"channelId": seeded.sales_id, "query": "invoice"})
    ).json()
    assert [c["id"] for c in both["messages"]] == [by_name]
    await ingest(owner, seeded.sales_id, "4915112345678", content="marta writes again")
    again = (
        await owner.get(SEARCH, params={"channelId": seeded.sales_id, "query": "Marta"})
    ).json()
    assert [c["id"] for c in again["contacts"]] == [by_name]
    assert [c["id"] for c in again["messages"]] == [by_text]
    phone = (
        await owner.get(SEARCH, params={"channelId": seeded.sales_id, "query": "+49 30 555"})
    ).json()
    assert [c["id"] for c in phone["contacts"]] == [by_phone]
    assert phone["messages"] == []


@pytest.mark.parametrize("query", ["", "ab", "  a ", "xy"])
async def test_search_under_three_characters_is_empty(
    owner: httpx.AsyncClient, seeded: Seed, query: str
) -> None:
    await conv(
        owner,
        seeded.sales_id,
        "1001",
        "2026-01-01T10:00:00Z",
        contact={"name": "ab"},
        content="ab xy",
    )
    result = await owner.get(SEARCH, params={"channelId": seeded.sales_id, "query": query})
    assert result.status_code == 200
    assert result.json() == {"contacts": [], "messages": []}


async def test_search_query_length_is_counted_once_trimmed(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    """README: the query is trimmed before its length is checked (at most 256 characters)."""
    long_word = "a" * 256
    await conv(owner, seeded.sales_id, "1001", "2026-01-01T10:00:00Z", content=long_word)
    padded = await owner.get(
        SEARCH, params={"channelId": seeded.sales_id, "query": f"  {long_word}  "}
    )
    assert padded.status_code == 200, padded.text
    assert len(padded.json()["messages"]) == 1
    too_long = await owner.get(
        SEARCH, params={"channelId": seeded.sales_id, "query": f" {long_word}a "}
    )
    assert too_long.status_code == 400
    assert too_long.json()["error"]["code"] == "invalid_request"


async def test_search_finds_accented_text_typed_composed_or_decomposed(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    """An "é" arrives as one code point (NFC) from most keyboards and as "e" plus a combining
    accent (NFD) from some systems; the trigram index compares code points, so a query in one
    form used to miss text stored in the other."""
    composed_name = "Zoë Ærø"
    composed = await conv(
        owner, seeded.sales_id, "2001", "2026-01-01T10:00:00Z",
        contact={"name": composed_name}, content="ask Renée about the crème brûlée",
    )  # fmt: skip
    decomposed = await conv(
        owner, seeded.sales_id, "2002", "2026-01-02T10:00:00Z",
        contact={"name": unicodedata.normalize("NFD", "Zoë Ærø")},
        content=unicodedata.normalize("NFD", "ask Renée about the crème brûlée"),
    )  # fmt: skip
    assert unicodedata.normalize("NFD", composed_name) != composed_name

    async def found(query: str) -> tuple[list[str], list[str]]:
        body = (
            await owner.get(SEARCH, params={"channelId": seeded.sales_id, "query": query})
        ).json()
        return [c["id"] for c in body["contacts"]], [c["id"] for c in body["messages"]]

    for form in ("NFC", "NFD"):
        assert await found(unicodedata.normalize(form, "zoë")) == ([decomposed, composed], [])
        assert await found(unicodedata.normalize(form, "RENÉE")) == ([], [decomposed, composed])
        assert await found(unicodedata.normalize(form, "brûlée")) == ([], [decomposed, composed])
    # The stored text is kept as it came: only the query is normalised.
    history = (await owner.get(f"{LIST}/{decomposed}/messages")).json()["messages"]
    assert unicodedata.normalize("NFD", "crème brûlée") in history[0]["content"]
    # Text in neither form (characters NFC replaces, some precomposed ones) is found by itself.
    neither = {
        "\u095b\u093f\u0902\u0926\u0917\u0940": "2003",  # Hindi, precomposed ZA U+095B
        "\uf900\uf901\uf902": "2004",  # CJK compatibility ideographs
        "Vi\u00ea\u0323t": "2005",  # Vietnamese: e-circumflex composed, dot below combining
    }
    for text, phone in neither.items():
        assert unicodedata.normalize("NFC", text) != text
        assert unicodedata.normalize("NFD", text) != text
        cid = await conv(
            owner, seeded.sales_id, phone, "2026-01-03T10:00:00Z", content=f"say {text} ok"
        )
        assert await found(text) == ([], [cid]), text
    # The minimum of three counts characters: "ée" typed decomposed is three code points.
    assert await found(unicodedata.normalize("NFD", "ée")) == ([], [])


async def test_search_does_not_match_system_rows_and_handles_quotes(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    cid = await conv(
        owner, seeded.sales_id, "1001", "2026-01-01T10:00:00Z", content='say "hi" * OR x'
    )
    arrange.set_status(store, cid, "CLOSED")
    await ingest(owner, seeded.sales_id, "1001", content="back")  # writes a SYSTEM "reopened" row
    reopened = (
        await owner.get(SEARCH, params={"channelId": seeded.sales_id, "query": "reopened"})
    ).json()
    assert reopened == {"contacts": [], "messages": []}
    quoted = (
        await owner.get(SEARCH, params={"channelId": seeded.sales_id, "query": '"hi" *'})
    ).json()
    assert [c["id"] for c in quoted["messages"]] == [cid]
    missing = await owner.get(SEARCH, params={"channelId": seeded.sales_id})
    assert missing.status_code == 400


async def test_search_is_driven_by_the_trigram_indexes(store: Store) -> None:
    from inboxd.store.conversations import CONTACT_MATCHES_SQL, MESSAGE_MATCHES_SQL, search_range

    plans = store.read_sync(
        lambda c: [
            [str(r[3]) for r in c.execute(f"EXPLAIN QUERY PLAN {sql}", args)]
            for sql, args in (
                (CONTACT_MATCHES_SQL, ('name : NEAR("abc" "xyz", 9)', *search_range(1), 1)),
                (MESSAGE_MATCHES_SQL, ('NEAR("abc" "xyz", 9)', *search_range(1), 1)),
            )
        ]
    )
    for plan in plans:
        # FTS5 itself is given the channel's range of rowids (">" and "<" in its plan), so it
        # reads only that part of each doclist (schema v17, v19).
        fts5_index = plan[0].rsplit(" ", 1)[-1]
        assert "M" in fts5_index and ">" in fts5_index and "<" in fts5_index, plan
        fts = [
            i
            for i, line in enumerate(plan)
            if "VIRTUAL TABLE INDEX" in line and ":M" in line and ":=M" not in line
        ]
        assert fts, plan  # a MATCH lookup (0:=M would be a per-row probe by rowid)
        joined = plan[fts[0] + 1]
        assert "USING INTEGER PRIMARY KEY" in joined, plan  # rows fetched by the index's hits
        assert not any(line.startswith("SCAN") and "VIRTUAL" not in line for line in plan), plan
        # Matches come newest first from the index itself: no sort of all matches.
        assert not any("TEMP B-TREE" in line for line in plan), plan


def test_channel_tokens_are_the_same_in_sql_and_python(store: Store) -> None:
    """The tokens opening each indexed text (schema v17, v19), up to the last channel pk: the
    mark, then two characters from U+F0100 on, never the mark again; each channel its own."""
    from inboxd.store.conversations import search_token
    from inboxd.store.schema import MESSAGE_TOKEN_SQL, SEARCH_MAX_CHANNEL_PK

    edges = [0, 1, 4095, 4096, 4097, 65_535, 65_536, 65_537, SEARCH_MAX_CHANNEL_PK]
    pks = sorted({*edges, *range(100, 70_000, 997)})
    in_sql = store.read_sync(
        lambda c: [
            c.execute(f"SELECT {MESSAGE_TOKEN_SQL.format(pk=':pk')}", {"pk": pk}).fetchone()[0]
            for pk in pks
        ]
    )
    assert in_sql == [search_token(pk) for pk in pks]
    assert len(set(in_sql)) == len(pks) and all(len(t) == 3 for t in in_sql)
    assert all(t[0] == "\U0010fffd" and "\U000f0100" <= min(t[1:]) <= "\U000f10ff" for t in in_sql)


async def test_search_in_a_small_channel_sees_only_its_matches_and_survives_a_rebuild(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    """Many matches elsewhere, a few here: the channel is part of the index query, and the
    schema v8, v18 and v19 rebuilds (which fill both indexes from the tables) give the same
    answers."""
    from inboxd.store.schema import MIGRATIONS

    for i in range(30):
        await ingest(owner, seeded.support_id, f"2000{i:03d}", content=f"refund please {i}",
                     contact={"name": f"Refund Fan {i}"})  # fmt: skip
    mine = [
        await conv(
            owner,
            seeded.sales_id,
            f"3000{i}",
            f"2026-01-0{i + 1}T10:00:00Z",
            contact={"name": "Ada"},
            content=f"where is my REFUND {i}",
        )
        for i in range(3)
    ]
    named = await conv(
        owner, seeded.sales_id, "3999", "2026-01-05T10:00:00Z", contact={"name": "Refundo"}
    )

    async def search() -> tuple[list[str], list[str]]:
        got = (
            await owner.get(SEARCH, params={"channelId": seeded.sales_id, "query": "refund"})
        ).json()
        return [c["id"] for c in got["contacts"]], [c["id"] for c in got["messages"]]

    before = await search()
    assert before == ([named], list(reversed(mine)))
    rebuild = sqlite3.connect(store.path, isolation_level=None)
    rebuild.executescript(
        f"BEGIN IMMEDIATE; {MIGRATIONS[7]} {MIGRATIONS[17]} {MIGRATIONS[18]} COMMIT;"
    )
    rebuild.close()
    assert await search() == before
    # A contact that moves its name keeps the index in step (delete with the old values).
    store.write_sync(lambda c: c.execute("UPDATE contacts SET name = 'Bea' WHERE name = 'Refundo'"))
    assert await search() == ([], list(reversed(mine)))


async def test_search_keeps_the_newest_matches_when_the_limit_cuts(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    """More matches than the limit: each list keeps the conversations with the newest matching
    messages and the newest matching contacts, which the index yields first (schema v18, v19:
    a channel's rows newest first), not the oldest re-sorted."""
    made = [
        await conv(
            owner,
            seeded.sales_id,
            f"4916000{i}",
            f"2026-02-0{i + 1}T10:00:00Z",
            content=f"quokka parcel {i}",
            contact={"name": f"Quill Aster {i}"},
        )
        for i in range(5)
    ]
    for query, key in (("quokka", "messages"), ("quill", "contacts")):
        got = await owner.get(
            SEARCH, params={"channelId": seeded.sales_id, "query": query, "limit": 2}
        )
        assert got.status_code == 200, got.text
        assert [c["id"] for c in got.json()[key]] == [made[4], made[3]], query


async def test_search_keys_keep_each_channel_apart_up_to_the_last_key(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    """Schema v17-v19: a message's or contact's row in its search index is keyed by its
    channel, then by itself (newest first), and a search reads only its channel's keys. The
    channel with the highest pk the keys have room for is searched like any other, beside a
    channel whose pk is 1; a message or contact that would fall past the keys' range is refused
    rather than indexed where no search would find it."""
    from inboxd.errors import StoreError
    from inboxd.store import accounts
    from inboxd.store.conversations import search_range, search_token
    from inboxd.store.schema import SEARCH_MAX_CHANNEL_PK, SEARCH_PK_MASK

    def add_channel(pk: int) -> str:
        store.write_sync(
            lambda c: c.execute(
                "INSERT INTO channels (pk, id, account_pk, name, type, created_at)"
                " VALUES (?, ?, 1, 'Edge', 'WHATSAPP', 0)",
                (pk, f"ch_edge{pk}"),
            )
        )
        return f"ch_edge{pk}"

    edge = add_channel(SEARCH_MAX_CHANNEL_PK)
    first_id = store.read_sync(
        lambda c: c.execute("SELECT id FROM channels WHERE pk = 1").fetchone()[0]
    )
    at_edge = await conv(owner, edge, "4917000001", "2026-01-01T10:00:00Z", content="refund edge",
                         contact={"name": "Edna Zellwig"})  # fmt: skip
    at_one = await conv(owner, first_id, "4917000002", "2026-01-01T10:00:00Z",
                        content="refund one", contact={"name": "Onno Zellwig"})  # fmt: skip

    async def found(channel: str, query: str = "refund") -> list[str]:
        got = await owner.get(SEARCH, params={"channelId": channel, "query": query})
        assert got.status_code == 200, got.text
        return [c["id"] for c in got.json()["messages"]]

    async def found_contacts(channel: str, query: str) -> list[str]:
        got = await owner.get(SEARCH, params={"channelId": channel, "query": query})
        assert got.status_code == 200, got.text
        return [c["id"] for c in got.json()["contacts"]]

    assert await found(edge) == [at_edge]
    assert await found(first_id) == [at_one]
    assert await found_contacts(edge, "zellwig") == [at_edge]
    assert await found_contacts(first_id, "zellwig") == [at_one]
    assert await found_contacts(edge, "4917000001") == [at_edge]
    assert await found_contacts(first_id, "4917000001") == []
    for table in ("messages_fts", "contacts_fts"):
        keys = store.read_sync(
            lambda c, t: [r[0] for r in c.execute(f"SELECT rowid FROM {t}")], table
        )
        assert max(keys) >> 40 == SEARCH_MAX_CHANNEL_PK
    assert search_range(1) == (1 << 40, (2 << 40) - 1)

    # What a search asks of the index: the query NEAR the channel's token, in its rowid range.
    def asked(channel: str, query: str) -> list[str]:
        def fn(conn: sqlite3.Connection) -> list[str]:
            traced: list[str] = []
            conn.set_trace_callback(traced.append)
            try:
                who = accounts.authenticate(conn, seeded.owner_key)
                conversations.search(conn, who, channel, query, 50)
            finally:
                conn.set_trace_callback(None)
            return [t for t in traced if t.startswith("SELECT") and "_fts f" in t]

        return store.read_sync(fn)

    token = search_token(SEARCH_MAX_CHANNEL_PK)
    first, last = search_range(SEARCH_MAX_CHANNEL_PK)
    sql = asked(edge, "4917")
    assert len(sql) == 2 and "FROM contacts_fts" in sql[0] and "FROM messages_fts" in sql[1], sql
    assert all(f"BETWEEN {first} AND {last}" in t for t in sql), sql
    near = f'NEAR("4917" "{token}", 2147483647)'
    assert f"'name : {near} OR phone_number : {near}'" in sql[0], sql
    assert f"'{near}'" in sql[1], sql

    # A text may carry another channel's token, mark and all: it is indexed with a stand-in for
    # the mark, so that channel's token still holds its own rows alone.
    await conv(owner, first_id, "4917000008", "2026-01-02T10:00:00Z",
               content=f"forged {token} refund", contact={"name": f"Forged {token}"})  # fmt: skip
    for table in ("messages_fts", "contacts_fts"):
        holders = store.read_sync(
            lambda c, t: [
                r[0] >> 40
                for r in c.execute(f"SELECT rowid FROM {t} WHERE {t} MATCH ?", (f'"{token}"',))
            ],
            table,
        )
        assert set(holders) == {SEARCH_MAX_CHANNEL_PK}, table
    # The mark and its stand-in are not searched for: a query holding one could match what
    # opens a text.
    for odd_char in ("\U0010fffd", "\U0010fffc"):
        await conv(owner, first_id, "4917000009", "2026-01-02T10:00:00Z",
                   content=f"x{odd_char}yzw", contact={"name": f"x{odd_char}yzw"})  # fmt: skip
        odd = await owner.get(SEARCH, params={"channelId": first_id, "query": f"x{odd_char}y"})
        assert [len(odd.json()[k]) for k in ("contacts", "messages")] == [0, 0]
        assert len(await found_contacts(first_id, "yzw")) == 1  # the rest is found
    # Above all the channel's own token, which opens every text of the channel.
    own = await owner.get(SEARCH, params={"channelId": first_id, "query": search_token(1)})
    assert own.json() == {"contacts": [], "messages": []}
    # Found however far into a long text (NEAR reaches across it).
    far = await conv(owner, first_id, "4917000010", "2026-01-03T10:00:00Z",
                     content="x" * 60_000 + " zebra crossing")  # fmt: skip
    got = await owner.get(SEARCH, params={"channelId": first_id, "query": "zebra crossing"})
    assert [c["id"] for c in got.json()["messages"]] == [far]

    # Past the range: no channel is made with a pk one above (its messages could not be keyed),
    # and a message pk one above the mask is refused by the index's trigger.
    with pytest.raises(StoreError, match="no room for another channel"):
        store.write_sync(lambda c: accounts.create_channel(c, 1, "Past", "WHATSAPP", 0))
    assert store.read_sync(lambda c: c.execute("SELECT max(pk) FROM channels").fetchone()[0]) == (
        SEARCH_MAX_CHANNEL_PK
    )
    with pytest.raises(sqlite3.IntegrityError, match="search index"):
        store.write_sync(
            lambda c: c.execute(
                "INSERT INTO messages (pk, id, account_pk, conversation_pk, channel_pk,"
                " direction, type, is_system, content, created_at)"
                " SELECT ?, 'msg_past', account_pk, conversation_pk, channel_pk, direction, type,"
                " 0, 'refund past', created_at FROM messages LIMIT 1",
                (SEARCH_PK_MASK + 1,),
            )
        )
    with pytest.raises(sqlite3.IntegrityError, match="search index"):
        store.write_sync(
            lambda c: c.execute(
                "INSERT INTO contacts (pk, id, account_pk, channel_pk, phone_number, name,"
                " created_at, updated_at) VALUES (?, 'ct_past', 1, 1, '4917000099', 'Past', 0, 0)",
                (SEARCH_PK_MASK + 1,),
            )
        )
    assert await found(edge) == [at_edge]
    assert await found_contacts(edge, "zellwig") == [at_edge]


@pytest.mark.parametrize("start", [16, 17, 18])
def test_migrating_to_v19_keys_each_text_by_its_channel_and_sorts_on_disk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, start: int
) -> None:
    """A store of schema v16, v17 or v18 with messages and contacts in two channels, written in
    time order (their channels interleaved): v18 rebuilds the message index and v19 the contact
    index keyed channel first, then newest first, each text opened by the channel's token; from
    v16 the message index is rebuilt once (v17's rebuild, which v18 redoes, is skipped, and the
    store goes from 16 to 18 in one transaction). The migrations' sorts go to temporary files
    (not memory), and the connection's own setting comes back; their log lines say what the
    long steps do."""
    from inboxd.errors import StoreError
    from inboxd.store.conversations import search_token
    from inboxd.store.db import db_path, migrate
    from inboxd.store.schema import (
        MIGRATIONS,
        SEARCH_MAX_CHANNEL_PK,
        SEARCH_PK_MASK,
        _indexed,
        _search_key,
    )

    conn = sqlite3.connect(db_path(tmp_path), isolation_level=None)
    for number, script in enumerate(MIGRATIONS[:start], start=1):
        conn.executescript(f"BEGIN; {script}\nPRAGMA user_version = {number}; COMMIT;")
    conn.executescript(
        "INSERT INTO accounts (pk, id, name, created_at) VALUES (1, 'acc_1', 'A', 0);"
        " INSERT INTO channels (pk, id, account_pk, name, type, created_at)"
        "  VALUES (1, 'ch_1', 1, 'One', 'WHATSAPP', 0), (2, 'ch_2', 1, 'Two', 'WHATSAPP', 0);"
        " INSERT INTO contacts (pk, id, account_pk, channel_pk, phone_number, name, avatar,"
        "  created_at, updated_at) VALUES (1, 'ct_1', 1, 1, '1', 'a', '', 0, 0),"
        "  (2, 'ct_2', 1, 2, '2', 'b', '', 0, 0), (3, 'ct_3', 1, 1, '4915100003', 'Ada Lovelace',"
        "  '', 0, 0), (4, 'ct_4', 1, 2, '4915100004', 'Ada Byron', '', 0, 0);"
        " INSERT INTO conversations (pk, id, account_pk, channel_pk, contact_pk, status,"
        "  sort_at, created_at, updated_at) VALUES (1, 'conv_1', 1, 1, 1, 'OPEN', 0, 0, 0),"
        "  (2, 'conv_2', 1, 2, 2, 'OPEN', 0, 0, 0);"
    )
    for pk in range(1, 7):  # channels 1, 2, 1, 2, ...
        channel = 2 - pk % 2
        conn.execute(
            "INSERT INTO messages (pk, id, account_pk, conversation_pk, channel_pk, direction,"
            " type, is_system, content, created_at) VALUES (?, ?, 1, ?, ?, 'INBOUND', 'TEXT',"
            " 0, ?, 0)",
            (pk, f"msg_{pk}", channel, channel, f"refund number {pk}"),
        )
    # And more text than FTS5 holds before it writes a segment out (1 MB of pending index):
    # written in key order without the rebuild's merge, it makes several (checked just below).
    words = [f"w{i:04d}x" for i in range(2000)]
    bulk = [
        (100 + i, f"msg_b{i}", " ".join(words[(i * 7 + j * 13) % 2000] for j in range(120)))
        for i in range(1500)
    ]
    conn.executemany(
        "INSERT INTO messages (pk, id, account_pk, conversation_pk, channel_pk, direction, type,"
        " is_system, content, created_at) VALUES (?, ?, 1, 1, 1, 'INBOUND', 'TEXT', 0, ?, 0)",
        bulk,
    )
    conn.executescript(
        "CREATE VIRTUAL TABLE temp.unmerged USING fts5(content, content='', tokenize='trigram');"
        " BEGIN; INSERT INTO temp.unmerged(rowid, content) SELECT -pk, content FROM messages"
        "  WHERE pk >= 100 ORDER BY -pk; COMMIT;"
    )
    assert conn.execute("SELECT count(DISTINCT segid) FROM temp.unmerged_idx").fetchone()[0] > 1
    conn.execute("DROP TABLE temp.unmerged")
    conn.execute("PRAGMA temp_store = MEMORY")
    # A store holding a channel past the keys' range cannot take v17 or v18: it stays as it
    # was, whole.
    conn.execute(
        "INSERT INTO channels (pk, id, account_pk, name, type, created_at)"
        " VALUES (?, 'ch_far', 1, 'Far', 'WHATSAPP', 0)",
        (SEARCH_MAX_CHANNEL_PK + 1,),
    )
    with (
        caplog.at_level("INFO", logger="inboxd.store"),
        pytest.raises(
            StoreError, match=f"cannot take schema version {start + 1}: it holds a channel pk"
        ),
    ):
        migrate(conn)
    assert not caplog.records  # no step logged that it would not make
    assert conn.execute("PRAGMA user_version").fetchone()[0] == start
    assert conn.execute("PRAGMA temp_store").fetchone()[0] == 2 and not conn.in_transaction
    conn.execute("DELETE FROM channels WHERE id = 'ch_far'")
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    with caplog.at_level("INFO", logger="inboxd.store"):
        assert migrate(conn) == len(MIGRATIONS) - start
    conn.set_trace_callback(None)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    # Each index rebuilt once, the message index in one transaction that also sets the version
    # to 18 (from v16 too).
    rebuilt = [s for s in statements if "'optimize'" in s]
    assert len(rebuilt) == (1 if start == 18 else 2), rebuilt
    versions = [s.strip() for s in statements if "user_version =" in s]
    assert versions == [
        f"PRAGMA user_version = {n};" for n in range(max(start + 1, 18), len(MIGRATIONS) + 1)
    ]
    notes = [str(getattr(r, "note", "")) for r in caplog.records]
    assert ("skipped: version 18 does it again" in notes) == (start == 16)
    assert ("rebuilds the message search index: about 35 s per million messages" in notes) == (
        start < 18
    )
    assert "rebuilds the contact search index: about 20 s per million contacts" in notes
    # The rebuild ran with temporary files (set before its transaction began, undone after).
    begin = next(i for i, s in enumerate(statements) if "BEGIN IMMEDIATE" in s)
    assert "PRAGMA temp_store = FILE" in statements[:begin]
    assert conn.execute("PRAGMA temp_store").fetchone()[0] == 2  # MEMORY again
    # One segment: the rebuild merged what it wrote.
    for table in ("messages_fts", "contacts_fts") if start < 18 else ("contacts_fts",):
        segments = conn.execute(f"SELECT count(DISTINCT segid) FROM {table}_idx").fetchone()[0]
        assert segments == 1, table
    pk_of = f"{SEARCH_PK_MASK} - (rowid & {SEARCH_PK_MASK})"
    keys = [
        (r[0] >> 40, r[1])
        for r in conn.execute(
            f"SELECT rowid, {pk_of} FROM messages_fts WHERE {pk_of} < 100 ORDER BY rowid"
        )
    ]
    assert keys == [(1, 5), (1, 3), (1, 1), (2, 6), (2, 4), (2, 2)]
    for channel, expected in ((1, [5, 3, 1]), (2, [6, 4, 2])):
        token = search_token(channel)
        found = conn.execute(
            f"SELECT {pk_of} FROM messages_fts WHERE messages_fts MATCH ? ORDER BY rowid",
            (f'NEAR("REFUND" "{token}", 99)',),
        ).fetchall()
        assert [r[0] for r in found] == expected
    # Contacts: keyed the same way, found NEAR their channel's token, in name and phone number.
    contact_keys = [(r[0] >> 40, r[1]) for r in conn.execute(
        f"SELECT rowid, {pk_of} FROM contacts_fts ORDER BY rowid")]  # fmt: skip
    assert contact_keys == [(1, 3), (1, 1), (2, 4), (2, 2)]

    def contacts_found(channel: int, column: str, text: str) -> list[int]:
        query = f'{column} : NEAR("{text}" "{search_token(channel)}", 99)'
        return [
            r[0]
            for r in conn.execute(
                f"SELECT {pk_of} FROM contacts_fts WHERE contacts_fts MATCH ? ORDER BY rowid",
                (query,),
            )
        ]

    assert contacts_found(1, "name", "ada") == [3] and contacts_found(2, "name", "ada") == [4]
    assert contacts_found(1, "phone_number", "4915") == [3]
    assert contacts_found(1, "name", "4915") == []
    # A contact's new name and phone number replace the old ones in the index: the update
    # trigger deletes the row with exactly what was indexed, so the index holds what one built
    # afresh from the table holds, every trigram at its place ("ace", the old name's end, is
    # gone too).
    conn.execute("UPDATE contacts SET name = 'Bob Hopper' WHERE pk = 3")
    conn.execute("UPDATE contacts SET phone_number = '4930777' WHERE pk = 4")
    assert contacts_found(1, "name", "hopper") == [3]
    assert contacts_found(1, "name", "ace") == []
    assert contacts_found(2, "phone_number", "4930") == [4]
    assert contacts_found(2, "phone_number", "004") == []
    conn.executescript(
        "CREATE VIRTUAL TABLE temp.fresh USING fts5(name, phone_number, content='',"
        "  tokenize='trigram');"
        f" INSERT INTO temp.fresh(rowid, name, phone_number) SELECT {_search_key('')},"
        f"  {_indexed('channel_pk', 'name')}, {_indexed('channel_pk', 'phone_number')}"
        "  FROM contacts;"
        " CREATE VIRTUAL TABLE temp.kept_terms USING fts5vocab(main, contacts_fts, instance);"
        " CREATE VIRTUAL TABLE temp.fresh_terms USING fts5vocab(temp, fresh, instance);"
    )
    kept, fresh = (
        conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2, 3, 4").fetchall()
        for t in ("temp.kept_terms", "temp.fresh_terms")
    )
    assert kept == fresh and len(kept) > 50
    # New messages get keys the same way.
    conn.execute(
        "INSERT INTO messages (pk, id, account_pk, conversation_pk, channel_pk, direction, type,"
        " is_system, content, created_at) VALUES (7, 'msg_7', 1, 1, 1, 'INBOUND', 'TEXT', 0,"
        " 'refund seven', 0)"
    )
    assert conn.execute(
        "SELECT count(*) FROM messages_fts WHERE rowid = ?", ((1 << 40) | (SEARCH_PK_MASK - 7),)
    ).fetchone() == (1,)
    # ... and the trigger refuses one whose channel is past the keys' range.
    with pytest.raises(sqlite3.IntegrityError, match="search index"):
        conn.execute(
            "INSERT INTO messages (pk, id, account_pk, conversation_pk, channel_pk, direction,"
            " type, is_system, content, created_at) VALUES (8, 'msg_8', 1, 1, ?, 'INBOUND',"
            " 'TEXT', 0, 'refund eight', 0)",
            (SEARCH_MAX_CHANNEL_PK + 1,),
        )


def test_a_migration_step_that_fails_midway_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    """v19 fails on its last statement (the trigger it recreates is missing here), after it has
    rebuilt the contact index: none of it is kept, the store stays at v18 with its v8-form index,
    and the connection is out of its transaction."""
    from inboxd.store.db import db_path, migrate
    from inboxd.store.schema import MIGRATIONS

    conn = sqlite3.connect(db_path(tmp_path), isolation_level=None)
    for number, script in enumerate(MIGRATIONS[:18], start=1):
        conn.executescript(f"BEGIN; {script}\nPRAGMA user_version = {number}; COMMIT;")
    conn.execute("DROP TRIGGER conversation_wire_contact")

    def index_columns() -> list[str]:
        return [r[1] for r in conn.execute("PRAGMA table_info(contacts_fts)")]

    assert index_columns() == ["name", "phone_number", "channel"]
    with pytest.raises(sqlite3.OperationalError, match="no such trigger"):
        migrate(conn)
    assert not conn.in_transaction
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 18
    assert index_columns() == ["name", "phone_number", "channel"]


def test_a_contact_update_works_after_another_connection_changed_the_schema(
    seeded: Seed,
) -> None:
    """A connection whose schema another has just changed (a migration, a CLI's ANALYZE) updates
    a contact at once. SQLite compiles a table's triggers newest first; with the search index's
    trigger newer than conversation_wire_contact, the first UPDATE of a connection that had not
    used the index yet failed with "no such table: contacts" (schema v19 keeps the index's
    trigger the older)."""
    from inboxd.store import accounts, messages
    from inboxd.store.db import db_path

    data = seeded.data_dir
    store = Store.open(data, readers=1)
    who = store.read_sync(accounts.authenticate, seeded.owner_key)
    new = arrange.inbound_text(seeded.sales_id, "4915100001", "hello", "Ada Lovelace")
    store.write_sync(messages.ingest, who, new, 1)
    store.close()
    other = sqlite3.connect(db_path(data), isolation_level=None)
    for change in ("CREATE TABLE elsewhere (a)", "ANALYZE", "DROP TABLE elsewhere"):
        store = Store.open(data, readers=1)  # connections that have not used the index
        try:
            store.read_sync(lambda c: c.execute("SELECT name FROM contacts").fetchall())
            other.execute(change)
            name = f"Ada {change.split()[0].title()}"
            store.write_sync(
                lambda c, n: c.execute("UPDATE contacts SET name = ? WHERE pk = 1", (n,)), name
            )
            got = store.read_sync(conversations.search, who, seeded.sales_id, name, 50)
            assert json.loads(got.contacts)[0]["contact"]["name"] == name
        finally:
            store.close()
    other.close()


async def test_stored_conversation_json_follows_contact_assignee_and_channel(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    """The wire JSON kept per conversation (schema v11) changes with everything it shows,
    including rows of other tables, and the migration builds the same text."""
    cid = await conv(owner, seeded.sales_id, "4915100001", "2026-01-01T10:00:00Z")
    other = await conv(owner, seeded.sales_id, "4915100002", "2026-01-01T11:00:00Z")
    arrange.assign(store, cid, seeded.ann_id)

    def stored_and_built() -> tuple[list[object], list[object]]:
        pks = store.read_sync(
            lambda c: [
                r[0]
                for r in c.execute("SELECT pk FROM conversations WHERE id IN (?, ?)", (cid, other))
            ]
        )
        found = dict(
            store.read_sync(
                lambda c: c.execute(
                    "SELECT pk, json FROM conversation_wire WHERE pk IN (?, ?)", pks
                ).fetchall()
            )
        )
        stored = [json.loads(found[pk]) for pk in pks]
        built = [
            wire.conversation(c, with_contact=True)
            for c in store.read_sync(conversations.load, pks)
        ]
        return stored, built

    stored, built = stored_and_built()
    mine = next(s for s in stored if s["id"] == cid)  # type: ignore[index]
    assert stored == built and mine["assignedUser"]["name"] == "Ann"  # type: ignore[index]
    # A new message with a new contact name, the assignee renamed, the channel's type changed.
    await conv(
        owner, seeded.sales_id, "4915100001", "2026-01-02T10:00:00Z", contact={"name": "Zoe"}
    )
    store.write_sync(
        lambda c: c.execute(
            "UPDATE users SET name = 'Ann B', avatar = 'a.png' WHERE id = ?", (seeded.ann_id,)
        )
    )
    store.write_sync(
        lambda c: c.execute("UPDATE channels SET type = 'SMS' WHERE id = ?", (seeded.sales_id,))
    )
    stored, built = stored_and_built()
    assert stored == built
    mine = next(s for s in stored if s["id"] == cid)  # type: ignore[index]
    assert mine["contact"]["name"] == "Zoe" and mine["assignedUser"]["name"] == "Ann B"  # type: ignore[index]
    assert {s["channelType"] for s in stored} == {"SMS"}  # type: ignore[index]
    # What the migration builds is what the triggers kept.
    from inboxd.store.schema import MIGRATIONS

    kept = store.read_sync(
        lambda c: c.execute("SELECT * FROM conversation_wire ORDER BY pk").fetchall()
    )
    rebuild = sqlite3.connect(store.path, isolation_level=None)
    rebuild.executescript(
        "BEGIN IMMEDIATE;"
        + "".join(
            f" DROP TRIGGER conversation_wire_{t};"
            for t in ("insert", "update", "delete", "contact", "user", "channel")
        )
        + f" DROP TABLE conversation_wire; {MIGRATIONS[10]} COMMIT;"
    )
    rebuild.close()
    again = store.read_sync(
        lambda c: c.execute("SELECT * FROM conversation_wire ORDER BY pk").fetchall()
    )
    assert [tuple(r) for r in again] == [tuple(r) for r in kept] and len(kept) == 2
