"""A cold store: does any request wait on another's disk I/O on the trio loop?

Drops the store's files from the OS page cache, starts the daemon and loads it with history
pages of conversations picked at random (28 connections; their pages must come from the disk)
while 4 more connections ask for counts (whose few pages stay in memory: a bystander). It
reads the bytes each of the daemon's threads had to fetch from the device (``read_bytes`` in
/proc, Linux) and the daemon's own count of waits for the disk on the trio thread; then the
counts alone, for the bystander's latency without the disk-bound load beside it; then the same
history load on other conversations, to see whether the store has warmed up by then.
``server.warm_cache`` is off unless ``--warm-cache`` is given: the question is what a cold store
does to the loop, and the warm-up would race the measurement.

With ``--baseline REV`` the revision REV (a temporary git worktree) runs the same first, on a
cache dropped again: before and after in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path
from typing import Any

from bench.common import ROOT, baseline_worktree, loop_disk_waits, report
from bench.feed import free_port, start, wait_http
from bench.http import LUA_ROTATE, run_python, run_wrk
from inboxd.store.db import db_path

COLD_CONNECTIONS = 28
BYSTANDER_CONNECTIONS = 4


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="a store from 'bench generate'")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds of load (10)")
    p.add_argument(
        "--sample", type=int, default=30_000, help="conversations whose history is read (30000)"
    )
    p.add_argument("--baseline", help="also run this git revision first, for before/after")
    p.add_argument(
        "--warm-cache",
        action="store_true",
        help="let serve read the store into the page cache at start (server.warm_cache;"
        " off here by default, so that the loop's disk waits are measured on a cold store)",
    )


def sample_conversations(data: Path, n: int) -> list[str]:
    conn = sqlite3.connect(f"file:{db_path(data)}?mode=ro", uri=True)
    try:
        top = int(conn.execute("SELECT max(pk) FROM conversations").fetchone()[0])
        pks = random.Random(7).sample(range(1, top + 1), min(n, top))
        ids: list[str] = []
        for start_at in range(0, len(pks), 900):
            chunk = pks[start_at : start_at + 900]
            marks = ",".join("?" * len(chunk))
            query = f"SELECT id FROM conversations WHERE pk IN ({marks})"
            ids += [r[0] for r in conn.execute(query, chunk)]
        random.Random(8).shuffle(ids)
        return ids
    finally:
        conn.close()


def evict(data: Path) -> None:
    """Drop the store's pages from the OS page cache (written out first: only clean pages go)."""
    for path in (db_path(data), Path(f"{db_path(data)}-wal")):
        if not path.exists():
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read_bytes(io_file: str) -> int:
    with open(io_file) as fh:
        for line in fh:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def device_reads(pid: int) -> tuple[int, int]:
    """Bytes fetched from the storage device so far: by the main (trio) thread, by the rest
    (the process's total, which keeps the counts of worker threads that have ended, minus the
    main thread's)."""
    main = _read_bytes(f"/proc/{pid}/task/{pid}/io")
    return main, _read_bytes(f"/proc/{pid}/io") - main


def measure(
    data: Path, cwd: Path, ids: list[str], key: str, seconds: float, wrk: bool, warm: bool
) -> dict[str, Any]:
    evict(data)
    port = free_port()
    daemon = start(
        ["-m", "inboxd", "serve", "--data", str(data), "--bind", f"127.0.0.1:{port}"],
        {
            "INBOXD_LIMITS_REQUESTS_PER_SECOND": "0",
            "INBOXD_LOG_LEVEL": "warning",
            "INBOXD_SERVER_WARM_CACHE": "true" if warm else "false",
        },
        cwd=cwd,
    )
    base = f"http://127.0.0.1:{port}"
    history = [f"/api/v1/inbox/conversations/{c}/messages?limit=50" for c in ids]
    counts = "/api/v1/inbox/conversations/counts"

    def load(paths: list[str], connections: int) -> dict[str, float]:
        if wrk:
            script = LUA_ROTATE % ", ".join(json.dumps(p) for p in paths)
            return run_wrk(base, seconds, key, script, connections)
        return run_python(base, seconds, key, paths, connections)

    try:
        wait_http(f"{base}/readyz", timeout=600, process=daemon)
        before = device_reads(daemon.pid)
        results: dict[str, dict[str, float]] = {}

        def cold_load() -> None:
            results["cold"] = load(history, COLD_CONNECTIONS)

        loader = threading.Thread(target=cold_load)
        loader.start()
        results["beside"] = load([counts], BYSTANDER_CONNECTIONS)
        loader.join()
        after = device_reads(daemon.pid)
        waits = loop_disk_waits(base)
        results["alone"] = load([counts], BYSTANDER_CONNECTIONS)
        # Has the store warmed up meanwhile? (serve reads it into the page cache when it fits.)
        # From the other end of the list: not the pages the first load already brought in.
        results["later"] = load(history[::-1], COLD_CONNECTIONS)
    finally:
        daemon.terminate()
        daemon.wait(15)
    return {
        **results,
        "loop_device_bytes": after[0] - before[0],
        "threads_device_bytes": after[1] - before[1],
        "loop_disk_waits": waits,
    }


def run(args: argparse.Namespace) -> int:
    data = Path(args.data)
    key = json.loads((data / "bench.json").read_text())["ownerKey"]
    ids = sample_conversations(data, args.sample)
    wrk = shutil.which("wrk") is not None
    if not wrk:
        print("bench cold: wrk is missing; using the slower Python driver (apt-get install wrk)")
    figures: dict[str, dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        versions = [("this tree", ROOT)]
        if args.baseline:
            where = Path(tempfile.mkdtemp(prefix="inboxd-cold-")) / "baseline"
            stack.callback(shutil.rmtree, where.parent, ignore_errors=True)
            versions.insert(
                0, (args.baseline, stack.enter_context(baseline_worktree(args.baseline, where)))
            )
        for name, cwd in versions:
            figures[name] = measure(data, cwd, ids, key, args.seconds, wrk, args.warm_cache)
    rows = [("figure", "value", "note")]
    for name, f in figures.items():
        mb = 1024 * 1024
        waits = "n/a" if f["loop_disk_waits"] is None else f"{f['loop_disk_waits']:.0f}"
        rows += [
            (f"{name}: device reads on the trio thread", f"{f['loop_device_bytes'] / mb:.1f} MB",
             f"in worker threads {f['threads_device_bytes'] / mb:.1f} MB; loop disk waits {waits}"),
            (f"{name}: history pages, cold store", f"{f['cold']['rps']:,.0f} req/s",
             f"p50 / p99 {f['cold']['p50_ms']:.1f} / {f['cold']['p99_ms']:.1f} ms, {COLD_CONNECTIONS} connections"),
            (f"{name}: other history pages, next", f"{f['later']['rps']:,.0f} req/s",
             f"p50 / p99 {f['later']['p50_ms']:.1f} / {f['later']['p99_ms']:.1f} ms, after {2 * args.seconds:.0f} s of load"),
            (f"{name}: counts beside them", f"p99 {f['beside']['p99_ms']:.1f} ms",
             f"p50 {f['beside']['p50_ms']:.1f} ms; alone p50 / p99 {f['alone']['p50_ms']:.1f} / {f['alone']['p99_ms']:.1f} ms"),
        ]  # fmt: skip
    report("cold", rows, {"args": vars(args), "figures": figures})
    return 0
