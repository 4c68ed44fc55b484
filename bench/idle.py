"""After an idle spell: is the store still in the page cache, and what do requests meet?

For ``server.warm_cache`` off, on with ``server.lock_cache`` off (the store kept mapped and
checked every second), and on with it on (locked, the default): reads the store through (so
that each starts from a warm page cache), starts the daemon, leaves it idle for ``--idle``
seconds, then reports how much of the database file is still resident (``fincore``, from
util-linux), the CPU the page-cache keeper child used over the idle spell (/proc, Linux), and
loads the daemon with read one over conversations picked at random (32 connections,
``--slices`` slices): requests/s, p50 / p99 and the daemon's loop disk waits in each slice. On
a machine that pages out idle page cache (BENCHMARKS.md, The machine) this is where the
keeper's mapping shows; on one that keeps its cache the rows should read alike.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.cold import sample_conversations
from bench.common import child_pid, daemon_metric, loop_disk_waits, report, thread_cpu_seconds
from bench.feed import free_port, start, wait_http
from bench.http import CONNECTIONS, LUA_ROTATE, run_python, run_wrk
from inboxd.store.db import db_path
from inboxd.store.warm import read_through


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="a store from 'bench generate'")
    p.add_argument("--idle", type=float, default=120.0, help="seconds idle before the load (120)")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds per slice of load (10)")
    p.add_argument("--slices", type=int, default=3, help="slices of load after the idle (3)")
    p.add_argument(
        "--sample", type=int, default=5_000, help="conversations read one at a time (5000)"
    )


def resident_bytes(path: Path) -> int | None:
    """How much of the file is in the page cache now (None without ``fincore``)."""
    if shutil.which("fincore") is None:
        return None
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.split()[0])


def keeper_cpu_seconds(daemon_pid: int) -> float | None:
    """CPU seconds the daemon's page-cache keeper child has used (None: no keeper, or no /proc)."""
    keeper = child_pid(daemon_pid, b"inboxd.store.warm")
    try:
        return None if keeper is None else thread_cpu_seconds(keeper)  # (it has one thread)
    except OSError:
        return None


SETTINGS = {  # name: (server.warm_cache, server.lock_cache)
    "warm_cache off": (False, True),
    "kept, lock_cache off": (True, False),
    "kept and locked": (True, True),
}


def measure(
    data: Path, setting: tuple[bool, bool], paths: list[str], key: str, args: argparse.Namespace
) -> dict[str, Any]:
    store = db_path(data)
    read_through([store, Path(f"{store}-wal")])
    port = free_port()
    daemon = start(
        ["-m", "inboxd", "serve", "--data", str(data), "--bind", f"127.0.0.1:{port}"],
        {
            "INBOXD_SERVER_WARM_CACHE": "true" if setting[0] else "false",
            "INBOXD_SERVER_LOCK_CACHE": "true" if setting[1] else "false",
            "INBOXD_LIMITS_REQUESTS_PER_SECOND": "0",
            "INBOXD_LOG_LEVEL": "warning",
        },
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/readyz", process=daemon)
        # The keeper's start (it maps the store in first); a store it does not keep (too large
        # for the memory here) never gets there: the gauge row says so.
        deadline = time.monotonic() + 60
        while setting[0] and time.monotonic() < deadline:
            if daemon_metric(base, "inboxd_store_in_memory") == 1:
                break
            time.sleep(0.1)
        cpu_before, idle_from = keeper_cpu_seconds(daemon.pid), time.monotonic()
        time.sleep(args.idle)
        cpu_after, idle_for = keeper_cpu_seconds(daemon.pid), time.monotonic() - idle_from
        keeper_share = (
            None if cpu_before is None or cpu_after is None else (cpu_after - cpu_before) / idle_for
        )
        figures: dict[str, Any] = {
            "file_bytes": store.stat().st_size,
            "resident_bytes": resident_bytes(store),
            "keeper_cpu_share": keeper_share,
            "in_memory": daemon_metric(base, "inboxd_store_in_memory"),
            "slices": [],
        }
        for _ in range(args.slices):
            waits_before = loop_disk_waits(base)
            if shutil.which("wrk"):
                script = LUA_ROTATE % ", ".join(json.dumps(p) for p in paths)
                load = run_wrk(base, args.seconds, key, script, CONNECTIONS)
            else:
                load = run_python(base, args.seconds, key, paths)
            waits_after = loop_disk_waits(base)
            waits = (
                None if waits_before is None or waits_after is None else waits_after - waits_before
            )
            figures["slices"].append({**load, "loop_disk_waits": waits})
        return figures
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)


def run(args: argparse.Namespace) -> int:
    data = Path(args.data)
    key = json.loads((data / "bench.json").read_text())["ownerKey"]
    paths = [f"/api/v1/inbox/conversations/{c}" for c in sample_conversations(data, args.sample)]
    figures = {name: measure(data, setting, paths, key, args) for name, setting in SETTINGS.items()}
    rows = [("figure", "value", "note")]
    gib = 1 << 30
    for name, f in figures.items():
        res = "n/a" if f["resident_bytes"] is None else f"{f['resident_bytes'] / gib:.2f} GiB"
        cpu = (
            "no keeper"
            if f["keeper_cpu_share"] is None
            else f"the keeper's CPU while idle {f['keeper_cpu_share']:.3%} of a core"
        )
        rows.append(
            (f"{name}: resident after {args.idle:.0f} s idle", res,
             f"of {f['file_bytes'] / gib:.2f} GiB (fincore); inboxd_store_in_memory"
             f" {f['in_memory']:.0f}; {cpu}")
        )  # fmt: skip
        for i, s in enumerate(f["slices"], 1):
            waits = "n/a" if s["loop_disk_waits"] is None else f"{s['loop_disk_waits']:.0f}"
            rows.append(
                (f"{name}: read one, slice {i}", f"{s['rps']:,.0f} req/s",
                 f"p50 / p99 {s['p50_ms']:.1f} / {s['p99_ms']:.1f} ms; loop disk waits {waits}")
            )  # fmt: skip
    report("idle", rows, {"args": vars(args), "figures": figures})
    return 0
