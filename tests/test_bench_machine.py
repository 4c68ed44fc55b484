"""``bench machine``: how slow stretches of the machine are told from the work's own size, and the
bare app's record of its scheduler's passes (BENCHMARKS.md, The machine)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from bench.feed import free_port, start, wait_http
from bench.machine import PASSES_ENV, covered, idle_probe, slow_passes, slow_stretches


def test_slow_chunks_are_those_over_five_times_the_median() -> None:
    usual = [(i * 1e-3, 100e-6) for i in range(100)]  # 10 ms of 100 us chunks
    slow = [(1.0 + i, 1e-3) for i in range(5)]  # 10x the median
    almost = [(1.5 + i, 450e-6) for i in range(5)]  # 4.5x: not slow
    # in order of time: an almost slow chunk after each slow one
    figures = slow_stretches(usual + sorted(slow + almost))
    assert figures["samples"] == 110
    assert figures["median_us"] == pytest.approx(100.0)
    assert figures["slow_count"] == 5
    assert figures["slow_share"] == pytest.approx(5e-3 / (10e-3 + 5e-3 + 2.25e-3))
    assert figures["longest_ms"] == pytest.approx(1.0)
    assert figures["stretches"] == 5  # each slow chunk stands alone here
    assert figures["longest_stretch_ms"] == pytest.approx(1.0)
    assert slow_stretches([])["slow_share"] == 0.0


def test_slow_chunks_one_after_the_other_make_one_stretch() -> None:
    t, samples = 0.0, []
    for duration in [100e-6] * 50 + [1.5e-3] * 12 + [100e-6] * 50 + [2e-3] * 3 + [100e-6] * 50:
        samples.append((t, duration))
        t += duration
    figures = slow_stretches(samples)
    assert figures["stretches"] == 2
    assert figures["longest_stretch_ms"] == pytest.approx(18.0)
    assert figures["slow_count"] == 15
    assert figures["longest_ms"] == pytest.approx(2.0)


def test_slow_time_shared_by_two_cpus_is_measured_by_overlap() -> None:
    base = [(i * 1e-4, 1e-4) for i in range(100)]
    # CPU a: slow from 1.000 to 1.010; CPU b: slow from 1.004 to 1.020, then 2.0 to 2.01.
    a = [*base, (1.000, 0.010)]
    b = [*base, (1.004, 0.016), (2.0, 0.01)]
    assert covered(a, b) == pytest.approx(0.6)  # 6 of a's 10 ms within b's
    assert covered(b, a) == pytest.approx(6 / 26)
    assert covered(base, b) is None  # nothing slow on the first: no share to give
    assert covered([], b) is None


def test_a_pass_is_slow_when_its_steps_ran_slower_not_when_it_had_more() -> None:
    usual = [[0.002, 64, 30e-6]] * 100
    slow = [[0.030, 64, 450e-6]] * 3
    more_work = [[0.020, 640, 30e-6]]  # long, but its steps took the usual time
    one_long_step = [[0.015, 64, 31e-6]]  # (its median step is the usual one)
    figures = slow_passes(usual + slow + more_work + one_long_step)
    assert figures["passes"] == 105
    assert figures["usual_step_us"] == pytest.approx(30.0)
    assert figures["slow_passes"] == 3
    assert figures["slow_share"] == pytest.approx(0.090 / (0.200 + 0.090 + 0.020 + 0.015))
    assert figures["longest_slow_ms"] == pytest.approx(30.0)
    assert figures["longest_pass_ms"] == pytest.approx(30.0)
    assert figures["slow_steps_a_pass"] == 64
    # With nothing recorded (no request served), every figure the table shows is still there.
    assert slow_passes([]) == {
        "passes": 0,
        "usual_step_us": 0.0,
        "median_steps_a_pass": 0,
        "slow_passes": 0,
        "slow_share": 0.0,
        "longest_slow_ms": 0.0,
        "slow_steps_a_pass": 0,
        "longest_pass_ms": 0.0,
    }


def test_the_idle_probe_covers_every_cpu_it_may_run_on() -> None:
    figures = idle_probe(0.2)
    cpus = sorted(os.sched_getaffinity(0))
    assert sorted(int(c) for c in figures["cpus"]) == cpus
    for c in figures["cpus"].values():
        assert c["samples"] > 100  # about 100 us a chunk
        assert 0.0 <= c["slow_share"] < 1.0
    assert figures["slow_share"] == max(c["slow_share"] for c in figures["cpus"].values())


def test_the_bare_app_writes_its_passes_on_sigusr1(tmp_path: Path) -> None:
    dump = tmp_path / "passes.json"
    port = free_port()
    bare = start(["-m", "bench.bare", str(port)], {PASSES_ENV: str(dump)})
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", process=bare)
        with httpx.Client() as client:
            for _ in range(20):
                assert client.get(f"http://127.0.0.1:{port}/ceiling").status_code == 200
        os.kill(bare.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not dump.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        passes = json.loads(dump.read_text())
        assert len(passes) >= 20  # at least a pass a request, one at a time
        for wall, steps, median_step in passes:
            assert steps >= 1
            assert 0 < median_step <= wall
        # Recording starts afresh after each dump: a second dump holds only the passes since.
        dump.unlink()
        os.kill(bare.pid, signal.SIGUSR1)
        while not dump.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(json.loads(dump.read_text())) < len(passes)
    finally:
        bare.terminate()
        bare.wait()
