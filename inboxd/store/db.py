"""The SQLite store: one writer connection, a small pool of read-only readers, WAL on disk.

SQL lives in plain sync functions ``fn(conn, *args)`` (see the sibling modules) so they can be
tested without trio and called from the CLI. The daemon runs them off the trio loop:

- ``await store.write(fn, ...)`` runs ``fn`` on the single writer connection inside
  ``BEGIN IMMEDIATE ... COMMIT``, one batch at a time (a ``CapacityLimiter(1)``; writes that wait
  share the next transaction; in the daemon ``Store.lead_batches`` runs every batch, elsewhere
  the first write waiting leads it). A state change, its SYSTEM message and its journal event
  are one call, so they commit together or not at all. In the daemon the batches run in the writer
  process (``Store.writer_process``, store/writer.py), on a connection of its own: the trio
  thread only sends them and reads back the outcomes. Without it (MockClock tests, or no child
  could start), the writes run on the trio thread within the same budget as reads and only the
  COMMIT (the fsync) goes to a worker thread, with the rest of the batch after a write that
  read from the disk; a batch that overruns, or finds another process holding the write lock,
  runs whole in a worker thread instead. Either way a batch, once taken, commits or fails
  whole even if its caller is cancelled.
- ``await store.read(fn, ...)`` runs ``fn`` inside a read transaction (one consistent snapshot).
  It first runs on the trio thread with a budget: ``INLINE_CPU_SECONDS`` of the thread's CPU time
  (work) or ``INLINE_WALL_SECONDS`` of wall time (waiting on disk, or preempted), whichever comes
  first. A read that overruns is interrupted there and run again on a reader in a worker thread
  (with the 5 s deadline), and reads of that function go straight to a thread for a while. Why
  not always a thread: a hop costs more than the reads the API makes (50-800 us from the page
  cache), and worse, SQLite releases the GIL around every step, so a worker thread waits for the
  busy trio thread once per row; measured, inline reads serve twice the requests (bench/HISTORY.md).
- Neither may make the loop wait for the disk. Pages not in the OS page cache (after a start,
  or a store larger than memory) have to be read from the device, and every task waits while
  the trio thread does. Nothing tells beforehand which pages a query will touch, so each inline
  read or write checks afterwards whether its thread read from the device (``getrusage``'s
  ``ru_inblock``, about 1 us): if it did, that function's reads or writes go to worker threads
  for ``INLINE_BACKOFF_SECONDS``, which bring the pages in without holding the loop. On a cold
  store that is one wait on the loop per function per second; on a warm one, none
  (``Store.loop_disk_waits`` counts them; ``/metrics`` exports it). Where the warm-up child
  keeps the store (store/warm.py: read in at start, then locked in memory, or checked every
  second where it may not lock), it says when all of it is in (``Store.in_memory``), and until
  then reads and writes go to worker threads without trying the loop: so with the store
  locked, none waits on the loop at all; what it could not lock is checked every second, and
  between two checks this bound still applies.

Durability: ``synchronous=FULL`` in WAL mode fsyncs the log on every commit, so a commit that has
returned survives a power cut (NORMAL could lose the last commits). CLI commands may write to the
same file while the daemon runs; ``busy_timeout`` makes them wait their turn.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import logging
import os
import resource
import sqlite3
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, ParamSpec, TypeVar

import attrs
import trio

from inboxd.errors import ServiceUnavailable, StorageUnavailable, StoreError
from inboxd.store.accounts import live_args
from inboxd.store.commit_times import CommitTimes
from inboxd.store.schema import MIGRATION_CHECKS, MIGRATIONS, REDONE_BY, SLOW_MIGRATIONS
from inboxd.store.writer import Flight, WriterProcess

# ``lead_batches`` sends the writes queued as one batch, but no more than this many or half of
# them, whichever is more; the rest are left for the next batches (by the same rule), the first
# of them sent the moment this one ends. Why: the 32 connections of a benchmark's write row
# fell into step (trio runs every request through the same stages in the same rounds), so each
# batch took nearly all of them; the serving thread then had nothing to do until it committed
# (asleep ~20 % of the time) and the writer nothing while the thread answered them and parsed
# the next ones. In two halves, one half is committed while the other is answered: writes
# 1.15-1.30x as fast in two `bench ab` runs on the 10M-message store (bench/HISTORY.md,
# thirty-fourth session). The floor keeps small batches whole: each costs the writer a COMMIT
# and an fsync.
BATCH_FLOOR: Final = 16


def batch_limit(pending: int) -> int:
    """The most of ``pending`` queued writes that ``lead_batches`` sends as the next batch (all
    of them when fewer)."""
    return max(BATCH_FLOOR, (pending + 1) // 2)


log = logging.getLogger("inboxd.store")

T = TypeVar("T")
P = ParamSpec("P")

DB_FILE: Final = "inboxd.db"
BUSY_TIMEOUT_MS: Final = 10_000
DEFAULT_READERS: Final = 4
# The longest a read may run; every query the API makes is index-backed and takes milliseconds.
READ_DEADLINE_SECONDS: Final = 5.0
# The most a read may hold the trio thread before it moves to a worker thread: CPU time (the
# thread's own work; a busy machine preempting us does not count) and wall time (time spent
# waiting for the disk does). Then how long a function that overran goes straight to a thread.
INLINE_CPU_SECONDS: Final = 0.005
INLINE_WALL_SECONDS: Final = 0.025
INLINE_BACKOFF_SECONDS: Final = 1.0
# The log line of each wait on the loop for the disk (``bench http`` looks for it).
DISK_WAIT_LOG: Final = "the trio thread waited for the disk"
# How often the daemon's checkpointer copies the WAL into the database file while writes come
# in (Store.checkpoint_forever); SQLite's own automatic checkpoint would do it inside a COMMIT.
CHECKPOINT_EVERY_SECONDS: Final = 1.0
# The WAL file's size the store goes back to. SQLite writes the log from its start again once
# a checkpoint has copied all of it and no reader still uses it, and truncates the file to
# ``journal_size_limit`` then; left at its default, a file grown by a burst of writes kept that
# size for good. And under writes that never pause, each round of PASSIVE checkpoints is
# overtaken by the commits made while it copies, so the log never starts again: an audit's four
# clients ingesting without a break grew it by about 40 MB a second. Past this size the
# checkpointer therefore also asks for a RESTART checkpoint, which holds new writes back while
# it copies the little the last round left and readers let go of the log (for at most
# WAL_RESTART_WAIT_MS), so that the next write starts the log over.
WAL_LIMIT_BYTES: Final = 64 * 1024 * 1024
WAL_RESTART_WAIT_MS: Final = 100
_WAL_FRAME_HEADER_BYTES: Final = 24  # each frame's, before its page
# While the warm-up child reads the store in (Store.in_memory False), every read goes to a
# worker thread, and most wait for the disk there: this many may run at once then (more reads
# from the device in flight, and one whose pages are in memory need not queue behind them). The
# readers past the usual ones have a small page cache (the OS's holds the pages) and are closed
# once the store is in.
WARMING_READERS: Final = 32
WARMING_CACHE_KIB: Final = 2048
# SQLite VM steps between deadline checks (BudgetedConnection.check_every): about 0.1 ms of
# SQLite's work on the trio thread, about 10 ms in a worker thread.
FINE_STEPS: Final = 10_000
COARSE_STEPS: Final = 1_000_000


# Linux's per-thread usage; elsewhere the whole process's, which can only err towards threads.
_RUSAGE_THREAD: Final = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
_PER_THREAD: Final = _RUSAGE_THREAD != resource.RUSAGE_SELF


def thread_disk_reads() -> int:
    """Blocks the calling thread has had to read from the storage device so far (reads that
    the OS page cache answered do not count)."""
    return resource.getrusage(_RUSAGE_THREAD).ru_inblock


def thread_major_faults() -> int:
    """Major page faults the calling thread has taken so far: pages of a mapped file (code of a
    library, say) that it touched while they were out of memory, and waited for the device."""
    return resource.getrusage(_RUSAGE_THREAD).ru_majflt


def db_path(data_dir: Path) -> Path:
    return data_dir / DB_FILE


@attrs.frozen
class Appended:
    """An event appended by the transaction that is committing (see JournalConnection)."""

    seq: int
    account_pk: int
    channel_pk: int | None
    type: str
    for_channel_webhooks: bool
    created_at: int
    body: bytes  # the envelope as committed


class BudgetedConnection(sqlite3.Connection):
    """A connection whose statements SQLite interrupts past a budget (its progress handler):
    wall time (``deadline``, time.monotonic()) or the running thread's CPU time (``budget``'s
    ``cpu_seconds``, time.thread_time()); no budget applies until ``budget`` sets one.

    The CPU clock is first read at SQLite's first check (``check_every`` steps into a
    statement), not when the budget is set: reading a thread's CPU clock is a system call,
    and under load py-spy found that one read per write held the trio thread for 4-8 % of a
    write's time, while most reads and writes finish before SQLite ever checks. What went by
    before that first check is counted at its wall time (at least the CPU time it took), so
    the budget is never looser than one counted from the start."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = float("inf")
        self.cpu_seconds = float("inf")  # the CPU budget; inf: none
        self.cpu_deadline: float | None = None  # set at the first check under a CPU budget
        self.budget_set_at = 0.0  # time.monotonic() when the budget was set
        self.check_every(COARSE_STEPS)

    def check_every(self, steps: int) -> None:
        """How many SQLite VM steps between deadline checks: FINE_STEPS on the trio thread
        (its budget is milliseconds), COARSE_STEPS in a worker thread, where each check is a
        Python call that must take the GIL from the busy trio thread (up to the switch
        interval, 5 ms, each time: with fine checks a 1.5 s read there overran its 5 s
        deadline while the loop was busy)."""
        self.set_progress_handler(self._past_deadline, steps)

    def budget(self, wall_seconds: float, cpu_seconds: float = float("inf")) -> None:
        """From now on, interrupt past ``wall_seconds`` of wall time or ``cpu_seconds`` of this
        thread's CPU time (the time before SQLite's first check counted at its wall time)."""
        self.budget_set_at = time.monotonic()
        self.deadline = self.budget_set_at + wall_seconds
        self.cpu_seconds = cpu_seconds
        self.cpu_deadline = None

    def _past_deadline(self) -> int:
        now = time.monotonic()
        if now > self.deadline:
            return 1
        if self.cpu_seconds == float("inf"):
            return 0
        if self.cpu_deadline is None:  # the first check: what is left, counted from here
            left = self.cpu_seconds - (now - self.budget_set_at)
            if left <= 0:
                return 1
            self.cpu_deadline = time.thread_time() + left
            return 0
        return 1 if time.thread_time() > self.cpu_deadline else 0

    def lift_deadline(self) -> None:
        self.deadline = self.cpu_seconds = float("inf")
        self.cpu_deadline = None


class JournalConnection(BudgetedConnection):
    """The writer's connection: it remembers the events the current transaction appends, so that
    after the commit the store can wake exactly the tasks that deliver them. Its budget applies
    while a batch runs on the trio thread (Store.write)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.appended: list[Appended] = []
        self.wakes: set[str] = set()  # Store.signal names to bump after the commit (wake())
        self.busy_timeout_ms = BUSY_TIMEOUT_MS

    def wait_when_busy(self, ms: int) -> None:
        """Set how long a BEGIN waits for another process's write lock (only when it changes)."""
        if self.busy_timeout_ms != ms:
            self.execute(f"PRAGMA busy_timeout = {ms}")
            self.busy_timeout_ms = ms


def wake(conn: sqlite3.Connection, name: str) -> None:
    """Once the write that calls this has committed, bump ``Store.signal(name)``: how a write
    tells the daemon's tasks that wait for one kind of change (the mailer for queued mail, an
    inbox webhook deliverer for its configuration) without waking them on every commit. A write
    that is rolled back wakes nobody; outside the daemon's writer this does nothing."""
    if isinstance(conn, JournalConnection):
        conn.wakes.add(name)


class ReaderConnection(BudgetedConnection):
    """A reader with a deadline: SQLite's progress handler aborts a statement that runs past
    it, so no read can hold a worker thread (and shutdown) for long."""

    warming = False  # one of the extra readers of a warm-up (WARMING_READERS)


def _connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    # isolation_level=None: we issue BEGIN/COMMIT ourselves. check_same_thread=False: trio's
    # worker threads are pooled, so one connection is used from several threads (never at once).
    conn = sqlite3.connect(
        path,
        isolation_level=None,
        check_same_thread=False,
        timeout=BUSY_TIMEOUT_MS / 1000,
        factory=ReaderConnection if readonly else JournalConnection,
    )
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA cache_size = -65536")  # 64 MiB of page cache per connection
    conn.execute("PRAGMA temp_store = MEMORY")
    conn.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
    if readonly:
        conn.execute("PRAGMA query_only = ON")
    return conn


# The WAL index header (https://www.sqlite.org/walformat.html, "The WAL-Index Header"): 48
# bytes at the start of the -shm file, in the machine's byte order, of which we check the
# version (WALINDEX_VERSION, 3007000) and isInit. SQLite writes it last in every commit.
WAL_INDEX_HEADER: Final = 48
_WAL_INDEX_VERSION: Final = 3_007_000


def wal_index_header(path: Path, conn: sqlite3.Connection) -> Any:
    """A view of the WAL index header where SQLite has mapped it in this process, for
    ``Store.commit_stamp`` (``.raw`` is its bytes); None (the stamp then asks SQLite) where it
    is not found in /proc/self/maps or is not a header we know. ``conn`` must stay open for as
    long as the view is read: SQLite keeps the index mapped while a connection uses it.

    Why SQLite's own mapping and not one of ours: POSIX record locks belong to the process,
    and closing *any* descriptor of a file drops all of the process's locks on it, SQLite's
    included, which it holds on the -shm file while a connection is open (the lock that says
    the index is in use, read marks). Another process (the CLI) would then take the index for
    unused and truncate it under our connections (found by ``bench ab``: a SIGBUS). Reading
    /proc opens no descriptor of the store's files. The same holds for any code added to the
    daemon later: it must never open and close the -shm (or database) file itself.

    The mapping is the one whose inode is the -shm file's and whose device or path is too (on
    btrfs, and overlayfs before Linux 6.8, /proc shows another device number than ``stat``).
    A forked child that outlives its parent's connections would find the file gone and its
    stamp still; inboxd's one child process runs another program at once."""
    conn.execute("PRAGMA data_version").fetchone()  # a read: SQLite has built and mapped it
    shm_path = f"{path}-shm"
    try:
        shm = os.stat(shm_path)
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        lines = []
    else:
        device = f"{os.major(shm.st_dev):02x}:{os.minor(shm.st_dev):02x}"
        real = os.path.realpath(shm_path)
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or fields[4] != str(shm.st_ino):
            continue
        if fields[3] != device and fields[5] != real:
            continue
        if int(fields[2], 16) != 0 or not fields[1].endswith("s"):  # region 0, shared
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if end - start < WAL_INDEX_HEADER:
            continue
        header = (ctypes.c_char * WAL_INDEX_HEADER).from_address(start)
        order = "<" if sys.byteorder == "little" else ">"
        version, _, _, is_init = struct.unpack_from(order + "IIIB", header.raw)
        if version == _WAL_INDEX_VERSION and is_init == 1:
            return header
    log.info("the WAL index is not mapped where expected: commit checks ask SQLite instead")
    return None


def _reader(path: Path) -> ReaderConnection:
    conn = _connect(path, readonly=True)
    assert isinstance(conn, ReaderConnection)
    return conn


def store_exists(data_dir: Path) -> bool:
    return db_path(data_dir).is_file()


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def db_path_of(conn: sqlite3.Connection) -> str:
    return str(conn.execute("PRAGMA database_list").fetchone()[2])


def _check_version(conn: sqlite3.Connection, allow_older: bool) -> None:
    version = schema_version(conn)
    if version > len(MIGRATIONS):
        raise StoreError(
            f"this store has schema version {version}, newer than this inboxd understands "
            f"({len(MIGRATIONS)}); run a newer inboxd"
        )
    if version < len(MIGRATIONS) and not allow_older:
        raise StoreError(
            f"this store has schema version {version}, older than this inboxd's "
            f"({len(MIGRATIONS)}): 'inboxd serve' or 'inboxd init' migrates it (take an "
            "'inboxd backup' first; it copies the store as it is)"
        )


def migrate(conn: sqlite3.Connection) -> int:
    """Apply the migrations this store has not had yet; return how many versions it went up
    (one skipped because a later one redoes it, schema.REDONE_BY, counts)."""
    _check_version(conn, allow_older=True)
    version = schema_version(conn)
    # A rebuild's sort (v17 sorts every message's text) spills to temporary files rather than
    # memory: in memory it took 2.5 GB for 10 million messages.
    temp_store = conn.execute("PRAGMA temp_store").fetchone()[0]
    conn.execute("PRAGMA temp_store = FILE")
    try:
        applied = _migrate_from(conn, version)
    finally:
        if conn.in_transaction:  # a step that failed midway: none of it is kept
            conn.execute("ROLLBACK")
        conn.execute(f"PRAGMA temp_store = {int(temp_store)}")
    return applied


def _migrate_from(conn: sqlite3.Connection, version: int) -> int:
    applied = 0
    for number in range(version + 1, len(MIGRATIONS) + 1):
        # Checked first: a store that cannot take a version logs no step it will not make.
        check = MIGRATION_CHECKS.get(number)
        if check is not None and (why := conn.execute(check).fetchone()[0]) is not None:
            raise StoreError(f"this store cannot take schema version {number}: it holds {why}")
        redone = number in REDONE_BY  # (a migration runs to the last version)
        if version > 0:  # an existing store (a new one is built in a blink)
            extra: dict[str, object] = {
                "schema_version": number,
                "of": len(MIGRATIONS),
                "path": str(db_path_of(conn)),
            }
            if redone:
                extra["note"] = f"skipped: version {REDONE_BY[number]} does it again"
            elif number in SLOW_MIGRATIONS:
                extra["note"] = SLOW_MIGRATIONS[number]
            log.info("migrating the store", extra=extra)
        applied += 1
        if redone:  # the store goes past this version in the later one's transaction
            continue
        # executescript runs the whole migration and the version bump as one transaction.
        conn.executescript(
            "BEGIN IMMEDIATE;\n"
            + MIGRATIONS[number - 1]
            + f"\nPRAGMA user_version = {number};\nCOMMIT;"
        )
    return applied


def _checkpoint(conn: sqlite3.Connection, limit: int, database_fd: int) -> float | None:
    """A PASSIVE checkpoint; and a RESTART one when the log holds more than ``limit`` bytes of
    frames (WAL_LIMIT_BYTES above). A PASSIVE round may copy all of the log, yet the next write
    goes on at its end while any reader still reads from it, and under steady reads one always
    does: RESTART waits for them. Returns how long the RESTART took (seconds; also one that gave
    up waiting for readers, WAL_RESTART_WAIT_MS, which held writes back as long), None if none
    ran.

    RESTART holds new writes back until it is done, and it ends by syncing the database file.
    SQLite syncs that file only in a round that reaches the log's end, so under steady writes
    the PASSIVE rounds before it leave everything they copied unsynced: on the generated store
    about 100 MB, whose sync took 44-66 ms (traced by hand), every write waiting meanwhile. The checkpointer
    syncs the file first (through ``database_fd``, a descriptor of it kept open: see
    ``Store.database_fd``), holding no lock (bench/HISTORY.md, the thirty-second session). That
    sync takes about 100 ms under the benchmark's writes, and the frames committed meanwhile
    were RESTART's to copy and sync, with writes held: a median of 22 ms a RESTART, 10 % over
    33 ms, at most 131 (74 RESTARTs, one every 2.4 s, timed by hand on the generated store
    under 32 connections' writes). So one more PASSIVE round and sync follow, still holding
    nothing, and RESTART is left the frames of their last few milliseconds: a median of 12 ms,
    10 % over 21, at most 43 (70 RESTARTs), and the p99 of status writes 38.8-44.7 ms against
    43.9-52.1 (six rows of 12 s each way, alternated; bench/HISTORY.md, the forty-second
    session). Commits still share the disk with those syncs."""
    _busy, frames, _copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    if frames * (page_size + _WAL_FRAME_HEADER_BYTES) <= limit:
        return None
    _head_start_sync(database_fd)
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()  # what came in during that sync
    _head_start_sync(database_fd)
    started = time.perf_counter()
    conn.execute(f"PRAGMA busy_timeout = {WAL_RESTART_WAIT_MS}")
    try:
        conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
    finally:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return time.perf_counter() - started


def _head_start_sync(fd: int) -> None:
    """fdatasync the database file through ``fd``: whoever wrote its pages, they are on the disk
    after. Only a head start: where it fails (a disk that refuses it), the RESTART after it
    syncs the file itself, and SQLite's error from there is what the checkpointer reports."""
    with contextlib.suppress(OSError):
        os.fdatasync(fd)


def _interrupted(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and "interrupted" in str(exc)


def _interrupted_or_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "interrupted" in text or "locked" in text or "busy" in text


def _too_long() -> ServiceUnavailable:
    return ServiceUnavailable("the query took too long; narrow it down", code="query_timeout")


def run_in_transaction(
    conn: sqlite3.Connection, begin: str, fn: Callable[..., T], *args: object
) -> T:
    """``fn`` inside BEGIN ... COMMIT; whatever fails (``fn``, or the COMMIT itself), the
    connection leaves the transaction.

    A read's deadline is lifted once ``fn`` is done: SQLite calls the progress handler every N
    steps of a statement counted over all its runs, so now and then it fires inside a COMMIT;
    a read whose work was over when its deadline passed must not be interrupted there (this
    once left a reader stuck in its transaction, failing every later read)."""
    if conn.in_transaction:  # never expected; a connection stuck in one would fail every call
        _rollback(conn)
    conn.execute(begin)
    try:
        result = fn(conn, *args)
        _lift_deadline(conn)
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise
    return result


def _lift_deadline(conn: sqlite3.Connection) -> None:
    if isinstance(conn, BudgetedConnection):
        conn.lift_deadline()


def _rollback(conn: sqlite3.Connection) -> None:
    _lift_deadline(conn)  # the deadline that interrupted a read must not interrupt its rollback
    if conn.in_transaction:
        conn.execute("ROLLBACK")


# (user pk, Idempotency-Key) of the request whose next write is its change (see Store.write).
IDEMPOTENT_WRITE: contextvars.ContextVar[tuple[int, str] | None] = contextvars.ContextVar(
    "IDEMPOTENT_WRITE", default=None
)


def _mark_applied(conn: sqlite3.Connection, mark: tuple[int, str]) -> None:
    """Record, in the write's own savepoint, that its Idempotency-Key's change is made."""
    conn.execute(
        "UPDATE idempotency_keys SET status = 0 WHERE user_pk = ? AND key = ? AND status IS NULL",
        mark,
    )


# SQLite's primary result codes (the low byte of ``sqlite_errorcode``) that say the store cannot
# take a write just now, whatever the write: the API's 503 code for each, what it means, and
# whether the write can be said not to have been made (an I/O error under a COMMIT's fsync may
# leave it in the WAL). Not SQLITE_LOCKED: without a shared cache it is a conflict within one
# connection, a bug.
_STORAGE_FAILURES: Final = {
    sqlite3.SQLITE_BUSY: (
        "storage_busy",
        "another process holds the store's write lock (the CLI, a backup?)",
        True,
    ),
    sqlite3.SQLITE_READONLY: (
        "storage_unavailable",
        "the store is read-only (its directory, file or filesystem)",
        True,
    ),
    sqlite3.SQLITE_IOERR: (
        "storage_unavailable",
        "the store's disk failed to read or write",
        False,
    ),
    sqlite3.SQLITE_FULL: ("storage_full", "the disk that holds the store is full", True),
    sqlite3.SQLITE_CANTOPEN: (
        "storage_unavailable",
        "the store's files cannot be opened",
        True,
    ),
}
STORAGE_CODES: Final = sorted({name for name, _, _ in _STORAGE_FAILURES.values()})
# With less than this free, an I/O error at opening is taken for the disk being full.
DISK_NEARLY_FULL: Final = 1 << 20
# Seconds, in the 503's Retry-After: as long as an Idempotency-Key's claim that its request
# could not release (the store refused that too) takes to free itself (idempotency.claim).
STORAGE_RETRY_AFTER: Final = 60
STORAGE_LOG_EVERY: Final = 60.0  # seconds: a line per kind at most this often, not per request


class StorageAlarm:
    """Says in the log that the store's disk or files refuse its writes (or checkpoints): each
    kind (SQLite's primary result code: a read-only store, an I/O error and files that cannot
    be opened share one 503 code but are told apart here) at most once a minute, with
    SQLite's own words, and that writes succeed again (at most once a minute too, however
    often a nearly full disk takes one write and refuses the next)."""

    def __init__(self) -> None:
        self._said: dict[str, float] = {}
        self._failing = False

    def _due(self, what: str) -> bool:
        now = time.monotonic()
        if now - self._said.get(what, -STORAGE_LOG_EVERY) < STORAGE_LOG_EVERY:
            return False
        self._said[what] = now
        return True

    def failed(self, error: BaseException, doing: str = "writes") -> StorageUnavailable | None:
        """The API's 503 for ``error`` when it is the store's disk or files refusing the work
        rather than the work itself (SQLite's FULL, IOERR, READONLY, CANTOPEN, BUSY), logged;
        None for any other error."""
        code = getattr(error, "sqlite_errorcode", None)
        if not isinstance(error, sqlite3.Error) or not isinstance(code, int):
            return None
        primary = code & 0xFF
        failure = _STORAGE_FAILURES.get(primary)
        if failure is None:
            return None
        name, what, not_made = failure
        if self._due(f"{doing} {primary}"):
            if doing == "writes":
                self._failing = True  # the log's last word on writes: a success will answer it
            log.error(
                "%s fail: %s",
                doing,
                what,
                extra={"error": f"{type(error).__name__}: {error}", "code": name},
            )
        outcome = (
            "the change was not made"
            if not_made
            else "the change may or may not have been made (retry with an Idempotency-Key)"
        )
        return StorageUnavailable(
            f"{outcome}: {what}; retry later", code=name, retry_after=STORAGE_RETRY_AFTER
        )

    def succeeded(self) -> None:
        """A write succeeded: say so once the log's last word on writes was a failure (within a
        minute of the last time it said so, a later success says it)."""
        if self._failing and self._due("writes succeed"):
            self._failing = False
            log.info("writes succeed again")


@attrs.define(eq=False)
class WriteRequest:
    fn: Callable[..., Any]
    args: tuple[object, ...]
    # (user pk, Idempotency-Key) to mark applied with the change, for the request's change.
    mark: tuple[int, str] | None = None
    result: Any = None
    error: BaseException | None = None
    appended: list[Appended] = attrs.Factory(list)
    wakes: set[str] = attrs.Factory(set)
    # The Event of the batch that took it (it will run, or has run), set once that batch has
    # committed or failed; None while no batch has taken it.
    ended: trio.Event | None = None
    # Set with ``ended`` (while ``lead_batches`` runs, each write waits on its own: a batch
    # need not take every write pending).
    done: trio.Event | None = None

    def outcome(self, alarm: StorageAlarm) -> Any:
        if self.error is not None:
            unavailable = alarm.failed(self.error)
            if unavailable is not None:
                raise unavailable from self.error
            raise self.error
        alarm.succeeded()
        return self.result


def _end(batch: list[WriteRequest], ended: trio.Event) -> None:
    """Wake every write of ``batch``, its outcome in: the writes that wait on the batch's
    ``ended`` and, while ``lead_batches`` runs, each on its own ``done``."""
    ended.set()
    for r in batch:
        if r.done is not None:
            r.done.set()


class CommitSignal:
    """Wakes tasks that wait for "something was committed" (the journal's readers)."""

    def __init__(self) -> None:
        self.version = 0
        self._event = trio.Event()

    def bump(self) -> None:
        self.version += 1
        self._event.set()
        self._event = trio.Event()

    async def wait_past(self, version: int) -> None:
        """Return once a commit after ``version`` (read before looking at the store) happened."""
        while self.version == version:
            await self._event.wait()


def writer_connection(path: Path) -> JournalConnection:
    """A connection for running write batches (the store's own, or the writer process's)."""
    conn = _connect(path, readonly=False)
    assert isinstance(conn, JournalConnection)
    conn.wait_when_busy(BUSY_TIMEOUT_MS)
    return conn


def run_batch(conn: sqlite3.Connection, batch: list[WriteRequest]) -> float | None:
    """``batch`` in one transaction, a savepoint per write, then the COMMIT: each request ends
    with its result or its error (all of them with the transaction's, if that fails). How long
    the COMMIT took (None if the batch failed)."""
    return _writes_then_commit(conn, batch, batch, begin=True)


def _writes_then_commit(
    conn: sqlite3.Connection,
    writes: list[WriteRequest],
    batch: list[WriteRequest],
    begin: bool = False,
) -> float | None:
    """``writes`` (the batch's, or the rest of them) in the batch's transaction, then the
    COMMIT; a failure of the transaction itself fails the whole batch. How long the COMMIT
    took, if it was made."""
    try:
        if begin:
            conn.execute("BEGIN IMMEDIATE")
        run_writes(conn, writes)
    except BaseException as exc:
        fail_batch(conn, batch, exc)
        if not isinstance(exc, Exception):
            raise
        return None
    return _commit_batch(conn, batch)


def _writer_stopped(error: BaseException | None) -> bool:
    return isinstance(error, ServiceUnavailable) and error.code == "writer_stopped"


def journal_end(conn: sqlite3.Connection) -> int:
    """The highest journal seq ever given: ``events`` is AUTOINCREMENT, so SQLite keeps it in
    ``sqlite_sequence`` and pruning never lowers it (``max(seq)`` of a journal pruned empty is
    0, which made a caught-up feed client's ``since`` look beyond the journal)."""
    row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
    return int(row[0]) if row else 0


def _journal_after(conn: sqlite3.Connection, seq: int) -> list[Appended]:
    """The journal's events after ``seq``, as the listeners get them after a commit."""
    return [
        Appended(
            r["seq"],
            r["account_pk"],
            r["channel_pk"],
            r["type"],
            bool(r["for_channel_webhooks"]),
            r["created_at"],
            bytes(r["body"]),
        )
        for r in conn.execute(
            "SELECT seq, account_pk, channel_pk, type, for_channel_webhooks, created_at, body"
            " FROM events WHERE seq > ? ORDER BY seq",
            (seq,),
        )
    ]


def run_writes(conn: sqlite3.Connection, batch: list[WriteRequest]) -> None:
    """Each write of the batch in its own savepoint, inside the open transaction; a write
    that raises an ``Exception`` is undone alone and keeps its error."""
    try:
        for r in batch:
            conn.appended, conn.wakes = [], set()  # type: ignore[attr-defined]
            conn.execute("SAVEPOINT w")
            try:
                r.result = r.fn(conn, *live_args(conn, r.args))
                if r.mark is not None:
                    _mark_applied(conn, r.mark)
            except BaseException as exc:
                _lift_deadline(conn)  # undoing it must not be interrupted
                if not conn.in_transaction:  # SQLite undid the whole (an interrupt does)
                    raise
                conn.execute("ROLLBACK TO w")
                conn.execute("RELEASE w")
                if not isinstance(exc, Exception) or _interrupted(exc):
                    raise
                r.error = exc
            else:
                conn.execute("RELEASE w")
                r.appended, r.wakes = conn.appended, conn.wakes  # type: ignore[attr-defined]
    finally:
        conn.appended, conn.wakes = [], set()  # type: ignore[attr-defined]


def _commit_batch(conn: sqlite3.Connection, batch: list[WriteRequest]) -> float | None:
    """COMMIT the open transaction (this is where SQLite fsyncs); how long it took, or None
    if it was not made."""
    if not conn.in_transaction:  # the batch failed as a whole; errors are set
        return None
    started = time.perf_counter()
    try:
        conn.execute("COMMIT")
    except BaseException as exc:
        fail_batch(conn, batch, exc)
        if not isinstance(exc, Exception):
            raise
        return None
    return time.perf_counter() - started


def fail_batch(conn: sqlite3.Connection, batch: list[WriteRequest], exc: BaseException) -> None:
    """The transaction failed: roll back; nothing of the batch is durable. Each write has its
    error before the ROLLBACK, which may fail too (on a failing disk): none may return its
    result as if it had committed."""
    for r in batch:
        r.appended, r.wakes = [], set()
        if r.error is None:
            r.error = exc
    _lift_deadline(conn)
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _open_failure(data_dir: Path, error: sqlite3.DatabaseError) -> str:
    """Why a store could not be opened, in words that do not call a store broken when its disk
    is full or failing (SQLite says "disk I/O error" for a -shm file it cannot grow)."""
    code = getattr(error, "sqlite_errorcode", 0) & 0xFF
    if code in _STORAGE_FAILURES:
        why = _STORAGE_FAILURES[code][1]
        if code == sqlite3.SQLITE_FULL or (code == sqlite3.SQLITE_IOERR and _nearly_full(data_dir)):
            why = "the disk that holds it is full"
        return f"cannot open the store in {data_dir}: {why} (SQLite: {error})"
    return f"{db_path(data_dir)} is not a usable inboxd store: {error}"


def _nearly_full(path: Path) -> bool:
    try:
        stat = os.statvfs(path)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize < DISK_NEARLY_FULL


def _check_writable(data_dir: Path) -> None:
    """Refuse a store in a directory or file this process may not write, saying so: SQLite
    says only "unable to open database file", which reads like a broken store. (Even to read,
    a store in WAL mode writes its -shm file beside the database.)"""
    for path in (data_dir, db_path(data_dir)):
        if not path.exists() or os.access(path, os.W_OK):
            continue
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            why = "its file system is mounted read-only"
        else:
            why = f"this user (uid {os.getuid()}) may not write it"
        raise StoreError(
            f"{path} is not writable: {why}; inboxd writes the store and its -wal and -shm"
            " files there"
        )


class Store:
    """An open store. Create it with ``Store.open``; ``close()`` it when done."""

    def __init__(
        self, data_dir: Path, readers: int = DEFAULT_READERS, offload: bool = True
    ) -> None:
        self.data_dir = data_dir
        # offload=False runs SQL on the trio thread. Only for tests on trio's MockClock: with
        # autojump the virtual clock leaps to the next deadline whenever every task waits, and a
        # task waiting for a worker thread counts as waiting, so timeouts would fire at random.
        self._offload = offload
        self.path = db_path(data_dir)
        writer = _connect(self.path, readonly=False)
        assert isinstance(writer, JournalConnection)
        self._writer = writer
        self._journal_listeners: list[Callable[[list[Appended]], None]] = []
        # The last journal event the listeners were told of (see _catch_up_listeners).
        self._heard_seq = journal_end(writer)
        self._readers = [_reader(self.path) for _ in range(readers)]
        self._reader_count = readers
        # The reader used on the trio thread: it never waits for a lock (a busy store sends the
        # read to a thread instead) and checks its budget often.
        inline = _reader(self.path)
        inline.execute("PRAGMA busy_timeout = 0")
        inline.check_every(FINE_STEPS)
        self._inline = inline
        self._inline_backoff: dict[Callable[..., Any], float] = {}
        # Where the database file is, as the warm-up child (store/warm.py) last said: True, all
        # in memory (reads run on the trio thread); False, being read in or partly out (reads
        # go to worker threads); None, no child keeps it (reads run on the trio thread until
        # one reads from the disk, INLINE_BACKOFF_SECONDS above).
        self.in_memory: bool | None = None
        self.inline_reads = 0  # reads served on the trio thread
        self.offloaded_reads = 0  # reads that went to a worker thread
        # Inline reads and writes that read from the device (the loop waited for the disk).
        self.loop_disk_waits = 0
        self.disk_reads: Callable[[], int] = thread_disk_reads  # tests replace it
        self.major_faults: Callable[[], int] = thread_major_faults  # and this
        # The trio thread's count as the last inline read or write ended: the next one's
        # "before", so each takes one reading (getrusage) instead of two. A block read by
        # anything else on the thread in between (rare: nothing else there reads files) is put
        # down to that next read or write, which then goes to threads for a second for nothing.
        self._blocks_seen: int | None = None
        # A descriptor of the database file for the checkpointer's own sync, opened on first use
        # and closed only after every connection (see database_fd).
        self._database_fd: int | None = None
        # Used only on the trio thread, only for commit_stamp (its fallback and the mapping).
        self._version_conn = _connect(self.path, readonly=True)
        # Read only while _version_conn is open (see wal_index_header).
        self._wal_header = wal_index_header(self.path, self._version_conn)
        # Held by the leader of the batch under way (and briefly by checkpoint_forever).
        self._write_limiter = trio.CapacityLimiter(1)
        self._pending: list[WriteRequest] = []  # writes no batch has taken yet
        self._next_leader = False  # a pending write is queued for the writer
        self._leader_changed = trio.Event()  # set (and replaced) when that place frees up
        # While ``lead_batches`` runs (the daemon's): it takes every batch, and writes only
        # queue and wait for their batch's end (each on its own ``done``).
        self._leading = False
        self._work = trio.Event()  # set when a write queues for lead_batches
        # The batch sent to the writer process whose answer lead_batches waits for (it holds
        # the writer on behalf of _flight_token until then).
        self._flight: tuple[list[WriteRequest], trio.Event, Flight] | None = None
        self._flight_token = object()
        self.batches = 0  # transactions committed by write(): each holds one or more writes
        # Where write batches run when set (the daemon's): a child process (store/writer.py).
        self.writer_process: WriterProcess | None = None
        self.offloaded_batches = 0  # batches whose writes all ran in a worker thread
        # The COMMITs of the batches run in this process (the writer process counts its own:
        # all_commit_times adds the two).
        self.commit_times = CommitTimes()
        # The checkpointer's RESTARTs, each holding new writes back while it runs.
        self.restart_times = CommitTimes()
        self.migrated = 0  # migrations Store.open applied
        self._read_limiter = trio.CapacityLimiter(readers)
        self.commits = CommitSignal()
        self.storage = StorageAlarm()  # logs the disk refusing writes (once a minute)
        self._signals: dict[str, CommitSignal] = {}

    @classmethod
    def open(
        cls,
        data_dir: Path,
        *,
        create: bool = False,
        readers: int = DEFAULT_READERS,
        offload: bool = True,
        migrate_it: bool = True,
        allow_older: bool = False,
    ) -> Store:
        """Open (and with ``create``, make) the store in ``data_dir``; migrate it forward.

        ``migrate_it=False`` (the CLI's commands besides ``serve`` and ``init``) leaves the
        schema as it is and refuses a store older than this code, naming the command that
        migrates it; with ``allow_older`` too (``backup``) an older store is opened as it is,
        so that the backup taken before an upgrade is of the store before it."""
        if not store_exists(data_dir):
            if not create:
                raise StoreError(f"no inboxd store in {data_dir} (run 'inboxd init --data DIR')")
            # Only its owner may enter a new data directory: the store holds the webhooks'
            # signing secrets and every message (the systemd unit's UMask=0077 does the same).
            try:
                data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"cannot create the data directory {data_dir}: {exc.strerror or exc}"
                ) from None
            _check_writable(data_dir)  # (it may have been there, empty)
        elif not data_dir.is_dir():
            raise StoreError(f"{data_dir} is not a directory")
        else:
            _check_writable(data_dir)
        try:
            boot = _connect(db_path(data_dir), readonly=False)
            try:
                mode = boot.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if mode != "wal":
                    raise StoreError(f"could not switch {db_path(data_dir)} to WAL mode")
                if migrate_it:
                    migrated = migrate(boot)
                else:
                    migrated = 0
                    _check_version(boot, allow_older)
            finally:
                boot.close()
        except sqlite3.DatabaseError as exc:
            raise StoreError(_open_failure(data_dir, exc)) from None
        store = cls(data_dir, readers, offload)
        store.migrated = migrated
        return store

    async def checkpoint_forever(self) -> None:
        """Copy committed pages from the WAL into the database file in the background, at most
        once a CHECKPOINT_EVERY_SECONDS and only after commits, on a connection of its own in a
        worker thread. Until this runs, the writer checkpoints inside its COMMITs (SQLite's
        automatic checkpoint, every 1,000 pages); then a write's COMMIT only appends to the WAL
        and fsyncs it: a checkpoint copying thousands of pages no longer stalls the batch that
        happens to cross the threshold, nor every write queued behind it.

        PASSIVE never waits for readers or the writer; pages that a reader still needs are
        copied by a later round. Cancellation: between rounds; a round under way finishes."""
        conn = _connect(self.path, readonly=False)
        database_fd = self.database_fd()
        try:
            await self._set_autocheckpoint(0)
            while True:
                version = self.commits.version
                await self.commits.wait_past(version)
                await trio.sleep(CHECKPOINT_EVERY_SECONDS)
                try:
                    if self._offload:
                        held = await trio.to_thread.run_sync(
                            _checkpoint, conn, WAL_LIMIT_BYTES, database_fd
                        )
                    else:
                        held = _checkpoint(conn, WAL_LIMIT_BYTES, database_fd)
                    if held is not None:
                        self.restart_times.observe(held)
                except sqlite3.Error as exc:
                    if self.storage.failed(exc, "checkpoints") is None:  # (logged there)
                        log.exception("could not checkpoint the WAL")
        finally:
            with trio.CancelScope(shield=True):
                await self._set_autocheckpoint(1000)  # SQLite's default
            conn.close()

    async def _set_autocheckpoint(self, pages: int) -> None:
        async with self._write_limiter:  # never while a batch uses the writer in a thread
            self._writer.execute(f"PRAGMA wal_autocheckpoint = {pages}")

    def all_commit_times(self) -> CommitTimes:
        """How long the write batches' COMMITs took, the writer process's and this one's (a
        copy: a batch in a worker thread may be adding to them)."""
        both = self.commit_times + CommitTimes()
        if self.writer_process is not None:
            both += self.writer_process.commit_times
        return both

    def commit_stamp(self) -> object:
        """A value that differs (``!=``) after any connection commits: the writer, the CLI,
        another process. Caches of what the store says use it to know when to ask again; it is
        cheap enough for every request and safe on the trio thread (no disk).

        It is the WAL index header (``wal_index_header``), read from the shared memory that
        SQLite keeps it in: every commit changes its frame count or, after the WAL restarts,
        its salt, before the commit returns. About 0.1 us, against 4-5 us idle for ``PRAGMA
        data_version`` (``bench bound`` prints both), which takes and drops a read lock (two
        ``fcntl``, an ``fstat``) and goes through the query machinery; the pragma is the
        fallback where the index's mapping is not found."""
        if self._wal_header is not None:
            return self._wal_header.raw
        return int(self._version_conn.execute("PRAGMA data_version").fetchone()[0])

    @property
    def offload(self) -> bool:
        """Whether blocking work runs in worker threads (False only for MockClock tests)."""
        return self._offload

    def close(self) -> None:
        self._wal_header = None  # SQLite unmaps it with the last connection
        for conn in [self._writer, *self._readers, self._inline, self._version_conn]:
            conn.close()
        if self._database_fd is not None:  # last: closing it drops the process's locks
            os.close(self._database_fd)
            self._database_fd = None

    def database_fd(self) -> int:
        """A descriptor of the database file, kept open until ``close`` has closed every
        connection. Closing *any* descriptor of a file drops all of the process's POSIX locks on
        it, and SQLite holds one on the database file while a connection is open, which tells
        another process closing its last connection (the CLI) that the WAL is still in use: a
        descriptor opened and closed for one sync would let it delete the WAL under the daemon
        (see ``wal_index_header``)."""
        if self._database_fd is None:
            self._database_fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        return self._database_fd

    # -- sync access (CLI, tests) --------------------------------------------------------------

    def write_sync(self, fn: Callable[..., T], *args: object) -> T:
        self._writer.wait_when_busy(BUSY_TIMEOUT_MS)  # the CLI waits for the daemon's writes
        self._writer.appended, self._writer.wakes = [], set()
        return run_in_transaction(self._writer, "BEGIN IMMEDIATE", fn, *args)

    def read_sync(self, fn: Callable[..., T], *args: object) -> T:
        return run_in_transaction(self._readers[0], "BEGIN", fn, *args)

    # -- async access (the daemon) -------------------------------------------------------------

    def signal(self, name: str) -> CommitSignal:
        """The signal that commits of writes calling ``wake(conn, name)`` bump."""
        signal = self._signals.get(name)
        if signal is None:
            signal = self._signals[name] = CommitSignal()
        return signal

    def add_journal_listener(self, listener: Callable[[list[Appended]], None]) -> None:
        """Call ``listener`` (on the trio thread) with the events each committed write appended."""
        self._journal_listeners.append(listener)

    async def write(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(conn, *args)`` as one atomic change, off the trio loop; return its result
        once it is durable.

        Group commit: writes that arrive while a commit is under way wait for it and then go
        together into the next transaction (while ``lead_batches`` runs, up to ``batch_limit``
        of them; the rest into the ones after), each inside its own savepoint (a write that raises
        is rolled back alone and its caller gets the exception), with one fsync for all of them.
        Nobody's result is returned before the transaction holding it has committed.

        When the calling request carries an Idempotency-Key (``IDEMPOTENT_WRITE``), the same
        savepoint marks that key as applied, so a crash before the response is recorded can
        never let a retry apply the change twice."""
        mark = IDEMPOTENT_WRITE.get()
        if mark is not None:
            IDEMPOTENT_WRITE.set(None)  # the request's one change; later writes are bookkeeping
        request = WriteRequest(fn, args, mark)
        self._pending.append(request)
        if self._leading:
            return await self._queued(request)  # type: ignore[no-any-return]
        try:
            # One waiting write at a time queues for the writer: the next batch's leader. The
            # others wait until a leader takes them into its batch (or gives up its place).
            while request.ended is None and self._next_leader:
                await self._leader_changed.wait()
            if request.ended is not None:  # a batch took it
                if not request.ended.is_set():  # (set: its result is here; no checkpoint)
                    await request.ended.wait()  # its leader wakes it after the COMMIT
                return request.outcome(self.storage)  # type: ignore[no-any-return]
            self._next_leader = True
            try:
                await self._write_limiter.acquire()
            finally:
                self._next_leader = False
                self._leader_changed.set()
                self._leader_changed = trio.Event()
        except BaseException:  # cancelled (or interrupted) while waiting
            if request.ended is None:
                self._pending.remove(request)  # never ran, and never will
            raise
        try:
            if request.ended is None:  # (else lead_batches took it, as it started or stopped)
                await self._lead(*self._take())
        finally:
            self._write_limiter.release()
        return request.outcome(self.storage)  # type: ignore[no-any-return]

    async def _queued(self, request: WriteRequest) -> Any:
        """``write`` while ``lead_batches`` runs: wait for the batch that takes ``request`` to
        end. (Sending it here when the writer is idle, rather than leaving every send to
        ``lead_batches``, made batches of one or two and cost a tenth of the writes' speed:
        bench/HISTORY.md, thirty-third session.)"""
        request.done = done = trio.Event()
        self._work.set()
        try:
            await done.wait()
        except BaseException:
            if request.ended is None:
                self._pending.remove(request)  # never ran, and never will
            raise
        return request.outcome(self.storage)

    def _send_now(self) -> None:
        """``lead_batches``: send the pending writes (up to ``batch_limit`` of them) to the
        writer process in this step, if a child is running, no batch is in flight and the
        writer is free (not the checkpointer's for the moment). ``_land`` then waits for their
        answer."""
        process = self.writer_process
        if (
            self._flight is not None
            or not self._pending
            or process is None
            or self._write_limiter.available_tokens < 1  # (a batch or the checkpointer has it)
            or not process.running()
        ):
            return
        self._write_limiter.acquire_on_behalf_of_nowait(self._flight_token)
        batch, ended = self._take(batch_limit(len(self._pending)))
        try:
            self._flight = (batch, ended, process.send_nowait(batch))
        except BaseException as exc:  # (not foreseen: nothing was sent)
            self._write_limiter.release_on_behalf_of(self._flight_token)
            try:
                self._fail_batch(batch, exc)  # (as a batch that failed running)
            finally:
                _end(batch, ended)  # (none is left waiting, whatever happens)
            if not isinstance(exc, Exception):
                raise
            log.exception("a batch of writes could not be sent to the writer process")

    async def _land(self) -> None:
        """Wait for the batch in flight to end, holding the writer for it until then."""
        assert self._flight is not None
        try:
            await self._lead(*self._flight)
        finally:
            self._flight = None
            self._write_limiter.release_on_behalf_of(self._flight_token)

    async def lead_batches(self) -> None:
        """Run every batch of writes, one after the other, until cancelled (the daemon runs
        this beside its other tasks). A write then only queues and waits for its batch to end;
        none leads its own. Each batch takes the writes queued while the one before it ran, up
        to ``batch_limit`` of them (``BATCH_FLOOR``, or half when that is more), in the order
        they queued.

        Why: with writes leading their own batches, the next leader was woken in the same
        round as the writes the last batch answered, and trio runs a round's tasks in either
        order, so the next batch often waited for all of them to answer (the writer process
        idle meanwhile) before it was sent; and every write waiting behind a leader was woken
        once more each time the place changed hands. Here the writes queued are sent to the
        writer process in the step in which the last batch ended.

        An error past the writes' own (a journal listener's, say) is logged, and the next batch
        runs: each write of the batch has its outcome by then, and the daemon goes on.

        Once cancelled (between batches: one under way lands first), the writes still pending
        run in one last batch, shielded like every batch; later writes lead their own again."""
        self._leading = True
        try:
            while True:
                # No yield unless cancelled: right after the last batch ended, in the same step.
                await trio.lowlevel.checkpoint_if_cancelled()
                try:
                    await self._run_next()
                except Exception:
                    log.exception("a batch of writes failed past its writes")
        finally:
            self._leading = False
            try:
                with trio.CancelScope(shield=True):  # (no batch is in flight: _land ends it)
                    if self._pending:
                        async with self._write_limiter:
                            if self._pending:  # (its writes may have been cancelled meanwhile)
                                await self._lead(*self._take())
            except Exception:  # (as for every batch: the writes have their outcomes)
                log.exception("a batch of writes failed past its writes")
            finally:
                self._leader_changed.set()  # (writes that waited for a leader look again)
                self._leader_changed = trio.Event()

    async def _run_next(self) -> None:
        """``lead_batches``'s one step: send the writes pending (up to ``batch_limit``) and land
        them, or run them another way (no child running yet, or again; the checkpointer has the
        writer), or wait for a write."""
        self._send_now()
        if self._flight is not None:
            await self._land()
        elif self._pending:
            await self._write_limiter.acquire_on_behalf_of(self._flight_token)
            try:
                if self._pending:  # (its writes may have been cancelled meanwhile)
                    await self._lead(*self._take(batch_limit(len(self._pending))))
            finally:
                self._write_limiter.release_on_behalf_of(self._flight_token)
        else:
            self._work = trio.Event()
            await self._work.wait()

    def _take(self, limit: int | None = None) -> tuple[list[WriteRequest], trio.Event]:
        """The pending writes (the first ``limit`` of them), as the next batch, and the Event
        that batch sets when it ends."""
        if limit is None or limit >= len(self._pending):
            batch, self._pending = self._pending, []
        else:
            batch, self._pending = self._pending[:limit], self._pending[limit:]
        ended = trio.Event()
        for r in batch:
            r.ended = ended
        self.batches += 1
        return batch, ended

    async def _lead(
        self, batch: list[WriteRequest], ended: trio.Event, flight: Flight | None = None
    ) -> None:
        """Holding the writer: run and commit ``batch`` (or with ``flight``, wait for the writer
        process to, the batch sent already), tell the journal's listeners, then wake the
        batch's writes."""
        # True while the writer process may have committed a batch whose answer never came
        # back here (run or finish raised midway; it then ended the child, so the journal is
        # final):
        # its events must be read from the journal.
        fate_unknown = False
        try:
            try:
                # Shielded: once a batch is taken it runs and commits (or fails) whole, even if
                # the leader is cancelled meanwhile (a client that went away), or the other
                # writes of the batch would be lost, or left inside an open transaction that
                # every later write fails on.
                with trio.CancelScope(shield=True):
                    ran = False
                    if flight is not None:
                        assert self.writer_process is not None
                        fate_unknown = True
                        ran = await self.writer_process.finish(flight)
                        fate_unknown = False
                    elif self.writer_process is not None:
                        fate_unknown = True
                        ran = await self.writer_process.run(batch)
                        fate_unknown = False
                    if ran:
                        pass  # the writer process ran it
                    elif not self._offload:
                        self._run_batch(batch)
                    elif self.in_memory is False or (done := self._run_batch_inline(batch)) is None:
                        self.offloaded_batches += 1
                        await trio.to_thread.run_sync(self._run_batch, batch)
                    else:
                        # The first ``done`` changes are made; the rest (after one waited for
                        # the disk) and the COMMIT (the fsync) leave the loop.
                        await trio.to_thread.run_sync(self._finish_batch, batch, done)
            except BaseException as exc:  # the batch fails, not the store
                # (A BEGIN that the disk refused on the trio thread, say.) Every write of the
                # batch, the leader's too, returns it through its outcome, as 503 when it is the
                # disk's doing; only a BaseException (a KeyboardInterrupt) goes on up.
                self._fail_batch(batch, exc)
                if not isinstance(exc, Exception):
                    raise
            finally:
                self.commits.bump()
            for r in batch:
                if r.appended:
                    for listener in self._journal_listeners:
                        listener(r.appended)
                    self._heard_seq = max(self._heard_seq, r.appended[-1].seq)
                for name in r.wakes:
                    if (signal := self._signals.get(name)) is not None:
                        signal.bump()
            if fate_unknown or any(_writer_stopped(r.error) for r in batch):
                with trio.CancelScope(shield=True):  # (the leader may be cancelled by now)
                    await self._catch_up_listeners()
        finally:
            _end(batch, ended)  # in one go: each write of the batch returns its own outcome

    async def _catch_up_listeners(self) -> None:
        """The writer process was lost during a batch (or ``run`` or ``finish`` failed after
        sending it):
        whether it committed is unknown here, and if it did, its events and wakes never came
        back. Tell the listeners of every journal event after the last one they heard of, in
        order (still holding the writer, so nothing newer commits meanwhile), and bump every
        signal: the live feed has no gap, and the inbox webhook, the mailer and the channel
        webhooks do not sleep on work."""
        try:
            missed = await self.read(_journal_after, self._heard_seq)
        except Exception:
            log.exception("could not read the journal after a lost writer")
            return
        if missed:
            for listener in self._journal_listeners:
                listener(missed)
            self._heard_seq = missed[-1].seq
        for signal in self._signals.values():
            signal.bump()

    def _run_batch(self, batch: list[WriteRequest]) -> None:
        """One transaction, a savepoint per write (in a worker thread, or inline on MockClock)."""
        conn = self._writer
        conn.wait_when_busy(BUSY_TIMEOUT_MS)  # here waiting for another process is fine
        conn.check_every(COARSE_STEPS if self._offload else FINE_STEPS)
        if (seconds := run_batch(conn, batch)) is not None:
            self.commit_times.observe(seconds)

    def _finish_batch(self, batch: list[WriteRequest], done: int) -> None:
        """In a worker thread: the batch's writes from ``done`` on, in the transaction the trio
        thread opened, then the COMMIT."""
        if self._writer.in_transaction:  # else the batch failed as a whole; errors are set
            self._writer.check_every(COARSE_STEPS)
            if (seconds := _writes_then_commit(self._writer, batch[done:], batch)) is not None:
                self.commit_times.observe(seconds)

    def _fail_batch(self, batch: list[WriteRequest], exc: BaseException) -> None:
        fail_batch(self._writer, batch, exc)

    def _run_batch_inline(self, batch: list[WriteRequest]) -> int | None:
        """Make the batch's changes on the trio thread, each write within the inline budget,
        leaving the transaction open for the caller to finish in a worker thread; how many
        writes were made (fewer than all when one of them read from the disk: the rest go to
        the thread too). None (and nothing done) when the batch must run in a thread instead:
        another process holds the write lock, or one of its writes overran the budget lately
        or now.

        Why: in a worker thread, each statement hands the GIL back and forth with the busy trio
        thread, which cost more than the writes themselves and left the loop idle waiting for
        them (bench/HISTORY.md); the fsync at COMMIT must leave the loop, and so must whatever
        comes after a write that read from the disk."""
        now = time.monotonic()
        if any(self._inline_backoff.get(r.fn, 0.0) > now for r in batch):
            return None
        conn = self._writer
        conn.wait_when_busy(0)  # never wait on the loop: a busy store goes to a thread
        conn.check_every(FINE_STEPS)
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if _interrupted_or_busy(exc):
                return None
            raise
        done = 0
        blocks = self._blocks_before()  # then once after each write: the next one's "before"
        try:
            for r in batch:
                conn.budget(INLINE_WALL_SECONDS, INLINE_CPU_SECONDS)
                try:
                    run_writes(conn, [r])
                    done += 1
                    # Done. If it read from the disk, later batches of its kind go to a
                    # thread, and so does the rest of this one (its pages may be cold too).
                    after = self._blocks_seen = self.disk_reads()
                    if self._note_disk_wait(r.fn, blocks, after):
                        break
                    blocks = after
                except sqlite3.OperationalError as exc:
                    if not _interrupted(exc):
                        raise
                    # Over budget: undo the whole batch and let a thread do it; send this
                    # function's writes there directly for a while (and count the disk wait
                    # if it read from the disk before it was interrupted).
                    self._note_disk_wait(r.fn, blocks)
                    self._inline_backoff[r.fn] = time.monotonic() + INLINE_BACKOFF_SECONDS
                    self._fail_batch(batch, exc)
                    for undone in batch:
                        undone.result, undone.error = None, None
                    return None
        except BaseException as exc:
            # Not a write's own error (those stay with it): the transaction itself failed.
            # Finishing it will find nothing to commit and leave every error in place.
            self._blocks_seen = None  # read afresh next time: this write's reads go uncounted
            self._fail_batch(batch, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            conn.lift_deadline()
        return done

    def set_in_memory(self, state: bool | None) -> None:
        """Where the database file is (``in_memory``), as the warm-up child says: while it is
        not all in, up to ``WARMING_READERS`` reads at once in worker threads."""
        self.in_memory = state
        if state is False:
            self._read_limiter.total_tokens = max(self._reader_count, WARMING_READERS)
        else:  # (readers in use past the count go when they are done, in read)
            self._read_limiter.total_tokens = self._reader_count
            for conn in [c for c in self._readers if c.warming]:
                self._readers.remove(conn)
                conn.close()

    def _warming_reader(self) -> ReaderConnection:
        """An extra reader for a warm-up (in a worker thread: it opens the file)."""
        conn = _reader(self.path)
        conn.execute(f"PRAGMA cache_size = -{WARMING_CACHE_KIB}")
        conn.warming = True
        return conn

    async def read(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(conn, *args)`` in one snapshot: on the trio thread within the inline budget,
        else on a reader in a worker thread (see the module's docstring)."""
        if not self._offload:  # MockClock tests: everything on the trio thread
            reader = self._readers[0]  # waits out a busy store, like the threads' readers
            return self._read_on(reader, fn, args, READ_DEADLINE_SECONDS, True)
        if self.in_memory is not False and self._inline_backoff.get(fn, 0.0) <= time.monotonic():
            blocks = self._blocks_before()
            try:
                result = self._read_on(
                    self._inline, fn, args, INLINE_WALL_SECONDS, False, INLINE_CPU_SECONDS
                )
            except sqlite3.OperationalError as exc:
                if not _interrupted_or_busy(exc):
                    raise
                # Over budget (or a checkpoint holds the lock): let a thread do it, and send
                # this function's reads there directly for a while.
                self._inline_backoff[fn] = time.monotonic() + INLINE_BACKOFF_SECONDS
            else:
                self.inline_reads += 1
                return result
            finally:
                self._note_disk_wait(fn, blocks)  # however it ended (a NotFound, say)
        self.offloaded_reads += 1
        async with self._read_limiter:
            if self._readers:
                conn = self._readers.pop()
            else:  # a warm-up's tokens (set_in_memory) are more than the readers
                conn = await trio.to_thread.run_sync(self._warming_reader)
            conn.budget(READ_DEADLINE_SECONDS)
            try:
                return await trio.to_thread.run_sync(run_in_transaction, conn, "BEGIN", fn, *args)
            except sqlite3.OperationalError as exc:
                if "interrupted" in str(exc):
                    raise _too_long() from None
                raise
            finally:
                conn.lift_deadline()
                if conn.warming and self.in_memory is not False:
                    conn.close()  # the warm-up is over
                else:
                    self._readers.append(conn)

    def _blocks_before(self) -> int:
        """The trio thread's count of blocks read, as inline work starts (see ``_blocks_seen``).
        Where the count is the whole process's (no ``RUSAGE_THREAD``), worker threads' reads
        between two inline calls would land on the next one: read it afresh each time there."""
        if self._blocks_seen is None or not _PER_THREAD:
            self._blocks_seen = self.disk_reads()
        return self._blocks_seen

    def _note_disk_wait(
        self, kind: Callable[..., Any], blocks_before: int, blocks_after: int | None = None
    ) -> bool:
        """After work on the trio thread: if it read from the device (the count of blocks read
        moved; ``blocks_after`` None reads it now), the loop waited for the disk. Send that
        function to worker threads for a while (they warm the pages up) and say so."""
        if blocks_after is None:
            blocks_after = self._blocks_seen = self.disk_reads()
        if blocks_after == blocks_before:
            return False
        self.loop_disk_waits += 1
        self._inline_backoff[kind] = time.monotonic() + INLINE_BACKOFF_SECONDS
        # (at most once a function a second, by the backoff.) Where the warm-up child holds the
        # store in memory none should happen: a warning, naming what it was. Where the store is
        # not held (too large, or warm_cache off) they are expected, and info. With the trio
        # thread's major page faults so far (start-up's too): if they are 0, or did not move
        # since the line before, this wait was a read of a file, not a page of code or of a
        # mapped file (the -shm) brought back in. A total, not this read's own: its "before"
        # would cost every inline read a second getrusage.
        log.log(
            logging.WARNING if self.in_memory else logging.INFO,
            DISK_WAIT_LOG,
            extra={
                # (a write sent as an object, actions.Answered, by its name in that module)
                "function": getattr(kind, "__qualname__", None)
                or getattr(kind, "name", None)
                or repr(kind),
                "blocks": blocks_after - blocks_before,
                "major_faults": self.major_faults(),
                "in_memory": self.in_memory,
                "to_threads_for_seconds": INLINE_BACKOFF_SECONDS,
            },
        )
        return True

    @staticmethod
    def _read_on(
        conn: ReaderConnection,
        fn: Callable[..., T],
        args: tuple[object, ...],
        wall_seconds: float,
        final: bool,
        cpu_seconds: float = float("inf"),
    ) -> T:
        """Run the read on the trio thread; past its budget SQLite interrupts it, which is the
        caller's timeout when ``final``, else a signal to use a thread."""
        conn.budget(wall_seconds, cpu_seconds)
        try:
            return run_in_transaction(conn, "BEGIN", fn, *args)
        except sqlite3.OperationalError as exc:
            if final and "interrupted" in str(exc):
                raise _too_long() from None
            raise
        finally:
            conn.lift_deadline()

    def backup_to(self, target: Path, progress: Callable[[int, int], None] | None = None) -> None:
        """A consistent online copy of the store (SQLite's backup API), safe while serving."""
        dest = sqlite3.connect(target)
        try:
            src = _connect(self.path, readonly=True)
            try:

                def report(status: int, remaining: int, total: int) -> None:
                    if progress is not None:
                        progress(total - remaining, total)

                # One snapshot for the whole copy. Without a read transaction of its own, SQLite
                # starts the copy over whenever another connection commits between two of its
                # steps: under steady writes it never finished.
                src.execute("BEGIN")
                src.execute("SELECT count(*) FROM sqlite_schema").fetchone()
                src.backup(dest, pages=1024, progress=report)
                src.execute("COMMIT")
            finally:
                src.close()
        finally:
            dest.close()
