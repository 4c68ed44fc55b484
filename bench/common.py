"""Shared helpers: process memory and CPU readings, result tables and files."""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

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


def thread_cpu_seconds(pid: int, tid: int | None = None) -> float:
    """CPU time (user + system) of one thread of another process; its main thread by default."""
    with open(f"/proc/{pid}/task/{tid or pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes() -> int:
    """Resident memory of this process (Linux /proc)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }


def report(name: str, rows: list[tuple[str, str, str]], data: dict[str, Any]) -> Path:
    """Print a table of (figure, value, note) and write the figures as JSON."""
    width = max(len(r[0]) for r in rows)
    vwidth = max(len(r[1]) for r in rows)
    print(f"\n{name}")
    for figure, value, note in rows:
        print(f"  {figure:<{width}}  {value:>{vwidth}}  {note}")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **data}, indent=2))
    print(f"  written to {path}")
    return path


def loop_disk_waits(base: str) -> float | None:
    """The daemon's own count (absent before the revision that added it)."""
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith("inboxd_store_loop_disk_waits_total "):
            return float(line.split()[1])
    return None
