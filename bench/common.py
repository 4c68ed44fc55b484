"""Shared helpers: process memory and CPU readings, result tables and files."""

from __future__ import annotations

import json
import os
import platform
import resource
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


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
