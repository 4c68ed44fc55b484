"""The daemon's own code, locked in memory (inboxd/resident.py)."""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import re
from pathlib import Path

import pytest
import trio
import trio.testing

from inboxd import resident
from inboxd.resident import CodeLock, Locked, private_file_mappings

MAPS = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:00 1001                       /usr/bin/python3.11
55d0c0a01000-55d0c0a02000 r-xp 00001000 fd:00 1001                       /usr/bin/python3.11
55d0c1000000-55d0c1200000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000021000 rw-p 00000000 00:00 0
7f0000100000-7f0000108000 rw-s 00000000 fd:00 2002                       /srv/inboxd/inboxd.db-shm
7f0000200000-7f0000210000 r--p 00000000 fd:00 3003                       /opt/lib/orjson.so
7f0000210000-7f0000250000 r-xp 00010000 fd:00 3003                       /opt/lib/orjson.so
7f0000250000-7f0000260000 ---p 00050000 fd:00 3003                       /opt/lib/orjson.so
7f0000260000-7f0000262000 rw-p 00050000 fd:00 3003                       /opt/lib/orjson.so
7f0000300000-7f0000301000 r-xp 00000000 fd:00 4004                       /opt/my lib/x.so (deleted)
7f0000400000-7f0000a00000 r--p 00000000 fd:00 6006                       /usr/lib/locale/locale-archive
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
7ffd00100000-7ffd00102000 r-xp 00000000 00:00 0                          [vdso]
"""


def test_the_mappings_locked_are_those_of_the_executable_and_its_libraries() -> None:
    """Code, read-only and initialised data of the executable and its libraries (also of a
    library replaced on disk since, and a path with a space); not the heap, the stack or the
    kernel's, not a shared mapping (the store's -shm), not a guard region with no access, not
    a data file mapped privately (no mapping of it runs)."""
    got = private_file_mappings(MAPS)
    assert [(m.start, m.length, m.path) for m in got] == [
        (0x55D0C0A00000, 0x1000, "/usr/bin/python3.11"),
        (0x55D0C0A01000, 0x1000, "/usr/bin/python3.11"),
        (0x7F0000200000, 0x10000, "/opt/lib/orjson.so"),
        (0x7F0000210000, 0x40000, "/opt/lib/orjson.so"),
        (0x7F0000260000, 0x2000, "/opt/lib/orjson.so"),
        (0x7F0000300000, 0x1000, "/opt/my lib/x.so (deleted)"),
    ]


class FakeMlock:
    """mlock(2) that refuses (ENOMEM, as past RLIMIT_MEMLOCK) once ``limit`` bytes are locked."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.calls: list[tuple[int, int]] = []
        self.locked = 0

    def __call__(self, address: int, length: int) -> int:
        self.calls.append((address, length))
        if self.locked + length > self.limit:
            ctypes.set_errno(errno.ENOMEM)
            return -1
        self.locked += length
        return 0


def test_a_look_locks_what_fits_says_why_not_the_rest_and_tries_it_again() -> None:
    maps = [MAPS]
    mlock = FakeMlock(limit=0x12000)
    lock = CodeLock(read_maps=lambda: maps[0], mlock=mlock)
    total = sum(m.length for m in private_file_mappings(MAPS))  # 0x55000

    # The first two fit (0x2000), the third (0x10000) fits, the fourth (0x40000) does not, nor
    # then the last two: the look tries each, and says why some were not locked.
    assert lock.look() == Locked(locked=0x12000, not_locked=total - 0x12000, reason="ENOMEM")
    assert len(mlock.calls) == 6

    # The limit raised: the next look locks the rest, and only the rest.
    mlock.limit = 1 << 30
    del mlock.calls[:]
    assert lock.look() == Locked(locked=total, not_locked=0)
    assert [length for _, length in mlock.calls] == [0x40000, 0x2000, 0x1000]

    # Nothing new: nothing locked again.
    del mlock.calls[:]
    assert lock.look() == Locked(locked=total, not_locked=0)
    assert mlock.calls == []

    # A library loaded since is locked at the next look; one unmapped since is forgotten (its
    # lock went with its mapping).
    loaded = "7f0000b00000-7f0000b04000 r-xp 00000000 fd:00 5005    /opt/lib/_ssl.so\n"
    maps[0] = MAPS.replace(
        "7f0000300000-7f0000301000 r-xp 00000000 fd:00 4004                       /opt/my lib/x.so"
        " (deleted)\n",
        loaded,
    )
    assert lock.look() == Locked(locked=total - 0x1000 + 0x4000, not_locked=0)
    assert mlock.calls == [(0x7F0000B00000, 0x4000)]


def test_the_budget_bounds_what_is_locked() -> None:
    """A mapping past what is left of the budget is left to the kernel, and the look says
    so."""
    mlock = FakeMlock(limit=1 << 30)
    lock = CodeLock(read_maps=lambda: MAPS, mlock=mlock, budget=0x13000)
    total = sum(m.length for m in private_file_mappings(MAPS))
    # 0x1000 + 0x1000 + 0x10000; not 0x40000 nor then 0x2000; 0x1000 still fits.
    assert lock.look() == Locked(locked=0x13000, not_locked=total - 0x13000, reason="budget")
    assert [length for _, length in mlock.calls] == [0x1000, 0x1000, 0x10000, 0x1000]


def test_a_look_refused_outright_stops_there() -> None:
    """EPERM (no memory-lock allowance at all): the rest would be refused too."""

    def refused(address: int, length: int) -> int:
        calls.append(length)
        ctypes.set_errno(errno.EPERM)
        return -1

    calls: list[int] = []
    total = sum(m.length for m in private_file_mappings(MAPS))
    assert CodeLock(read_maps=lambda: MAPS, mlock=refused).look() == Locked(0, total, "EPERM")
    assert calls == [0x1000]


def _locked_paths() -> set[str]:
    """The files of this process's mappings that the kernel has locked (VmFlags ``lo``)."""
    locked, path = set(), ""
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                fields = line.split(maxsplit=5)
                path = fields[5].strip() if len(fields) > 5 else ""
            elif line.startswith("VmFlags:") and " lo" in line and path.startswith("/"):
                locked.add(path)
    return locked


def test_this_process_s_code_is_locked_in_memory_or_the_look_says_why_not() -> None:
    """For real: the test process's own interpreter and libraries (SQLite's among them, which
    inboxd's store loads), as the daemon's task locks its own."""
    import sqlite3  # noqa: F401 (its extension module must be loaded: it is, through inboxd)

    libc = ctypes.CDLL(None, use_errno=True)
    libc.munlockall()  # (what a daemon run in this process earlier may have locked)
    mappings = private_file_mappings(Path("/proc/self/maps").read_text())
    sqlite_lib = next(m.path for m in mappings if "_sqlite3" in m.path)
    assert sqlite_lib not in _locked_paths()
    try:
        state = CodeLock().look()
        if state.reason:  # no permission to lock it all here (RLIMIT_MEMLOCK, no CAP_IPC_LOCK)
            assert state.reason == "budget" or state.reason in errno.errorcode.values()
            assert state.not_locked > 0
        else:
            assert state.not_locked == 0 and state.locked > 0
            locked = _locked_paths()
            assert sqlite_lib in locked
            assert {m.path for m in mappings} <= locked
    finally:
        libc.munlockall()  # (the test process as it was)
    assert sqlite_lib not in _locked_paths()


async def _run_task_until(
    done: trio.Event, monkeypatch: pytest.MonkeyPatch, lock_class: type
) -> None:
    """Run the daemon's task with looks from ``lock_class``, looking every 60 s, until
    ``done``."""
    monkeypatch.setattr(resident, "CodeLock", lock_class)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(resident.keep_code_in_memory, 60.0)
        await done.wait()
        nursery.cancel_scope.cancel()


async def test_the_task_logs_the_first_look_and_each_change_of_reason(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
) -> None:
    states = [
        Locked(locked=8 << 20, not_locked=12 << 20, reason="ENOMEM"),
        Locked(locked=8 << 20, not_locked=12 << 20, reason="ENOMEM"),
        Locked(locked=20 << 20, not_locked=0),
        Locked(locked=21 << 20, not_locked=0),
        Locked(locked=256 << 20, not_locked=1 << 20, reason="budget"),
    ]
    looks: list[float] = []  # when each look ran
    all_looked = trio.Event()

    class Scripted:  # (each look runs in a worker thread, as the real one)
        def look(self) -> Locked:
            looks.append(autojump_clock.current_time())
            if len(looks) > len(states):  # (the last state was logged: the task went on)
                trio.from_thread.run_sync(all_looked.set)
            return states[min(len(looks), len(states)) - 1]

    caplog.set_level(logging.INFO, logger="inboxd.daemon")
    await _run_task_until(all_looked, monkeypatch, Scripted)
    assert [b - a for a, b in itertools.pairwise(looks)] == [60.0] * len(states)
    logged = [(r.levelname, r.getMessage(), r.__dict__.get("not_locked")) for r in caplog.records]
    assert logged == [
        (
            "INFO",
            "locked the daemon's code in memory, not all of it: the kernel may page the rest"
            " out, and a request that needs it then waits for the disk (it needs a memory-lock"
            " limit as large, LimitMEMLOCK=infinity in inboxd.service, or CAP_IPC_LOCK)",
            "ENOMEM",
        ),
        ("INFO", "locked the daemon's code in memory", None),
        # (inboxd's own bound, not the system's limit: no advice about the limit)
        (
            "INFO",
            "locked the daemon's code in memory, not all of it: the kernel may page the rest"
            " out, and a request that needs it then waits for the disk",
            "budget",
        ),
    ]
    assert caplog.records[0].__dict__["locked_bytes"] == 8 << 20
    assert caplog.records[1].__dict__["not_locked_bytes"] == 0


async def test_where_there_is_nothing_to_look_at_the_task_says_so_once_and_ends(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_proc() -> str:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/proc/self/maps")

    monkeypatch.setattr(resident, "_read_maps", no_proc)
    with trio.fail_after(5):
        await resident.keep_code_in_memory()
    assert [r.getMessage() for r in caplog.records] == [
        "cannot lock the daemon's code in memory here"
    ]
    assert "FileNotFoundError" in caplog.records[0].__dict__["error"]


async def test_a_later_look_that_fails_is_logged_and_the_next_one_made(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
) -> None:
    looks = 0
    third = trio.Event()

    class Flaky:
        def look(self) -> Locked:
            nonlocal looks
            looks += 1
            if looks == 2:
                raise OSError(errno.EMFILE, "Too many open files")
            if looks == 3:
                trio.from_thread.run_sync(third.set)
            return Locked(locked=20 << 20, not_locked=0)

    caplog.set_level(logging.INFO, logger="inboxd.daemon")
    await _run_task_until(third, monkeypatch, Flaky)
    assert [r.getMessage() for r in caplog.records] == [
        "locked the daemon's code in memory",
        "could not look at the daemon's code to lock it in memory; trying again later",
    ]
