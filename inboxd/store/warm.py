"""Warming the OS page cache with the store at start-up.

After a reboot or a restart under memory pressure the store's pages are on the disk only, and
requests bring them in one random page at a time: measured here, 4 KB pages at random come at
about 5.5 MB/s while the same file reads sequentially at 830 MB/s. ``warm`` has the files read
through once, sequentially, and the kernel keeps what was read in its page cache, which every
process shares (the 6.8 GB bench store took 6-7 s on an idle machine). Requests meanwhile are
served as usual; reads that still find a page missing leave the loop (see db.py).
``posix_fadvise(WILLNEED)`` was tried first: it returns at once, but the kernel then read only
part of the file ahead (750 MB in 10 s here).

The reading happens in a child process, never in the daemon's own: closing a file descriptor
of the database drops every POSIX lock the process holds on it, SQLite's included, and another
process (the CLI) could then take the store for its own and, say, remove a WAL the daemon still
writes to (SQLite's "How To Corrupt" section 2.2). A test that revokes a key with the CLI while
the daemon runs caught exactly that with an in-process first version.

The child then stays, holding the database file mapped (read-only, ``MAP_POPULATE``: mapping it
is what reads it in) until the daemon stops, and maps what the file grows by every
``CHECK_SECONDS``. A page that some process maps is in use, not idle cache: some virtual
machines page out file pages that no process maps and nobody touched for a minute (a DAMON
``pageout`` scheme, this one's too), which left the store cold a minute after the load moved on,
and requests waiting for the disk (BENCHMARKS.md, The machine). Mapped pages are still ordinary
page cache, which the kernel reclaims under memory pressure like any other; so the child also
locks them in memory (``mlock``, ``server.lock_cache``) up to half of the memory available at
start, where the system lets it (``RLIMIT_MEMLOCK``, which inboxd.service lifts, or
``CAP_IPC_LOCK``). What it could not lock (no permission, or what the store grew by past that
budget) it checks with ``mincore`` at each look and maps again when pages have left, which reads
them back in. The WAL is read through, not kept: it is written all the time, so its pages are
the most recently used there are.

The child says where the store is (``Keeper``), and the daemon's reads follow
(``Store.in_memory``): on the trio thread while all of it is in memory, in worker threads while
it is being read in (after a start, seconds for gigabytes) or read back. So while the store is
kept locked, no read on the loop waits for the disk: locked pages cannot leave. Unlocked ones
are seen gone within a second (the check is the child's work: 0.4 % of a core for a 7 GB
store), and until then db.py's bound applies: a read on the loop that had to wait sends its
function to worker threads for a second. So does a store that is not kept (too large, or
``warm_cache`` off).

Only when the store takes at most ``MAX_SHARE_OF_AVAILABLE`` of the memory the OS reports
available, so that warming never pushes out what the machine needs more. In a container or a
systemd unit with ``MemoryMax=``/``MemoryHigh=``, the page cache the reader fills is charged to
the daemon's own memory cgroup, so what counts there is the lesser of that and the room left
below the cgroup's limits (and its parents'): v2 ``memory.high``/``memory.max`` against
``memory.current``, v1 ``memory.limit_in_bytes`` against ``memory.usage_in_bytes``.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

import attrs
import trio

log = logging.getLogger("inboxd.store")

MAX_SHARE_OF_AVAILABLE: Final = 0.5


def read_through(paths: Iterable[str | Path]) -> None:
    """Send each file to /dev/null, which reads it into the page cache without copying it to
    the process (2 GB: 0.7 s and 0.08 s of CPU here, against 1.4 s and ~1 s of CPU for reading
    it into a buffer). It opens and closes the files: never call it in the daemon's own process
    (see above). ``warm`` runs it in a child; the bench scripts call it directly."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # a WAL checkpointed away meanwhile
                continue
            try:
                offset = 0
                while sent := os.sendfile(null, fd, offset, 8 << 20):
                    offset += sent
            finally:
                os.close(fd)
    finally:
        os.close(null)


# How often the keeper looks at the file (grown, shrunk, replaced?) and at whether what it could
# not lock is all still in memory; past this many mappings it maps the whole file again in one
# (a process may hold only so many, vm.max_map_count).
CHECK_SECONDS: Final = 1.0
MAX_MAPS: Final = 256
# Looks in a row that find part of the store out of memory and fail to read it back (memory is
# short): then the keeper gives up (says ``lost``), so that the daemon's reads stop waiting for
# it in worker threads.
GIVE_UP_LOOKS: Final = 10

_MAP_FAILED: Final = ctypes.c_void_p(-1).value
# madvise(2): read the range's pages in (Linux 5.14; earlier kernels refuse it, EINVAL).
_MADV_POPULATE_READ: Final = getattr(mmap, "MADV_POPULATE_READ", 22)


class Libc:
    """The C library's mmap, munmap, mlock and mincore: Python's mmap module has no mlock nor
    mincore, and gives no address of a read-only mapping to pass to them. (The keeper's, and
    the daemon's lock of its own code, resident.py.)"""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.mmap = getattr(libc, "mmap64", libc.mmap)  # a 64-bit offset on 32-bit systems too
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = [
            *(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int),
            ctypes.c_int64,
        ]
        self.munmap, self.mlock, self.mincore = libc.munmap, libc.mlock, libc.mincore
        for fn in (self.munmap, self.mlock):
            fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]
        self.madvise = libc.madvise
        self.madvise.restype = ctypes.c_int
        self.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.mincore.restype = ctypes.c_int
        self.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def _os_error() -> OSError:
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code))


@attrs.define
class _Mapping:
    address: int
    length: int
    locked: int = 0  # bytes locked in memory, from its start
    not_locked: str = ""  # why the rest is not: off, budget, or mlock's errno
    vector: ctypes.Array[ctypes.c_char] | None = None  # for mincore of the rest, once asked

    def unlocked(self) -> tuple[int, int]:
        """The address and length of the part not locked (length 0: none)."""
        return self.address + self.locked, self.length - self.locked


class Keeper:
    """What the keeper child does, one look at a time (``keep`` runs it; tests drive it).

    It maps the database file read-only with ``MAP_POPULATE`` (mapping it is what reads it in)
    and locks as much of it in memory (``mlock``) as ``lock_budget`` and the system allow
    (``RLIMIT_MEMLOCK``, or ``CAP_IPC_LOCK``). Locked pages cannot leave memory; of the rest,
    each look checks with ``mincore`` that all of it is still in, and reads back what is not
    (``MADV_POPULATE_READ``; on kernels before 5.14, by mapping the whole file again).

    It says its state in lines (``say``), each time it changes: ``in locked`` (all of the file
    in memory, locked there), ``in unlocked REASON`` (all of it in, not all locked: ``off``, a
    ``budget`` too small, or the errno mlock gave), ``in unverified`` (mapped, but mincore is
    refused here, so whether it stayed in cannot be told), ``out`` (part of it is not in
    memory, and being read back in), or ``lost`` (it could not be read back in
    ``GIVE_UP_LOOKS`` looks in a row: the keeper gives up)."""

    def __init__(self, db: Path, lock_budget: int, max_maps: int = MAX_MAPS) -> None:
        self.db = db
        self.lock_budget = lock_budget
        self.max_maps = max_maps
        self._libc = Libc()
        self.maps: list[_Mapping] = []
        self.mapped = 0  # the file's size as last mapped
        self._file = (0, 0)  # (st_dev, st_ino) of the file the mappings are of
        self.unverified = False  # mincore refused: whether unlocked pages stayed in is unknown
        self.said = ""
        self.out_looks = 0  # looks in a row that could not bring all of it back
        self.unmapped = True  # the last look could not open or map what the file holds

    def look(self, say: Callable[[str], None]) -> bool:
        """Map what the file changed by; if part of it is out of memory, say so before reading
        it back (seconds, for a large store read from the disk), then say it is in. False once
        the keeper gives up (it said ``lost``)."""
        self._map_to_end()
        for m in self.maps:  # what could not be locked before (the budget, a passing ENOMEM)
            if m.locked < m.length and m.not_locked != "off":
                self._lock(m)
        if not self._all_in():
            self._say(say, "out")
            self._read_back()
            if not self._all_in():
                self.out_looks += 1
                if self.out_looks < GIVE_UP_LOOKS:
                    return True
                self._say(say, "lost")
                return False
        self.out_looks = 0
        unlocked = [m for m in self.maps if m.locked < m.length]
        if not unlocked:
            self._say(say, "in locked")
        else:
            self._say(
                say, "in unverified" if self.unverified else f"in unlocked {unlocked[0].not_locked}"
            )
        return True

    def close(self) -> None:
        for m in self.maps:
            self._libc.munmap(m.address, m.length)
        self.maps.clear()

    def _say(self, say: Callable[[str], None], line: str) -> None:
        if line != self.said:
            say(line)
            self.said = line

    def _all_in(self) -> bool:
        return not self.unmapped and all(self._resident(m) for m in self.maps)

    def _resident(self, m: _Mapping) -> bool:
        """Whether the part of ``m`` not locked is all in memory (the locked part is)."""
        address, length = m.unlocked()
        if length <= 0 or self.unverified:
            return True
        if m.vector is None:
            m.vector = ctypes.create_string_buffer(-(-length // mmap.PAGESIZE))
        if self._libc.mincore(address, length, m.vector) != 0:
            if ctypes.get_errno() not in (errno.EPERM, errno.ENOSYS):
                return False  # (EAGAIN, short of memory itself): not known to be in
            self.unverified = True  # refused (a seccomp filter): assume, as before
            return True
        # A byte per page, whose lowest bit says "in memory" (the others are reserved; Linux
        # writes 0 or 1, and a bit mask over 1.8 MB, for 7 GB, would cost more than the call).
        return b"\0" not in m.vector.raw

    def _read_back(self) -> None:
        """Read in what left memory, leaving the locked parts as they are; where the kernel
        cannot (EINVAL before 5.14; EFAULT when the file shrank under a mapping), map the whole
        file again. Other failures (ENOMEM, EINTR) leave it to the next look."""
        if self.unmapped:
            self._map_to_end(whole=True)
            return
        for m in self.maps:
            address, length = m.unlocked()
            if length > 0 and self._libc.madvise(address, length, _MADV_POPULATE_READ) != 0:
                if ctypes.get_errno() in (errno.EINVAL, errno.EFAULT):
                    self._map_to_end(whole=True)
                return

    def _map_to_end(self, whole: bool = False) -> None:
        """Map what is not mapped yet (with ``whole``, all of it again); on any failure (the
        file gone, say), leave things as they are, not all in (``unmapped``), and try again at
        the next look."""
        self.unmapped = True
        try:
            fd = os.open(self.db, os.O_RDONLY)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            size, file = st.st_size, (st.st_dev, st.st_ino)
            if not whole and size == self.mapped and file == self._file:
                self.unmapped = False
                return
            # Grown: map the new part. Shrunk (a VACUUM), another file at the path (a restore),
            # or too many mappings: the whole file, before letting the old mappings go.
            whole = whole or size < self.mapped or file != self._file
            whole = whole or len(self.maps) >= self.max_maps
            start = 0 if whole else self.mapped - self.mapped % mmap.ALLOCATIONGRANULARITY
            new = self._map(fd, start, size - start) if size > start else None
        except OSError:
            return
        finally:
            os.close(fd)
        if whole:  # (its locks go with it; the new mapping's, just below, take a few ms)
            self.close()
        if new is not None:
            self.maps.append(new)
            self._lock(new)
        self.mapped, self._file, self.unmapped = size, file, False

    def _map(self, fd: int, offset: int, length: int) -> _Mapping:
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        address = self._libc.mmap(None, length, mmap.PROT_READ, flags, fd, offset)
        if address is None or address == _MAP_FAILED:
            raise _os_error()
        return _Mapping(address, length)

    def _lock(self, m: _Mapping) -> None:
        """Lock as much more of ``m`` as the budget left (and the system) allows, after what
        is locked of it already; the old mappings of a whole remap are gone by then, so that
        they do not count against either. At each look again, for what could not be."""
        room = self.lock_budget - sum(other.locked for other in self.maps)
        rest = m.length - m.locked
        amount = rest if rest <= room else max(0, room) // mmap.PAGESIZE * mmap.PAGESIZE
        if self.lock_budget <= 0:
            m.not_locked = "off"
        elif amount == 0:
            m.not_locked = "budget"
        elif self._libc.mlock(m.address + m.locked, amount) != 0:
            m.not_locked = errno.errorcode.get(ctypes.get_errno(), "error")
        else:
            m.locked += amount
            m.not_locked = "" if m.locked == m.length else "budget"


def keep(
    db: Path,
    wal: Path | None = None,
    every: float = CHECK_SECONDS,
    max_maps: int = MAX_MAPS,
    lock_budget: int = 0,
) -> None:
    """The keeper child's work: read the WAL through, map (and lock) the database file, say
    its state on stdout (``Keeper``), then look again every ``every`` seconds until stdin
    closes (the daemon stopped, or died). It opens and closes the files: never call it in the
    daemon's own process (see above).

    The child ignores SIGINT and SIGTERM (``_KEEPER`` says so first thing, before any import),
    as the writer process does: they reach the whole process group or service (Ctrl-C in a
    terminal, systemd stopping the unit) while the daemon still drains its requests, and a
    keeper gone then sends its reads back to the bounded way (and logs a warning at every stop).
    The daemon closes its stdin once it is done."""
    if wal is not None:
        read_through([wal])
    # If memory runs out, the kernel reclaims the clean pages it could not lock first; should
    # it still have to kill a process, let it be this one rather than the daemon (its locked
    # pages go with it; inboxd.service has OOMPolicy=continue, so that does not stop the
    # service).
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:
        pass
    keeper = Keeper(db, lock_budget, max_maps)

    def say(line: str) -> None:
        sys.stdout.write(f"{line}\n")
        sys.stdout.flush()

    stdin = sys.stdin.fileno()
    while keeper.look(say):
        readable, _, _ = select.select([stdin], [], [], every)
        if readable and not os.read(stdin, 4096):
            return  # the daemon closed its end (or died)


# The child's program, ignoring SIGINT and SIGTERM from its first line (``keep``). Not niced: inboxd.service filters out setpriority (@resources), and with
# so little CPU to spend there is nothing to yield.
_KEEPER: Final = (
    "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN);"
    " signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    " import sys; from pathlib import Path; from inboxd.store.warm import keep;"
    " keep(Path(sys.argv[1]), Path(sys.argv[2]) if sys.argv[2] else None, float(sys.argv[3]),"
    " int(sys.argv[4]), int(sys.argv[5]))"
)


def meminfo(field: str) -> int | None:
    """A figure of /proc/meminfo in bytes (None where there is no such file or field)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def available_memory() -> int | None:
    """``MemAvailable``: what the OS could give without swapping, page cache it can drop
    included."""
    return meminfo("MemAvailable")


CGROUP_ROOT: Final = Path("/sys/fs/cgroup")
# cgroup v1 reports "no limit" as 2**63 - 1 rounded down to a page.
_V1_UNLIMITED: Final = 1 << 62


def _reclaimable(directory: Path, stat_key: str) -> int:
    """Page cache the cgroup holds that the kernel can drop at once (its inactive file pages):
    counted in its usage, yet room, as MemAvailable counts it (kubelet's "working set" too)."""
    try:
        for line in (directory / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == stat_key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _room_below_limits(
    directory: Path, limits: tuple[str, ...], usage: str, stat_key: str
) -> int | None:
    """Bytes left below the lowest of the cgroup directory's limits; None without a limit."""
    found = []
    for name in limits:
        try:
            raw = (directory / name).read_text().strip()
        except OSError:
            continue
        if raw != "max" and int(raw) < _V1_UNLIMITED:
            found.append(int(raw))
    if not found:
        return None
    used = int((directory / usage).read_text()) - _reclaimable(directory, stat_key)
    return max(0, min(found) - used)


def cgroup_headroom(
    root: Path = CGROUP_ROOT, membership: Path = Path("/proc/self/cgroup")
) -> int | None:
    """Bytes this process's memory cgroups (its own and every one above it, v1 or v2) let it
    still use; None where none has a limit or there are no cgroups to read. A v1 memory
    controller mounted together with others (not at ``memory/``) is not found: then the OS's
    figure alone counts."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return None
    rooms: list[int] = []
    limits: tuple[str, ...]
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:  # v2; in a hybrid set-up under unified/
            base = root if (root / "cgroup.controllers").exists() else root / "unified"
            limits, usage, stat_key = (
                ("memory.high", "memory.max"),
                "memory.current",
                "inactive_file",
            )
        elif "memory" in controllers.split(","):
            base = root / "memory"
            limits, usage = ("memory.limit_in_bytes",), "memory.usage_in_bytes"
            stat_key = "total_inactive_file"
        else:
            continue
        directory = base / path.strip("/")
        for level in [directory, *directory.parents]:
            try:
                room = _room_below_limits(level, limits, usage, stat_key)
            except (OSError, ValueError):  # an unreadable level: the others still count
                room = None
            if room is not None:
                rooms.append(room)
            if level == base or level == level.parent:
                break
    return min(rooms) if rooms else None


def memory_for_warming() -> int | None:
    """What the page cache may grow by: the OS's available memory, or less within a cgroup."""
    known = [m for m in (available_memory(), cgroup_headroom()) if m is not None]
    return min(known) if known else None


def files_of(db: Path) -> list[Path]:
    """The database file and its write-ahead log, those that exist."""
    return [p for p in (db, Path(f"{db}-wal")) if p.exists()]


def store_bytes(files: list[Path]) -> int:
    """The size of a store's files (``files_of``), as warming counts it."""
    return sum(p.stat().st_size for p in files)


def worth_warming(size: int, available: int | None) -> bool:
    return available is not None and size <= available * MAX_SHARE_OF_AVAILABLE


class _Lines:
    """The lines a child writes to a trio stream, one at a time."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = b""

    async def next(self) -> str | None:
        """The next line without its newline; None once the stream has ended."""
        while b"\n" not in self._buffer:
            if not (chunk := await self._stream.receive_some()):
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="replace")


def _is_in(state: str) -> bool | None:
    """A keeper's state line: True for all in memory, False for part out (being read back),
    None for no longer kept (``lost``, or no such line)."""
    word = state.split(" ", 1)[0]
    return True if word == "in" else False if word == "out" else None


# The most often a keeper's "part of the store is out of memory" is logged, and its "back in".
LOG_EVERY_SECONDS: Final = 60.0
# How long a stopping daemon gives the keeper to end by itself once its stdin is closed (it
# answers within a look's time, unless it is reading pages back): then it is killed, which
# costs nothing (it holds no state), so the daemon's stop stays within CONTRACT section 1's
# 10 s after server.shutdown_timeout's 5 s of requests.
KEEPER_STOP_SECONDS: Final = 2.0


async def warm(
    db: Path,
    *,
    lock: bool = True,
    in_memory: Callable[[bool | None], None] = lambda _: None,
    task_status: trio.TaskStatus[int | None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Have the store's files read into the page cache and kept there (locked in memory with
    ``lock``, as far as the system allows), if they fit (see above): started once they are in
    (with the keeper's pid; None when it is not kept), then holds them until cancelled (the
    daemon stopping), when the keeper is stopped.

    ``in_memory`` hears where the store is, for the daemon's reads (Store.in_memory): False
    while the keeper reads it in or finds part of it out of memory, True while all of it is in,
    and None once there is no keeper (the store is not kept: too large, or the keeper failed
    or stopped)."""
    try:
        await _warm(db, lock, in_memory, task_status)
    finally:
        in_memory(None)


async def _warm(
    db: Path,
    lock: bool,
    in_memory: Callable[[bool | None], None],
    task_status: trio.TaskStatus[int | None],
) -> None:
    try:
        files = files_of(db)
        size = store_bytes(files)
    except OSError as exc:  # a WAL checkpointed away between the two looks, say
        log.warning("could not warm the page cache", extra={"error": str(exc)})
        task_status.started(None)
        return
    if db not in files:  # nothing to keep (the WAL alone is not worth a child)
        task_status.started(None)
        return
    available = memory_for_warming()
    if not worth_warming(size, available):
        log.info(
            "not warming the page cache: the store is too large for the memory available",
            extra={"store_bytes": size, "available_bytes": available},
        )
        task_status.started(None)
        return
    assert available is not None  # (worth_warming)
    lock_budget = int(available * MAX_SHARE_OF_AVAILABLE) if lock else 0
    wal = Path(f"{db}-wal")
    started = time.monotonic()
    try:
        keeper = await trio.lowlevel.open_process(
            [
                *(sys.executable, "-c", _KEEPER, str(db)),
                *(str(wal) if wal in files else "", str(CHECK_SECONDS), str(MAX_MAPS)),
                str(lock_budget),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
    except OSError as exc:  # a cold cache is not an error
        log.warning("could not warm the page cache", extra={"error": str(exc)})
        task_status.started(None)
        return
    assert keeper.stdin is not None and keeper.stdout is not None
    in_memory(False)  # until the keeper says it has all of it in
    warmed = False
    try:
        lines = _Lines(keeper.stdout)
        # Its first "in" (after any "out": pages it could not read in at once).
        while (state := await lines.next()) == "out":
            pass  # (in_memory is False already)
        if state is None or _is_in(state) is not True:
            keeper.kill()  # ("lost", or a line this daemon does not know: a keeper from
            log.warning(  # another version, mid-upgrade; it would wait for its stdin)
                "could not warm the page cache",
                extra={"error": f"the keeper said {state!r} (exit status {await keeper.wait()})"},
            )
            task_status.started(None)
            return
        warmed = True
        in_memory(True)
        how = state.split(" ")
        log.info(
            "read the store into the page cache; keeping it there",
            extra={
                "store_bytes": size,
                "seconds": round(time.monotonic() - started, 2),
                "locked": how[1:] == ["locked"],
                **({"not_locked": how[2]} if how[1:2] == ["unlocked"] else {}),
            },
        )
        task_status.started(keeper.pid)
        # "Part of it left", and an "in" that is not all locked, are logged once a minute at
        # most; each logged "out" is followed by its "in again".
        out_logged_at = how_logged_at = -LOG_EVERY_SECONDS
        out_logged = False
        last_in = state
        while (state := await lines.next()) is not None:  # until the daemon stops
            now_in = _is_in(state)
            in_memory(now_in)
            now = time.monotonic()
            if now_in is None:
                log.warning(
                    "the keeper could not keep the store in the page cache (memory is short,"
                    " or the file cannot be mapped): reads run on the trio thread again,"
                    " bounded (store/db.py)",
                    extra={"keeper_said": state},
                )
            elif now_in:
                if out_logged:
                    log.info("the store is all in the page cache again")
                    out_logged = False
                changed = state not in (last_in, "in locked")
                if changed and now - how_logged_at >= LOG_EVERY_SECONDS:
                    log.warning(
                        "the store is in the page cache, not all locked there",
                        extra={"keeper_said": state},
                    )
                    how_logged_at = now
                last_in = state
            elif now - out_logged_at >= LOG_EVERY_SECONDS:
                log.warning(
                    "part of the store left the page cache: reads leave the trio thread until"
                    " the keeper has read it back"
                )
                out_logged_at, out_logged = now, True
        status = await keeper.wait()
        log.warning(
            "the store is no longer kept in the page cache",
            extra={"error": f"the keeper stopped (exit status {status})"},
        )
    finally:
        with trio.CancelScope(shield=True):
            if warmed:  # it waits for its stdin to close; while mapping, it does not look
                await keeper.stdin.aclose()
                with trio.move_on_after(KEEPER_STOP_SECONDS):
                    await keeper.wait()
            if keeper.returncode is None:
                keeper.kill()
                await keeper.wait()
            await keeper.stdin.aclose()
            await keeper.stdout.aclose()
