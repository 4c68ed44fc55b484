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

Only when the store takes at most ``MAX_SHARE_OF_AVAILABLE`` of the memory the OS reports
available, so that warming never pushes out what the machine needs more. In a container or a
systemd unit with ``MemoryMax=``/``MemoryHigh=``, the page cache the reader fills is charged to
the daemon's own memory cgroup, so what counts there is the lesser of that and the room left
below the cgroup's limits (and its parents'): v2 ``memory.high``/``memory.max`` against
``memory.current``, v1 ``memory.limit_in_bytes`` against ``memory.usage_in_bytes``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

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


# The child's program. Not niced: inboxd.service filters out setpriority (@resources), and with
# so little CPU to spend there is nothing to yield.
_READER: Final = (
    "import sys; from inboxd.store.warm import read_through; read_through(sys.argv[1:])"
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


def worth_warming(size: int, available: int | None) -> bool:
    return available is not None and size <= available * MAX_SHARE_OF_AVAILABLE


async def warm(db: Path) -> None:
    """Have the store's files read into the page cache, if they fit (see above). Cancelled
    (the daemon stopping), the reader is killed."""
    try:
        files = files_of(db)
        size = sum(p.stat().st_size for p in files)
    except OSError as exc:  # a WAL checkpointed away between the two looks, say
        log.warning("could not warm the page cache", extra={"error": str(exc)})
        return
    available = memory_for_warming()
    if not worth_warming(size, available):
        log.info(
            "not warming the page cache: the store is too large for the memory available",
            extra={"store_bytes": size, "available_bytes": available},
        )
        return
    started = time.monotonic()
    try:
        await trio.run_process(
            [sys.executable, "-c", _READER, *map(str, files)],
            stdin=subprocess.DEVNULL,
            capture_stdout=True,
            capture_stderr=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:  # a cold cache is not an error
        log.warning("could not warm the page cache", extra={"error": str(exc)})
        return
    log.info(
        "read the store into the page cache",
        extra={"store_bytes": size, "seconds": round(time.monotonic() - started, 2)},
    )
