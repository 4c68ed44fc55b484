"""Shared helpers: process memory and CPU readings, result tables and files."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import httpx

from inboxd.config import LOG_LEVELS
from inboxd.store import shards, tidy
from inboxd.store.db import Store, db_path, run_in_transaction
from inboxd.store.warm import meminfo
from inboxd.timeutil import now_us

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def baseline_worktree(revision: str, where: Path) -> Iterator[Path]:
    """``revision`` checked out at ``where`` (a temporary git worktree), removed afterwards."""
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-q", str(where), revision], cwd=ROOT, check=True
    )
    try:
        yield where
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT)


def add_log_level(p: argparse.ArgumentParser, whose: str) -> None:
    """``--log-level`` of the scripts that start inboxd daemons: warning unless given, so that
    the figures leave out the access log that the daemon's default level (info) writes a line a
    request (BENCHMARKS.md, How to run)."""
    p.add_argument(
        "--log-level",
        default="warning",
        choices=LOG_LEVELS,
        help=f"{whose} log.level (warning here unless given: no access log; info, the daemon's"
        " default, writes a line a request)",
    )


def thread_cpu_seconds(pid: int, tid: int | None = None) -> float:
    """CPU time (user + system) of one thread of another process; its main thread by default.

    From the scheduler's own count in nanoseconds (``schedstat``) where the kernel keeps one:
    ``stat``'s clock ticks (10 ms) would leave a share of a 3 s slice uncertain by up to 0.7
    points, as large as the differences ``bench ab`` and ``bench bound`` look for."""
    task = f"/proc/{pid}/task/{tid or pid}"
    try:
        with open(f"{task}/schedstat") as fh:
            return int(fh.read().split()[0]) / 1e9
    except (FileNotFoundError, ValueError, IndexError):
        pass
    with open(f"{task}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes() -> int:
    """Resident memory of this process (Linux /proc)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def timed(fn: Any, *args: Any) -> float:
    """Seconds ``fn(*args)`` took."""
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


DAMON_ADMIN = Path("/sys/kernel/mm/damon/admin/kdamonds")
DAMON_RECLAIM = Path("/sys/module/damon_reclaim/parameters")


def _pages_out_page_cache(context: Path, scheme: Path) -> bool:
    """Whether a DAMON pageout scheme can reach unmapped file pages (the page cache): it
    monitors physical memory and no filter of its rejects them or all but anonymous memory."""
    if (context / "operations").read_text().strip() != "paddr":
        return False
    filters = scheme / "ops_filters"
    if not filters.exists():
        filters = scheme / "filters"
    for rule in sorted(filters.glob("[0-9]*")):
        kind = (rule / "type").read_text().strip()
        matching = (rule / "matching").read_text().strip() == "Y"
        allow = (rule / "allow").read_text().strip() == "Y"
        if kind == "unmapped" and matching and not allow:
            return False  # unmapped pages rejected
        if kind == "anon" and matching and allow:
            return False  # only anonymous memory allowed
    return True


def page_cache_reclaim(admin: Path = DAMON_ADMIN, module: Path = DAMON_RECLAIM) -> str | None:
    """How the kernel pages out page cache nobody touched for a while, if it does: a DAMON
    ``pageout`` scheme over physical memory (some virtual machines run one) or the
    DAMON_RECLAIM module. On such a machine the page cache keeps only what the load touched in
    the last minute or so, so a large store is partly cold whatever read it before: loop disk
    waits and offloaded work follow. None when neither is on (or this is not Linux); "unknown"
    when DAMON runs but its settings cannot be read (they are root's only)."""
    try:
        for kdamond in sorted(admin.glob("[0-9]*")):
            if (kdamond / "state").read_text().strip() != "on":
                continue
            for context in sorted((kdamond / "contexts").glob("[0-9]*")):
                aggregate_us = int((context / "monitoring_attrs/intervals/aggr_us").read_text())
                for scheme in sorted((context / "schemes").glob("[0-9]*")):
                    if (scheme / "action").read_text().strip() != "pageout":
                        continue
                    if not _pages_out_page_cache(context, scheme):
                        continue
                    age = int((scheme / "access_pattern/age/min").read_text()) * aggregate_us
                    quota = int((scheme / "quotas/bytes").read_text())
                    every = int((scheme / "quotas/reset_interval_ms").read_text())
                    limit = f"up to {quota / 2**20:.0f} MiB per {every} ms" if quota else "no cap"
                    return f"DAMON pages out memory idle for {age / 1e6:.0f} s or more ({limit})"
        if (module / "enabled").read_text().strip() == "Y":
            age = int((module / "min_age").read_text())
            return f"DAMON_RECLAIM pages out memory idle for {age / 1e6:.0f} s or more"
    except PermissionError:
        return "unknown: DAMON runs, its settings are readable by root only"
    except (OSError, ValueError):
        return None
    return None


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The processor's name as the kernel reports it (Linux): the machines here change from
    one session to the next, and their speed with them."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "memory_bytes": meminfo("MemTotal"),
        "platform": platform.platform(),
        "page_cache_reclaim": page_cache_reclaim(),
    }


def report(name: str, rows: list[tuple[str, str, str]], data: dict[str, Any]) -> Path:
    """Print a table of (figure, value, note) and write the figures as JSON."""
    width = max(len(r[0]) for r in rows)
    vwidth = max(len(r[1]) for r in rows)
    print(f"\n{name}")
    for figure, value, note in rows:
        print(f"  {figure:<{width}}  {value:>{vwidth}}  {note}")
    host = machine()
    if host["page_cache_reclaim"]:
        print(f"  this machine: {host['page_cache_reclaim']} (BENCHMARKS.md, The machine)")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": host, **data}, indent=2))
    print(f"  written to {path}")
    return path


def daemon_metric(base: str, name: str) -> float | None:
    """A series from the daemon's /metrics, named as exposed (with its labels, if any, as in
    ``name{label="value"}``); None where this revision has none."""
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None


RESTART_SECONDS: Final = "inboxd_store_checkpoint_restart_seconds"


def write_buckets(base: str) -> tuple[dict[float, float] | None, dict[float, float] | None]:
    """From one /metrics answer, the daemon's ``inboxd_store_commit_seconds`` histogram (each
    bucket's bound in seconds, ``inf`` for ``+Inf``, and its cumulative count of write batches'
    COMMITs) and ``inboxd_store_checkpoint_restart_seconds`` (the checkpointer's RESTARTs, each
    holding new writes back while it ran), the same way. None for one this revision has not."""
    text = httpx.get(f"{base}/metrics").text
    return commit_buckets_in(text), commit_buckets_in(text, RESTART_SECONDS)


def commit_buckets_in(
    exposition: str, name: str = "inboxd_store_commit_seconds"
) -> dict[float, float] | None:
    """``inboxd_store_commit_seconds`` (or another histogram over the same buckets, ``name``)
    read from the text of a /metrics answer: each bucket's bound and its cumulative count."""
    found = {}
    for line in exposition.splitlines():
        if line.startswith(f'{name}_bucket{{le="'):
            found[float(line.split('"')[1])] = float(line.split()[-1])
    return found or None


def commits_between(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """The COMMITs made between two readings of ``write_buckets``: how many, how many took
    over 50 and over 100 ms, and the bound within which all of them took (None: over the
    largest bound, or no COMMIT)."""
    made = {bound: after[bound] - before.get(bound, 0.0) for bound in after}
    count = made[math.inf]
    within = [bound for bound, n in made.items() if bound < math.inf and n == count]
    return {
        "count": int(count),
        "over_50_ms": int(count - made[0.05]),
        "over_100_ms": int(count - made[0.1]),
        "all_within_ms": min(within) * 1000 if within and count else None,
    }


def loop_disk_waits(base: str) -> float | None:
    """The daemon's own count (absent before the revision that added it)."""
    return daemon_metric(base, "inboxd_store_loop_disk_waits_total")


def offloaded_reads(base: str) -> float | None:
    """Reads the daemon ran in a worker thread rather than on the trio thread: over the inline
    budget, after a disk wait, during a warm-up, or sent there for a second after one of those
    (inboxd/store/db.py). None from a revision without the count."""
    return daemon_metric(base, 'inboxd_store_reads_total{on="worker_thread"}')


def child_pid(pid: int, marker: bytes) -> int | None:
    """The pid of a child of process ``pid`` whose command line holds ``marker`` (the daemon's
    writer process or page-cache keeper; /proc, Linux), if it has one. By each process's parent
    in /proc: trio starts a child from a worker thread, so a task's ``children`` file would
    have to be read for every thread."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and marker in cmdline:
            return int(entry.name)
    return None


def search_indexes_up_to_date(data: Path) -> dict[str, Any]:
    """The search upkeep the daemon does in the background, a step at a time, done before
    anything is measured: each channel past the size line gets its own message search index,
    filled (store/shards.py), and the b-trees of the contact index and of those own indexes are
    merged (store/tidy.py). Prints progress; returns the channels made ready and each merge's
    steps, seconds and b-trees."""
    Store.open(data, readers=1).close()  # migrated first
    conn = sqlite3.connect(db_path(data), isolation_level=None)
    started = time.perf_counter()
    size_before = db_path(data).stat().st_size

    def progress(channel_pk: int, below: int, top: int) -> None:
        print(
            f"\r  search index of its own for channel {channel_pk}:"
            f" {1 - below / max(top, 1):.0%}, {time.perf_counter() - started:.0f} s",
            end="",
            file=sys.stderr,
            flush=True,
        )

    try:
        made = shards.bring_up_to_date(conn, now_us, progress=progress)
        if made:
            grown = (db_path(data).stat().st_size - size_before) / 2**20
            print(
                f"\n  {len(made)} channel(s) given an index of their own in"
                f" {time.perf_counter() - started:.0f} s; the store grew {grown:,.0f} MiB",
                file=sys.stderr,
            )
        merges = {}
        for index in tidy.indexes(conn):
            merging, steps, btrees = time.perf_counter(), 0, tidy.btrees(conn, index)
            while run_in_transaction(conn, "BEGIN IMMEDIATE", tidy.step, index, 1_000):
                steps += 1
            merges[index] = merge = {
                "steps": steps,
                "seconds": round(time.perf_counter() - merging, 1),
                "btreesBefore": btrees,
                "btrees": tidy.btrees(conn, index),
            }
            if steps:
                print(
                    f"  search index {index} merged: {btrees} b-trees -> {merge['btrees']}"
                    f" in {merge['seconds']} s",
                    file=sys.stderr,
                )
    finally:
        conn.close()
    return {"ownSearchIndex": made, "searchIndexMerges": merges}
