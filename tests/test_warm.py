"""store/warm.py: reading the store into the OS page cache at start-up, when it fits, and
keeping it there (a child holds it mapped)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio

from inboxd.store import warm
from inboxd.store.db import thread_disk_reads


def test_only_a_store_that_takes_at_most_half_the_available_memory_is_warmed() -> None:
    gib = 1 << 30
    assert warm.worth_warming(6 * gib, 12 * gib)
    assert not warm.worth_warming(6 * gib + 1, 12 * gib)
    assert not warm.worth_warming(1, None)  # no /proc/meminfo: leave the cache alone


def _files(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_cgroup_v2_limit_and_its_parents_bound_the_memory_for_warming(tmp_path: Path) -> None:
    gib = 1 << 30
    membership = tmp_path / "proc-self-cgroup"
    membership.write_text("0::/system.slice/inboxd.service\n")
    root = tmp_path / "cgroup"
    _files(
        root,
        {
            "cgroup.controllers": "cpu memory",
            "system.slice/inboxd.service/memory.max": f"{8 * gib}",
            "system.slice/inboxd.service/memory.high": "max",
            "system.slice/inboxd.service/memory.current": f"{1 * gib}",
        },
    )
    assert warm.cgroup_headroom(root, membership) == 7 * gib
    _files(
        root, {"system.slice/memory.max": f"{4 * gib}", "system.slice/memory.current": f"{3 * gib}"}
    )
    assert warm.cgroup_headroom(root, membership) == 1 * gib  # the parent has less room
    _files(root, {"system.slice/memory.stat": f"anon 1\ninactive_file {2 * gib}\nactive_file 5\n"})
    assert warm.cgroup_headroom(root, membership) == 3 * gib  # the parent's cold cache is room
    _files(root, {"system.slice/inboxd.service/memory.high": f"{1 * gib}"})
    assert warm.cgroup_headroom(root, membership) == 0  # at its high mark already


def test_a_cgroup_v1_limit_counts_and_an_unlimited_one_does_not(tmp_path: Path) -> None:
    gib = 1 << 30
    membership = tmp_path / "proc-self-cgroup"
    membership.write_text("5:cpu,cpuacct:/a/b\n4:memory:/a/b\n0::/\n")
    root = tmp_path / "cgroup"
    unlimited = "9223372036854771712"
    _files(
        root,
        {
            "memory/memory.limit_in_bytes": unlimited,
            "memory/memory.usage_in_bytes": f"{20 * gib}",
            "memory/a/b/memory.limit_in_bytes": unlimited,
            "memory/a/b/memory.usage_in_bytes": f"{1 * gib}",
        },
    )
    assert warm.cgroup_headroom(root, membership) is None  # no limit anywhere
    _files(
        root,
        {
            "memory/a/memory.limit_in_bytes": f"{2 * gib}",
            "memory/a/memory.usage_in_bytes": f"{gib // 2}",
        },
    )
    assert warm.cgroup_headroom(root, membership) == 3 * gib // 2
    _files(root, {"memory/a/memory.stat": f"cache 9\ntotal_inactive_file {gib // 4}\n"})
    assert warm.cgroup_headroom(root, membership) == 7 * gib // 4
    _files(root, {"memory/a/b/memory.limit_in_bytes": "garbage"})  # unreadable: skipped
    assert warm.cgroup_headroom(root, membership) == 7 * gib // 4
    assert warm.cgroup_headroom(root, tmp_path / "absent") is None


def cold_store(db: Path) -> None:
    """A database and a WAL of random bytes, on the disk only (as after a reboot)."""
    db.write_bytes(os.urandom(24 << 20))
    Path(f"{db}-wal").write_bytes(os.urandom(1 << 20))
    for path in warm.files_of(db):
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def _disk_reads_reading(db: Path, wal: bool = True) -> int:
    """Blocks read from the device while reading one page of every MB of the store's files
    (without ``wal``, of the database file only)."""
    before = thread_disk_reads()
    for path in warm.files_of(db) if wal else [db]:
        fd = os.open(path, os.O_RDONLY)
        try:
            for offset in range(0, path.stat().st_size, 1 << 20):
                os.pread(fd, 4096, offset)  # as random reads would
        finally:
            os.close(fd)
    return thread_disk_reads() - before


def mapped_ranges(pid: int, path: Path) -> list[tuple[int, int]]:
    """The byte ranges of ``path`` that process ``pid`` maps (from /proc/PID/maps)."""
    ranges = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(path):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            offset = int(fields[2], 16)
            ranges.append((offset, offset + end - start))
    return sorted(ranges)


async def test_warming_brings_a_cold_store_into_the_page_cache_and_keeps_it_mapped(
    tmp_path: Path,
) -> None:
    # The control: a cold store that is not warmed is read from the device (so this filesystem
    # counts such reads, and the assertion below can fail).
    control = tmp_path / "control" / "inboxd.db"
    control.parent.mkdir()
    cold_store(control)
    assert _disk_reads_reading(control) > 0
    db = tmp_path / "inboxd.db"
    cold_store(db)
    said: list[bool | None] = []  # where the store is, as the daemon's reads hear it
    async with trio.open_nursery() as nursery:
        keeper = await nursery.start(partial(warm.warm, db, in_memory=said.append))
        assert keeper is not None
        assert said == [False, True]  # reads left the loop until it was all in
        assert _disk_reads_reading(db) == 0  # all from memory
        # The keeper holds the whole database file mapped while the daemon runs.
        assert mapped_ranges(keeper, db) == [(0, 24 << 20)]
        stopping = time.monotonic()
        nursery.cancel_scope.cancel()  # the daemon stopping
    # The keeper let go when its stdin closed, well before the 2 s after which it is killed.
    assert time.monotonic() - stopping < 1
    assert not await trio.Path(f"/proc/{keeper}").exists()  # gone (and reaped) once it has stopped
    assert said == [False, True, None]  # nothing keeps the store now


@contextlib.contextmanager
def running_keeper(
    db: Path, max_maps: int, lock_budget: int = 0, says: bytes = b"in unlocked off\n"
) -> Iterator[subprocess.Popen[bytes]]:
    """A keeper of ``db`` looking every 0.05 s, once it has said ``says`` (its first state);
    on the way out, its stdin is closed (as when the daemon goes) and it must exit by itself."""
    keeper = subprocess.Popen(
        [sys.executable, "-c", warm._KEEPER, str(db), "", "0.05", str(max_maps), str(lock_budget)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert keeper.stdout is not None and keeper.stdout.readline() == says
        yield keeper
        assert keeper.stdin is not None
        keeper.stdin.close()
        assert keeper.wait(timeout=10) == 0
    finally:
        keeper.kill()
        keeper.wait()


def wait_until_mapped(
    keeper: subprocess.Popen[bytes], db: Path, ranges: list[tuple[int, int]]
) -> None:
    deadline = time.monotonic() + 10
    while mapped_ranges(keeper.pid, db) != ranges:
        assert keeper.poll() is None, "the keeper ended"
        assert time.monotonic() < deadline, mapped_ranges(keeper.pid, db)
        time.sleep(0.02)


def test_the_keeper_maps_what_the_file_grows_by_and_exits_when_the_daemon_goes(
    tmp_path: Path,
) -> None:
    db = tmp_path / "inboxd.db"
    db.write_bytes(os.urandom(3 << 20))
    with running_keeper(db, max_maps=2) as keeper:
        assert mapped_ranges(keeper.pid, db) == [(0, 3 << 20)]
        # SIGTERM and SIGINT reach the whole service when systemd stops it, or the process
        # group on Ctrl-C: the keeper stays until the daemon closes its stdin (below).
        keeper.send_signal(signal.SIGTERM)
        keeper.send_signal(signal.SIGINT)
        # The store grows by 2 MB and a bit (in one step: a write's size grows page by page,
        # and a look in the middle would see two growths).
        os.truncate(db, (5 << 20) + 4096)
        deadline = time.monotonic() + 10
        while mapped_ranges(keeper.pid, db)[-1][1] < (5 << 20) + 4096:
            assert time.monotonic() < deadline, mapped_ranges(keeper.pid, db)
            time.sleep(0.02)
        covered = mapped_ranges(keeper.pid, db)
        assert len(covered) == 2 and covered[0] == (0, 3 << 20)
        assert covered[1][0] <= covered[0][1] and covered[1][1] == (5 << 20) + 4096  # no gap
        # It grows again: two mappings are the most, so the whole file is mapped in one.
        os.truncate(db, (6 << 20) + 4096)
        wait_until_mapped(keeper, db, [(0, (6 << 20) + 4096)])
        # A VACUUM shrinks it: mapped again from the start, as it now is.
        os.truncate(db, 4 << 20)
        wait_until_mapped(keeper, db, [(0, 4 << 20)])


async def test_a_daemon_stopping_during_the_warm_up_kills_the_keeper_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the keeper maps the store in (seconds for a large one) it does not read its
    stdin; a daemon stopping then must not wait for it."""
    db = tmp_path / "inboxd.db"
    db.write_bytes(b"\0" * 4096)
    # A keeper that takes its time before saying it is warm, as a 6 GB store's would.
    monkeypatch.setattr(warm, "_KEEPER", "import time; time.sleep(30)")
    started = time.monotonic()
    with trio.move_on_after(0.5):  # the daemon stops half a second in
        await warm.warm(db)
    assert time.monotonic() - started < 1.5  # killed at once, not given the 2 s of a warm one


def test_a_keeper_survives_its_file_shrinking_and_going(tmp_path: Path) -> None:
    """Whatever happens to the file between two looks, the keeper keeps going (and maps the
    file again once it is back)."""
    db = tmp_path / "inboxd.db"
    db.write_bytes(os.urandom(1 << 20))
    with running_keeper(db, max_maps=32) as keeper:
        db.unlink()
        time.sleep(0.3)  # a few of its looks find no file
        assert keeper.poll() is None
        db.write_bytes(os.urandom(2 << 20))  # a new file at the same path
        wait_until_mapped(keeper, db, [(0, 2 << 20)])


def surely_may_lock(nbytes: int) -> bool:
    """Whether this process may lock ``nbytes`` in memory for sure: a memory-lock limit that
    large, or CAP_IPC_LOCK (bit 14 of the effective capabilities) in the initial user namespace
    (in another, the bit shows but mlock does not heed it)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY or soft >= nbytes:
        return True
    status = Path("/proc/self/status").read_text()
    capabilities = int(status.split("CapEff:")[1].split()[0], 16)
    initial = Path("/proc/self/uid_map").read_text().split() == ["0", "0", "4294967295"]
    return bool(capabilities & (1 << 14)) and initial


def locked_bytes(pid: int) -> int:
    """What process ``pid`` holds locked in memory (VmLck in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmLck:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmLck")


REFUSED = ("in unlocked ENOMEM", "in unlocked EPERM", "in unlocked EAGAIN")


def test_the_keeper_locks_the_store_in_memory_within_its_budget_when_it_may(
    tmp_path: Path,
) -> None:
    db = tmp_path / "inboxd.db"
    cold_store(db)  # 24 MB, on the disk only
    size = 24 << 20
    # Locking off: mapped (so read in) but not locked.
    with running_keeper(db, max_maps=32, lock_budget=0, says=b"in unlocked off\n") as keeper:
        assert locked_bytes(keeper.pid) == 0
    budget = size + (2 << 20)
    first = subprocess.run(  # (its stdin closed: it stops after its first look)
        [sys.executable, "-c", warm._KEEPER, str(db), "", "0.05", "32", str(budget)],
        input=b"",
        capture_output=True,
        check=True,
    ).stdout.decode()
    if first != "in locked\n":  # the system refuses: the keeper says why, mapped only
        assert first.rstrip("\n") in REFUSED
        assert not surely_may_lock(budget)
        return
    with running_keeper(db, 32, lock_budget=budget, says=b"in locked\n") as keeper:
        assert locked_bytes(keeper.pid) >= size
        # What the file grows by is locked too, while the budget lasts (grown in one step,
        # as above)...
        os.truncate(db, size + (1 << 20))
        deadline = time.monotonic() + 10
        while locked_bytes(keeper.pid) < size + (1 << 20):
            assert time.monotonic() < deadline, locked_bytes(keeper.pid)
            time.sleep(0.02)
        # ...and past it, only as far as it goes: the rest is mapped (read in, and checked
        # at each look). It says so.
        os.truncate(db, size + (3 << 20))
        assert keeper.stdout is not None
        assert keeper.stdout.readline() == b"in unlocked budget\n"
        deadline = time.monotonic() + 10
        while mapped_ranges(keeper.pid, db)[-1][1] < size + (3 << 20):
            assert time.monotonic() < deadline, mapped_ranges(keeper.pid, db)
            time.sleep(0.02)
        assert size + (1 << 20) <= locked_bytes(keeper.pid) <= budget


def _evict(keeper: warm.Keeper, db: Path) -> None:
    """Take the file's unlocked pages out of memory under the keeper's feet: unmap them from
    its mappings (they stay mapped, the pages are just dropped from them) and drop the clean
    pages no process maps, as the kernel's reclaim would. Locked pages stay (mapped)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for m in keeper.maps:
        address, length = m.unlocked()
        if length > 0:
            assert libc.madvise(address, length, mmap.MADV_DONTNEED) == 0
    fd = os.open(db, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_a_keeper_that_may_not_lock_finds_pages_gone_and_reads_them_back(tmp_path: Path) -> None:
    """Without the lock, the kernel may reclaim the store's pages; each look checks with
    mincore, says ``out`` (the daemon's reads leave the loop) and reads them back in."""
    db = tmp_path / "inboxd.db"
    cold_store(db)
    said: list[str] = []
    keeper = warm.Keeper(db, lock_budget=0)
    try:
        before = thread_disk_reads()
        assert keeper.look(said.append)
        assert thread_disk_reads() > before  # it read the store in from the disk
        assert said == ["in unlocked off"]
        keeper.look(said.append)
        assert said == ["in unlocked off"]  # nothing changed: nothing said
        _evict(keeper, db)
        assert _disk_reads_reading(db, wal=False) > 0  # gone from memory (this brought some in)
        _evict(keeper, db)
        before = thread_disk_reads()
        assert keeper.look(said.append)
        assert said == ["in unlocked off", "out", "in unlocked off"]
        assert thread_disk_reads() > before  # read back in
        assert _disk_reads_reading(db, wal=False) == 0
    finally:
        keeper.close()


def populate_read_works() -> bool:
    """Whether this kernel reads a mapping's pages in on madvise(MADV_POPULATE_READ) (5.14)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    with mmap.mmap(-1, mmap.PAGESIZE) as m:
        address = ctypes.addressof(ctypes.c_char.from_buffer(m))
        return bool(libc.madvise(address, mmap.PAGESIZE, warm._MADV_POPULATE_READ) == 0)


def test_a_keeper_locks_what_its_budget_allows_and_reads_back_only_the_rest(
    tmp_path: Path,
) -> None:
    """A store larger than the lock budget: its first part is locked, the rest checked; pages
    of the rest that leave are read back without letting go of the lock."""
    db = tmp_path / "inboxd.db"
    cold_store(db)  # 24 MB
    budget = 4 << 20
    said: list[str] = []
    keeper = warm.Keeper(db, lock_budget=budget)
    try:
        assert keeper.look(said.append)
        [m] = keeper.maps
        if m.locked:
            assert said == ["in unlocked budget"] and m.locked == budget
            assert locked_bytes(os.getpid()) >= budget
        else:  # a memory-lock limit under 4 MB
            assert said[0] in REFUSED and not surely_may_lock(budget)
        _evict(keeper, db)
        assert _disk_reads_reading(db, wal=False) > 0
        _evict(keeper, db)
        assert keeper.look(said.append)
        assert said == [said[0], "out", said[0]]
        if populate_read_works():  # read back where it was mapped, the lock left alone
            assert keeper.maps == [m]
        else:  # (before Linux 5.14: mapped again, and locked again as far as before)
            assert len(keeper.maps) == 1 and keeper.maps[0].locked == m.locked
            m = keeper.maps[0]
        assert _disk_reads_reading(db, wal=False) == 0
        if m.locked:
            assert m.locked == budget and locked_bytes(os.getpid()) >= budget  # still locked
    finally:
        keeper.close()


def test_mapping_the_whole_file_again_locks_it_again(tmp_path: Path) -> None:
    """Past ``max_maps`` growths the keeper maps the whole file again in one, and locks that,
    saying nothing new: the store stays locked."""
    db = tmp_path / "inboxd.db"
    db.write_bytes(os.urandom(1 << 20))
    said: list[str] = []
    keeper = warm.Keeper(db, lock_budget=8 << 20, max_maps=1)
    try:
        keeper.look(said.append)
        if said != ["in locked"]:  # a memory-lock limit under 1 MB
            assert said[0] in REFUSED and not surely_may_lock(1 << 20)
            return
        os.truncate(db, 2 << 20)
        keeper.look(said.append)
        [m] = keeper.maps
        assert (m.length, m.locked) == (2 << 20, 2 << 20)
        assert said == ["in locked"] and locked_bytes(os.getpid()) >= 2 << 20
    finally:
        keeper.close()


def test_what_could_not_be_locked_is_locked_at_a_later_look_once_it_may(tmp_path: Path) -> None:
    """A lock refused (the budget then, or a passing ENOMEM) is tried again at each look."""
    db = tmp_path / "inboxd.db"
    db.write_bytes(os.urandom(1 << 20))
    said: list[str] = []
    keeper = warm.Keeper(db, lock_budget=256 << 10)
    try:
        keeper.look(said.append)
        if said != ["in unlocked budget"]:  # a memory-lock limit under 256 KB
            assert said[0] in REFUSED and not surely_may_lock(256 << 10)
            return
        assert keeper.maps[0].locked == 256 << 10
        keeper.lock_budget = 8 << 20  # (as a passing failure would clear)
        keeper.look(said.append)
        assert said == ["in unlocked budget", "in locked"] and keeper.maps[0].locked == 1 << 20
    finally:
        keeper.close()


def test_a_keeper_that_cannot_map_the_store_says_so_and_gives_up(tmp_path: Path) -> None:
    """Nothing mapped is not "in"; and a store that cannot be brought in, look after look, is
    given up (the daemon then reads as for a store not kept) rather than waited for."""
    said: list[str] = []
    keeper = warm.Keeper(tmp_path / "gone.db", lock_budget=1 << 30)
    for _ in range(warm.GIVE_UP_LOOKS - 1):
        assert keeper.look(said.append)
    assert said == ["out"]
    assert not keeper.look(said.append)
    assert said == ["out", "lost"]


async def test_the_daemon_hears_where_the_store_is_as_the_keeper_says_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "inboxd.db"
    db.write_bytes(b"\0" * 4096)
    said = ["out", "in locked", "out", "in unlocked budget", "out", "lost"]
    monkeypatch.setattr(
        warm,
        "_KEEPER",
        f"import sys, time\nfor line in {said!r}:\n    print(line, flush=True); time.sleep(0.05)",
    )
    heard: list[bool | None] = []
    caplog.set_level(logging.INFO, logger="inboxd.store")
    with trio.fail_after(10):
        await warm.warm(db, in_memory=heard.append)  # returns when the keeper ends
    assert heard == [False, True, False, True, False, None, None]
    logged = [r.getMessage() for r in caplog.records if r.name == "inboxd.store"]
    # Started once it is first all in; the first "out" after that is logged, and its "in
    # again"; that "in" is not all locked, which is logged too; the second "out" falls within
    # the minute, so it is not; then the keeper gives up, and ends.
    assert logged == [
        "read the store into the page cache; keeping it there",
        "part of the store left the page cache: reads leave the trio thread until the keeper"
        " has read it back",
        "the store is all in the page cache again",
        "the store is in the page cache, not all locked there",
        "the keeper could not keep the store in the page cache (memory is short, or the file"
        " cannot be mapped): reads run on the trio thread again, bounded (store/db.py)",
        "the store is no longer kept in the page cache",
    ]


async def test_a_keeper_that_says_what_the_daemon_does_not_know_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keeper of another version (mid-upgrade) waits for its stdin to close: the daemon
    must not wait for it to end by itself, nor read the store as if it were kept."""
    db = tmp_path / "inboxd.db"
    db.write_bytes(b"\0" * 4096)
    monkeypatch.setattr(
        warm, "_KEEPER", "import sys, time\nprint('warm', flush=True); sys.stdin.read()"
    )
    heard: list[bool | None] = []
    with trio.fail_after(5):
        assert await warm.warm(db, in_memory=heard.append) is None
    assert heard == [False, None]
