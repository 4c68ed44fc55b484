"""Search indexes' b-trees merged a step at a time (store/tidy.py): the contact index and a large
channel's own message index. Every search gives the answers it gave before, at most one b-tree
is left on each level, and a stop between two steps or inside one loses nothing."""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Callable

import httpx
import pytest
import trio

from inboxd import daemon
from inboxd.daemon import tidy_search_indexes
from inboxd.store import accounts, conversations, messages, shards, tidy
from inboxd.store.db import Store, WriteRequest, run_batch, run_in_transaction, writer_connection
from inboxd.store.schema import message_shard_table
from inboxd.timeutil import now_us
from tests import arrange
from tests.conftest import Seed, ingest
from tests.fts5_records import varint

_FIRST = ["Ada", "Lin", "Mateo", "Zoë", "Ольга", "Kim", "José", "Ngozi"]
_LAST = ["Hopper", "Schulz", "Ruiz", "Иванова", "Park", "Müller", "Okafor", "Lovelace"]
_QUERIES = [
    "hopper", "schulz", "ada", "zoë", "ольга", "müller", "Kim Park", "opp", "4930", "49300",
    "000012", "renamed", "Old Name", "nothing like this", "e R",
]  # fmt: skip


def _levels(conn: sqlite3.Connection, index: str = tidy.CONTACTS) -> list[int]:
    """How many b-trees each level of an index holds, from FTS5's structure record (row 10 of
    its _data table: a 4-byte cookie, then varints: levels, b-trees, writes, and for each level
    its merge state, its count of b-trees and each one's id and first and last page)."""
    blob = conn.execute(f"SELECT block FROM {index}_data WHERE id = 10").fetchone()[0]
    i = 4
    levels, i = varint(blob, i)
    _, i = varint(blob, i)
    _, i = varint(blob, i)
    out = []
    for _ in range(levels):
        _, i = varint(blob, i)
        count, i = varint(blob, i)
        for _ in range(3 * count):
            _, i = varint(blob, i)
        out.append(count)
    return out


def _arrive(store: Store, seeded: Seed, groups: list[int], first: int = 0) -> None:
    """Contacts in writes (transactions) of ``groups`` contacts each, with FTS5's automatic
    merging off meanwhile, so that each write leaves a b-tree of its own, larger for a larger
    write (as an import, or contacts arriving faster than merges, leave them); every fifth is
    renamed after, in one more write."""
    who = store.read_sync(accounts.authenticate, seeded.owner_key)
    rng = random.Random(first)
    at = now_us()
    store.write_sync(_automerge, 0)
    n = first
    for size in groups:

        def write(conn: sqlite3.Connection, start: int, size: int = size) -> None:
            for k in range(start, start + size):
                channel = seeded.sales_id if k % 3 else seeded.support_id
                name = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}" if k % 5 else "Old Name"
                new = arrange.inbound_text(channel, f"4930{k:06d}", "hi", name)
                messages.ingest(conn, who, new, at + k)

        store.write_sync(write, n)
        n += size

    def rename(conn: sqlite3.Connection) -> None:
        for k in range(first, n, 5):
            channel = seeded.sales_id if k % 3 else seeded.support_id
            renamed = arrange.inbound_text(channel, f"4930{k:06d}", "again", f"Renamed {k}")
            messages.ingest(conn, who, renamed, at + n + k)

    store.write_sync(rename)
    store.write_sync(_automerge, 4)  # FTS5's default again


def _automerge(conn: sqlite3.Connection, value: int, index: str = tidy.CONTACTS) -> None:
    conn.execute(f"INSERT INTO {index}({index}, rank) VALUES ('automerge', ?)", (value,))


_GROUPS = [30, 30, 8, 8, 2, 2]


def _answers(store: Store, seeded: Seed) -> dict[tuple[str, str, int], list[str]]:
    """Each query's contact list in both channels, as contact phone numbers."""
    who = store.read_sync(accounts.authenticate, seeded.owner_key)
    out = {}
    for channel in (seeded.sales_id, seeded.support_id):
        for query in _QUERIES:
            for limit in (3, 50):
                got = store.read_sync(conversations.search, who, channel, query, limit)
                out[channel, query, limit] = [
                    c["contact"]["phoneNumber"] for c in json.loads(got.contacts)
                ]
    return out


def _check(conn: sqlite3.Connection, index: str = tidy.CONTACTS) -> None:
    conn.execute(f"INSERT INTO {index}({index}) VALUES ('integrity-check')")


def _merge_all(
    store: Store, index: str = tidy.CONTACTS, each: Callable[[int], None] | None = None
) -> int:
    """Steps of a page until one does no work; the steps that did. Bounded: a step that
    reported work for ever would fail the test here, not hang it."""
    for steps in range(1_000):
        if not store.write_sync(tidy.step, index, 1):
            return steps
        if each is not None:
            each(steps + 1)
    pytest.fail("a step still reported work after 1,000 steps")


def test_merging_keeps_every_answer_and_leaves_a_btree_a_level(seeded: Seed, store: Store) -> None:
    _arrive(store, seeded, _GROUPS)
    before = _answers(store, seeded)
    levels = store.read_sync(_levels)
    assert max(levels) >= 2, levels  # automatic merging left levels with several b-trees
    assert store.read_sync(tidy.btrees, tidy.CONTACTS) == sum(levels)
    assert before[seeded.sales_id, "hopper", 50]  # (the queries find contacts)
    assert before[seeded.sales_id, "renamed", 50]
    assert not before[seeded.sales_id, "Old Name", 50]  # renamed away (a delete in the index)

    def same_answers(step: int) -> None:
        assert _answers(store, seeded) == before, step

    # A page a step: several steps, merges left half done between them.
    steps = _merge_all(store, each=same_answers)
    assert steps >= 2
    merged = store.read_sync(_levels)
    assert max(merged) == 1 and sum(merged) < sum(levels), (levels, merged)
    assert store.read_sync(tidy.btrees, tidy.CONTACTS) == sum(merged)
    store.write_sync(_check)
    assert not store.write_sync(tidy.step, tidy.CONTACTS, 1)  # nothing left to merge
    assert (
        store.read_sync(
            lambda c: c.execute(
                "SELECT v FROM contacts_fts_config WHERE k = 'usermerge'"
            ).fetchone()[0]
        )
        == tidy.USERMERGE
    )
    # New contacts still go in, and a later pass merges their b-trees too.
    _arrive(store, seeded, [5, 5, 1, 1], first=500)
    assert max(store.read_sync(_levels)) >= 2
    assert _merge_all(store) >= 1
    assert max(store.read_sync(_levels)) == 1
    store.write_sync(_check)


def test_a_stop_between_steps_or_inside_one_loses_nothing(seeded: Seed) -> None:
    store = Store.open(seeded.data_dir, readers=1)
    try:
        _arrive(store, seeded, _GROUPS)
        before = _answers(store, seeded)
        assert store.write_sync(tidy.step, tidy.CONTACTS, 1)
    finally:
        store.close()  # a stop between two steps

    def step_then_fail(conn: sqlite3.Connection) -> None:
        assert tidy.step(conn, tidy.CONTACTS, 1)
        raise RuntimeError("stopped inside a step")

    conn = sqlite3.connect(seeded.data_dir / "inboxd.db", isolation_level=None)
    try:
        with pytest.raises(RuntimeError):  # a step whose transaction never commits
            run_in_transaction(conn, "BEGIN IMMEDIATE", step_then_fail)
    finally:
        conn.close()
    store = Store.open(seeded.data_dir, readers=1)
    try:
        assert _answers(store, seeded) == before
        store.write_sync(_check)
        # As the daemon's writer runs them: a batch, a savepoint a write, one COMMIT. The failed
        # step rolls back alone; the ingest after it and the next step commit.
        who = store.read_sync(accounts.authenticate, seeded.owner_key)
        arrival = arrange.inbound_text(seeded.sales_id, "4939000001", "hi", "Late Arrival")
        batch = [
            WriteRequest(step_then_fail, ()),
            WriteRequest(messages.ingest, (who, arrival, now_us())),
            WriteRequest(tidy.step, (tidy.CONTACTS, 1)),
        ]
        conn = writer_connection(seeded.data_dir / "inboxd.db")
        try:
            run_batch(conn, batch)
        finally:
            conn.close()
        assert isinstance(batch[0].error, RuntimeError)
        assert batch[1].error is None and batch[2].error is None and batch[2].result is True
        assert _answers(store, seeded) == before  # (no query of the list finds the new one)
        late = store.read_sync(conversations.search, who, seeded.sales_id, "late arr", 50)
        assert [c["contact"]["phoneNumber"] for c in json.loads(late.contacts)] == ["4939000001"]
        assert _merge_all(store) > 0
        assert max(store.read_sync(_levels)) == 1
        assert _answers(store, seeded) == before
        store.write_sync(_check)
    finally:
        store.close()


async def test_the_daemons_pass_merges_the_index_and_logs_it(
    owner: httpx.AsyncClient, seeded: Seed, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """``tidy_search_indexes`` (what the daemon runs every hour) on the daemon's store: the API's
    searches answer as before, and the log says what it did."""
    _arrive(store, seeded, _GROUPS)

    async def search(query: str) -> list[str]:
        got = await owner.get(
            "/api/v1/inbox/conversations/search",
            params={"channelId": seeded.sales_id, "query": query},
        )
        assert got.status_code == 200, got.text
        return [c["contact"]["phoneNumber"] for c in got.json()["contacts"]]

    before = {q: await search(q) for q in _QUERIES}
    assert before["hopper"] and before["renamed"]
    btrees = store.read_sync(tidy.btrees, tidy.CONTACTS)
    caplog.set_level("INFO", logger="inboxd")
    steps = (await tidy_search_indexes(store, pages=1))[tidy.CONTACTS]
    assert steps > 1
    assert {q: await search(q) for q in _QUERIES} == before
    done = [r for r in caplog.records if r.getMessage() == "search index merged"]
    assert len(done) == 1
    assert done[0].steps == steps  # type: ignore[attr-defined]
    assert done[0].btrees_before == btrees  # type: ignore[attr-defined]
    assert done[0].btrees == sum(store.read_sync(_levels)) < btrees  # type: ignore[attr-defined]
    assert await tidy_search_indexes(store) == {tidy.CONTACTS: 0}  # nothing left: no second line
    assert len([r for r in caplog.records if r.getMessage() == done[0].getMessage()]) == 1


@pytest.fixture
def fragmented(seeded: Seed, monkeypatch: pytest.MonkeyPatch) -> int:
    """A contact index left in many b-trees, and the sales channel's own message index started
    and a few steps filled (a daemon stopped midway), its automatic merging off so that each
    step leaves a b-tree; the daemon's first look 2 s after its start. Returns the sales
    channel's pk. Requested before the daemon's fixtures, so that the daemon starts on this
    store."""
    monkeypatch.setattr(daemon, "SEARCH_FIRST_CHECK_SECONDS", 2.0)
    monkeypatch.setattr(tidy, "STEP_PAGES", 1)
    monkeypatch.setattr(shards, "SHARD_MESSAGES", 40)
    monkeypatch.setattr(shards, "STEP_ROWS", 5)
    store = Store.open(seeded.data_dir, readers=1)
    try:
        _arrive(store, seeded, _GROUPS)
        assert max(store.read_sync(_levels)) >= 2
        who = store.read_sync(accounts.authenticate, seeded.owner_key)
        at = now_us()
        for n in range(60):
            new = arrange.inbound_text(seeded.sales_id, f"4933{n:04d}", f"parcel {n}")
            store.write_sync(messages.ingest, who, new, at + n)
        sales = store.read_sync(
            lambda c: c.execute(
                "SELECT pk FROM channels WHERE id = ?", (seeded.sales_id,)
            ).fetchone()[0]
        )
        assert store.write_sync(shards.start, sales, at)
        store.write_sync(_automerge, 0, message_shard_table(sales))
        for _ in range(3):
            assert store.write_sync(shards.step, sales, at, 5)
        return int(sales)
    finally:
        store.close()


async def test_the_running_daemon_merges_the_indexes_through_its_writer_process(
    fragmented: int, owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    """The daemon as it runs (its hourly task, its writer process), a minute after it starts (2 s
    here), while contacts keep arriving through the API: its first pass finishes the channel's
    own index and then merges it and the contact index (the next pass is an hour away)."""
    index = message_shard_table(fragmented)
    for n in range(10):
        await ingest(
            owner, seeded.sales_id, f"4931{n:06d}", content="hello",
            contact={"name": f"Grace Hopper {n}"},
        )  # fmt: skip
    with trio.fail_after(30):
        while store.read_sync(shards.ready_channels) != (fragmented,):  # noqa: ASYNC110
            await trio.sleep(0.05)
        while max(store.read_sync(_levels)) > 1 or max(store.read_sync(_levels, index)) > 1:  # noqa: ASYNC110
            await trio.sleep(0.05)
    store.write_sync(_check)
    store.write_sync(_check, index)
    got = await owner.get(
        "/api/v1/inbox/conversations/search",
        params={"channelId": seeded.sales_id, "query": "grace hopper", "limit": 50},
    )
    assert got.status_code == 200, got.text
    found = sorted(c["contact"]["phoneNumber"] for c in got.json()["contacts"])
    assert found == [f"4931{n:06d}" for n in range(10)]
    for n in (0, 31, 59):
        got = await owner.get(
            "/api/v1/inbox/conversations/search",
            params={"channelId": seeded.sales_id, "query": f"parcel {n}", "limit": 50},
        )
        assert got.status_code == 200, got.text
        assert [c["contact"]["phoneNumber"] for c in got.json()["messages"]] == [f"4933{n:04d}"]


def test_only_the_indexes_kept_merged_are_named() -> None:
    conn = sqlite3.connect(":memory:")
    for name in ("messages_fts", "contacts_fts; DROP TABLE contacts", "message_shard_", "x"):
        with pytest.raises(ValueError, match="not a search index kept merged"):
            tidy.step(conn, name)
        with pytest.raises(ValueError):
            tidy.btrees(conn, name)


async def test_a_channels_own_index_is_merged_too(
    owner: httpx.AsyncClient, seeded: Seed, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A channel's own message index (store/shards.py), once ready, is kept merged like the
    contact index: messages arriving one write at a time leave it in many b-trees; the daemon's
    pass merges them, and the API's searches answer as before."""
    who = store.read_sync(accounts.authenticate, seeded.owner_key)
    sales = store.read_sync(
        lambda c: c.execute("SELECT pk FROM channels WHERE id = ?", (seeded.sales_id,)).fetchone()[
            0
        ]
    )
    at = now_us()
    for n in range(30):
        new = arrange.inbound_text(seeded.sales_id, f"4932{n:04d}", f"parcel order {n}")
        store.write_sync(messages.ingest, who, new, at + n)
    assert store.write_sync(shards.start, sales, at)
    while store.write_sync(shards.step, sales, at, 10):
        pass
    index = message_shard_table(sales)
    assert store.read_sync(tidy.indexes) == [tidy.CONTACTS, index]
    store.write_sync(_automerge, 0, index)
    for n in range(30, 50):  # one b-tree each in the channel's own index
        new = arrange.inbound_text(seeded.sales_id, f"4932{n:04d}", f"parcel refund {n}")
        store.write_sync(messages.ingest, who, new, at + n)
    store.write_sync(_automerge, 4, index)
    assert max(store.read_sync(_levels, index)) >= 2

    async def search(query: str) -> list[str]:
        got = await owner.get(
            "/api/v1/inbox/conversations/search",
            params={"channelId": seeded.sales_id, "query": query, "limit": 100},
        )
        assert got.status_code == 200, got.text
        return [c["contact"]["phoneNumber"] for c in got.json()["messages"]]

    queries = ("parcel", "order", "refund", "refund 4", "cel ord", "nothing like this")
    before = {q: await search(q) for q in queries}
    assert len(before["parcel"]) == 50 and len(before["refund"]) == 20
    caplog.set_level("INFO", logger="inboxd")
    done = await tidy_search_indexes(store, pages=1)
    assert done[index] >= 1
    assert max(store.read_sync(_levels, index)) == 1
    store.write_sync(_check, index)
    assert {q: await search(q) for q in queries} == before
    logged = [r for r in caplog.records if getattr(r, "index", None) == index]
    assert [r.getMessage() for r in logged] == ["search index merged"]
    assert logged[0].steps == done[index]  # type: ignore[attr-defined]
