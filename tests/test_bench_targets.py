"""``bench http``'s verdict on the issue's targets: which figure is held to which target, and
that "met" is strict and unrounded (BENCHMARKS.md, "Against the issue's targets")."""

from __future__ import annotations

from bench.http import share_target, verdicts


def _row(rps: float, p99_ms: float) -> dict[str, float]:
    return {"rps": rps, "p50_ms": p99_ms / 2, "p99_ms": p99_ms, "non_2xx": 0.0}


def test_each_row_is_held_to_its_target() -> None:
    assert share_target("list page, tab=unassigned") == 0.60
    assert share_target("read one") == 0.85
    assert share_target("counts") == 0.85
    assert share_target("write: assignee") == 0.70
    assert share_target("search (largest channel)") is None
    assert share_target("history page (50)") is None


def test_verdicts_are_strict_and_unrounded() -> None:
    results = {
        "read one": _row(849.9, 49.9),  # 84.99 % of the ceiling: missed
        "counts": _row(850.0, 50.0),  # exactly 85 %: met; a p99 of exactly 50 ms: missed
        "write: title": _row(700.0, 12.0),
        "history page (50)": _row(100.0, 900.0),  # no target: no verdict
    }
    ceilings = {name: {"rps": 1000.0} for name in results}
    search = {"largest": {"p99_ms": 49.99}, "smallest": {"p99_ms": 50.01}}
    got = {v["figure"]: v["met"] for v in verdicts(results, ceilings, 1.99, search)}
    assert got == {
        "start-up until /readyz": True,
        "read one: share of the ceiling": False,
        "read one: p99": True,
        "counts: share of the ceiling": True,
        "counts: p99": False,
        "write: title: share of the ceiling": True,
        "write: title: p99": True,
        "search p99, largest channel": True,
        "search p99, smallest channel": False,
    }
    assert not verdicts({}, {}, 2.0, {})[0]["met"]  # start-up of exactly 2 s misses "< 2 s"
