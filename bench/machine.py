"""The machine itself: how steadily it runs a fixed piece of work, alone and while serving.

On the virtual machine these benchmarks ran on, the same work sometimes runs 5-35x slower for
stretches of a few to tens of milliseconds, mostly on both CPUs at once, and the guest sees that
time as ordinary running time (no steal was reported over one run checked by hand). A request in
flight during such a stretch waits for it, so it shows in every server's tail, the framework's
ceiling's too. This benchmark measures it, so that a run's p99 can be read beside it
(BENCHMARKS.md, The machine):

- **idle**: one process a CPU, each pinned to its CPU, repeats a fixed chunk of pure-Python work
  (100-150 us there) for ``--seconds``. A chunk is *slow* when it took over ``SLOW`` times the
  median chunk of its CPU, in the thread's CPU time (other processes taking the CPU do not
  count). Figures: the share of the time in slow chunks on each CPU, the longest stretch of
  slow chunks one after the other, and how much of the first CPU's slow time fell within the
  second's.
- **served**: the bare app (bench/bare.py, the framework's ceiling) with an instrument on trio's
  scheduler (``BENCH_BARE_PASSES``), under the load generator at 32 connections for
  ``--served-seconds``. Per pass of the scheduler it records the wall time, the task steps and
  their median. A pass is *slow* when its median step took over ``SLOW`` times the run's median
  step: the same steps, run slower (a pass that is long because it has more steps, or one long
  step, is not). Figures: requests/s, p50 / p99, the slow passes' share of the time in the
  scheduler's passes (its I/O waits left out), the longest one.

``bench http`` runs the idle probe before and after its rows and shows it as a row of its table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from bench.common import report
from bench.feed import free_port, start, wait_http

SLOW: Final = 5.0  # times the median: a chunk or a pass's steps ran at under a fifth the speed
# The served probe's instrument (bench/bare.py): set to a file, the bare app records its passes
# and writes them there on SIGUSR1 (then starts afresh).
PASSES_ENV: Final = "BENCH_BARE_PASSES"
_CHUNK_ROUNDS: Final = 2_000  # 100-150 us of pure Python on the machine measured


def _chunk() -> int:
    total = 0
    for i in range(_CHUNK_ROUNDS):
        total += i * i
    return total


def spin(seconds: float) -> list[tuple[float, float]]:
    """(start, duration) of each fixed chunk of work run back to back for ``seconds``: its start
    on the wall clock, its duration in the thread's CPU time, so that a chunk the kernel set
    aside for another process does not count as slow; a chunk the host ran slowly does (the
    guest counts that as CPU time)."""
    for _ in range(200):  # warm up
        _chunk()
    samples = []
    end = time.perf_counter() + seconds
    while (started := time.perf_counter()) < end:
        cpu = time.thread_time()
        _chunk()
        samples.append((started, time.thread_time() - cpu))
    return samples


def slow_stretches(samples: list[tuple[float, float]], slow: float = SLOW) -> dict[str, Any]:
    """How much of ``samples``' time (``(start, duration)`` each, in order) went to samples that
    took over ``slow`` times their median, and in how many stretches: a stretch is a run of slow
    samples one after the other (from the first's start to the last's end)."""
    if not samples:
        return {
            "samples": 0,
            "median_us": 0.0,
            "slow_share": 0.0,
            "slow_count": 0,
            "stretches": 0,
            "longest_stretch_ms": 0.0,
            "longest_ms": 0.0,
        }
    durations = [d for _, d in samples]
    median = statistics.median(durations)
    slow_ones = [d for _, d in samples if d > slow * median]
    stretches: list[float] = []
    began: float | None = None
    for (at, duration), following in zip(samples, [*samples[1:], None], strict=True):
        if duration > slow * median:
            began = at if began is None else began
            if following is None or following[1] <= slow * median:
                stretches.append(at + duration - began)
                began = None
    return {
        "samples": len(samples),
        "median_us": median * 1e6,
        "slow_share": sum(slow_ones) / sum(durations),
        "slow_count": len(slow_ones),
        "stretches": len(stretches),
        "longest_stretch_ms": max(stretches, default=0.0) * 1e3,
        "longest_ms": max(durations) * 1e3,
    }


def covered(
    mine: list[tuple[float, float]], theirs: list[tuple[float, float]], slow: float = SLOW
) -> float | None:
    """The share of ``mine``'s slow time that fell within ``theirs``' slow samples (both
    ``(start, duration)`` on one clock): near 1 when the two CPUs slow down together."""

    def intervals(samples: list[tuple[float, float]]) -> list[tuple[float, float]]:
        median = statistics.median(d for _, d in samples)
        return sorted((s, s + d) for s, d in samples if d > slow * median)

    if not mine or not theirs:
        return None
    ours, others = intervals(mine), intervals(theirs)
    total = sum(e - s for s, e in ours)
    if total == 0:
        return None
    shared, j = 0.0, 0
    for s, e in ours:
        while j < len(others) and others[j][1] <= s:
            j += 1
        k = j
        while k < len(others) and others[k][0] < e:
            shared += min(e, others[k][1]) - max(s, others[k][0])
            k += 1
    return shared / total


# One probe process a CPU: pinned, it spins and prints its samples as JSON.
_PROBE = (
    "import json, os, sys; os.sched_setaffinity(0, {int(sys.argv[1])});"
    " from bench.machine import spin; print(json.dumps(spin(float(sys.argv[2]))))"
)


def idle_probe(seconds: float) -> dict[str, Any]:
    """Every CPU busy with a probe at once (``time.perf_counter`` is one clock for all)."""
    cpus = sorted(os.sched_getaffinity(0))
    root = Path(__file__).resolve().parent.parent
    probes = [
        subprocess.Popen(
            [sys.executable, "-c", _PROBE, str(cpu), str(seconds)],
            cwd=root,
            stdout=subprocess.PIPE,
            text=True,
        )
        for cpu in cpus
    ]
    samples = []
    for probe in probes:
        out, _ = probe.communicate()
        if probe.returncode != 0:
            raise RuntimeError(f"bench machine: a probe exited with {probe.returncode}")
        samples.append([tuple(s) for s in json.loads(out)])
    figures: dict[str, Any] = {
        "seconds": seconds,
        "cpus": {str(cpu): slow_stretches(s) for cpu, s in zip(cpus, samples, strict=True)},
    }
    if len(samples) > 1:
        figures["first_cpus_slow_time_within_the_seconds"] = covered(samples[0], samples[1])
    figures["slow_share"] = max(c["slow_share"] for c in figures["cpus"].values())
    figures["longest_stretch_ms"] = max(c["longest_stretch_ms"] for c in figures["cpus"].values())
    return figures


def slow_passes(passes: list[list[float]], slow: float = SLOW) -> dict[str, Any]:
    """``passes``: ``[wall seconds, task steps, median step seconds]`` of each pass of trio's
    scheduler. A pass is slow when its median step took over ``slow`` times the median of the
    passes' median steps."""
    usual = statistics.median(p[2] for p in passes) if passes else 0.0
    slow_ones = [p for p in passes if p[2] > slow * usual]
    wall = sum(p[0] for p in passes)
    return {
        "passes": len(passes),
        "usual_step_us": usual * 1e6,
        "median_steps_a_pass": statistics.median(p[1] for p in passes) if passes else 0,
        "slow_passes": len(slow_ones),
        "slow_share": sum(p[0] for p in slow_ones) / wall if wall else 0.0,
        "longest_slow_ms": max((p[0] for p in slow_ones), default=0.0) * 1e3,
        "slow_steps_a_pass": statistics.median(p[1] for p in slow_ones) if slow_ones else 0,
        "longest_pass_ms": max((p[0] for p in passes), default=0.0) * 1e3,
    }


def served_probe(seconds: float, driver: str) -> dict[str, Any]:
    from bench.http import run_python, run_wrk  # (here: bench.http imports this module)

    port = free_port()
    with tempfile.TemporaryDirectory() as scratch:
        dump = Path(scratch) / "passes.json"
        bare = start(["-m", "bench.bare", str(port)], {PASSES_ENV: str(dump)})
        try:
            url = f"http://127.0.0.1:{port}/ceiling"
            wait_http(f"http://127.0.0.1:{port}/healthz", process=bare)

            def load(s: float) -> dict[str, Any]:
                if driver == "wrk":
                    return run_wrk(url, s, None, None)
                return run_python(url, s, None, None)

            load(min(2.0, seconds))  # warm-up, not recorded
            os.kill(bare.pid, signal.SIGUSR1)  # start afresh
            _wait_for(dump)
            dump.unlink()
            served = load(seconds)
            os.kill(bare.pid, signal.SIGUSR1)
            _wait_for(dump)
            passes = json.loads(dump.read_text())
        finally:
            bare.terminate()
            bare.wait()
    return {
        "driver": driver,
        "seconds": seconds,
        "rps": served["rps"],
        "p50_ms": served["p50_ms"],
        "p99_ms": served["p99_ms"],
        **slow_passes(passes),
    }


def _wait_for(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench machine: the bare app wrote no {path.name}")
        time.sleep(0.02)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=8.0, help="idle probe, per CPU at once (8)")
    p.add_argument(
        "--served-seconds", type=float, default=8.0, help="the bare app under load (8; 0: skip)"
    )
    p.add_argument("--driver", choices=["auto", "wrk", "python"], default="auto")


def run(args: argparse.Namespace) -> int:
    idle = idle_probe(args.seconds)
    rows = [
        ("idle: CPUs probed at once", f"{len(idle['cpus'])}", f"{args.seconds:g} s"),
    ]
    for cpu, c in idle["cpus"].items():
        rows.append(
            (
                f"idle, CPU {cpu}: time in slow chunks",
                f"{c['slow_share'] * 100:.1f} %",
                f"{c['slow_count']} of {c['samples']} chunks over {SLOW:g}x the median"
                f" {c['median_us']:.0f} us, in {c['stretches']} stretches, the longest"
                f" {c['longest_stretch_ms']:.1f} ms",
            )
        )
    if idle.get("first_cpus_slow_time_within_the_seconds") is not None:
        share = idle["first_cpus_slow_time_within_the_seconds"]
        rows.append(
            ("idle: the first CPU's slow time within the second's", f"{share * 100:.0f} %", "")
        )
    data: dict[str, Any] = {"slow": SLOW, "idle": idle}
    if args.served_seconds > 0:
        driver = args.driver
        if driver == "auto":
            driver = "wrk" if shutil.which("wrk") else "python"
        s = served_probe(args.served_seconds, driver)
        data["served"] = s
        rows += [
            (
                "served: the bare app's ceiling",
                f"{s['rps']:,.0f} req/s",
                f"32 connections, {driver}",
            ),
            (
                "served: p50 / p99",
                f"{s['p50_ms']:.1f} / {s['p99_ms']:.1f} ms",
                f"p50 + the longest slow pass {s['p50_ms'] + s['longest_slow_ms']:.1f} ms"
                " (a request that waited one out)",
            ),
            (
                "served: scheduler passes",
                f"{s['passes']:,}",
                f"{s['median_steps_a_pass']:g} task steps a pass (median), the usual step"
                f" {s['usual_step_us']:.0f} us",
            ),
            (
                "served: the time in slow passes",
                f"{s['slow_share'] * 100:.1f} %",
                f"{s['slow_passes']} passes whose median step took over {SLOW:g}x the usual;"
                f" the longest {s['longest_slow_ms']:.1f} ms, {s['slow_steps_a_pass']:g} steps"
                " a pass (median)",
            ),
        ]
    report("machine", rows, data)
    return 0
