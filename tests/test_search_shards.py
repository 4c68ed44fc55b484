"""A large channel's message search index of its own (schema v20, store/shards.py): made and
filled a step at a time while messages keep coming, it gives every search the answers the
shared index gives, and a stop anywhere loses nothing."""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
from pathlib import Path

import httpx
import pytest
import trio

from inboxd import daemon
from inboxd.daemon import maintain_search_shards
from inboxd.store import accounts, actions, conversations, messages, shards
from inboxd.store.db import Store, db_path, run_in_transaction
from inboxd.store.schema import SEARCH_CHANNEL_SHIFT, SEARCH_PK_MASK, message_shard_table
from inboxd.timeutil import now_us
from tests import arrange
from tests.conftest import Seed, ingest
from tests.fts5_records import varint

_WORDS = [
    "order", "refund", "please", "help", "the", "parcel", "delivery", "address", "café",
    "cafe\u0301", "Straße", "STRASSE", "naïve", "\"quoted\"", "4915", "+49 151", "🙂", "x",
    "ordered", "refunds", "\U0010fffd", "\U0010fffc", "Ünïcödé", "日本語", "ok",
]  # fmt: skip
_QUERIES = [
    "order", "refund", "order refund", "please help", "the order", "café", "cafe\u0301",
    "CAFÉ", "strasse", "straße", "naïve", "quoted", '"quoted"', "4915", "+49 151", "🙂 ok",
    "日本語", "ünïcödé", "der ref", "nothing like this", "\U0010fffd", "ed re", "x x",
]  # fmt: skip


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 6)))


def _ingest(store: Store, seeded: Seed, rng: random.Random, count: int, at: int) -> int:
    """``count`` messages from random numbers in both channels (sales twice as often), some of
    them with a SYSTEM row after them; returns the next instant."""
    who = store.read_sync(accounts.authenticate, seeded.owner_key)
    for _ in range(count):
        channel = seeded.sales_id if rng.random() < 0.67 else seeded.support_id
        phone = f"4930{rng.randint(0, 40):04d}"
        new = arrange.inbound_text(channel, phone, _text(rng), f"{rng.choice(_WORDS)} Name")
        got = store.write_sync(messages.ingest, who, new, at)
        at += 1_000_000
        if rng.random() < 0.1:
            store.write_sync(
                actions.rename, who, got.message.conversation_id, f"order refund {rng.random()}", at
            )
            at += 1_000_000
    return at


def _answers(store: Store, seeded: Seed) -> dict[tuple[str, str, int], tuple[list[int], ...]]:
    """Each query's two lists in both channels, as conversation pks (the copies' ids differ)."""
    who = store.read_sync(accounts.authenticate, seeded.owner_key)
    pks = dict(store.read_sync(lambda c: c.execute("SELECT id, pk FROM conversations").fetchall()))
    out = {}
    for n, channel in enumerate((seeded.sales_id, seeded.support_id)):
        for query in _QUERIES:
            for limit in (3, 50):
                got = store.read_sync(conversations.search, who, channel, query, limit)
                out[str(n), query, limit] = tuple(
                    [pks[c["id"]] for c in json.loads(part)]
                    for part in (got.contacts, got.messages)
                )
    return out


def _shared_rows(store: Store, channel_pk: int) -> int:
    first = channel_pk << SEARCH_CHANNEL_SHIFT
    return store.read_sync(
        lambda c: c.execute(
            "SELECT count(*) FROM messages_fts_docsize WHERE id BETWEEN ? AND ?",
            (first, first | SEARCH_PK_MASK),
        ).fetchone()[0]
    )


def _rows_indexed(conn: sqlite3.Connection, channel_pk: int) -> int:
    """The rows a channel's own index counts (FTS5's nTotalRow, the first varint of its
    averages record): a rowid indexed twice counts twice there, not in its row sizes table,
    which keeps one row a rowid."""
    blob = conn.execute(
        f"SELECT block FROM {message_shard_table(channel_pk)}_data WHERE id = 1"
    ).fetchone()[0]
    return varint(blob, 0)[0]


def _sales_pk(store: Store, seeded: Seed) -> int:
    return store.read_sync(
        lambda c: c.execute("SELECT pk FROM channels WHERE id = ?", (seeded.sales_id,)).fetchone()[
            0
        ]
    )


def test_a_shard_filled_while_messages_come_gives_the_shared_index_answers(
    seeded: Seed, tmp_path: Path
) -> None:
    """Two copies of one store take the same messages; in one, the sales channel gets its own
    index, filled in small steps with messages arriving between them. Every search gives the same
    answers in both, while it fills and once it is ready; from then on the shared index takes
    none of the channel's messages."""
    shutil.copytree(seeded.data_dir, tmp_path / "plain")
    plain = Store.open(tmp_path / "plain", readers=1)
    sharded = Store.open(seeded.data_dir, readers=1)
    try:
        at = now_us()
        for store in (plain, sharded):
            _ingest(store, seeded, random.Random(1), 160, at)
        at += 10**9
        sales = _sales_pk(sharded, seeded)
        assert sharded.read_sync(shards.due, 80) == [sales]  # support holds fewer
        assert sharded.write_sync(shards.start, sales, at)
        assert not sharded.write_sync(shards.start, sales, at)  # one each
        steps = 0
        while sharded.write_sync(shards.step, sales, at, 7, 25):
            steps += 1
            for store in (plain, sharded):  # both take the same messages (same pks)
                _ingest(store, seeded, random.Random(steps), 2, at)
            at += 10**8
            if steps % 5 == 0:
                assert not sharded.read_sync(shards.has_ready_shard, sales)
                assert _answers(sharded, seeded) == _answers(plain, seeded)
        assert steps > 10  # many steps, messages between them
        assert sharded.read_sync(shards.ready_channels) == (sales,)
        assert sharded.read_sync(shards.unfinished) == []
        assert sharded.read_sync(shards.due, 80) == []
        assert _answers(sharded, seeded) == _answers(plain, seeded)
        # The index holds each of the channel's searchable messages once.
        table = message_shard_table(sales)
        held, searchable = sharded.read_sync(
            lambda c: (
                c.execute(f"SELECT count(*) FROM {table}_docsize").fetchone()[0],
                c.execute(
                    "SELECT count(*) FROM messages WHERE channel_pk = ? AND is_system = 0",
                    (sales,),
                ).fetchone()[0],
            )
        )
        assert held == searchable
        assert sharded.read_sync(_rows_indexed, sales) == searchable  # none of them twice
        shared_before = _shared_rows(sharded, sales)
        for store in (plain, sharded):
            _ingest(store, seeded, random.Random(99), 40, at)
        assert _shared_rows(sharded, sales) == shared_before  # the channel's own index took them
        assert _shared_rows(plain, sales) > shared_before
        assert _answers(sharded, seeded) == _answers(plain, seeded)
    finally:
        plain.close()
        sharded.close()


def test_a_stop_between_steps_or_inside_one_loses_nothing(seeded: Seed) -> None:
    """Each step is a transaction: one that fails midway leaves the index and its bookmark as
    they were, and a store opened afresh goes on from the bookmark to the same answers."""
    store = Store.open(seeded.data_dir, readers=1)
    try:
        _ingest(store, seeded, random.Random(2), 120, now_us())
        before = _answers(store, seeded)
        sales = _sales_pk(store, seeded)
        store.write_sync(shards.start, sales, now_us())
        for _ in range(3):
            assert store.write_sync(shards.step, sales, now_us(), 5, 30)
    finally:
        store.close()

    def state(conn: sqlite3.Connection) -> tuple[int, int]:
        return (
            conn.execute(
                "SELECT filled_below FROM message_shards WHERE channel_pk = ?", (sales,)
            ).fetchone()[0],
            conn.execute(f"SELECT count(*) FROM {message_shard_table(sales)}_docsize").fetchone()[
                0
            ],
        )

    conn = sqlite3.connect(db_path(seeded.data_dir), isolation_level=None)
    try:
        kept = state(conn)

        def failing(c: sqlite3.Connection) -> None:
            shards.step(c, sales, now_us(), 5, 30)
            assert state(c) != kept  # it did its work...
            raise RuntimeError("power cut")  # ...and then the transaction did not commit

        with pytest.raises(RuntimeError):
            run_in_transaction(conn, "BEGIN IMMEDIATE", failing)
        assert state(conn) == kept
        assert not conn.in_transaction
    finally:
        conn.close()
    store = Store.open(seeded.data_dir, readers=1)  # a restart
    try:
        assert store.read_sync(shards.unfinished) == [sales]
        while store.write_sync(shards.step, sales, now_us(), 5, 30):
            pass
        assert store.read_sync(shards.ready_channels) == (sales,)
        assert _answers(store, seeded) == before
    finally:
        store.close()


def test_messages_go_in_from_a_connection_opened_before_the_index_was_made(seeded: Seed) -> None:
    """The index and its trigger are made while other connections are open (the daemon's
    writer, a CLI): their next message goes into it (SQLite prepares their statements anew),
    also from one that has not used any search index yet (schema v19's trigger quirk)."""
    early = Store.open(seeded.data_dir, readers=1)
    idle = Store.open(seeded.data_dir, readers=1)
    try:
        at = _ingest(early, seeded, random.Random(3), 30, now_us())
        idle.read_sync(lambda c: c.execute("SELECT count(*) FROM channels").fetchone())
        sales = _sales_pk(early, seeded)
        other = sqlite3.connect(db_path(seeded.data_dir), isolation_level=None)
        try:
            shards.bring_up_to_date(other, now_us, threshold=10, rows=4)
        finally:
            other.close()
        assert early.read_sync(shards.ready_channels) == (sales,)
        for n, store in enumerate((early, idle)):
            who = store.read_sync(accounts.authenticate, seeded.owner_key)
            text = f"zanzibar parcel {n}"
            new = arrange.inbound_text(seeded.sales_id, f"493099999{n}", text, "Zed")
            store.write_sync(messages.ingest, who, new, at + n)
            got = store.read_sync(conversations.search, who, seeded.sales_id, text, 50)
            assert len(json.loads(got.messages)) == 1
    finally:
        early.close()
        idle.close()


async def test_the_daemon_makes_and_fills_a_channels_index_and_its_searches_read_it(
    owner: httpx.AsyncClient, seeded: Seed, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """``maintain_search_shards`` (what the daemon runs every hour) on the daemon's store: the
    channel past the size line gets its index, filled step by step, and the API's searches
    answer from it as they did before."""
    _ingest(store, seeded, random.Random(4), 90, now_us())

    async def search(query: str) -> list[str]:
        got = await owner.get(
            "/api/v1/inbox/conversations/search",
            params={"channelId": seeded.sales_id, "query": query},
        )
        assert got.status_code == 200, got.text
        return [c["id"] for c in got.json()["messages"]]

    before = {q: await search(q) for q in ("order", "refund", "café", "der ref", "🙂 ok")}
    assert any(before.values())
    sales = _sales_pk(store, seeded)
    caplog.set_level("INFO", logger="inboxd")

    class Clock:
        @staticmethod
        def now_us() -> int:
            return now_us()

    made = await maintain_search_shards(store, Clock(), threshold=40, step_rows=6)
    assert made == [sales]
    assert {q: await search(q) for q in before} == before
    done = [r for r in caplog.records if r.getMessage().startswith("search index")]
    assert [r.getMessage() for r in done] == [
        "search index of its own: started",
        "search index of its own: ready",
    ]
    assert done[1].channel == seeded.sales_id and done[1].steps > 5  # type: ignore[attr-defined]
    assert await maintain_search_shards(store, Clock(), threshold=40) == []  # nothing left
    # A message from now on goes into the channel's own index alone: the API's search finds it
    # there.
    await ingest(owner, seeded.sales_id, "4930777777", content="zymurgy parcel")
    assert len(await search("zymurgy")) == 1


def _word(n: int) -> str:
    """A five-letter word of its own for message ``n``: no two are substrings of each other."""
    return "zq" + "".join(chr(97 + (n // 26**k) % 26) for k in range(3))


@pytest.fixture
def half_filled(seeded: Seed, monkeypatch: pytest.MonkeyPatch) -> int:
    """The sales channel past a small size line, its own index started and a few steps filled
    (a daemon stopped midway); the daemon's first look 2 s after its start.
    Requested before the daemon's fixtures, so that the daemon starts on this store."""
    monkeypatch.setattr(daemon, "SEARCH_FIRST_CHECK_SECONDS", 2.0)
    monkeypatch.setattr(shards, "SHARD_MESSAGES", 40)
    monkeypatch.setattr(shards, "STEP_ROWS", 5)
    store = Store.open(seeded.data_dir, readers=1)
    try:
        who = store.read_sync(accounts.authenticate, seeded.owner_key)
        at = now_us()
        for n in range(60):
            new = arrange.inbound_text(seeded.sales_id, f"4930{n:04d}", f"parcel {_word(n)}")
            store.write_sync(messages.ingest, who, new, at + n)
        sales = _sales_pk(store, seeded)
        assert store.write_sync(shards.start, sales, at)
        for _ in range(3):
            assert store.write_sync(shards.step, sales, at, 5)
        return sales
    finally:
        store.close()


async def test_the_running_daemon_finishes_an_index_through_its_writer_process(
    half_filled: int, owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    """The daemon as it runs (its hourly task, its writer process): it goes on with an index a
    stop left half filled, while messages keep coming through the API, and then every message
    is found by the API's search, each once."""
    sales = half_filled
    scraped = (await owner.get("/metrics")).text  # (its first look is 2 s away)
    assert 'inboxd_search_own_indexes{state="filling"} 1.0' in scraped
    assert 'inboxd_search_own_indexes{state="ready"} 0.0' in scraped
    for n in range(60, 100):  # while it fills
        await ingest(owner, seeded.sales_id, f"4930{n:04d}", content=f"parcel {_word(n)}")
    with trio.fail_after(30):
        while store.read_sync(shards.ready_channels) != (sales,):  # noqa: ASYNC110 (the store)
            await trio.sleep(0.05)
    searchable = 100
    assert store.read_sync(_rows_indexed, sales) == searchable
    scraped = (await owner.get("/metrics")).text
    assert 'inboxd_search_own_indexes{state="ready"} 1.0' in scraped
    assert 'inboxd_search_own_indexes{state="filling"} 0.0' in scraped
    for n in range(100):
        got = await owner.get(
            "/api/v1/inbox/conversations/search",
            params={"channelId": seeded.sales_id, "query": _word(n)},
        )
        assert got.status_code == 200, got.text
        found = got.json()["messages"]
        assert [c["contact"]["phoneNumber"] for c in found] == [f"4930{n:04d}"], n
