"""Public ids: a kind prefix and 20 base32 characters that sort by creation time."""

from __future__ import annotations

import os
import re
import threading

import pytest

from inboxd import ids


def test_ids_have_the_prefix_and_twenty_base32_characters() -> None:
    made = [ids.new_id("msg") for _ in range(10_000)]
    assert all(re.fullmatch(r"msg_[2-7a-z]{20}", i) for i in made)
    assert len(set(made)) == len(made)


def test_ids_sort_by_creation_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # 2026-11-23 and one microsecond, one second and a year later: the later id sorts after,
    # whatever the random part.
    base = 1_795_392_000_000_000_000
    made = []
    for later_ns in (0, 1_000, 1_000_000_000, 365 * 86_400 * 10**9):
        monkeypatch.setattr(ids.time, "time_ns", lambda ns=base + later_ns: ns)
        made.append(ids.new_id("evt"))
    assert made == sorted(made) and len(set(made)) == 4
    # Ids made in the same microsecond differ in their random part.
    assert len({ids.new_id("evt") for _ in range(100)}) == 100


def test_ids_made_in_one_microsecond_by_many_threads_never_repeat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The random parts come from a pool of OS randomness shared by threads: none repeats,
    also across refills of the pool. (A race on the pool's lock is too rare to provoke here;
    this shows the pool's bookkeeping, not the lock.)"""
    monkeypatch.setattr(ids.time, "time_ns", lambda: 1_795_392_000_000_000_000)
    made: list[list[str]] = [[] for _ in range(4)]

    def make(into: list[str]) -> None:
        for _ in range(3 * ids._POOL_IDS):
            into.append(ids.new_id("msg"))

    threads = [threading.Thread(target=make, args=(m,)) for m in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for m in made for i in m]
    assert len(every) == 12 * ids._POOL_IDS
    assert len(set(every)) == len(every)


def test_a_forked_child_draws_its_own_random_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ids.time, "time_ns", lambda: 1_795_392_000_000_000_000)
    ids.new_id("evt")  # the parent's pool holds unused random bytes now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the id it makes next, had it kept the pool, is the parent's next
        try:
            os.write(write, ids.new_id("evt").encode())
        finally:
            os._exit(0)  # never back into pytest
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 100).decode()
    os.close(read)
    assert re.fullmatch(r"evt_[2-7a-z]{20}", child)
    assert child != ids.new_id("evt")
