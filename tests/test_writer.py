"""The writer process (store/writer.py): the daemon's write batches run in a child process, and
come back with each write's result or error, its journal events and its signals; a writer that
dies is replaced, and the batch it was running fails with 503 rather than hangs."""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import logging
import os
import pickle
import signal
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trio

from inboxd import daemon, wire
from inboxd.config import Config
from inboxd.errors import (
    Conflict,
    InboxError,
    RateLimited,
    ServiceUnavailable,
    StorageUnavailable,
    StoreError,
)
from inboxd.store import accounts, actions, conversations, db, idempotency, messages, writer
from inboxd.store.commit_times import COMMIT_BUCKETS, CommitTimes
from inboxd.store.db import IDEMPOTENT_WRITE, Appended, Store
from inboxd.store.writer import WriterProcess
from tests import writer_helpers as helpers
from tests.arrange import inbound_text
from tests.conftest import OPENAPI_HOOKS, Seed, auth, ingest, message_body, seed_store


@pytest.fixture
def seed(tmp_path: Path) -> Seed:
    return seed_store(tmp_path / "data")


@contextlib.asynccontextmanager
async def child_writing(
    seed: Seed, *, lead: bool, start_child: bool = False
) -> AsyncIterator[tuple[Store, trio.CancelScope]]:
    """The seed's store writing through its child (started first with ``start_child``; else the
    first batch starts it); with ``lead``, ``lead_batches`` running as in the daemon until the
    scope yielded is cancelled (or the block ends)."""
    s = Store.open(seed.data_dir, readers=1)
    s.writer_process = WriterProcess(s.path)
    try:
        if start_child:
            await s.writer_process.start()
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()
            if lead:

                async def lead_batches() -> None:
                    with scope:
                        await s.lead_batches()

                nursery.start_soon(lead_batches)
                await trio.testing.wait_all_tasks_blocked()  # (it runs before the first write)
            yield s, scope
            scope.cancel()
    finally:
        await s.writer_process.aclose()
        s.close()


@pytest.fixture(params=["lead_batches", "leaders"])
async def store(seed: Seed, request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """The store writing through its child, its batches taken by ``lead_batches`` as in the
    daemon, or by the writes themselves (each test runs both ways)."""
    async with child_writing(seed, lead=request.param == "lead_batches") as (s, _):
        yield s


def committed(store: Store) -> list[dict[str, int]]:
    """The data of the test.pid events that committed, in order."""
    rows = store.read_sync(
        lambda c: [r[0] for r in c.execute("SELECT body FROM events WHERE type = 'test.pid'")]
    )
    return [json.loads(body)["data"] for body in rows]


async def test_writes_run_in_the_child_and_bring_back_results_events_and_signals(
    store: Store,
) -> None:
    seen: list[list[Appended]] = []
    store.add_journal_listener(seen.append)
    signal_before = store.signal("test.signal").version
    results: dict[int, int] = {}

    async def one(n: int) -> None:
        results[n] = await store.write(helpers.record_pid, n)

    async with trio.open_nursery() as nursery:
        for n in range(8):
            nursery.start_soon(one, n)
    assert store.writer_process is not None
    child = store.writer_process.pid
    assert child is not None and child != os.getpid()
    assert results == {n: child for n in range(8)}
    assert sorted(d["n"] for d in committed(store)) == list(range(8))
    assert {d["pid"] for d in committed(store)} == {child}
    # Each write's event reached the journal's listeners in the daemon, with its committed seq.
    appended = [a for batch in seen for a in batch]
    assert sorted(json.loads(a.body)["data"]["n"] for a in appended) == list(range(8))
    seqs = store.read_sync(
        lambda c: [r[0] for r in c.execute("SELECT seq FROM events WHERE type = 'test.pid'")]
    )
    assert sorted(a.seq for a in appended) == seqs
    assert store.signal("test.signal").version > signal_before
    assert store.writer_process.started == 1


async def concurrently(store: Store, writes: list[tuple[Any, object]]) -> dict[int, object]:
    """Each ``(fn, arg)`` written at once (so that they share batches): by index, its result
    or the error it raised."""
    outcomes: dict[int, object] = {}

    async def one(i: int, fn: Any, arg: object) -> None:
        try:
            outcomes[i] = await store.write(fn, arg)
        except Exception as exc:
            outcomes[i] = exc

    async with trio.open_nursery() as nursery:
        for i, (fn, arg) in enumerate(writes):
            nursery.start_soon(one, i, fn, arg)
    return outcomes


async def test_a_failing_write_is_undone_alone_and_its_error_comes_back_as_raised(
    store: Store,
) -> None:
    outcomes = await concurrently(
        store,
        [(helpers.refuse_after_writing if n == 1 else helpers.record_pid, n) for n in range(3)],
    )
    refused = outcomes[1]
    assert isinstance(refused, Conflict)
    assert (refused.code, refused.message) == ("test_refused", "write 1 refuses")
    assert sorted(d["n"] for d in committed(store)) == [0, 2]
    # An error that does not survive pickling comes back as a StoreError naming it.
    with pytest.raises(StoreError, match="Unpicklable: no pickle"):
        await store.write(helpers.raise_unpicklable)
    assert (await store.write(helpers.record_pid, 3)) == store.writer_process.pid  # type: ignore[union-attr]


async def test_each_batch_s_commit_is_timed_in_the_child_and_counted_here(store: Store) -> None:
    """The child times each batch's COMMIT and sends it back with the outcomes: the writer
    process counts it (``inboxd_store_commit_seconds``); a failing write is undone alone, and
    its batch commits and is counted all the same."""
    await concurrently(store, [(helpers.record_pid, n) for n in range(5)])
    with pytest.raises(Conflict):
        await store.write(helpers.refuse_after_writing, 5)
    assert store.writer_process is not None
    in_child = store.writer_process.commit_times
    assert sum(in_child.counts) == store.batches >= 2
    assert 0 < in_child.total < 10
    assert sum(store.commit_times.counts) == 0  # (no batch ran in this process)
    assert store.all_commit_times() == in_child


async def test_a_batch_run_in_the_daemon_s_own_process_is_timed_there(seed: Seed) -> None:
    s = Store.open(seed.data_dir, readers=1)  # (no writer process: batches run here)
    try:
        for n in range(3):
            await s.write(helpers.record_pid, n)
        assert sum(s.commit_times.counts) == 3
        assert s.all_commit_times() == s.commit_times
        assert s.all_commit_times() is not s.commit_times  # (a copy, for a scrape)
    finally:
        s.close()


@pytest.mark.parametrize(
    ("seconds", "bucket"),
    [(0.0, 0), (0.0005, 0), (0.00051, 1), (0.005, 3), (0.0051, 4), (1.0, 10), (1.01, 11), (60, 11)],
)
def test_a_duration_is_counted_in_the_first_bucket_it_does_not_exceed(
    seconds: float, bucket: int
) -> None:
    durations = CommitTimes()
    durations.observe(seconds)
    assert durations.counts == [int(n == bucket) for n in range(len(COMMIT_BUCKETS) + 1)]
    assert durations.total == seconds
    both = durations + durations
    assert both.counts == [2 * c for c in durations.counts] and both.total == 2 * seconds


async def test_a_batch_and_an_answer_larger_than_the_pipe_go_through(store: Store) -> None:
    # The frames are written and read on the pipe's descriptors directly; a pipe holds 64 KiB,
    # so these wait for room and read in many pieces.
    blobs = [bytes([n]) * 300_000 for n in range(3)]
    outcomes = await concurrently(store, [(helpers.echo_large, blob) for blob in blobs])
    assert outcomes == {n: blob + blob for n, blob in enumerate(blobs)}
    assert sorted(d["n"] for d in committed(store)) == [300_000] * 3
    assert {d["pid"] for d in committed(store)} == {store.writer_process.pid}  # type: ignore[union-attr]


@pytest.fixture
async def led(seed: Seed) -> AsyncIterator[tuple[Store, trio.CancelScope]]:
    """A store writing through its child with ``lead_batches`` running, its child started, and
    the scope that stops ``lead_batches``."""
    async with child_writing(seed, lead=True, start_child=True) as pair:
        yield pair


def note_batches(
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    note: Callable[[list[db.WriteRequest], str], object],
) -> None:
    """Call ``note`` with each batch the store gives its child from now on, and how: "sent"
    at once by lead_batches (``send_nowait``), or "run" (``run``: its other path, its last
    batch, or a write leading its own)."""
    process = store.writer_process
    assert process is not None
    send, run = process.send_nowait, process.run

    def sending(batch: list[db.WriteRequest]) -> writer.Flight:
        note(batch, "sent")
        return send(batch)

    async def running(batch: list[db.WriteRequest], **tries: int) -> bool:
        note(batch, "run")
        return await run(batch, **tries)

    monkeypatch.setattr(process, "send_nowait", sending)
    monkeypatch.setattr(process, "run", running)


async def slow_then_queued(
    store: Store, queued: int, seen: list[str]
) -> tuple[int, dict[int, object]]:
    """One slow write sent alone, then ``queued`` quick ones while it runs in the child; each
    write's outcome, and the slow one's return noted in ``seen``."""
    outcomes: dict[int, object] = {}

    async def slow() -> None:
        await store.write(helpers.sleep_then_record, 0.1)
        seen.append("the slow write returned")

    async def quick(n: int) -> None:
        outcomes[n] = await store.write(helpers.record_pid, n)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow)
        await trio.testing.wait_all_tasks_blocked()  # its batch is in the child
        for n in range(queued):
            nursery.start_soon(quick, n)
    return store.batches, outcomes


async def test_lead_batches_sends_the_next_batch_in_the_step_the_last_one_ended(
    led: tuple[Store, trio.CancelScope], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writes queued while a batch runs go to the child together, and at once: before any
    write of the batch that just ended has even resumed (no round of other tasks between)."""
    store, _ = led
    assert store.writer_process is not None
    seen: list[str] = []
    note_batches(store, monkeypatch, lambda batch, how: seen.append(f"{how} {len(batch)}"))
    # Five times: with a yield before the send, trio would run the slow write's task first
    # in about half of them (it runs a round's tasks in either order).
    for _ in range(5):
        seen.clear()
        before = store.batches
        batches, outcomes = await slow_then_queued(store, 5, seen)
        assert seen == ["sent 1", "sent 5", "the slow write returned"]
        assert batches - before == 2
        assert outcomes == {n: store.writer_process.pid for n in range(5)}
    assert sorted(d["n"] for d in committed(store)) == sorted([-1, 0, 1, 2, 3, 4] * 5)


@pytest.mark.parametrize(
    ("queued", "batches"),
    [(10, [10]), (16, [16]), (20, [16, 4]), (33, [17, 16]), (40, [20, 16, 4])],
)
async def test_many_writes_queued_go_to_the_child_half_at_a_time_one_batch_after_the_other(
    led: tuple[Store, trio.CancelScope],
    monkeypatch: pytest.MonkeyPatch,
    queued: int,
    batches: list[int],
) -> None:
    """Past ``BATCH_FLOOR`` writes queued, a batch takes the first half of them (in the order
    they queued), and the rest go as the next batch (by the same rule) the moment it ends; each
    write is woken once, by the end of its own batch, with its own outcome."""
    assert db.BATCH_FLOOR == 16  # (the cases assume it)
    store, _ = led
    assert store.writer_process is not None
    seen: list[str] = []
    note_batches(
        store, monkeypatch, lambda batch, how: seen.append(f"{how} {[r.args[0] for r in batch]}")
    )
    before = store.batches
    outcomes: dict[int, object] = {}
    order: list[int] = []  # as they queued (trio starts the tasks in either order)
    returned: list[int] = []

    async def quick(n: int) -> None:
        order.append(n)  # (write queues it before it first yields)
        outcomes[n] = await store.write(helpers.record_pid, n)
        returned.append(n)

    async with trio.open_nursery() as nursery:
        # (0.3 s in the child: time enough for the rest to queue meanwhile)
        nursery.start_soon(store.write, helpers.sleep_then_record, 0.3)
        await trio.testing.wait_all_tasks_blocked()  # its batch is in the child
        for n in range(queued):
            nursery.start_soon(quick, n)
    ends = list(itertools.accumulate(batches))
    bounds = list(zip([0, *ends], ends, strict=False))  # each batch's slice of ``order``
    halves = [order[a:b] for a, b in bounds]
    assert seen == ["sent [0.3]", *(f"sent {half}" for half in halves)]
    assert store.batches - before == 1 + len(batches)
    assert outcomes == {n: store.writer_process.pid for n in range(queued)}
    # A batch's writes all return before any write of the batch after it.
    assert [sorted(returned[a:b]) for a, b in bounds] == [sorted(half) for half in halves]
    assert sorted(d["n"] for d in committed(store)) == [-1, *range(queued)]


async def test_a_queued_write_cancelled_before_its_batch_is_never_made(
    led: tuple[Store, trio.CancelScope],
) -> None:
    store, _ = led
    scope = trio.CancelScope()
    made: list[int] = []

    async def write(n: int, cancel_scope: trio.CancelScope) -> None:
        with cancel_scope:
            made.append(await store.write(helpers.record_pid, n))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.write, helpers.sleep_then_record, 0.3)
        await trio.testing.wait_all_tasks_blocked()  # in the child
        nursery.start_soon(write, 1, scope)
        nursery.start_soon(write, 2, trio.CancelScope())
        await trio.testing.wait_all_tasks_blocked()  # both queued behind it
        scope.cancel()
    assert len(made) == 1
    assert sorted(d["n"] for d in committed(store)) == [-1, 2]


async def queued_behind_a_slow_write(
    store: Store, queued: int, then: Callable[[], None]
) -> dict[int, object]:
    """A write 0.3 s long in the child, ``queued`` quick ones behind it; once all of them wait,
    ``then()``; each quick write's outcome, once every write has returned."""
    outcomes: dict[int, object] = {}

    async def quick(n: int) -> None:
        outcomes[n] = await store.write(helpers.record_pid, n)

    with trio.fail_after(10):  # (writes that nobody runs fail here rather than hang)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.write, helpers.sleep_then_record, 0.3)
            await trio.testing.wait_all_tasks_blocked()
            for n in range(queued):
                nursery.start_soon(quick, n)
            await trio.testing.wait_all_tasks_blocked()
            then()
    return outcomes


async def test_lead_batches_stopping_lands_its_batch_and_runs_the_writes_queued(
    led: tuple[Store, trio.CancelScope], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled (the daemon stopping) with a batch in the child and writes queued behind it:
    the batch lands, and the queued writes run in one last batch as lead_batches ends; later
    writes lead their own."""
    store, scope = led
    sends: list[str] = []
    note_batches(store, monkeypatch, lambda batch, how: sends.append(f"{how} {len(batch)}"))
    before = []

    def stop() -> None:
        before.append(store.batches)
        scope.cancel()

    outcomes = await queued_behind_a_slow_write(store, 3, stop)
    assert sends == ["sent 1", "run 3"]  # the three not sent by the loop, but together...
    assert store.batches - before[0] == 1  # ...in the last batch, taken once cancelled
    assert sorted(outcomes) == [0, 1, 2]
    assert not store._leading
    assert await store.write(helpers.record_pid, 3) == store.writer_process.pid  # type: ignore[union-attr]
    assert sorted(d["n"] for d in committed(store)) == [-1, 0, 1, 2, 3]


@pytest.mark.parametrize(
    ("queued", "stop", "sizes"),
    [(3, True, ["run 3"]), (20, False, ["run 16", "sent 4"])],
    ids=["lead_batches stopping meanwhile", "lead_batches running"],
)
async def test_writes_queued_while_the_writer_is_held_run_once_it_is_free(
    led: tuple[Store, trio.CancelScope],
    monkeypatch: pytest.MonkeyPatch,
    queued: int,
    stop: bool,
    sizes: list[str],
) -> None:
    """Writes queued while the writer is held (by the checkpointer; here by the test) run once
    it is free: with lead_batches cancelled meanwhile (the daemon stopping), in one last batch;
    with it running, by the same limit as ever (lead_batches' other path: 20 go as 16, then
    4)."""
    store, scope = led
    assert store.writer_process is not None
    noted: list[str] = []
    note_batches(store, monkeypatch, lambda batch, how: noted.append(f"{how} {len(batch)}"))
    outcomes: dict[int, object] = {}
    release = trio.Event()

    async def hold(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with store._write_limiter:
            task_status.started()
            await release.wait()

    async def quick(n: int) -> None:
        outcomes[n] = await store.write(helpers.record_pid, n)

    with trio.fail_after(10):  # (writes that nobody runs fail here rather than hang)
        async with trio.open_nursery() as nursery:
            await nursery.start(hold)
            for n in range(queued):
                nursery.start_soon(quick, n)
            await trio.testing.wait_all_tasks_blocked()
            assert not outcomes
            before = store.batches
            if stop:
                scope.cancel()
                await trio.testing.wait_all_tasks_blocked()
            release.set()
    assert noted == sizes
    assert store.batches - before == len(sizes)
    assert store._leading is not stop
    assert outcomes == {n: store.writer_process.pid for n in range(queued)}


async def test_a_batch_that_could_not_be_sent_fails_its_writes_and_the_next_goes_on(
    led: tuple[Store, trio.CancelScope],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An error nobody foresaw in sending a batch (nothing sent): each of its writes returns it
    (none is left waiting), the error is logged, and the next batch goes to the child."""
    store, _ = led
    assert store.writer_process is not None
    send = store.writer_process.send_nowait
    failures = [RuntimeError("the pipe is not what it was")]

    def failing_once(batch: list[db.WriteRequest]) -> writer.Flight:
        if failures:
            raise failures.pop()
        return send(batch)

    monkeypatch.setattr(store.writer_process, "send_nowait", failing_once)
    outcomes: dict[int, object] = {}

    async def quick(n: int) -> None:
        try:
            outcomes[n] = await store.write(helpers.record_pid, n)
        except RuntimeError as exc:
            outcomes[n] = str(exc)

    with trio.fail_after(10):  # (a write left waiting would hang here)
        async with trio.open_nursery() as nursery:
            for n in range(3):
                nursery.start_soon(quick, n)
    assert outcomes == {n: "the pipe is not what it was" for n in range(3)}
    assert "a batch of writes could not be sent to the writer process" in caplog.text
    assert "failed past its writes" not in caplog.text
    assert await store.write(helpers.record_pid, 3) == store.writer_process.pid
    assert sorted(d["n"] for d in committed(store)) == [3]


async def test_a_batch_larger_than_the_pipe_goes_through_sent_at_once(
    led: tuple[Store, trio.CancelScope], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``send_nowait`` writes what the pipe takes in the step; ``finish`` the rest."""
    store, _ = led
    assert store.writer_process is not None
    send = store.writer_process.send_nowait
    left: list[int] = []

    def noting(batch: list[db.WriteRequest]) -> writer.Flight:
        flight = send(batch)
        left.append(len(flight.rest))
        return flight

    monkeypatch.setattr(store.writer_process, "send_nowait", noting)
    blob = b"x" * 300_000
    assert await store.write(helpers.echo_large, blob) == blob + blob
    assert len(left) == 1 and 0 < left[0] < 300_000  # the pipe took part of it at once


def exited(pid: int) -> bool:
    """Whether the child ``pid`` has exited (and is not reaped yet: its state is Z)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


async def killed(pid: int) -> None:
    """Kill the process ``pid`` and wait until it has exited."""
    os.kill(pid, signal.SIGKILL)
    with trio.fail_after(10):
        while not exited(pid):  # noqa: ASYNC110 (polling another process)
            await trio.sleep(0.01)


async def test_a_batch_sent_to_a_writer_already_gone_goes_to_a_new_one(
    led: tuple[Store, trio.CancelScope],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The child died and is not reaped yet when a batch is sent to it: the pipe refuses the
    batch whole, so none of it was made, and it goes to a new child (not a 503)."""
    store, _ = led
    process = store.writer_process
    assert process is not None and process.pid is not None
    first = process.pid
    await killed(first)
    monkeypatch.setattr(process, "running", lambda: True)  # (as if not seen to exit yet)
    how: list[str] = []
    note_batches(store, monkeypatch, lambda batch, sent_or_run: how.append(sent_or_run))
    assert await store.write(helpers.record_pid, 1) not in (first, None)
    assert how == ["sent", "run"]  # sent to the dead child, then run by a new one
    assert process.started == 2
    assert "the store's writer process stopped" in caplog.text
    monkeypatch.undo()
    assert await store.write(helpers.record_pid, 2) == process.pid
    assert [d["n"] for d in committed(store)] == [1, 2]


async def test_a_batch_no_child_took_fails_with_503_not_made_and_the_next_starts_one(
    led: tuple[Store, trio.CancelScope], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new child that a batch goes to dies too before reading it: the batch fails with 503
    ``writer_stopped``, which says the change was not made (nothing of it reached a child), and
    no third child is tried for it; the next batch starts one."""
    store, _ = led
    process = store.writer_process
    assert process is not None and process.pid is not None
    await killed(process.pid)
    spawn = process._spawn

    async def dead_on_arrival() -> trio.Process:
        child = await spawn()
        await killed(child.pid)
        return child

    monkeypatch.setattr(process, "running", lambda: True)  # (as if not seen to exit yet)
    monkeypatch.setattr(process, "_spawn", dead_on_arrival)
    with pytest.raises(ServiceUnavailable) as exc, trio.fail_after(10):  # (a retry for good)
        await store.write(helpers.record_pid, 1)
    assert exc.value.code == "writer_stopped"
    assert "the change was not made" in str(exc.value)
    assert process.started == 2
    monkeypatch.undo()
    assert await store.write(helpers.record_pid, 2) == process.pid
    assert process.started == 3
    assert [d["n"] for d in committed(store)] == [2]


async def test_a_batch_for_a_writer_found_gone_keeps_the_errors_of_what_does_not_pickle(
    led: tuple[Store, trio.CancelScope], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch sent to a child already gone goes to a new one whole: a write of it that does
    not pickle fails alone there as it did here, and the others are made."""
    store, _ = led
    process = store.writer_process
    assert process is not None and process.pid is not None
    await killed(process.pid)
    monkeypatch.setattr(process, "running", lambda: True)  # (as if not seen to exit yet)
    sizes: list[int] = []
    note_batches(store, monkeypatch, lambda batch, how: sizes.append(len(batch)))
    outcomes = await concurrently(
        store, [(helpers.record_pid, 0), (helpers.record_pid, lambda: None)]
    )
    assert sizes == [2, 2]  # sent to the dead child, then run by a new one, together
    assert outcomes[0] == process.pid and process.started == 2
    assert isinstance(outcomes[1], StoreError) and "cannot be sent" in str(outcomes[1])
    assert [d["n"] for d in committed(store)] == [0]


async def test_a_batch_for_a_writer_found_gone_is_written_here_if_no_new_one_may_run(
    led: tuple[Store, trio.CancelScope], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new child would run other code than the daemon (a new version installed under
    it): the batch that found the old one gone is written from the daemon's own process, as
    every later one."""
    store, _ = led
    process = store.writer_process
    assert process is not None and process.pid is not None
    await killed(process.pid)

    async def changed() -> trio.Process:
        raise writer.CodeChanged("inboxd's files changed since the daemon started")

    monkeypatch.setattr(process, "running", lambda: True)  # (as if not seen to exit yet)
    monkeypatch.setattr(process, "_spawn", changed)
    assert await store.write(helpers.record_pid, 1) == os.getpid()
    assert process.unavailable
    monkeypatch.undo()
    assert await store.write(helpers.record_pid, 2) == os.getpid()
    assert [d["n"] for d in committed(store)] == [1, 2]


async def test_a_child_found_gone_when_a_batch_runs_is_replaced_for_that_batch(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch run (not sent at once) by a child that died after it was looked at: none of it
    reached the child, and a new one makes it (once more at most)."""
    first = await store.write(helpers.record_pid, 1)
    process = store.writer_process
    assert process is not None and process._process is not None
    gone = process._process
    ensure = process._ensure_started
    handed: list[int] = []

    async def not_looking() -> trio.Process:  # the dead child once, as if it looked alive
        if not handed:
            handed.append(gone.pid)
            return gone
        return await ensure()

    await killed(first)
    monkeypatch.setattr(process, "running", lambda: False)  # (lead_batches runs it: run())
    monkeypatch.setattr(process, "_ensure_started", not_looking)
    assert await store.write(helpers.record_pid, 2) not in (first, None)
    assert handed == [first] and process.started == 2
    assert [d["n"] for d in committed(store)] == [1, 2]


async def test_a_batch_part_of_which_reached_a_child_that_died_may_or_may_not_be_made(
    led: tuple[Store, trio.CancelScope], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Part of a large batch went down the pipe, then the child died: it may have read that
    part, so the batch is not run again; it fails with 503 "may or may not"."""
    store, _ = led
    process = store.writer_process
    assert process is not None and process.pid is not None
    first = process.pid
    send = process.send_nowait
    left: list[int] = []

    def sending_then_killing(batch: list[db.WriteRequest]) -> writer.Flight:
        flight = send(batch)
        left.append(len(flight.rest))
        os.kill(first, signal.SIGKILL)
        return flight

    monkeypatch.setattr(process, "send_nowait", sending_then_killing)
    with pytest.raises(ServiceUnavailable) as exc:
        await store.write(helpers.echo_large, b"x" * 300_000)
    assert 0 < left[0] < 300_000  # the pipe took part of it
    assert exc.value.code == "writer_stopped" and "may or may not" in str(exc.value)
    monkeypatch.undo()
    assert await store.write(helpers.record_pid, 2) not in (first, None)
    assert process.started == 2
    assert [d["n"] for d in committed(store)] == [2]


async def test_a_journal_listener_that_raises_leaves_lead_batches_running(
    led: tuple[Store, trio.CancelScope], caplog: pytest.LogCaptureFixture
) -> None:
    """An error after the writes (a listener's) is logged; the writes have their results and
    the next batch runs."""
    store, _ = led

    def fails(appended: list[Appended]) -> None:
        raise RuntimeError("a listener's bug")

    store.add_journal_listener(fails)
    with caplog.at_level(logging.ERROR, logger="inboxd.store"):
        assert await store.write(helpers.record_pid, 1) == store.writer_process.pid  # type: ignore[union-attr]
    assert "a batch of writes failed past its writes" in caplog.text
    store._journal_listeners.remove(fails)
    assert store._leading
    assert await store.write(helpers.record_pid, 2) == store.writer_process.pid  # type: ignore[union-attr]
    assert [d["n"] for d in committed(store)] == [1, 2]


async def test_a_journal_listener_that_raises_in_the_last_batch_leaves_lead_batches_ending(
    led: tuple[Store, trio.CancelScope], caplog: pytest.LogCaptureFixture
) -> None:
    """The same in the last batch, as lead_batches stops: logged, not raised into the daemon's
    stop; the writes have their results, and later writes lead their own."""
    store, scope = led

    def fails(appended: list[Appended]) -> None:
        raise RuntimeError("a listener's bug")

    def stop() -> None:
        store.add_journal_listener(fails)
        scope.cancel()

    with caplog.at_level(logging.ERROR, logger="inboxd.store"):
        outcomes = await queued_behind_a_slow_write(store, 2, stop)
    store._journal_listeners.remove(fails)
    assert caplog.text.count("a batch of writes failed past its writes") == 2
    assert outcomes == {n: store.writer_process.pid for n in range(2)}  # type: ignore[union-attr]
    assert not store._leading
    assert await store.write(helpers.record_pid, 2) == store.writer_process.pid  # type: ignore[union-attr]


async def test_a_writer_that_died_between_batches_is_replaced(store: Store) -> None:
    first = await store.write(helpers.record_pid, 1)
    await killed(first)
    second = await store.write(helpers.record_pid, 2)
    assert second != first
    assert store.writer_process is not None and store.writer_process.started == 2
    assert [d["n"] for d in committed(store)] == [1, 2]


async def test_a_writer_killed_mid_batch_fails_that_batch_with_503_and_commits_none_of_it(
    store: Store,
) -> None:
    child = await store.write(helpers.record_pid, 1)
    failed: list[ServiceUnavailable] = []

    async def slow() -> None:
        with pytest.raises(ServiceUnavailable) as exc:
            await store.write(helpers.sleep_then_record, 5.0)
        failed.append(exc.value)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow)
        await trio.sleep(0.5)  # it is sleeping inside its transaction
        os.kill(child, signal.SIGKILL)
    assert failed[0].status == 503 and failed[0].code == "writer_stopped"
    assert "may or may not" in failed[0].message
    # Its transaction never committed; the next write has a new writer.
    assert await store.write(helpers.record_pid, 2) != child
    assert [d["n"] for d in committed(store)] == [1, 2]
    assert sum(store.all_commit_times().counts) == 2  # (the two COMMITs made, timed)


async def test_a_full_disk_fails_writes_with_503_storage_full_until_there_is_room(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite's SQLITE_FULL (a real one: the writer's store may not grow) is 503 storage_full
    with Retry-After, logged once however many writes fail; nothing of a failed write is
    kept, and writes go on once there is room again."""
    caplog.set_level(logging.INFO, logger="inboxd.store")
    await store.write(helpers.record_pid, 1)
    await store.write(helpers.fill_the_disk)
    for n in (2, 3):
        with pytest.raises(ServiceUnavailable) as full:
            await store.write(helpers.record_big, n)
        assert isinstance(full.value, StorageUnavailable)
        assert full.value.status == 503 and full.value.code == "storage_full"
        assert full.value.headers() == {"Retry-After": str(db.STORAGE_RETRY_AFTER)}
        assert "disk that holds the store is full" in full.value.message
        cause = full.value.__cause__
        assert isinstance(cause, sqlite3.OperationalError)
        assert cause.sqlite_errorname == "SQLITE_FULL"
    logged = [r for r in caplog.records if r.getMessage().startswith("writes fail")]
    assert len(logged) == 1 and logged[0].levelname == "ERROR"
    assert "database or disk is full" in str(logged[0].__dict__["error"])
    await store.write(helpers.free_the_disk)
    await store.write(helpers.record_big, 4)
    assert [d["n"] for d in committed(store)] == [1, 4]
    await store.write(helpers.record_pid, 5)
    said = [r.getMessage() for r in caplog.records if r.name == "inboxd.store"]
    assert said.count("writes succeed again") == 1
    assert said.index("writes succeed again") > said.index(logged[0].getMessage())


async def test_a_full_disk_answers_writes_503_while_reads_go_on(
    seed: Seed, config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over HTTP, through the daemon's own writer process: a write the full disk refuses is a
    JSON 503 storage_full with Retry-After (as the OpenAPI document says, which the client's
    hooks check), with and without an Idempotency-Key; reads answer as before, and the same
    request succeeds once there is room again."""
    opened: list[Store] = []
    open_store = Store.open

    def keep(*args: Any, **kwargs: Any) -> Store:
        opened.append(s := open_store(*args, **kwargs))
        return s

    monkeypatch.setattr(Store, "open", keep)
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            lambda task_status: daemon.run(
                seed.data_dir, config, shutdown, bind="127.0.0.1:0", task_status=task_status
            )
        )
        [store] = opened
        async with httpx.AsyncClient(
            base_url=urls[0], headers=auth(seed.owner_key), event_hooks=OPENAPI_HOOKS
        ) as client:
            counts = "/api/v1/inbox/conversations/counts"
            before = (await client.get(counts)).json()
            await store.write(helpers.fill_the_disk)
            body = message_body(seed.sales_id, "15550009", content="x" * 200_000)
            for headers in ({}, {"Idempotency-Key": "full-1"}):
                r = await client.post("/api/v1/messaging/messages", json=body, headers=headers)
                assert r.status_code == 503, r.text
                assert r.headers["Retry-After"] == str(db.STORAGE_RETRY_AFTER)
                assert r.json()["error"]["code"] == "storage_full"
                assert "full" in r.json()["error"]["message"]
            assert (await client.get(counts)).json() == before
            await store.write(helpers.free_the_disk)
            r = await client.post(
                "/api/v1/messaging/messages", json=body, headers={"Idempotency-Key": "full-1"}
            )
            assert r.status_code == 201, r.text
            assert (await client.get(counts)).json()["all"] == before["all"] + 1
        shutdown.set()


async def test_an_sql_error_of_a_write_is_not_taken_for_a_storage_failure(store: Store) -> None:
    """Only the store's disk and files make a 503: an SQL error of a write (a bug, answered
    500) is not turned into "retry later", SQLITE_LOCKED (one connection's own conflict)
    neither."""
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        await store.write(helpers.bad_sql)
    with pytest.raises(sqlite3.OperationalError) as locked:
        await store.write(helpers.lock_a_table)
    assert locked.value.sqlite_errorname == "SQLITE_LOCKED"


async def test_a_disk_that_is_full_now_and_then_is_logged_once_a_minute_not_each_time(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="inboxd.store")
    for n in range(3):
        await store.write(helpers.fill_the_disk)
        with pytest.raises(StorageUnavailable):
            await store.write(helpers.record_big, n)
        await store.write(helpers.free_the_disk)
        await store.write(helpers.record_big, n)
    said = [r.getMessage() for r in caplog.records if r.name == "inboxd.store"]
    assert said == [
        "writes fail: the disk that holds the store is full",
        "writes succeed again",
    ]


async def test_a_batch_the_disk_refuses_in_the_daemon_s_own_process_is_503_for_every_write(
    tmp_path: Path,
) -> None:
    """Without the writer process (it could not start), the batch runs on the trio thread: a
    BEGIN that the store refuses (read-only here: ``query_only`` on the writer's connection)
    is the same 503 for the write that led the batch as for the others, not SQLite's error."""
    store = Store.open(seed_store(tmp_path / "data").data_dir, readers=1)
    try:
        store._writer.execute("PRAGMA query_only = ON")
        outcomes: list[StorageUnavailable] = []

        async def write(n: int) -> None:
            with pytest.raises(StorageUnavailable) as refused:
                await store.write(helpers.record_pid, n)
            outcomes.append(refused.value)

        async with trio.open_nursery() as nursery:
            for n in range(3):
                nursery.start_soon(write, n)
        assert [e.code for e in outcomes] == ["storage_unavailable"] * 3
        assert store.batches < 3  # (they went together)
        store._writer.execute("PRAGMA query_only = OFF")
        await store.write(helpers.record_pid, 4)
        assert [d["n"] for d in committed(store)] == [4]
    finally:
        store.close()


async def test_events_of_a_batch_whose_writer_died_after_committing_are_still_heard(
    store: Store,
) -> None:
    """The write gets 503 writer_stopped ("may or may not"), but it did commit: the journal's
    listeners (the live feed, the webhook deliverers) hear of its event all the same, once and
    in order, and the signals it would have bumped are bumped (they used to hear nothing)."""
    seen: list[Appended] = []
    store.add_journal_listener(seen.extend)
    await store.write(helpers.record_pid, 1)
    await store.write(helpers.die_after_the_next_commit)
    signal_before = store.signal("test.signal").version
    with pytest.raises(ServiceUnavailable) as lost:
        await store.write(helpers.record_pid, 2)
    assert lost.value.code == "writer_stopped"
    assert [d["n"] for d in committed(store)] == [1, 2]  # it committed
    assert store.signal("test.signal").version > signal_before
    await store.write(helpers.record_pid, 3)  # a new writer
    heard = [json.loads(a.body)["data"]["n"] for a in seen if a.type == "test.pid"]
    assert heard == [1, 2, 3]
    assert [a.seq for a in seen] == sorted({a.seq for a in seen})


async def test_events_of_a_batch_whose_answer_failed_here_are_still_heard(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child committed and answered, but reading the answer raised something unforeseen
    (not a lost child): the write fails, yet the listeners hear of its event at once, as
    after a lost writer (left from the eighteenth session's review: they heard nothing). The
    child is ended first (it could have been still at work, its answer unread), so the
    journal read is final, and the next write goes to a new child."""
    seen: list[Appended] = []
    store.add_journal_listener(seen.extend)
    first_child = await store.write(helpers.record_pid, 1)
    assert store.writer_process is not None
    receive = WriterProcess._receive

    async def receive_then_fail(self: WriterProcess, process: trio.Process) -> bytes:
        await receive(self, process)
        raise RuntimeError("something unforeseen")

    monkeypatch.setattr(WriterProcess, "_receive", receive_then_fail)
    signal_before = store.signal("test.signal").version
    with pytest.raises(RuntimeError):
        await store.write(helpers.record_pid, 2)
    assert [d["n"] for d in committed(store)] == [1, 2]  # it committed
    heard = [json.loads(a.body)["data"]["n"] for a in seen if a.type == "test.pid"]
    assert heard == [1, 2]
    assert store.signal("test.signal").version > signal_before
    monkeypatch.undo()
    assert await store.write(helpers.record_pid, 3) != first_child
    heard = [json.loads(a.body)["data"]["n"] for a in seen if a.type == "test.pid"]
    assert heard == [1, 2, 3]


async def test_a_child_left_at_work_by_an_unforeseen_error_is_ended(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unforeseen error before the answer was read: the child, still running the batch, is
    ended rather than left to commit later (unheard) and to answer the next batch with this
    one's outcomes (found by the nineteenth session's review)."""
    first_child = await store.write(helpers.record_pid, 1)

    async def fail_at_once(self: WriterProcess, process: trio.Process) -> bytes:
        raise RuntimeError("something unforeseen")

    monkeypatch.setattr(WriterProcess, "_receive", fail_at_once)
    with pytest.raises(RuntimeError):
        await store.write(helpers.sleep_then_record, 1.0)
    monkeypatch.undo()
    second_child = await store.write(helpers.record_pid, 3)
    assert second_child not in (None, first_child)
    await trio.sleep(1.5)  # (past the first child's sleep, had it lived)
    assert [d["n"] for d in committed(store)] == [1, 3]


async def test_the_writer_ignores_sigterm_and_exits_once_its_pipe_closes(store: Store) -> None:
    child = await store.write(helpers.record_pid, 1)
    os.kill(child, signal.SIGTERM)  # systemd stopping the unit signals every process in it
    os.kill(child, signal.SIGINT)  # Ctrl-C in a terminal, the whole process group
    await trio.sleep(0.2)
    assert await store.write(helpers.record_pid, 2) == child  # still the same writer
    process = store.writer_process._process  # type: ignore[union-attr]
    assert process is not None
    await store.writer_process.aclose()  # type: ignore[union-attr]
    assert process.returncode == 0


async def test_the_idempotency_mark_commits_with_the_change_in_the_writer(
    store: Store, seed: Seed
) -> None:
    """As tests/test_idempotency.py's lost-response case, through the child: the mark that the
    request's change was made commits in that change's savepoint."""
    who = store.read_sync(accounts.authenticate, seed.owner_key)
    assert who is not None
    new = inbound_text(seed.sales_id, "15550001")
    conv = (await store.write(messages.ingest, who, new, 1)).message.conversation_id
    assert await store.write(idempotency.claim, who.user_pk, "k", b"fp", 1_000) is None
    IDEMPOTENT_WRITE.set((who.user_pk, "k"))
    renamed = await store.write(actions.rename, who, conv, "Applied once", 1_000)
    assert renamed.title == "Applied once"
    assert IDEMPOTENT_WRITE.get() is None  # only the request's first write carries the mark
    with pytest.raises(Conflict) as refused:
        await store.write(idempotency.claim, who.user_pk, "k", b"fp", 1_000 + 61 * 10**6)
    assert refused.value.code == "idempotency_key_applied"


async def test_results_come_back_equal_to_what_the_store_holds(store: Store, seed: Seed) -> None:
    """attrs values cross the pipe as their class and field values (the writer's pickler):
    what a write returns through the child equals the same value read in this process."""
    who = store.read_sync(accounts.authenticate, seed.owner_key)
    assert who is not None
    new = inbound_text(seed.sales_id, "15550003", "hello", name="Carla")
    ingested = await store.write(messages.ingest, who, new, 5)
    conv_id = ingested.message.conversation_id
    assert ingested.message == store.read_sync(messages.load_one, ingested.message.pk)
    assigned = await store.write(actions.assign, who, conv_id, seed.ann_id, 6)
    assert assigned == store.read_sync(conversations.get, who, conv_id)
    assert assigned.assigned_user is not None and assigned.assigned_user.id == seed.ann_id
    # The routes' form (actions.Answered): the answer's JSON, encoded in the child, is what
    # this process would encode from the row it reads back.
    answer = await store.write(actions.RENAME_ANSWERED, who, conv_id, "Carla's", 7)
    renamed = store.read_sync(conversations.get, who, conv_id)
    assert renamed.title == "Carla's"
    assert answer == orjson.dumps(wire.conversation(renamed, with_contact=False))


def written_bytes(pid: int) -> int:
    """How many bytes process ``pid`` has written so far (write calls of any kind)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError(f"no wchar in /proc/{pid}/io")


def writer_children() -> list[int]:
    """The pids of this process's writer children still running (not yet exited)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == os.getpid() and stat[0] != "Z" and b"inboxd.store.writer" in cmdline:
            found.append(int(entry.name))
    return found


async def test_the_daemon_writes_through_its_child_and_stops_it_on_shutdown(
    seed: Seed, config: Config
) -> None:
    shutdown = trio.Event()
    assert writer_children() == []
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            lambda task_status: daemon.run(
                seed.data_dir, config, shutdown, bind="127.0.0.1:0", task_status=task_status
            )
        )
        with trio.fail_after(10):  # started with the daemon, beside its other tasks
            while not (children := writer_children()):  # noqa: ASYNC110 (another process)
                await trio.sleep(0.01)
        assert len(children) == 1
        async with httpx.AsyncClient(base_url=urls[0], headers=auth(seed.owner_key)) as client:
            conv = (await ingest(client, seed.sales_id, "15550002"))["conversationId"]
            before = written_bytes(children[0])
            r = await client.patch(
                f"/api/v1/inbox/conversations/{conv}/title", json={"title": "From the child"}
            )
            assert r.status_code == 200 and r.json()["title"] == "From the child"
        # The child wrote it: its SQL and COMMIT (the WAL, its fsync) and its answer on the
        # pipe are its own writes (/proc's wchar counts every byte a process writes).
        assert written_bytes(children[0]) > before + 4096
        assert writer_children() == children
        shutdown.set()
    assert writer_children() == []  # closed with the daemon, not left behind


async def test_a_writer_that_cannot_start_leaves_the_daemon_writing_from_its_own_process(
    seed: Seed, config: Config, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(writer, "_CHILD", "import sys; sys.exit(3)")  # dies before "ready"
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            lambda task_status: daemon.run(
                seed.data_dir, config, shutdown, bind="127.0.0.1:0", task_status=task_status
            )
        )
        assert writer_children() == []
        async with httpx.AsyncClient(base_url=urls[0], headers=auth(seed.owner_key)) as client:
            conv = (await ingest(client, seed.sales_id, "15550004"))["conversationId"]
            r = await client.patch(
                f"/api/v1/inbox/conversations/{conv}/title", json={"title": "From the daemon"}
            )
            assert r.status_code == 200 and r.json()["title"] == "From the daemon"
        shutdown.set()
    warned = [r for r in caplog.records if "writer process" in r.getMessage()]
    assert warned and "exit status 3" in str(warned[0].__dict__.get("error"))


async def test_a_new_writer_that_does_not_start_fails_only_its_batch(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await store.write(helpers.record_pid, 1)
    await killed(first)
    monkeypatch.setattr(writer, "_CHILD", "import sys; sys.exit(4)")
    with pytest.raises(ServiceUnavailable) as exc:
        await store.write(helpers.record_pid, 2)
    assert exc.value.code == "writer_stopped"
    assert "the change was not made" in str(exc.value)  # (no child had any of it)
    monkeypatch.undo()
    assert await store.write(helpers.record_pid, 3) not in (first, None)
    assert [d["n"] for d in committed(store)] == [1, 3]


async def test_what_a_write_prints_goes_to_stderr_not_into_the_pipe(
    store: Store, capfd: pytest.CaptureFixture[str]
) -> None:
    child = await store.write(helpers.print_then_record, 1)
    assert await store.write(helpers.record_pid, 2) == child  # still in step, same writer
    assert [d["n"] for d in committed(store)] == [1, 2]
    assert "debug: hello from write 1" in capfd.readouterr().err


async def test_what_does_not_pickle_fails_only_its_own_write(store: Store) -> None:
    outcomes = await concurrently(
        store,
        [
            (helpers.record_pid, 0),
            (helpers.record_pid, lambda: None),  # an argument that does not pickle
            (helpers.return_unpicklable, 2),  # a result that does not pickle
            (helpers.record_pid, 3),
            # An Answered that is not one of actions' names: it pickles by that name only.
            (actions.Answered(actions.rename, "RENAME_ANSWERED"), 4),
        ],
    )
    assert isinstance(outcomes[1], StoreError) and "cannot be sent" in str(outcomes[1])
    assert isinstance(outcomes[2], StoreError) and "cannot be sent back" in str(outcomes[2])
    assert isinstance(outcomes[4], StoreError) and "Answered(" in str(outcomes[4])
    assert "cannot be sent to the writer" in str(outcomes[4])
    child = store.writer_process.pid  # type: ignore[union-attr]
    assert outcomes[0] == outcomes[3] == child  # the others committed, in the same writer
    assert sorted(d["n"] for d in committed(store)) == [0, 3]  # write 2 was undone
    assert store.writer_process.started == 1  # type: ignore[union-attr]


def test_each_answered_write_is_the_module_name_it_pickles_by() -> None:
    """The routes' writes (actions.*_ANSWERED) cross the pipe as references to their names."""
    answered = {k: v for k, v in vars(actions).items() if isinstance(v, actions.Answered)}
    assert set(answered) == {
        "ASSIGN_ANSWERED",
        "SET_STATUS_ANSWERED",
        "SET_BLOCKED_ANSWERED",
        "RENAME_ANSWERED",
        "MARK_READ_ANSWERED",
    }
    for name, write in answered.items():
        assert write.name == name
        assert pickle.loads(pickle.dumps(write, pickle.HIGHEST_PROTOCOL)) is write


@pytest.mark.parametrize(
    "error",
    [
        Conflict("the contact is already blocked", code="already_blocked"),
        RateLimited("slow down", retry_after=7),
        ServiceUnavailable("busy", code="query_timeout"),
    ],
)
def test_errors_survive_the_pipe_with_their_class_code_and_attributes(error: InboxError) -> None:
    back = pickle.loads(writer.outcome_pickle(error))
    assert type(back) is type(error)
    assert (back.message, back.code, back.headers(), back.body()) == (
        error.message,
        error.code,
        error.headers(),
        error.body(),
    )
    assert writer._picklable(error) is error  # sent as itself, not as a StoreError


async def test_a_child_that_answers_garbage_at_start_is_not_used(
    seed: Seed, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A whole frame that does not unpickle, then it waits: "not ready", at once.
    monkeypatch.setattr(
        writer,
        "_CHILD",
        "import sys, time; sys.stdout.buffer.write(b'\\x00\\x00\\x00\\x04abcd');"
        " sys.stdout.flush(); time.sleep(30)",
    )
    s = Store.open(seed.data_dir, readers=1)
    s.writer_process = WriterProcess(s.path)
    try:
        with trio.fail_after(10):
            await s.writer_process.start()
        assert s.writer_process.unavailable and writer_children() == []
        assert (await s.write(helpers.record_pid, 1)) == os.getpid()  # written right here
    finally:
        await s.writer_process.aclose()
        s.close()


async def test_a_writer_running_other_code_than_the_daemon_is_not_used(store: Store) -> None:
    """A new version installed under the running daemon: the replacement of a writer that died
    would run the new code, so the daemon writes from its own process until it restarts."""
    assert store.writer_process is not None
    first = await store.write(helpers.record_pid, 1)
    await killed(first)
    store.writer_process.fingerprint = "the code the daemon started with"  # not what is on disk
    assert await store.write(helpers.record_pid, 2) == os.getpid()  # written right here
    assert store.writer_process.unavailable and store.writer_process.started == 1
    assert writer_children() == []
    assert [d["n"] for d in committed(store)] == [1, 2]


def _log_starts(wal: Path) -> int:
    """The checkpoint sequence number in the WAL's header, which SQLite bumps each time the log
    starts over (https://www.sqlite.org/fileformat.html, "WAL File Format")."""
    with wal.open("rb") as log:
        return int.from_bytes(log.read(16)[12:16], "big")


@contextlib.contextmanager
def _wal_file(tmp_path: Path) -> Iterator[tuple[Path, sqlite3.Connection, sqlite3.Connection, int]]:
    """A database in WAL mode with no automatic checkpoint: its path, a writer connection, a
    checkpointer connection and a descriptor of the file for db._checkpoint's own sync."""
    path = tmp_path / "wal.db"
    writer = db._connect(path, readonly=False)
    writer.execute("PRAGMA journal_mode = WAL")
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("CREATE TABLE t (x BLOB)")
    checkpointer = db._connect(path, readonly=False)
    database_fd = os.open(path, os.O_RDONLY)
    try:
        yield path, writer, checkpointer, database_fd
    finally:
        for conn in (writer, checkpointer):
            conn.close()
        os.close(database_fd)  # (after the connections: it would drop their locks)


def test_the_wal_starts_over_while_readers_come_and_go(tmp_path: Path) -> None:
    """A PASSIVE checkpoint copies the log only up to what the oldest reader reads, and the next
    write goes on at the log's end unless all of it was copied and no reader still uses it;
    under steady writes the daemon's own readers (the feed, the deliverers) come and go without
    a break, and the log never started over: an audit's four clients ingesting without a pause
    grew it by about 40 MB a second. Past WAL_LIMIT_BYTES of frames the checkpointer now also
    asks for a RESTART checkpoint, which waits (up to WAL_RESTART_WAIT_MS) for the readers of
    the moment to finish, and the next write starts the log over."""
    with _wal_file(tmp_path) as (path, writer, checkpointer, database_fd):
        reader = db._connect(path, readonly=True)
        limit = 64 * 1024

        def write() -> None:
            writer.execute("INSERT INTO t VALUES (randomblob(8000))")

        for _ in range(20):  # past the limit
            write()
        first = _log_starts(Path(f"{path}-wal"))
        for _attempt in range(5):  # (a reader's end comes from a thread: given a few tries)
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM t").fetchone()  # it reads the log as it is now
            write()  # ... and the log grows past it: a checkpoint copies only up to the reader
            done = threading.Timer(0.01, lambda: reader.execute("COMMIT"))
            done.start()
            db._checkpoint(checkpointer, limit, database_fd)
            done.join()
            write()
            if _log_starts(Path(f"{path}-wal")) != first:
                break
        assert _log_starts(Path(f"{path}-wal")) != first
        frames = checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
        assert frames < 10  # the log started over: it holds the last write alone
        reader.close()


def test_the_database_file_is_synced_before_restart_holds_writes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RESTART holds new writes back until it has synced the database file; under steady
    writes the PASSIVE rounds before it left everything they copied unsynced (SQLite syncs only
    a round that reaches the log's end), and on the generated store that sync took 44-66 ms of
    every write's time. The checkpointer syncs the file first, holding nothing; under the limit
    it neither syncs nor restarts."""
    with _wal_file(tmp_path) as (path, writer, checkpointer, database_fd):
        steps: list[str] = []
        fdatasync = os.fdatasync

        def recorded(fd: int) -> None:
            steps.append(f"fdatasync {os.readlink(f'/proc/self/fd/{fd}')}")
            fdatasync(fd)

        monkeypatch.setattr(os, "fdatasync", recorded)
        checkpointer.set_trace_callback(
            lambda sql: steps.append(sql) if "wal_checkpoint" in sql else None
        )
        limit = 64 * 1024
        writer.execute("INSERT INTO t VALUES (randomblob(8000))")
        # one page or two: under the limit, and no RESTART to time
        assert db._checkpoint(checkpointer, limit, database_fd) is None
        assert steps == ["PRAGMA wal_checkpoint(PASSIVE)"]
        steps.clear()
        for _ in range(20):  # past it
            writer.execute("INSERT INTO t VALUES (randomblob(8000))")
        held = db._checkpoint(checkpointer, limit, database_fd)
        # Another PASSIVE round and sync, still holding nothing, for what was committed during
        # the first sync: RESTART, which holds writes back, is left only what came after.
        assert steps == [
            "PRAGMA wal_checkpoint(PASSIVE)",
            f"fdatasync {path.resolve()}",
            "PRAGMA wal_checkpoint(PASSIVE)",
            f"fdatasync {path.resolve()}",
            "PRAGMA wal_checkpoint(RESTART)",
        ]
        assert held is not None and 0 < held < 5  # how long the RESTART took, in seconds


def test_a_failed_head_start_sync_leaves_the_checkpoint_to_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpointer's own sync is only a head start: an OSError there (the daemon's
    checkpoint loop handles SQLite's errors, not others) must not end the loop; the RESTART
    still runs and the log starts over."""
    with _wal_file(tmp_path) as (path, writer, checkpointer, database_fd):

        def refused(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", refused)
        for _ in range(20):
            writer.execute("INSERT INTO t VALUES (randomblob(8000))")
        first = _log_starts(Path(f"{path}-wal"))
        db._checkpoint(checkpointer, 64 * 1024, database_fd)  # no OSError out of it
        writer.execute("INSERT INTO t VALUES (randomblob(8000))")
        assert _log_starts(Path(f"{path}-wal")) != first  # RESTART ran: the log started over
