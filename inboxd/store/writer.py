"""The writer process: the daemon's writes run in a child process of their own.

Why: a write is a few hundred microseconds of Python and SQLite (the change, its SYSTEM row, two
journal events, their indexes), and on the trio thread that is time every other request waits for.
A worker thread does not help: SQLite releases the GIL around every statement, and each time the
worker takes it back it waits for the busy trio thread (bench/HISTORY.md). A process has a GIL and
a core of its own. The trio thread only sends each batch (the functions, by reference, and their
arguments) and reads back each write's outcome; the child runs the batch in one transaction, a
savepoint per write, commits it (the fsync happens there too) and answers.

The frames on the pipes are a 4-byte big-endian length and a pickle. Everything a write function
takes and returns is plain data (attrs classes, strings, numbers, the answers' JSON), and the
functions are module level (so are the routes' ``actions.*_ANSWERED``), so pickling them is a
reference by name. An error a write raises is sent back as it is
when it pickles, or as a ``StoreError`` naming it when it does not.

A new child gets the daemon's ``sys.path`` and says it is ready once it has imported and opened
the store (within ``READY_SECONDS``). The daemon starts it beside its other tasks; the first
batch waits for it. Should the first child not start at all (no processes allowed here, say),
``unavailable`` is set, logged, and the store writes from the daemon's own process as it did
before the writer existed. So it does when a child would run other code than the daemon (a new
version installed under it): "ready" carries a digest of inboxd's files (``code_fingerprint``).

The child ends when its stdin closes (the daemon stopping) after finishing the batch it is on.
If it dies, the batch it was running fails with ``ServiceUnavailable`` ``writer_stopped`` (its
fate is unknown to the daemon: it may have committed) and the next batch starts a new child. A
batch whose first byte the pipe refused (the child died just before) was not made: it goes to a
new child (once).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import pickle
import signal
import sqlite3
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final

import attrs
import trio

from inboxd.errors import ServiceUnavailable, StoreError
from inboxd.store.commit_times import CommitTimes

if TYPE_CHECKING:
    from inboxd.store.db import WriteRequest

log = logging.getLogger("inboxd.store")

_LENGTH: Final = struct.Struct(">I")
# The child imports what the daemon imports: it gets the daemon's sys.path (argv[2]).
_CHILD: Final = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[2]);"
    " from inboxd.store.writer import serve; serve(sys.argv[1])"
)
# How long a new child may take to import, open the store and say it is ready: the first one
# (at start, beside the daemon's other tasks), and one replacing a child that died (a batch
# waits for it, shielded, so it must stay well inside a service manager's stop timeout).
READY_SECONDS: Final = 30.0
RESPAWN_READY_SECONDS: Final = 10.0
# A length past this means the pipe is out of step (nothing a write returns comes near it).
MAX_FRAME: Final = 256 << 20
_READY: Final = "ready"


def code_fingerprint() -> str:
    """A digest of inboxd's source files as they are on disk now. The daemon takes it once
    when it starts; a child reports its own with "ready". They differ when a new version was
    installed under the running daemon: a child would then run other code than the daemon
    that pickles its writes (other classes, other SQL for the same schema)."""
    package = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for source in sorted(package.rglob("*.py")):
        digest.update(str(source.relative_to(package)).encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()


class CodeChanged(OSError):
    """A new child's code is not the daemon's (a new version installed since it started)."""


def _frame(obj: object) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(data)) + data


# attrs class -> its fields' names, when calling the class with their values in order rebuilds
# an equal instance (every field an __init__ argument, positional, unconverted); None if not.
_REBUILT_BY_INIT: dict[type, tuple[str, ...] | None] = {}


def _init_fields(cls: type) -> tuple[str, ...] | None:
    if cls not in _REBUILT_BY_INIT:
        fields = attrs.fields(cls)
        init = getattr(cls.__dict__.get("__init__"), "__code__", None)
        plain = (
            init is not None
            and init.co_filename.startswith("<attrs generated")  # not a hand-written __init__
            and all(
                f.init and not f.kw_only and f.converter is None and f.alias == f.name
                for f in fields
            )
        )
        _REBUILT_BY_INIT[cls] = tuple(f.name for f in fields) if plain else None
    return _REBUILT_BY_INIT[cls]


class _OutcomePickler(pickle.Pickler):
    """Pickles attrs instances as their class and field values, which the daemon unpickles by
    calling the class: about half the trio thread's time of attrs' own ``__setstate__`` (a
    Python loop over the slots), which under load was 20-25 us of each write's outcome."""

    def reducer_override(self, obj: Any) -> Any:
        cls = type(obj)
        if attrs.has(cls) and (names := _init_fields(cls)) is not None:
            return cls, tuple([getattr(obj, name) for name in names])
        return NotImplemented


def _name(fn: Callable[..., Any]) -> str:
    """A write function's name for an error (a callable object, such as ``actions.Answered``,
    has no ``__qualname__``)."""
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def outcome_pickle(obj: object) -> bytes:
    """``obj`` pickled as the child sends its answers (attrs values by ``_OutcomePickler``)."""
    buffer = io.BytesIO()
    _OutcomePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(outcome_pickle(exc))
    except Exception:
        return StoreError(f"{type(exc).__name__}: {exc}")
    return exc


# -- the child -------------------------------------------------------------------------------


@attrs.frozen
class _PickledResult:
    """A write function whose result is pickled inside the write's savepoint: a result that
    does not pickle fails that write alone (undone) instead of the whole committed batch."""

    fn: Callable[..., Any]

    def __call__(self, conn: sqlite3.Connection, *args: object) -> bytes:
        result = self.fn(conn, *args)
        try:
            return outcome_pickle(result)
        except Exception as exc:
            raise StoreError(f"the result of {_name(self.fn)} cannot be sent back: {exc}") from None


def _refuse(conn: sqlite3.Connection, error: Exception) -> None:
    raise error


def _request(db: Any, data: bytes) -> Any:
    """One write of a batch, from its pickle (a write that does not unpickle here fails
    alone)."""
    try:
        fn, args, mark = pickle.loads(data)
    except Exception as exc:
        return db.WriteRequest(_refuse, (StoreError(f"a write could not be read: {exc}"),))
    return db.WriteRequest(_PickledResult(fn), args, mark)


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    data = stream.read(n)
    if len(data) < n:  # EOF: the daemon is gone or stopping
        return None
    return data


def serve(path: str) -> None:
    """The child's loop: read a batch, run and commit it, answer; until stdin closes.

    SIGINT and SIGTERM are ignored: they reach the whole process group or service (Ctrl-C in a
    terminal, systemd stopping the unit) while the daemon still drains its requests, and a
    writer gone then would fail their writes. The daemon closes the pipe once it is done."""
    from inboxd.store import db

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    conn = db.writer_connection(Path(path))
    # The daemon's checkpointer copies the WAL into the database (Store.checkpoint_forever):
    # this connection's COMMITs only append to the WAL and fsync it.
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    # The frames get a descriptor of their own; whatever else writes to stdout (a print, a
    # library) goes to stderr instead of into them.
    stdout = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    stdin = sys.stdin.buffer
    stdout.write(_frame((_READY, code_fingerprint())))
    stdout.flush()
    try:
        while (header := _read_exact(stdin, _LENGTH.size)) is not None:
            payload = _read_exact(stdin, _LENGTH.unpack(header)[0])
            if payload is None:
                break
            batch = [_request(db, data) for data in pickle.loads(payload)]
            commit_seconds = db.run_batch(conn, batch)
            answer = outcome_pickle(
                (
                    commit_seconds,
                    [
                        (
                            r.result,
                            None if r.error is None else _picklable(r.error),
                            r.appended,
                            r.wakes,
                        )
                        for r in batch
                    ],
                )
            )
            stdout.write(_LENGTH.pack(len(answer)))
            stdout.write(answer)
            stdout.flush()
    finally:
        conn.close()


# -- the daemon's side -----------------------------------------------------------------------


@attrs.define(eq=False)
class Flight:
    """A batch sent to the child (``WriterProcess.send_nowait``) whose answer is still to come."""

    process: trio.Process
    batch: list[WriteRequest]  # the batch as given (``finish`` may hand it to ``run``)
    sent: list[WriteRequest]  # the batch's requests that pickled, in the frame's order
    rest: memoryview  # what of the frame is still to be written to the pipe
    size: int  # the frame's length

    @property
    def untouched(self) -> bool:
        """Whether no byte of the frame has gone down the pipe yet."""
        return len(self.rest) == self.size


def _payloads(batch: list[WriteRequest]) -> tuple[list[WriteRequest], list[bytes]]:
    """Each request pickled on its own: one that does not pickle fails alone (its error set)."""
    sent, payload = [], []
    for r in batch:
        try:
            payload.append(pickle.dumps((r.fn, r.args, r.mark), pickle.HIGHEST_PROTOCOL))
        except Exception as exc:
            r.error = StoreError(f"{_name(r.fn)} cannot be sent to the writer: {exc}")
        else:
            sent.append(r)
    return sent, payload


class WriterProcess:
    """The daemon's handle on its writer child: one batch at a time (the store's write
    limiter sees to that), by ``run``, or sent by ``send_nowait`` and landed by ``finish``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._process: trio.Process | None = None
        self._spawning = trio.Lock()  # start() may run beside the first batch
        self._buffer = bytearray()
        self.started = 0  # children started so far
        # The first child did not start (no processes allowed here, say), or a new one would
        # run other code (CodeChanged): run() refuses every batch, and the store writes from
        # the daemon's own process as it did before the writer.
        self.unavailable = False
        self.fingerprint = code_fingerprint()  # the code this daemon runs
        self.commit_times = CommitTimes()  # the COMMIT of each batch, as the child timed it

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def start(self) -> None:
        """Start the child and wait until it is ready (or give up: ``unavailable``)."""
        with contextlib.suppress(OSError):
            await self._ensure()

    async def _ensure(self) -> trio.Process:
        """The running child, started if need be; ``OSError`` if it does not start."""
        try:
            return await self._ensure_started()
        except OSError as exc:
            if (self.started == 0 or isinstance(exc, CodeChanged)) and not self.unavailable:
                self.unavailable = True
                log.warning(
                    "could not start the store's writer process; writing from the daemon's own"
                    " until it restarts",
                    extra={"error": f"{type(exc).__name__}: {exc}"},
                )
            raise

    async def _ensure_started(self) -> trio.Process:
        # (Taking the lock yields to the other ready tasks once, like the checkpoint that
        # _send_rest skips. Skipping it too while a child runs measured no different:
        # bench/HISTORY.md.)
        async with self._spawning:
            if self.unavailable:  # (a start that failed while this waited for the lock)
                raise OSError("the writer process could not start here")
            if self._process is not None and self._process.poll() is not None:
                await self._lost(BrokenPipeError("it exited between two batches"))
            if self._process is None:
                self._process = await self._spawn()
            return self._process

    async def _spawn(self) -> trio.Process:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", _CHILD, str(self.path), json.dumps(sys.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._buffer.clear()
        said: object = None
        try:
            with (
                trio.move_on_after(RESPAWN_READY_SECONDS if self.started else READY_SECONDS),
                contextlib.suppress(Exception),  # whatever it said (or did), it is not ready
            ):
                said = pickle.loads(await self._receive(process))
        except BaseException:  # cancelled (the daemon stopping as it starts): no child left
            await _end(process)
            raise
        if said != (_READY, self.fingerprint):
            status = await _end(process)
            if isinstance(said, tuple) and said[:1] == (_READY,):
                raise CodeChanged("inboxd's files changed since the daemon started")
            raise OSError(f"the writer process did not start (exit status {status})")
        self.started += 1
        return process

    async def _receive(self, process: trio.Process) -> bytes:
        """The next frame from the child, read from the pipe directly: trio's
        ``receive_some`` would first yield to every other ready task (as ``_send_rest`` says)
        before it even looks. Right after a send the pipe is empty, and this waits for it to
        be readable once."""
        assert isinstance(process.stdout, trio.lowlevel.FdStream)
        fd = process.stdout.fileno()
        need = _LENGTH.size
        while True:
            if len(self._buffer) >= need:
                if need == _LENGTH.size:
                    length = _LENGTH.unpack_from(self._buffer)[0]
                    if length > MAX_FRAME:
                        raise BrokenPipeError(f"out of step (a frame of {length} bytes)")
                    need += length
                    continue
                data = bytes(self._buffer[_LENGTH.size : need])
                del self._buffer[:need]
                return data
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(fd)
                continue
            if not chunk:
                raise BrokenPipeError("the writer process stopped")
            self._buffer += chunk

    def running(self) -> bool:
        """Whether a child is up and no other is being started: ``send_nowait`` can send."""
        process = self._process
        return process is not None and not self._spawning.locked() and process.poll() is None

    def send_nowait(self, batch: list[WriteRequest]) -> Flight:
        """Send ``batch`` to the running child (``running()``) in this step, without yielding
        to other tasks; ``finish`` then waits for its answer. Call it holding the writer, and
        with no other batch in flight. Whatever of the frame the pipe did not take at once
        (a batch past 64 KiB, or all of it if writing failed: the child is gone) ``finish``
        sends first (and a batch none of which went, to a child gone, to a new child)."""
        assert self._process is not None
        sent, payload = _payloads(batch)
        frame = memoryview(_frame(payload) if sent else b"")
        flight = Flight(self._process, batch, sent, frame, len(frame))
        if sent:
            assert isinstance(self._process.stdin, trio.lowlevel.FdStream)
            # (the pipe full, or the child gone: what is left goes to finish)
            with contextlib.suppress(OSError):
                flight.rest = frame[os.write(self._process.stdin.fileno(), frame) :]
        return flight

    async def run(self, batch: list[WriteRequest], *, tries: int = 2) -> bool:
        """Run ``batch`` in the child; each request gets its result or error, its journal
        events and its signals. Not cancellable midway: call it shielded. False (and nothing
        done) if no child ever started here: the caller runs the batch itself.

        A child found gone before any of the batch reached it (it died after it was looked
        at) did not make it: the batch goes to a new one, up to ``tries`` children in all (a
        child that dies as it starts is not replaced for good), then fails with 503
        ``writer_stopped``, not made. So does a batch for which no new child starts."""
        if self.unavailable:
            return False
        sent, payload = _payloads(batch)
        if not sent:
            return True
        try:
            for _ in range(tries):
                try:
                    process = await self._ensure()
                except OSError as exc:
                    if self.unavailable:
                        for r in batch:
                            r.error = None
                        return False
                    await self._lost(exc)
                    break
                frame = memoryview(_frame(payload))
                if await self._finish(Flight(process, batch, sent, frame, len(frame))):
                    return True
            for r in sent:  # (no child took any of it)
                r.error = ServiceUnavailable(
                    "the store's writer stopped before the change reached it; the change was"
                    " not made",
                    code="writer_stopped",
                )
            return True
        except BaseException as exc:
            await self._lost(exc)
            raise

    async def finish(self, flight: Flight) -> bool:
        """Send what ``send_nowait`` could not, wait for the child's answer and give each
        request of ``flight`` its outcome. Not cancellable midway: call it shielded.

        If the child was gone before any of the batch reached it (it died after ``running``
        looked), nothing of the batch was made: it goes to a new child (``run``, one try), as
        it would have had the child been seen gone, and what ``run`` returns is returned."""
        try:
            if await self._finish(flight):
                return True
        except BaseException as exc:
            # Unforeseen, after the batch may have been sent: the child may still be running it
            # and commit later, and its answer would put the pipe out of step. End it, so the
            # journal the caller reads next is final; the next batch starts a new child.
            await self._lost(exc)
            raise
        return await self.run(flight.batch, tries=1)

    async def _finish(self, flight: Flight) -> bool:
        """True once each request sent has its outcome; False (no outcome set, the child
        ended) if the child was gone before any of the frame reached it."""
        sent = flight.sent
        if not sent:
            return True
        try:
            if flight.rest:
                try:
                    await _send_rest(flight)
                except OSError as exc:
                    if not flight.untouched:
                        raise  # (the child may have read the part that went)
                    await self._lost(exc)
                    return False
            reply = await self._receive(flight.process)
            try:
                commit_seconds, outcomes = pickle.loads(reply)
                if len(outcomes) != len(sent):
                    raise ValueError(f"{len(outcomes)} outcomes for {len(sent)} writes")
            except Exception as exc:  # out of step: a new child starts on the next batch
                raise BrokenPipeError(f"an answer that could not be read: {exc}") from None
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            await self._lost_batch(sent, exc)
            return True
        if commit_seconds is not None:
            self.commit_times.observe(commit_seconds)
        for r, (result, error, appended, wakes) in zip(sent, outcomes, strict=True):
            r.error, r.appended, r.wakes = error, appended, wakes
            if error is None:
                try:
                    r.result = pickle.loads(result)
                except Exception as exc:  # committed, but its result cannot be built here
                    r.error = StoreError(f"the result of {_name(r.fn)} is unreadable: {exc}")
        return True

    async def _lost_batch(self, sent: list[WriteRequest], exc: BaseException) -> None:
        await self._lost(exc)
        for r in sent:
            r.error = ServiceUnavailable(
                "the store's writer stopped; the change may or may not have been made",
                code="writer_stopped",
            )

    async def _lost(self, exc: BaseException) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        status = await _end(process)
        log.error(
            "the store's writer process stopped; starting another for the next write",
            extra={"error": f"{type(exc).__name__}: {exc}", "exit_status": status},
        )

    async def aclose(self) -> None:
        """Let the child finish and exit (its stdin closes); kill it after 5 s."""
        process, self._process = self._process, None
        if process is None:
            return
        with trio.CancelScope(shield=True):
            assert process.stdin is not None
            await process.stdin.aclose()
            with trio.move_on_after(5):
                await process.wait()
            await _end(process)


async def _send_rest(flight: Flight) -> None:
    """The rest of ``flight``'s frame down the child's stdin, written at once: trio's
    ``send_all`` would first yield to every other ready task (a checkpoint before the write),
    which under load is a few milliseconds with the child idle (bench/HISTORY.md, tenth
    session). ``flight.rest`` keeps up with what went, should a write fail."""
    stdin = flight.process.stdin
    assert isinstance(stdin, trio.lowlevel.FdStream)
    fd = stdin.fileno()
    while flight.rest:
        try:
            flight.rest = flight.rest[os.write(fd, flight.rest) :]
        except BlockingIOError:  # the pipe is full (a batch past 64 KiB): wait for room
            await trio.lowlevel.wait_writable(fd)


async def _end(process: trio.Process) -> int:
    """Kill ``process`` unless it has exited; close its pipes; its exit status."""
    with trio.CancelScope(shield=True):
        process.kill()  # (nothing if it has exited already)
        status = await process.wait()
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                await pipe.aclose()
    return status
