"""Public ids: a kind prefix and 20 base32 characters that sort by creation time."""

from __future__ import annotations

import re

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
