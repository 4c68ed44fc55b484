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
available, so that warming never pushes out what the machine needs more.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

import trio

log = logging.getLogger("inboxd.store")

MAX_SHARE_OF_AVAILABLE: Final = 0.5
# The child: send each file to /dev/null, which reads it into the page cache without copying it
# to the process (2 GB: 0.7 s and 0.08 s of CPU here, against 1.4 s and ~1 s of CPU for reading
# it into a buffer). Not niced: inboxd.service filters out setpriority (@resources), and with
# so little CPU to spend there is nothing to yield.
_READER: Final = """
import os, sys
null = os.open(os.devnull, os.O_WRONLY)
for path in sys.argv[1:]:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # a WAL checkpointed away meanwhile
        continue
    offset = 0
    while sent := os.sendfile(null, fd, offset, 8 << 20):
        offset += sent
"""


def available_memory() -> int | None:
    """``MemAvailable`` from /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


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
    available = available_memory()
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
