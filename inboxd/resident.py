"""Keeping the daemon's own code in memory.

The kernel may take back any page of a mapped file that nothing has touched for a while: under
memory pressure on any machine, and on some virtual machines once the page has been idle for a
minute (a DAMON ``pageout`` scheme, as on the benchmark machine: BENCHMARKS.md, The machine).
The daemon's code is made of such pages: the interpreter's, and those of every shared library
and extension module it has loaded (SQLite, orjson, the pickler of the writer's hand-off...). A
part of it that the load had not used for a minute was read back from the disk, a page at a
time, on the trio thread, by the first request that needed it, and every request in flight
waited: by hand, after a few minutes of reads only, the first writes faulted orjson's JSON
parser back in, which the daemon logged as a loop disk wait of the next read on the loop
(``auth_epoch``, bench/HISTORY.md, fortieth session).

``CodeLock`` locks the mappings of the process's executable and shared libraries in memory
(``mlock``): the code, read-only data and initialised data of the interpreter, its libraries
and extension modules; about 20 MB for the daemon. Shared mappings (the store's ``-shm``) are
the store's, not code, and are left alone. ``keep_code_in_memory``, a task of the daemon, locks
them once start-up is done, in a worker thread (on a cold start that reads them from the disk),
and looks again every ``CHECK_SECONDS`` for libraries loaded since. Where the system does not
allow it all (``RLIMIT_MEMLOCK``, which inboxd.service lifts, or ``CAP_IPC_LOCK``), what fits is
locked, and the start-up log line says how much was not, and why. ``server.lock_code = false``
turns it off.

The writer child's code is kept with the daemon's, as far as the daemon's lock reaches (all of
it where the memory-lock limit allows): the child maps no file the daemon has not (a test
checks it), and a page of a file is one page in memory however many processes map it, so a page
locked by the daemon stays for the child too (the kernel does not reclaim a locked page,
whoever else maps it). What the child has written of those mappings (its own copies of
relocated data) is its anonymous memory, like its heap.
"""

from __future__ import annotations

import ctypes
import errno
import logging
from collections.abc import Callable
from typing import Final

import attrs
import trio

from inboxd.store.warm import Libc

log = logging.getLogger("inboxd.daemon")

# How often the task looks for mappings not locked yet (a library loaded since, a lock refused
# before): reading and parsing /proc/self/maps takes about a millisecond (by hand, 254 mappings
# with the daemon's modules loaded: 0.75 ms), in a worker thread.
CHECK_SECONDS: Final = 60.0
# The most it locks in all: code is tens of megabytes (a library mapped past what is left of
# this is left to the kernel).
LOCK_BUDGET_BYTES: Final = 256 << 20


@attrs.frozen
class Mapping:
    """One line of /proc/self/maps that ``CodeLock`` locks: a private mapping of an executable
    or a shared library."""

    start: int
    end: int
    path: str

    @property
    def length(self) -> int:
        return self.end - self.start


def private_file_mappings(maps: str) -> list[Mapping]:
    """The mappings of the executable and its shared libraries in ``maps`` (the text of
    /proc/self/maps): every private mapping that may be read or run of a file of which some
    mapping runs (its code, read-only and initialised data). Not anonymous memory, not the
    kernel's (``[vdso]``), not shared mappings, not the guard regions between a library's
    segments (no access), not data files mapped privately (a locale archive, which can be
    hundreds of megabytes)."""
    lines = []
    for line in maps.splitlines():
        # address perms offset dev inode pathname (which may hold spaces, or end " (deleted)")
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[4] != "0" and fields[5].startswith("/"):
            lines.append(fields)
    code = {fields[5] for fields in lines if fields[1][2:3] == "x"}
    out = []
    for address, perms, _offset, _dev, _inode, path in lines:
        if path in code and perms[3:4] == "p" and perms[:3] != "---":
            start, _, end = address.partition("-")
            out.append(Mapping(int(start, 16), int(end, 16), path))
    return out


@attrs.frozen
class Locked:
    """Where a look left things: bytes locked, bytes not locked (and why: an errno's name, or
    ``budget``; empty when all is locked)."""

    locked: int
    not_locked: int
    reason: str = ""


def _read_maps() -> str:
    with open("/proc/self/maps", errors="surrogateescape") as f:  # (paths are bytes)
        return f.read()


class CodeLock:
    """Locks the mappings of the process's executable and shared libraries, one look at a time:
    each look locks those not locked yet (a lock the system refused is tried again at the next
    look)."""

    def __init__(
        self,
        *,
        read_maps: Callable[[], str] | None = None,
        mlock: Callable[[int, int], int] | None = None,
        budget: int = LOCK_BUDGET_BYTES,
    ) -> None:
        self._read_maps = read_maps or _read_maps
        self._mlock = mlock or Libc().mlock
        self._budget = budget
        self._locked: set[Mapping] = set()

    def look(self) -> Locked:
        mappings = private_file_mappings(self._read_maps())
        self._locked &= set(mappings)  # (one unmapped since: its lock went with it)
        used = sum(m.length for m in self._locked)
        reason = ""  # the first refusal's
        for m in mappings:
            if m in self._locked:
                continue
            if used + m.length > self._budget:
                reason = reason or "budget"
            elif self._mlock(m.start, m.length) != 0:
                code = ctypes.get_errno()
                reason = reason or errno.errorcode.get(code, "error")
                if code == errno.EPERM:  # (no allowance at all: the rest would be refused)
                    break
            else:
                self._locked.add(m)
                used += m.length
        total = sum(m.length for m in mappings)
        return Locked(locked=used, not_locked=total - used, reason=reason)


async def keep_code_in_memory(check_seconds: float = CHECK_SECONDS) -> None:
    """A task of the daemon's: lock its code in memory (``CodeLock``) now and at each look
    after. Logs the first look, and each later one whose reason for what is not locked
    differs. Where the first look cannot be made at all (no /proc, no mlock), it says so once
    and ends; a later look that fails is logged and the next one tried."""
    said: str | None = None
    try:
        lock = CodeLock()
    except (OSError, AttributeError) as exc:  # no mlock in this C library
        _cannot(exc)
        return
    while True:
        try:
            # (a look may read pages from the disk, and can be made again: a stop need not
            # wait for it)
            now = await trio.to_thread.run_sync(lock.look, abandon_on_cancel=True)
        except Exception as exc:  # (this task is an aid: it never takes the daemon down)
            if said is None:
                _cannot(exc)
                return
            log.warning(
                "could not look at the daemon's code to lock it in memory; trying again later",
                extra={"error": f"{type(exc).__name__}: {exc}"},
            )
        else:
            if now.reason != said:
                log.info(
                    "locked the daemon's code in memory"
                    if not now.reason
                    else "locked the daemon's code in memory, not all of it: the kernel may page"
                    " the rest out, and a request that needs it then waits for the disk"
                    + (
                        ""
                        if now.reason == "budget"
                        else " (it needs a memory-lock limit as large, LimitMEMLOCK=infinity in"
                        " inboxd.service, or CAP_IPC_LOCK)"
                    ),
                    extra={
                        "locked_bytes": now.locked,
                        "not_locked_bytes": now.not_locked,
                        **({"not_locked": now.reason} if now.reason else {}),
                    },
                )
                said = now.reason
        await trio.sleep(check_seconds)


def _cannot(exc: BaseException) -> None:
    log.warning(
        "cannot lock the daemon's code in memory here",
        extra={"error": f"{type(exc).__name__}: {exc}"},
    )
