"""store/warm.py: reading the store into the OS page cache at start-up, when it fits."""

from __future__ import annotations

import os
from pathlib import Path

from inboxd.store import warm
from inboxd.store.db import thread_disk_reads


def test_only_a_store_that_takes_at_most_half_the_available_memory_is_warmed() -> None:
    gib = 1 << 30
    assert warm.worth_warming(6 * gib, 12 * gib)
    assert not warm.worth_warming(6 * gib + 1, 12 * gib)
    assert not warm.worth_warming(1, None)  # no /proc/meminfo: leave the cache alone


def cold_store(db: Path) -> None:
    """A database and a WAL of random bytes, on the disk only (as after a reboot)."""
    db.write_bytes(os.urandom(24 << 20))
    Path(f"{db}-wal").write_bytes(os.urandom(1 << 20))
    for path in warm.files_of(db):
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


async def test_warming_brings_a_cold_store_into_the_page_cache(tmp_path: Path) -> None:
    db = tmp_path / "inboxd.db"
    cold_store(db)
    await warm.warm(db)
    before = thread_disk_reads()
    for path in warm.files_of(db):
        fd = os.open(path, os.O_RDONLY)
        try:
            for offset in range(0, path.stat().st_size, 1 << 20):
                os.pread(fd, 4096, offset)  # one page of every MB, as random reads would
        finally:
            os.close(fd)
    assert thread_disk_reads() == before  # all from memory
