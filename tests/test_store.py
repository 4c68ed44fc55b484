"""The store's group commit: concurrent writes share a transaction and an fsync, yet each is
atomic on its own, fails on its own and is acknowledged only once durable."""

from __future__ import annotations

import itertools
import logging
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from inboxd.errors import Conflict, ServiceUnavailable, StoreError
from inboxd.store import db, events
from inboxd.store.db import Appended, ReaderConnection, Store
from tests.conftest import seed_store


@pytest.fixture
def patient_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    """A seeded store whose functions, once sent to a worker thread for overrunning the inline
    budget, stay there for the rest of the test however slow the machine (the default "while"
    is 1 s; a long read here takes ~1.5 s)."""
    monkeypatch.setattr(db, "INLINE_BACKOFF_SECONDS", 60.0)
    store = Store.open(seed_store(tmp_path / "data").data_dir)
    yield store
    store.close()


def append_event(conn: sqlite3.Connection, n: int, fail: bool) -> int:
    seq = events.append(conn, 1, None, "test.event", {"n": n}, 1)
    if fail:
        raise Conflict(f"write {n} refuses", code="test")
    return seq


def committed_test_events(store: Store) -> list[bytes]:
    """The bodies of the events append_event committed, in order."""
    return store.read_sync(
        lambda c: [r[0] for r in c.execute("SELECT body FROM events WHERE type = 'test.event'")]
    )


async def test_concurrent_writes_share_transactions_and_fail_alone(tmp_path: Path) -> None:
    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir)
    seen: list[list[Appended]] = []
    store.add_journal_listener(seen.append)
    results: dict[int, int | str] = {}
    try:

        async def one(n: int) -> None:
            try:
                results[n] = await store.write(append_event, n, n == 7)
            except Conflict as exc:
                results[n] = exc.code

        before = store.batches
        async with trio.open_nursery() as nursery:
            for n in range(40):
                nursery.start_soon(one, n)
        batches = store.batches - before
        assert results[7] == "test"
        assert all(isinstance(results[n], int) for n in range(40) if n != 7)
        assert batches < 40  # writes that waited went together
        stored = committed_test_events(store)
        assert len(stored) == 39 and b'"n":7' not in b"".join(stored)
        # Listeners hear each committed write once, in commit order, and never the failed one.
        heard = [a.seq for batch in seen for a in batch]
        assert heard == sorted(heard) and len(heard) == 39
    finally:
        store.close()


async def hold_writer(store: Store, release: trio.Event, task_status: Any) -> None:
    """Hold the store's writer (as a commit under way would) until ``release`` is set."""
    async with store._write_limiter:
        task_status.started()
        await release.wait()


async def test_a_wake_bumps_its_signal_only_once_the_write_commits(tmp_path: Path) -> None:
    """``db.wake`` is how the mailer and the inbox webhook deliverer learn of their kind of
    change without waking on every commit: a committed write bumps the named signal, a write
    that fails does not, and other names stay quiet."""
    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir)
    try:
        mine, other = store.signal("test.mine"), store.signal("test.other")

        def waking(conn: sqlite3.Connection, fail: bool) -> None:
            db.wake(conn, "test.mine")
            events.append(conn, 1, None, "test.event", {}, 1)
            if fail:
                raise Conflict("refused", code="test")

        await store.write(waking, False)
        assert (mine.version, other.version) == (1, 0)
        with pytest.raises(Conflict):
            await store.write(waking, True)
        assert mine.version == 1
        woke = trio.Event()

        async def waiter() -> None:
            await mine.wait_past(1)
            woke.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            await store.write(lambda conn: events.append(conn, 1, None, "test.event", {}, 1))
            await trio.testing.wait_all_tasks_blocked()
            assert not woke.is_set()  # an unrelated commit
            await store.write(waking, False)
        assert woke.is_set() and mine.version == 2
    finally:
        store.close()


async def test_a_write_cancelled_while_waiting_never_runs(tmp_path: Path) -> None:
    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir)
    try:
        release = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(hold_writer, store, release)
            with trio.move_on_after(0.05):
                await store.write(append_event, 1, False)
            release.set()
        await store.write(append_event, 2, False)  # the next batch must not carry write 1
        bodies = committed_test_events(store)
        assert len(bodies) == 1 and b'"n":2' in bodies[0]
    finally:
        store.close()


async def test_a_write_behind_a_cancelled_one_takes_its_place_in_the_queue(tmp_path: Path) -> None:
    """One waiting write at a time queues for the writer and the others wait behind it: when
    that one is cancelled, one of the others must take its place (none may wait forever), and
    the cancelled write must never run."""
    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir)
    try:
        release = trio.Event()
        first = trio.CancelScope()
        results: dict[int, int] = {}

        async def write(n: int, scope: trio.CancelScope) -> None:
            with scope:
                results[n] = await store.write(append_event, n, False)

        with trio.fail_after(10):  # (a write left waiting forever fails here)
            async with trio.open_nursery() as nursery:
                await nursery.start(hold_writer, store, release)
                nursery.start_soon(write, 1, first)  # queues for the writer
                await trio.testing.wait_all_tasks_blocked()
                for n in (2, 3):  # wait behind it
                    nursery.start_soon(write, n, trio.CancelScope())
                await trio.testing.wait_all_tasks_blocked()
                first.cancel()
                await trio.testing.wait_all_tasks_blocked()
                release.set()
        assert sorted(results) == [2, 3]
        bodies = committed_test_events(store)
        assert len(bodies) == 2 and not any(b'"n":1' in b for b in bodies)
        assert store.batches == 1  # 2 and 3 went together, after the writer was free
    finally:
        store.close()


async def test_a_write_whose_batch_committed_gets_its_result_though_cancelled_meanwhile(
    tmp_path: Path,
) -> None:
    """A write cancelled after its batch committed (here: by a journal listener, which runs
    between the COMMIT and the batch's wake-up) still returns its result: its change is
    durable, and the caller must not be told otherwise."""
    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir, offload=False)  # the whole batch runs without a yield
    follower_scope = trio.CancelScope()
    store.add_journal_listener(lambda appended: follower_scope.cancel())
    try:
        release = trio.Event()
        results: dict[str, int] = {}

        async def leader() -> None:
            results["leader"] = await store.write(append_event, 1, False)

        async def follower() -> None:
            with follower_scope:
                results["follower"] = await store.write(append_event, 2, False)

        async with trio.open_nursery() as nursery:
            await nursery.start(hold_writer, store, release)
            nursery.start_soon(leader)  # queues for the writer
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(follower)  # waits behind it
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        assert sorted(results) == ["follower", "leader"]
        assert len(committed_test_events(store)) == 2
    finally:
        store.close()


async def test_the_writes_of_a_batch_return_together_once_it_commits(tmp_path: Path) -> None:
    """The writes a batch carried wake together when its leader has committed and told the
    journal's listeners: none returns before its change is durable and heard."""
    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir)
    heard: list[int] = []
    store.add_journal_listener(lambda appended: heard.extend(a.seq for a in appended))
    try:
        release = trio.Event()
        returned: list[tuple[int, int]] = []

        async def write(n: int) -> None:
            seq = await store.write(append_event, n, False)
            returned.append((seq, len(heard)))

        async with trio.open_nursery() as nursery:
            await nursery.start(hold_writer, store, release)
            for n in range(10):
                nursery.start_soon(write, n)
            await trio.testing.wait_all_tasks_blocked()
            before = store.batches
            release.set()
        assert store.batches - before == 1
        # Every write returned after all ten were committed and heard.
        assert sorted(count for _, count in returned) == [10] * 10
        assert sorted(seq for seq, _ in returned) == sorted(heard)
    finally:
        store.close()


async def test_a_failing_commit_fails_every_write_of_its_batch(tmp_path: Path) -> None:
    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir)
    try:

        def poison(conn: sqlite3.Connection) -> None:
            # A deferred foreign-key violation: the statement passes, the COMMIT fails.
            conn.execute("PRAGMA defer_foreign_keys = ON")
            conn.execute(
                "INSERT INTO users (id, account_pk, email, name, role, created_at)"
                " VALUES ('usr_x', 999, 'x@example.com', 'X', 'OPERATOR', 1)"
            )

        errors: list[Exception] = []

        async def run(fn: Any, *args: object) -> None:
            try:
                await store.write(fn, *args)
            except sqlite3.Error as exc:
                errors.append(exc)

        release = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(hold_writer, store, release)
            nursery.start_soon(run, append_event, 1, False)
            nursery.start_soon(run, poison)
            await trio.sleep(0.05)  # both wait for the writer: they form one batch
            release.set()
        assert len(errors) == 2
        count = store.read_sync(
            lambda c: c.execute("SELECT count(*) FROM events WHERE type = 'test.event'").fetchone()[
                0
            ]
        )
        assert count == 0
    finally:
        store.close()


@pytest.mark.parametrize("mapped", [True, False], ids=["wal-index", "pragma"])
def test_the_commit_stamp_moves_with_every_commit_of_any_connection(
    tmp_path: Path, mapped: bool
) -> None:
    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir)
    other = Store.open(seed.data_dir, readers=1)
    try:
        if mapped:
            assert store._wal_header is not None  # Linux keeps the index in the -shm file
        else:
            store._wal_header = None  # as where the index cannot be mapped
        stamps = [store.commit_stamp()]
        assert store.commit_stamp() == stamps[-1]  # no commit, same stamp
        store.read_sync(lambda c: c.execute("SELECT count(*) FROM events").fetchone())
        assert store.commit_stamp() == stamps[-1]  # nor after a read
        other.write_sync(append_event, 1, False)  # another connection
        stamps.append(store.commit_stamp())
        store.write_sync(append_event, 2, False)  # the store's own writer
        stamps.append(store.commit_stamp())
        # The WAL emptied by a checkpoint, then restarted by the next commit (new salts).
        other.write_sync(append_event, 3, False)
        other._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        stamps.append(store.commit_stamp())
        other.write_sync(append_event, 4, False)
        stamps.append(store.commit_stamp())
        # Another process, as the CLI would be.
        probe = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('CREATE TABLE p (x)'); c.commit()"
        subprocess.run([sys.executable, "-c", probe, str(db.db_path(seed.data_dir))], check=True)
        stamps.append(store.commit_stamp())
        assert all(a != b for a, b in itertools.pairwise(stamps)), stamps
    finally:
        other.close()
        store.close()


def test_opening_a_store_keeps_sqlite_s_locks_on_the_wal_index(tmp_path: Path) -> None:
    """Our process must still hold SQLite's "in use" lock on the -shm file after Store.open
    (closing any descriptor of the file would drop it), or another process would truncate
    the index under our connections. Checked from another process, as fcntl locks need."""
    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir)
    try:
        assert store._wal_header is not None
        # SQLite's DMS lock: byte (22 + 8) * 4 + 8 = 128 of the -shm file (os_unix.c).
        probe = (
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR)\n"
            "try: fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 128)\n"
            "except OSError: print('held')\n"
            "else: print('free')"
        )
        shm = f"{db.db_path(seed.data_dir)}-shm"
        out = subprocess.run([sys.executable, "-c", probe, shm], capture_output=True, text=True)
        assert out.stdout.strip() == "held", out
        assert store.commit_stamp() == store.commit_stamp()
    finally:
        store.close()


def test_the_checkpointer_s_own_sync_keeps_sqlite_s_lock_on_the_database_file(
    tmp_path: Path,
) -> None:
    """The checkpointer syncs the database file itself before a RESTART (db._checkpoint). In WAL
    mode every open connection holds a shared lock on that file, and another process closing
    its last connection (the CLI) deletes the WAL unless it sees one: a descriptor opened and
    closed for the sync would have dropped all of ours (POSIX locks are the process's). Checked
    from another process, as fcntl locks need."""
    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir)
    path = db.db_path(seed.data_dir)
    checkpointer = db._connect(path, readonly=False)
    # SQLite's shared lock: a read lock on bytes SHARED_FIRST (the pending byte, 2**30, plus 2)
    # onwards (os_unix.c); a write lock on its first byte fails while one is held.
    probe = (
        "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "try: fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 2**30 + 2)\n"
        "except OSError: print('held')\n"
        "else: print('free')"
    )

    def lock() -> str:
        out = subprocess.run(
            [sys.executable, "-c", probe, str(path)], capture_output=True, text=True
        )
        return out.stdout.strip()

    try:
        store.read_sync(lambda conn: conn.execute("SELECT count(*) FROM users").fetchone())
        assert lock() == "held"
        for _ in range(3):
            store.write_sync(lambda conn: conn.execute("UPDATE accounts SET name = name || 'x'"))
        db._checkpoint(checkpointer, 1, store.database_fd())  # past the limit: sync, RESTART
        assert lock() == "held"
    finally:
        checkpointer.close()
        store.close()
    assert lock() == "free"  # (the probe can tell)


async def test_key_cache_survives_other_commits_and_sees_access_changes(tmp_path: Path) -> None:
    from inboxd.api.app import KeyCache
    from inboxd.ids import hash_api_key
    from inboxd.store import accounts

    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir)
    other = Store.open(seed.data_dir, readers=1)  # like the CLI in another process
    try:
        cache = KeyCache(store)
        lookups = 0
        real_read = store.read

        async def counting_read(fn: Any, *args: object) -> Any:
            nonlocal lookups
            lookups += fn is accounts.authenticate
            return await real_read(fn, *args)

        store.read = counting_read  # type: ignore[method-assign]
        assert cache.cached(cache.digest(seed.bob_key)) is None  # nothing cached yet
        first = await cache.lookup(seed.bob_key)
        again = await cache.lookup(seed.bob_key)
        assert first is not None and again == first
        assert lookups == 1  # the second lookup came from the cache
        # Entries are named by BLAKE2b keyed with the cache's own secret: the same name for the
        # same key, not the SHA-256 the store keeps, and another cache's names differ.
        assert cache.digest(seed.bob_key) == cache.digest(seed.bob_key)
        assert cache.digest(seed.bob_key) != hash_api_key(seed.bob_key)
        assert cache.digest(seed.bob_key) != KeyCache(store).digest(seed.bob_key)
        assert (
            cache.cached(cache.digest(seed.bob_key)) == first
        )  # the requests' path: no store, no await
        # A commit that touches no key, user or access (here: an event) keeps the cache, but
        # the sync path cannot know that without reading the store: it says "ask lookup".
        other.write_sync(append_event, 1, False)
        assert cache.cached(cache.digest(seed.bob_key)) is None
        assert await cache.lookup(seed.bob_key) == first
        assert lookups == 1
        assert cache.cached(cache.digest(seed.bob_key)) == first
        # Channel access changes from another process: the principal is read again.
        ann = await cache.lookup(seed.ann_key)
        assert ann is not None and ann.channel_pks is not None and len(ann.channel_pks) == 2
        other.write_sync(
            lambda c: c.execute(
                "DELETE FROM channel_access WHERE user_pk = (SELECT pk FROM users WHERE id = ?)"
                " AND channel_pk = (SELECT pk FROM channels WHERE id = ?)",
                (seed.ann_id, seed.support_id),
            )
        )
        ann_now = await cache.lookup(seed.ann_key)
        assert ann_now is not None and ann_now.channel_pks is not None
        assert len(ann_now.channel_pks) == 1 and lookups == 3
        key_id = other.read_sync(
            lambda c: c.execute(
                "SELECT k.id FROM api_keys k JOIN users u ON u.pk = k.user_pk WHERE u.id = ?",
                (seed.bob_id,),
            ).fetchone()[0]
        )
        # (The access change emptied the cache: bob's principal is read again, then cached.)
        assert await cache.lookup(seed.bob_key) == first and lookups == 4
        assert cache.cached(cache.digest(seed.bob_key)) == first
        other.write_sync(accounts.revoke_key, other.read_sync(accounts.the_account_pk), key_id, 1)
        assert (
            cache.cached(cache.digest(seed.bob_key)) is None
        )  # a commit since: never the stale principal
        assert await cache.lookup(seed.bob_key) is None  # revoked: asked the store again
        assert cache.cached(cache.digest(seed.bob_key)) is None
        assert lookups == 5
        assert await cache.lookup("ibx_unknown") is None
    finally:
        other.close()
        store.close()


def count_to(conn: sqlite3.Connection, n: int) -> int:
    """A read whose SQLite work grows with ``n`` (a recursive count, no table)."""
    return int(
        conn.execute(
            "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?)"
            " SELECT count(*) FROM c",
            (n,),
        ).fetchone()[0]
    )


async def test_short_reads_stay_on_the_loop_and_long_ones_move_to_a_thread(
    patient_store: Store,
) -> None:
    store = patient_store
    assert await store.read(count_to, 10) == 10
    assert (store.inline_reads, store.offloaded_reads) == (1, 0)
    # Far past the inline budget: interrupted on the loop, then answered from a thread.
    assert await store.read(count_to, 3_000_000) == 3_000_000
    assert (store.inline_reads, store.offloaded_reads) == (1, 1)
    # The function that overran goes straight to a thread for a while, even when short;
    # other functions still run inline.
    assert await store.read(count_to, 5) == 5
    assert (store.inline_reads, store.offloaded_reads) == (1, 2)
    assert await store.read(lambda c: c.execute("SELECT 41 + 1").fetchone()[0]) == 42
    assert (store.inline_reads, store.offloaded_reads) == (2, 2)


def test_a_cpu_budget_interrupts_a_long_statement_and_a_short_one_never_reads_the_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the thread's CPU clock is a system call, dear under load: a budget reads it only
    from SQLite's first check on, so short statements (most of the API's) never do."""
    seed = seed_store(tmp_path / "data")
    conn = db._reader(db.db_path(seed.data_dir))
    conn.check_every(db.FINE_STEPS)
    reads = 0
    thread_time = db.time.thread_time

    def counted() -> float:
        nonlocal reads
        reads += 1
        return thread_time()

    monkeypatch.setattr(db.time, "thread_time", counted)
    try:
        conn.budget(60.0, 0.005)
        assert count_to(conn, 100) == 100  # well under FINE_STEPS steps
        assert reads == 0
        conn.budget(60.0, 0.005)  # the wall deadline is far; the CPU budget interrupts
        with pytest.raises(sqlite3.OperationalError, match="interrupted"):
            count_to(conn, 50_000_000)
        assert reads >= 2  # the first check starts the clock, a later one finds it past
        conn.lift_deadline()
        reads = 0
        assert count_to(conn, 300_000) == 300_000  # no budget: checks read no clock
        assert reads == 0
        # The time before the first check counts too (at its wall time): a budget spent in
        # Python before SQLite ever checked ends at that check, no looser than before.
        conn.budget(60.0, 0.005)
        db.time.sleep(0.01)
        with pytest.raises(sqlite3.OperationalError, match="interrupted"):
            count_to(conn, 50_000_000)
        assert reads == 0
    finally:
        conn.close()


class Device:
    """Stands in for the calling thread's count of blocks read from the storage device (like
    getrusage's RUSAGE_THREAD, each thread has its own): the functions below "read the disk"
    by bumping it, as a page-cache miss would."""

    def __init__(self) -> None:
        self.blocks: dict[int, int] = {}

    def bump(self, blocks: int) -> None:
        me = threading.get_ident()
        self.blocks[me] = self.blocks.get(me, 0) + blocks

    def read(self) -> int:
        return self.blocks.get(threading.get_ident(), 0)


@pytest.fixture
def device(patient_store: Store) -> Device:
    """The patient store's disk count, under the test's control."""
    fake = Device()
    patient_store.disk_reads = fake.read
    return fake


async def test_a_read_that_waited_for_the_disk_sends_its_kind_to_threads(
    patient_store: Store, device: Device, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="inboxd.store")
    store = patient_store
    loop_thread = threading.get_ident()
    ran_on: list[int] = []

    def cold_read(conn: sqlite3.Connection) -> int:
        ran_on.append(threading.get_ident())
        device.bump(8)  # its pages were not in the page cache
        return count_to(conn, 10)

    assert await store.read(cold_read) == 10  # answered: the wait has already happened
    assert ran_on == [loop_thread] and store.loop_disk_waits == 1
    # The log says which function it was, for an operator asking what the count in /metrics
    # was: info here, where no warm-up child holds the store (waits are to be expected).
    (waited,) = [
        r for r in caplog.records if r.getMessage() == "the trio thread waited for the disk"
    ]
    assert (waited.levelno, waited.function, waited.blocks) == (  # type: ignore[attr-defined]
        logging.INFO,
        cold_read.__qualname__,
        8,
    )
    # With the trio thread's major page faults so far (a page of code brought back in from the
    # device would move them; a read of the store's file does not): getrusage's own count.
    assert 0 <= waited.major_faults <= db.thread_major_faults()  # type: ignore[attr-defined]
    # Its next reads warm the pages up in a worker thread, never on the loop.
    assert await store.read(cold_read) == 10
    assert ran_on[1] != loop_thread and store.loop_disk_waits == 1
    assert (store.inline_reads, store.offloaded_reads) == (1, 1)
    # Reads that find their pages in memory stay on the loop.
    assert await store.read(count_to, 5) == 5
    assert (store.inline_reads, store.offloaded_reads, store.loop_disk_waits) == (2, 1, 1)
    # Where the store is held in memory a wait should not happen at all: a warning.
    store.set_in_memory(True)

    def cold_count(conn: sqlite3.Connection) -> int:
        device.bump(2)
        return count_to(conn, 3)

    store.major_faults = lambda: 7  # as the count stands when the wait is noted
    assert await store.read(cold_count) == 3 and store.loop_disk_waits == 2
    warned = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and r.getMessage() == "the trio thread waited for the disk"
    ]
    assert [(r.function, r.major_faults) for r in warned] == [  # type: ignore[attr-defined]
        (cold_count.__qualname__, 7)
    ]


async def test_while_the_store_is_being_read_in_no_read_or_write_runs_on_the_loop(
    patient_store: Store, device: Device
) -> None:
    """The warm-up child says where the store is (store/warm.py): while it reads it in, or
    finds part of it out of memory, reads and writes go to worker threads without trying the
    loop first; once all of it is in, on the loop; with no child (None), on the loop until one
    reads from the disk."""
    store = patient_store
    loop_thread = threading.get_ident()
    ran_on: list[int] = []

    def where(conn: sqlite3.Connection, n: int) -> int:
        ran_on.append(threading.get_ident())
        return count_to(conn, n)

    def write_where(conn: sqlite3.Connection, n: int) -> int:
        ran_on.append(threading.get_ident())
        return append_event(conn, n, False)

    assert store.in_memory is None  # no warm-up child (the daemon's sets it)
    assert await store.read(where, 3) == 3
    store.set_in_memory(False)
    assert await store.read(where, 4) == 4
    await store.write(write_where, 1)
    assert (store.inline_reads, store.offloaded_reads, store.offloaded_batches) == (1, 1, 1)
    store.set_in_memory(True)
    assert await store.read(where, 5) == 5
    await store.write(write_where, 2)
    assert (store.inline_reads, store.offloaded_reads, store.offloaded_batches) == (2, 1, 1)
    assert [t == loop_thread for t in ran_on] == [True, False, False, True, True]
    assert store.loop_disk_waits == 0 and device.read() == 0


async def test_while_the_store_is_being_read_in_more_reads_run_at_once(
    patient_store: Store,
) -> None:
    """A warm-up sends every read to a worker thread, most of them waiting for the disk: up to
    WARMING_READERS run at once then, not the usual four, so that one whose pages are in memory
    need not queue behind them; the extra readers go once the store is in."""
    store = patient_store
    together = 3 * db.DEFAULT_READERS
    arrived = threading.Barrier(together, timeout=10)  # breaks unless all run at once

    def meet(conn: sqlite3.Connection) -> int:
        arrived.wait()
        return count_to(conn, 2)

    async def read_and_note(results: list[int]) -> None:
        results.append(await store.read(meet))

    store.set_in_memory(False)
    results: list[int] = []
    async with trio.open_nursery() as nursery:
        for _ in range(together):
            nursery.start_soon(read_and_note, results)
    assert results == [2] * together and not arrived.broken
    assert len(store._readers) == together and store.offloaded_reads == together
    store.set_in_memory(True)  # all in: back to the usual readers, the extra ones closed
    assert len(store._readers) == db.DEFAULT_READERS
    assert not any(conn.warming for conn in store._readers)
    assert store._read_limiter.total_tokens == db.DEFAULT_READERS
    # The store in while extra readers are in use: each is closed as its read ends.
    store.set_in_memory(False)
    release = threading.Event()
    started = threading.Semaphore(0)

    def held(conn: sqlite3.Connection) -> int:
        started.release()
        release.wait(10)
        return count_to(conn, 3)

    async def read_held(results: list[int]) -> None:
        results.append(await store.read(held))

    results = []
    async with trio.open_nursery() as nursery:
        for _ in range(together):
            nursery.start_soon(read_held, results)
        for _ in range(together):  # all of them running, in their threads
            await trio.to_thread.run_sync(started.acquire)
        store.set_in_memory(True)
        release.set()
    assert results == [3] * together
    assert len(store._readers) == db.DEFAULT_READERS
    assert not any(conn.warming for conn in store._readers)


async def test_inline_reads_take_one_disk_reading_each(
    patient_store: Store, device: Device
) -> None:
    """Each inline read's "before" is the last one's "after": one getrusage per read."""
    store = patient_store
    readings = 0

    def counting() -> int:
        nonlocal readings
        readings += 1
        return device.read()

    store.disk_reads = counting
    for n in range(1, 6):
        assert await store.read(count_to, n) == n
    assert (store.inline_reads, readings, store.loop_disk_waits) == (5, 6, 0)
    # A block read between two of them (by nothing we measure) lands on the next read.
    device.bump(1)
    assert await store.read(count_to, 3) == 3
    assert (readings, store.loop_disk_waits) == (7, 1)


async def test_an_interrupted_inline_write_leaves_its_disk_reads_to_no_one_else(
    patient_store: Store, device: Device
) -> None:
    """A write that read the disk and then overran the inline budget counts its own wait; the
    next read, of another function with its pages in memory, is not blamed for it."""
    store = patient_store

    def warm_read(conn: sqlite3.Connection) -> int:
        return int(conn.execute("SELECT 1").fetchone()[0])

    def slow_cold_write(conn: sqlite3.Connection, n: int) -> int:
        device.bump(8)
        return count_to(conn, n)  # far past the inline budget: interrupted, then in a thread

    assert await store.read(warm_read) == 1
    assert await store.write(slow_cold_write, 3_000_000) == 3_000_000
    assert store.loop_disk_waits == 1
    assert await store.read(warm_read) == 1
    assert store.loop_disk_waits == 1 and warm_read not in store._inline_backoff


async def test_a_write_that_waited_for_the_disk_sends_its_kind_to_threads(
    patient_store: Store, device: Device
) -> None:
    store = patient_store
    loop_thread = threading.get_ident()
    ran_on: list[int] = []

    def cold_append(conn: sqlite3.Connection, n: int) -> int:
        ran_on.append(threading.get_ident())
        device.bump(8)
        return append_event(conn, n, False)

    first = await store.write(cold_append, 1)
    assert ran_on == [loop_thread] and store.loop_disk_waits == 1
    assert store.offloaded_batches == 0  # done once, on the loop; only its COMMIT left it
    second = await store.write(cold_append, 2)
    assert ran_on[1] != loop_thread and store.offloaded_batches == 1
    await store.write(append_event, 3, False)  # other writes stay on the loop
    assert store.offloaded_batches == 1 and store.loop_disk_waits == 1
    seqs = store.read_sync(
        lambda c: [r[0] for r in c.execute("SELECT seq FROM events WHERE type = 'test.event'")]
    )
    assert seqs[:2] == [first, second] and len(seqs) == 3


async def test_a_write_sent_as_an_object_is_logged_by_its_name(
    patient_store: Store, device: Device, caplog: pytest.LogCaptureFixture
) -> None:
    """Writes that answer in wire JSON are objects (actions.Answered), with no __qualname__: a
    wait of one is logged by its name, not by its repr (which holds a memory address)."""
    caplog.set_level(logging.INFO, logger="inboxd.store")

    class ColdAnswered:
        name = "COLD_ANSWERED"

        def __call__(self, conn: sqlite3.Connection, n: int) -> int:
            device.bump(4)
            return append_event(conn, n, False)

    await patient_store.write(ColdAnswered(), 1)
    assert patient_store.loop_disk_waits == 1
    assert [
        r.function  # type: ignore[attr-defined]
        for r in caplog.records
        if r.getMessage() == "the trio thread waited for the disk"
    ] == ["COLD_ANSWERED"]


async def test_the_writes_of_a_batch_after_one_that_waited_for_the_disk_leave_the_loop(
    patient_store: Store, device: Device
) -> None:
    """One transaction, three writes: the first reads from the disk on the loop, so the other
    two (whose pages may be cold as well) run in the worker thread that commits them all."""
    store = patient_store
    loop_thread = threading.get_ident()
    ran_on: dict[int, int] = {}

    def append(conn: sqlite3.Connection, n: int, cold: bool) -> int:
        ran_on[n] = threading.get_ident()
        if cold:
            device.bump(8)
        return append_event(conn, n, False)

    seqs: dict[int, int] = {}

    async def write(n: int, cold: bool) -> None:
        seqs[n] = await store.write(append, n, cold)

    release = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(hold_writer, store, release)
        for n, cold in ((1, True), (2, False), (3, False)):
            nursery.start_soon(write, n, cold)
            await trio.testing.wait_all_tasks_blocked()
        release.set()
    assert ran_on[1] == loop_thread
    assert ran_on[2] == ran_on[3] != loop_thread
    assert store.loop_disk_waits == 1 and store.offloaded_batches == 0
    committed = store.read_sync(
        lambda c: [r[0] for r in c.execute("SELECT seq FROM events WHERE type = 'test.event'")]
    )
    assert committed == [seqs[1], seqs[2], seqs[3]]


def test_the_disk_count_sees_reads_the_page_cache_could_not_answer(tmp_path: Path) -> None:
    """db.thread_disk_reads on a real file: dropped from the page cache, then read back."""
    path = tmp_path / "cold"
    path.write_bytes(os.urandom(4 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        before = db.thread_disk_reads()
        os.pread(fd, 4096, 2 << 20)
        after_cold = db.thread_disk_reads()
        os.pread(fd, 4096, 2 << 20)
        assert after_cold > before
        assert db.thread_disk_reads() == after_cold  # now from the page cache
    finally:
        os.close(fd)


async def test_the_loop_is_never_held_much_past_the_inline_budget(tmp_path: Path) -> None:
    """While an expensive read runs, another task still gets the loop within a few ms."""
    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir)
    gaps: list[float] = []
    try:

        async def ticker(done: trio.Event) -> None:
            last = trio.current_time()
            while not done.is_set():
                await trio.lowlevel.checkpoint()
                now = trio.current_time()
                gaps.append(now - last)
                last = now

        done = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker, done)
            await trio.lowlevel.checkpoint()
            assert await store.read(count_to, 3_000_000) == 3_000_000
            done.set()
        # The read itself takes far longer than the budget; the loop was held only for it.
        assert max(gaps) < 0.05, max(gaps)
    finally:
        store.close()


def test_the_journal_is_pruned_only_where_nothing_owes_delivery(tmp_path: Path) -> None:
    from inboxd.store import webhooks

    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir)
    day = 86_400_000_000
    try:

        def event_at(at: int) -> int:
            return store.write_sync(lambda c: events.append(c, 1, None, "test.event", {}, at))

        old = [event_at(day * i) for i in range(1, 11)]  # days 1-10
        new = [event_at(day * 20 + i) for i in range(3)]  # day 20
        seqs = lambda: store.read_sync(  # noqa: E731
            lambda c: [r[0] for r in c.execute("SELECT seq FROM events ORDER BY seq")]
        )
        # An inbox webhook that has delivered up to old[3], a delivery log row for old[2], and a
        # redelivery queued for old[7]: pruning before day 15 stops at old[3].
        store.write_sync(
            lambda c: c.execute(
                "INSERT INTO inbox_webhooks (account_pk, url, secret, created_at, updated_at,"
                " delivered_seq) VALUES (1, 'https://x.example/h', 's', 0, 0, ?)",
                (old[3],),
            )
        )
        store.write_sync(
            webhooks.record_attempt,
            1,
            webhooks.Attempt(old[2], "dlv_1", 1, "delivered", 200, None, 1.0, day * 3, 0),
            None,
        )
        store.write_sync(lambda c: webhooks.queue_redelivery(c, 1, _event_id(c, old[7]), 0))
        assert store.write_sync(events.prune, day * 15, 100) == 4
        assert seqs() == old[4:] + new
        assert store.read_sync(events.pruned_through) == old[3]
        assert store.read_sync(lambda c: c.execute("SELECT count(*) FROM webhook_deliveries")
                               .fetchone()[0]) == 0  # fmt: skip
        # The webhook catches up: pruning goes on up to the queued redelivery, in batches.
        store.write_sync(
            lambda c: c.execute("UPDATE inbox_webhooks SET delivered_seq = ?", (new[-1],))
        )
        assert store.write_sync(events.prune, day * 15, 2) == 2
        assert store.write_sync(events.prune, day * 15, 2) == 1
        assert store.write_sync(events.prune, day * 15, 2) == 0
        assert seqs() == old[7:] + new
        # With the redelivery done, everything before the cut-off goes, nothing after it.
        store.write_sync(lambda c: c.execute("DELETE FROM webhook_redeliveries"))
        assert store.write_sync(events.prune, day * 15, 100) == 3
        assert seqs() == new
        assert store.read_sync(events.pruned_through) == old[-1]
    finally:
        store.close()


def _event_id(conn: sqlite3.Connection, seq: int) -> str:
    return str(conn.execute("SELECT id FROM events WHERE seq = ?", (seq,)).fetchone()[0])


def test_a_delivering_channel_webhook_url_holds_the_journal(tmp_path: Path) -> None:
    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir)
    try:
        seqs = [
            store.write_sync(
                lambda c, i=i: events.append(
                    c, 1, 1, "test.event", {}, i + 1, for_channel_webhooks=True
                )
            )
            for i in range(6)
        ]

        def url(state: str, delivered: int) -> None:
            store.write_sync(
                lambda c: c.execute(
                    "INSERT INTO channel_webhook_urls (channel_pk, url, position, state,"
                    " delivered_seq, created_at, updated_at) VALUES (1, ?, 0, ?, ?, 0, 0)",
                    (f"https://{state}.example/h", state, delivered),
                )
            )

        url("delivering", seqs[1])
        url("paused", 0)  # a paused URL keeps only its backlog_retention: it holds nothing
        assert store.write_sync(events.prune, 1_000, 100) == 2
        assert store.read_sync(events.pruned_through) == seqs[1]
        # A URL of a quiet channel sits far back but is owed nothing: it holds nothing either.
        store.write_sync(lambda c: c.execute("UPDATE channel_webhook_urls SET channel_pk = 2"))
        store.write_sync(lambda c: c.execute("UPDATE channel_webhook_urls SET delivered_seq = 0"))
        assert store.write_sync(events.prune, 1_000, 100) == 4
    finally:
        store.close()


def past_deadline_then(conn: sqlite3.Connection, how: str) -> int:
    """A read whose deadline passes while it runs: in the middle of reading rows (SQLite
    interrupts it with a statement still open), or just before it fails, or returns."""
    assert isinstance(conn, ReaderConnection)
    rows = conn.execute(
        "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 10000000)"
        " SELECT i FROM c"
    )
    rows.fetchone()
    rows.close()
    # SQLite calls the handler every N steps of a statement, counted over all its runs, so now
    # and then it falls inside the COMMIT; make it every step to be sure it does here.
    conn.set_progress_handler(conn._past_deadline, 1)
    conn.deadline = 0.0  # anything SQLite does from here on is past it
    if how == "reading":
        conn.execute("SELECT count(*) FROM (SELECT 1 UNION ALL SELECT 2)").fetchall()
    if how == "failing":
        raise Conflict("gave up", code="test")
    return 1


async def test_an_interrupted_read_never_leaves_its_connection_in_a_transaction(
    tmp_path: Path,
) -> None:
    """Under load a read overran its budget at its very end: the COMMIT was interrupted, the
    inline connection stayed inside the transaction, and every later read failed with 'cannot
    start a transaction within a transaction' (500s). Each way out must leave it clean."""
    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir)
    try:
        for how in ("reading", "failing", "returning"):
            try:
                await store.read(past_deadline_then, how)
            except (Conflict, ServiceUnavailable):
                assert how != "returning"
            assert not store._inline.in_transaction
            assert not any(r.in_transaction for r in store._readers)
            for _ in range(3):
                assert await store.read(count_to, 10) == 10
        assert not store._inline.in_transaction
    finally:
        store.close()


async def test_writes_run_on_the_loop_and_only_the_commit_leaves_it(tmp_path: Path) -> None:
    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir)
    try:
        loop_thread = threading.get_ident()
        ran_on: list[int] = []

        def where(conn: sqlite3.Connection, n: int) -> int:
            ran_on.append(threading.get_ident())
            return append_event(conn, n, False)

        seq = await store.write(where, 1)
        assert ran_on == [loop_thread] and store.offloaded_batches == 0
        # Durable once it returns: another connection (another process) sees it.
        other = sqlite3.connect(store.path)
        assert other.execute("SELECT max(seq) FROM events").fetchone()[0] == seq
        other.close()
    finally:
        store.close()


async def test_a_write_over_the_budget_is_redone_in_a_thread_with_one_result(
    patient_store: Store,
) -> None:
    store = patient_store
    runs: list[int] = []

    def slow_append(conn: sqlite3.Connection, n: int) -> int:
        runs.append(threading.get_ident())
        seq = append_event(conn, n, False)
        assert count_to(conn, 3_000_000) == 3_000_000  # far past the inline budget
        return seq

    seq = await store.write(slow_append, 1)
    # Interrupted on the loop (its event undone), then done once in a thread.
    assert len(runs) == 2 and runs[0] == threading.get_ident() != runs[1]
    assert store.offloaded_batches == 1
    bodies = store.read_sync(
        lambda c: [
            tuple(r) for r in c.execute("SELECT seq, body FROM events WHERE type = 'test.event'")
        ]
    )
    assert len(bodies) == 1 and bodies[0][0] == seq
    # That function goes straight to a thread for a while; others stay on the loop.
    await store.write(slow_append, 2)
    assert len(runs) == 3 and runs[2] != threading.get_ident()
    await store.write(append_event, 3, False)
    assert store.offloaded_batches == 2


async def test_a_write_waits_in_a_thread_while_another_process_holds_the_store(
    tmp_path: Path,
) -> None:
    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir)
    other = sqlite3.connect(store.path, isolation_level=None)  # like the CLI writing
    try:
        other.execute("BEGIN IMMEDIATE")
        gaps: list[float] = []
        result: list[int] = []

        async def write() -> None:
            result.append(await store.write(append_event, 1, False))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            last = trio.current_time()
            for _ in range(20):  # the loop stays free while the write waits
                await trio.sleep(0.01)
                gaps.append(trio.current_time() - last)
                last = trio.current_time()
            assert not result
            other.execute("COMMIT")
        assert result and store.offloaded_batches == 1
        assert max(gaps) < 0.05, max(gaps)
    finally:
        other.close()
        store.close()


async def test_a_leader_cancelled_as_its_batch_starts_still_commits_the_batch(
    tmp_path: Path,
) -> None:
    """A client that goes away just as its write leads a batch (hypercorn cancels the request)
    must neither drop the other writes of the batch nor leave the writer in a transaction."""
    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir)
    try:
        release = trio.Event()
        leader_scope = trio.CancelScope()
        results: dict[str, object] = {}

        async def holder(task_status: Any) -> None:
            await store._write_limiter.acquire()
            task_status.started()
            await release.wait()
            store._write_limiter.release()  # the leader now owns the writer...
            leader_scope.cancel()  # ...and is cancelled before it runs

        async def leader() -> None:
            with leader_scope:
                results["leader"] = await store.write(append_event, 1, False)

        async def follower() -> None:
            results["follower"] = await store.write(append_event, 2, False)

        async with trio.open_nursery() as nursery:
            await nursery.start(holder)
            nursery.start_soon(leader)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(follower)
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        assert isinstance(results["follower"], int)
        bodies = committed_test_events(store)
        assert len(bodies) == 2  # the leader's write committed too, as the store promises
        assert isinstance(await store.write(append_event, 3, False), int)
    finally:
        store.close()


async def test_the_checkpointer_copies_the_wal_outside_commits(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A log of 1 MiB is past the limit (the write below makes about 6 MB): its RESTART is timed
    # (inboxd_store_checkpoint_restart_seconds).
    monkeypatch.setattr(db, "WAL_LIMIT_BYTES", 1 << 20)
    seed = seed_store(tmp_path / "data")
    store = Store.open(seed.data_dir, offload=False)  # MockClock: SQL on the trio thread
    db_file = store.path

    def many_events(conn: sqlite3.Connection) -> None:
        for n in range(3_000):  # well over SQLite's 1,000-page automatic checkpoint
            events.append(conn, 1, None, "test.event", {"n": n, "pad": "x" * 2_000}, 1)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.checkpoint_forever)
            await trio.testing.wait_all_tasks_blocked()
            before = db_file.stat().st_size
            await store.write(many_events)
            # The COMMIT only appended to the WAL: no checkpoint inside it.
            assert db_file.stat().st_size == before
            assert sum(store.restart_times.counts) == 0
            await trio.sleep(1.5)  # the checkpointer's round
            assert db_file.stat().st_size > before + 3_000 * 2_000
            assert sum(store.restart_times.counts) == 1
            assert store.restart_times.total > 0
            nursery.cancel_scope.cancel()
        # Stopped: the writer checkpoints by itself again.
        automatic = store._writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        assert automatic == 1000
    finally:
        store.close()


def test_a_backup_finishes_while_another_connection_keeps_committing(tmp_path: Path) -> None:
    """The copy reads one snapshot: it used to start over at every commit between its steps
    and never finished under steady writes."""
    seed_store(tmp_path)
    with sqlite3.connect(db.db_path(tmp_path)) as conn:  # ~24 MB: the copy takes several steps
        conn.execute("CREATE TABLE ballast (b BLOB)")
        conn.executemany("INSERT INTO ballast VALUES (randomblob(100000))", [()] * 240)
    stop = threading.Event()
    commits = [0]

    def keep_committing() -> None:
        writer = sqlite3.connect(db.db_path(tmp_path), isolation_level=None, timeout=30)
        writer.execute("CREATE TABLE ticks (n INTEGER)")
        while not stop.is_set():
            writer.execute("INSERT INTO ticks VALUES (1)")
            commits[0] += 1
        writer.close()

    thread = threading.Thread(target=keep_committing)
    thread.start()
    store = Store.open(tmp_path, readers=1)
    target = tmp_path / "backup.db"
    finished = threading.Event()
    try:
        while commits[0] < 10:  # writes are under way
            pass
        backup = threading.Thread(target=lambda: (store.backup_to(target), finished.set()))
        backup.start()
        backup.join(timeout=30)
    finally:
        stop.set()
        thread.join()
        store.close()
    assert finished.is_set(), f"no backup after 30 s and {commits[0]} commits"
    with sqlite3.connect(target) as copy:
        assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert copy.execute("SELECT count(*) FROM ballast").fetchone() == (240,)


def test_a_store_this_process_may_not_write_is_refused_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not SQLite's "unable to open database file" (which reads like a broken store), but
    which path, and why. (Tests may run as root, whom file modes do not stop: the permission
    is refused here through ``os.access``.)"""
    data = seed_store(tmp_path / "data").data_dir
    for path in (data, db.db_path(data)):
        with monkeypatch.context() as m:
            m.setattr(db.os, "access", lambda p, mode, path=path: Path(p) != path)
            with pytest.raises(StoreError) as refused:
                Store.open(data)
        assert str(refused.value) == (
            f"{path} is not writable: this user (uid {os.getuid()}) may not write it;"
            " inboxd writes the store and its -wal and -shm files there"
        )
    Store.open(data).close()  # (it was the permission, not the store)


def test_a_data_directory_that_cannot_be_made_is_refused_saying_why(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(StoreError) as refused:
        Store.open(tmp_path / "a-file" / "data", create=True)
    assert str(refused.value) == (
        f"cannot create the data directory {tmp_path / 'a-file' / 'data'}: Not a directory"
    )


def sqlite_error(code: int, text: str = "") -> sqlite3.OperationalError:
    """An error as SQLite raises it, with its (extended) result code."""
    exc = sqlite3.OperationalError(text or f"code {code}")
    exc.sqlite_errorcode = code  # type: ignore[attr-defined]
    return exc


def test_a_store_that_cannot_be_opened_for_its_disk_does_not_read_as_a_broken_store(
    tmp_path: Path,
) -> None:
    """SQLite's error at opening a store on a full disk (FULL, or "disk I/O error" for the
    -shm file it cannot grow) names the disk; other errors keep "not a usable inboxd store"."""
    assert db._open_failure(
        tmp_path, sqlite_error(sqlite3.SQLITE_FULL, "database or disk is full")
    ) == (
        f"cannot open the store in {tmp_path}: the disk that holds it is full"
        " (SQLite: database or disk is full)"
    )
    # tmp_path's disk has room: an I/O error there is said as such.
    assert db._open_failure(
        tmp_path, sqlite_error(sqlite3.SQLITE_IOERR_SHMSIZE, "disk I/O error")
    ) == (
        f"cannot open the store in {tmp_path}: the store's disk failed to read or write"
        " (SQLite: disk I/O error)"
    )
    assert db._open_failure(
        tmp_path, sqlite_error(sqlite3.SQLITE_NOTADB, "file is not a database")
    ) == (f"{tmp_path / 'inboxd.db'} is not a usable inboxd store: file is not a database")


def test_a_batch_whose_rollback_fails_too_leaves_no_write_looking_committed() -> None:
    """On a failing disk the ROLLBACK of a failed batch may raise as well: every write of the
    batch has its error by then, so none returns its result as if it had committed."""

    class FailingRollback:
        in_transaction = True

        def execute(self, sql: str) -> None:
            raise sqlite3.OperationalError("disk I/O error")

    made = db.WriteRequest(fn=lambda conn: None, args=(), result="made, then rolled back")
    refused = db.WriteRequest(fn=lambda conn: None, args=(), error=ValueError("its own"))
    cause = sqlite3.OperationalError("database or disk is full")
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        db.fail_batch(FailingRollback(), [made, refused], cause)  # type: ignore[arg-type]
    assert made.error is cause and isinstance(refused.error, ValueError)


def test_the_storage_alarm_tells_apart_kinds_that_share_a_503_code(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A read-only store, an I/O error and files that cannot be opened all answer 503
    storage_unavailable; within one minute each is still logged once, in its own words."""
    caplog.set_level(logging.INFO, logger="inboxd.store")
    now = [1000.0]
    monkeypatch.setattr(db.time, "monotonic", lambda: now[0])

    alarm = db.StorageAlarm()
    # SQLITE_IOERR_WRITE (an extended code: its low byte is SQLITE_IOERR)
    for code in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR_WRITE, sqlite3.SQLITE_CANTOPEN):
        for _ in range(2):
            failed = alarm.failed(sqlite_error(code))
            assert failed is not None and failed.code == "storage_unavailable"
            now[0] += 1
    said = [r.getMessage() for r in caplog.records if r.name == "inboxd.store"]
    assert said == [
        "writes fail: the store is read-only (its directory, file or filesystem)",
        "writes fail: the store's disk failed to read or write",
        "writes fail: the store's files cannot be opened",
    ]


def test_the_storage_alarm_ends_on_the_truth_whatever_the_order_within_a_minute(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Two kinds of failure and successes within a minute: a success held back by the
    once-a-minute limit is said by a later one, so the log's last word on writes is never a
    failure that has passed."""
    caplog.set_level(logging.INFO, logger="inboxd.store")
    now = [1000.0]
    monkeypatch.setattr(db.time, "monotonic", lambda: now[0])

    alarm = db.StorageAlarm()
    full = alarm.failed(sqlite_error(sqlite3.SQLITE_FULL))
    assert full is not None and full.code == "storage_full"
    alarm.succeeded()
    now[0] += 1
    busy = alarm.failed(sqlite_error(sqlite3.SQLITE_BUSY))
    assert busy is not None and busy.code == "storage_busy"
    alarm.succeeded()  # within the minute: not said yet
    alarm.succeeded()
    now[0] += db.STORAGE_LOG_EVERY
    alarm.succeeded()  # now it is
    alarm.succeeded()
    assert alarm.failed(ValueError("a bug")) is None
    said = [r.getMessage() for r in caplog.records if r.name == "inboxd.store"]
    assert said == [
        "writes fail: the disk that holds the store is full",
        "writes succeed again",
        "writes fail: another process holds the store's write lock (the CLI, a backup?)",
        "writes succeed again",
    ]
