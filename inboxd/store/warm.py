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
``REMAP_SECONDS``. A page that some process maps is in use, not idle cache: some virtual
machines page out file pages that no process maps and nobody touched for a minute (a DAMON
``pageout`` scheme, this one's too), which left the store cold a minute after the load moved on,
and requests waiting for the disk (BENCHMARKS.md, The machine). Mapped pages are still ordinary
page cache: the kernel reclaims them under memory pressure like any other (and a store that
grows past the memory rule below while kept stays mapped, for that reason). The WAL is read
through, not kept: it is written all the time.

Only when the store takes at most ``MAX_SHARE_OF_AVAILABLE`` of the memory the OS reports
available, so that warming never pushes out what the machine needs more. In a container or a
systemd unit with ``MemoryMax=``/``MemoryHigh=``, the page cache the reader fills is charged to
the daemon's own memory cgroup, so what counts there is the lesser of that and the room left
below the cgroup's limits (and its parents'): v2 ``memory.high``/``memory.max`` against
``memory.current``, v1 ``memory.limit_in_bytes`` against ``memory.usage_in_bytes``.
"""

from __future__ import annotations

import logging
import mmap
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import trio

log = logging.getLogger("inboxd.store")

MAX_SHARE_OF_AVAILABLE: Final = 0.5
# How often the keeper maps what the database file has grown by since; past this many mappings
# it maps the whole file again in one (a process may hold only so many, vm.max_map_count).
REMAP_SECONDS: Final = 60.0
MAX_MAPS: Final = 32


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


def keep(
    db: Path, wal: Path | None = None, every: float = REMAP_SECONDS, max_maps: int = MAX_MAPS
) -> None:
    """The keeper child's work: read the WAL through, map the database file read-only (which
    reads it in), say ``warm`` on stdout, then hold the mappings until stdin closes (the daemon
    stopped, or died), mapping what the file grew by every ``every`` seconds (past ``max_maps``
    mappings, the whole file again in one). It opens and closes the files: never call it in the
    daemon's own process (see above)."""
    if wal is not None:
        read_through([wal])
    maps: list[mmap.mmap] = []
    mapped = 0
    mapped_file = (0, 0)  # (st_dev, st_ino) of the file the mappings are of

    def map_to_end() -> None:
        """Map what is not mapped yet; on any failure (the file gone, or shrunk between two
        looks), leave things as they are and try again next time."""
        nonlocal mapped, mapped_file
        try:
            fd = os.open(db, os.O_RDONLY)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            size, file = st.st_size, (st.st_dev, st.st_ino)
            if size == mapped and file == mapped_file:
                return
            # Grown: map the new part. Shrunk (a VACUUM), another file at the path (a restore),
            # or too many mappings: the whole file, before letting the old mappings go.
            whole = size < mapped or file != mapped_file or len(maps) >= max_maps
            start = 0 if whole else mapped - mapped % mmap.ALLOCATIONGRANULARITY
            new = mmap.mmap(
                fd,
                size - start,
                flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                prot=mmap.PROT_READ,
                offset=start,
            )
        except (OSError, ValueError):  # ValueError: it shrank since fstat
            return
        finally:
            os.close(fd)
        if whole:
            for m in maps:
                m.close()
            maps.clear()
        maps.append(new)
        mapped, mapped_file = size, file

    # If memory runs out, the kernel reclaims these clean pages first; should it still have to
    # kill a process, let it be this one rather than the daemon (inboxd.service has
    # OOMPolicy=continue, so that does not stop the service).
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:
        pass
    map_to_end()
    sys.stdout.write("warm\n")
    sys.stdout.flush()
    stdin = sys.stdin.fileno()
    while True:
        readable, _, _ = select.select([stdin], [], [], every)
        if readable and not os.read(stdin, 4096):
            return  # the daemon closed its end (or died)
        map_to_end()


# The child's program. Not niced: inboxd.service filters out setpriority (@resources), and with
# so little CPU to spend there is nothing to yield.
_KEEPER: Final = (
    "import sys; from pathlib import Path; from inboxd.store.warm import keep;"
    " keep(Path(sys.argv[1]), Path(sys.argv[2]) if sys.argv[2] else None, float(sys.argv[3]),"
    " int(sys.argv[4]))"
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


async def warm(
    db: Path, *, task_status: trio.TaskStatus[int | None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Have the store's files read into the page cache and kept there, if they fit (see
    above): started once they are in (with the keeper's pid; None when it is not kept), then
    holds them until cancelled (the daemon stopping), when the keeper is stopped."""
    try:
        files = files_of(db)
        size = sum(p.stat().st_size for p in files)
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
    wal = Path(f"{db}-wal")
    started = time.monotonic()
    try:
        keeper = await trio.lowlevel.open_process(
            [
                *(sys.executable, "-c", _KEEPER, str(db)),
                *(str(wal) if wal in files else "", str(REMAP_SECONDS), str(MAX_MAPS)),
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
    warmed = False
    try:
        said = b""
        while not said.endswith(b"\n") and (chunk := await keeper.stdout.receive_some()):
            said += chunk
        if said != b"warm\n":
            log.warning(
                "could not warm the page cache",
                extra={"error": f"the keeper stopped (exit status {await keeper.wait()})"},
            )
            task_status.started(None)
            return
        warmed = True
        log.info(
            "read the store into the page cache; keeping it there",
            extra={"store_bytes": size, "seconds": round(time.monotonic() - started, 2)},
        )
        task_status.started(keeper.pid)
        status = await keeper.wait()  # until the daemon stops: it never ends on its own
        log.warning(
            "the store is no longer kept in the page cache",
            extra={"error": f"the keeper stopped (exit status {status})"},
        )
    finally:
        with trio.CancelScope(shield=True):
            if warmed:  # it waits for its stdin to close; while mapping, it does not look
                await keeper.stdin.aclose()
                with trio.move_on_after(5):
                    await keeper.wait()
            if keeper.returncode is None:
                keeper.kill()
                await keeper.wait()
            await keeper.stdin.aclose()
            await keeper.stdout.aclose()
