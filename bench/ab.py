"""Before and after: the same endpoints on two versions of inboxd, beside the ceiling, in one run.

The ceiling on these machines moves by 20 % within minutes, so comparing two ``bench http`` runs
says little about a change worth 5 %. This runs both versions at once: the baseline (a git
revision, checked out into a temporary worktree) and the working tree, each on its own copy of
the store, with the bare quart-trio ceiling, loading each in turn in short slices (the order
alternating) after one unrecorded warm-up slice each, and reporting the median requests/s of
each and the median of the per-slice ratios after / before (each pair ran back to back, so a
drift of the machine moves both; a median ignores a slice that a hiccup spoiled). Beside them,
how busy each daemon's serving thread was (its CPU time over the slice's wall time, /proc): a
change that leaves the thread waiting less (for the writer process, say) shows there even when
the machine's noise hides it in requests/s.

The row ``ceiling`` (not run unless asked for) loads each version's own bare app instead, the
baseline's from its worktree: what a change to the setup both serve with (bench/bare.py installs
the daemon's changes to hypercorn) does to the ceiling itself. With it, every other row also
prints each version's share of its own ceiling (the baseline's estimated as that row's ceiling
over the ceiling row's after / before).

Both daemons run at log level warning, as ``bench http`` runs its daemon (no access log), unless
``--log-level`` says otherwise: at info, the default, each writes its access log's line a request
(each daemon's log to a file of its own). ``--baseline-log-level`` runs the baseline at another
level: with ``--baseline HEAD`` and nothing changed in the working tree, the same code at two
levels, which is what the access log costs served (``--baseline-log-level warning --log-level
info``).

The store given must be one the baseline understands (its schema or older): both copies are
made from it, and each daemon migrates its own. Needs wrk and git; the copies need free disk.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    add_log_level,
    baseline_worktree,
    loop_disk_waits,
    report,
    thread_cpu_seconds,
)
from bench.feed import ROOT, free_port, start, wait_http
from bench.http import (
    LUA_BARE_PATCH,
    LUA_ROTATE,
    LUA_WRITE,
    pick,
    reset_for_writes,
    run_python,
    run_wrk,
)
from inboxd.config import LOG_LEVELS

ROWS = ("list", "list-channel", "read", "counts", "history", "title", "assignee", "ceiling")
# Not in the default rows: "ceiling" loads each version's own bare app (bench/bare.py, from the
# baseline's worktree and from the working tree), for a change to the setup both serve with.
DEFAULT_ROWS = ROWS[:-1]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="a store from 'bench generate' (copied twice)")
    p.add_argument("--baseline", default="HEAD", help="the git revision to compare with (HEAD)")
    p.add_argument(
        "--rows",
        default=",".join(DEFAULT_ROWS),
        help=f"some of {', '.join(ROWS)} (all but ceiling: each version's own bare app)",
    )
    p.add_argument("--slices", type=int, default=6, help="slices per version and row (6)")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per slice (3)")
    add_log_level(p, "both daemons'")  # (each logs to a file of its own)
    p.add_argument(
        "--baseline-log-level",
        choices=LOG_LEVELS,
        help="the baseline's log.level, where it is to differ from --log-level's (with"
        " --baseline HEAD and no change: what the access log costs served)",
    )


def _copy_store(source: Path, target: Path) -> None:
    target.mkdir(parents=True)
    for f in source.iterdir():  # the database, its WAL if any, bench.json
        shutil.copy2(f, target / f.name)


def store_copies(
    cleanup: contextlib.ExitStack, source: Path, work: Path, names: tuple[str, ...]
) -> dict[str, Path]:
    """A copy of the store per name under ``work`` (removed on the way out), written back and
    read through (``_settle``). Register the servers' stop after this, so it runs first."""
    cleanup.callback(shutil.rmtree, work, ignore_errors=True)
    stores = {name: work / name for name in names}
    for store in stores.values():
        _copy_store(source, store)
    _settle(list(stores.values()))
    return stores


def _stop(processes: dict[str, Any]) -> None:
    for process in processes.values():
        process.terminate()
        process.wait(15)


def _settle(stores: list[Path]) -> None:
    """Flush the copies to the disk, then read each through once, so that neither version
    starts with its store being written back or half out of the OS cache. Without this, an
    A/A run (the same code on both sides) read the second copy's single reads at x0.90."""
    os.sync()
    for store in stores:
        for f in store.iterdir():
            with f.open("rb") as fh:
                while fh.read(1 << 24):
                    pass


def _rotated_paths(ids: dict[str, Any]) -> dict[str, list[str]]:
    """The rows that go through many conversations in turn."""
    convs = ids["conversations"][:500]
    return {
        "read": [f"/api/v1/inbox/conversations/{c}" for c in convs],
        "history": [
            f"/api/v1/inbox/conversations/{c}/messages?limit=50"
            for c in ids["history_conversations"]
        ],
    }


def _requests(ids: dict[str, Any]) -> dict[str, tuple[str, str | None, list[str]]]:
    """Row -> (path, wrk script, conversations a write script changes)."""
    convs, ch = ids["conversations"], ids["channel"]
    paths = _rotated_paths(ids)
    out: dict[str, tuple[str, str | None, list[str]]] = {
        "list": ("/api/v1/inbox/conversations?limit=50", None, []),
        "list-channel": (
            f"/api/v1/inbox/conversations?limit=50&channelId={ch}&status=OPEN",
            None,
            [],
        ),
        "counts": ("/api/v1/inbox/conversations/counts", None, []),
        "ceiling": ("/ceiling", None, []),
    }
    for name, rotate in paths.items():
        out[name] = ("", LUA_ROTATE % ", ".join(json.dumps(p) for p in rotate), [])
    for kind in ("title", "assignee"):
        targets = convs[:1000]
        script = LUA_WRITE % (", ".join(json.dumps(c) for c in targets), kind, ids["owner_id"])
        out[kind] = ("", script, targets)
    return out


def run(args: argparse.Namespace) -> int:
    source = Path(args.data)
    ids = pick(source)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = set(rows) - set(ROWS)
    if unknown:
        raise SystemExit(f"bench ab: unknown rows {', '.join(sorted(unknown))}")
    wrk = shutil.which("wrk") is not None
    if not wrk:  # CI's smoke run: reads only, through the slower Python driver
        print("bench ab: wrk is missing; reads only, with the Python driver (apt-get install wrk)")
        rows = [r for r in rows if r not in ("title", "assignee")]
    requests = _requests(ids)
    work = Path(tempfile.mkdtemp(prefix="inboxd-ab-"))
    daemons: dict[str, Any] = {}
    with contextlib.ExitStack() as cleanup:
        baseline_src = cleanup.enter_context(baseline_worktree(args.baseline, work / "baseline"))
        stores = store_copies(cleanup, source, work, ("before", "after"))
        cleanup.callback(_stop, daemons)
        ports = {"before": free_port(), "after": free_port(), "bare": free_port()}
        # server.warm_cache stays on (the default): _settle has read both copies through, so
        # the warm-up child's read is quick, and its mapping keeps each copy in the page cache
        # on a machine that pages out what is idle (The machine, in BENCHMARKS.md). Without
        # it the copies went cold between rows, and the rows measured the disk. A baseline
        # from before that child has neither.
        levels = {"before": args.baseline_log_level or args.log_level, "after": args.log_level}
        for who in ("before", "after"):
            env = {"INBOXD_LIMITS_REQUESTS_PER_SECOND": "0", "INBOXD_LOG_LEVEL": levels[who]}
            command = ["-m", "inboxd", "serve", "--data", str(stores[who])]
            command += ["--bind", f"127.0.0.1:{ports[who]}"]
            log = cleanup.enter_context(tempfile.TemporaryFile())  # (a daemon's stderr)
            cwd = baseline_src if who == "before" else ROOT
            daemons[who] = start(command, env, cwd=cwd, log=log)
            # A migration on a big store can take minutes: wait for it.
            wait_http(f"http://127.0.0.1:{ports[who]}/readyz", timeout=1800, process=daemons[who])
        daemons["bare"] = start(["-m", "bench.bare", str(ports["bare"])])
        wait_http(f"http://127.0.0.1:{ports['bare']}/healthz")
        if "ceiling" in rows:  # the baseline's own bare app, from its worktree
            ports["bare-before"] = free_port()
            command = ["-m", "bench.bare", str(ports["bare-before"])]
            daemons["bare-before"] = start(command, cwd=baseline_src)
            wait_http(f"http://127.0.0.1:{ports['bare-before']}/healthz")
        paths = _rotated_paths(ids)

        def load(url: str, rotate: list[str] | str, key: str | None, script: str | None) -> Any:
            if wrk:
                try:
                    return run_wrk(url, args.seconds, key, script)
                except RuntimeError as exc:  # say which server is gone, and how it ended
                    codes = {w: p.poll() for w, p in daemons.items()}
                    ended = {w: code for w, code in codes.items() if code is not None}
                    raise RuntimeError(f"{exc} (servers that exited: {ended or 'none'})") from None
            targets = rotate if isinstance(rotate, list) else [rotate]
            return run_python(url, args.seconds, key, targets)

        figures: dict[str, dict[str, Any]] = {}
        for row in rows:
            path, script, targets = requests[row]
            bare_script = LUA_BARE_PATCH if targets else None
            seen: dict[str, list[float]] = {"before": [], "after": [], "bare": []}
            p99s: dict[str, list[float]] = {"before": [], "after": [], "bare": []}
            errors = {"before": 0.0, "after": 0.0}
            busy: dict[str, list[float]] = {"before": [], "after": []}
            # whose server each version's slices load: the daemons, or for "ceiling" the bare apps
            served = {"before": "before", "after": "after"}
            if row == "ceiling":
                served = {"before": "bare-before", "after": "bare"}
            for who in ("before", "after"):  # warm-up: page cache, first-use costs
                if targets:
                    reset_for_writes(stores[who], targets)
                url = f"http://127.0.0.1:{ports[served[who]]}{path}"
                load(url, paths.get(row, ""), ids["key"], script)
            for i in range(args.slices):
                ceiling = f"http://127.0.0.1:{ports['bare']}/ceiling"
                bare = load(ceiling, "", None, bare_script)
                seen["bare"].append(bare["rps"])
                p99s["bare"].append(bare["p99_ms"])
                for who in ("before", "after") if i % 2 == 0 else ("after", "before"):
                    if targets:  # every write a real change: both stores start each slice alike
                        reset_for_writes(stores[who], targets)
                    url = f"http://127.0.0.1:{ports[served[who]]}{path}"
                    pid = daemons[served[who]].pid
                    cpu, started = thread_cpu_seconds(pid), time.perf_counter()
                    result = load(url, paths.get(row, ""), ids["key"], script)
                    busy[who].append(
                        (thread_cpu_seconds(pid) - cpu) / (time.perf_counter() - started)
                    )
                    seen[who].append(result["rps"])
                    p99s[who].append(result["p99_ms"])
                    errors[who] += result["non_2xx"]
            median = {k: statistics.median(v) for k, v in seen.items()}
            p99 = {k: statistics.median(v) for k, v in p99s.items()}
            ratio = statistics.median(
                a / b for a, b in zip(seen["after"], seen["before"], strict=True)
            )
            figures[row] = {
                "rps": median,
                "ratio": ratio,
                "p99_ms": p99,
                "slices": seen,
                "p99_slices": p99s,
                "non_2xx": errors,
                "thread_busy": {k: statistics.median(v) for k, v in busy.items()},
                "thread_busy_slices": busy,
            }
        # Reads and writes that waited for the disk on the trio thread (db.py sends those
        # functions to threads for a second): a copy that was not all in the page cache.
        waits = {w: loop_disk_waits(f"http://127.0.0.1:{ports[w]}") for w in ("before", "after")}
    table = [
        (
            "row",
            "before / after req/s (median)",
            "shares of the ceiling; after / before (median); p99 ms (median slice); busy",
        )
    ]
    # With the ceiling row, each version's share of its own ceiling: the baseline's bare app
    # was loaded only in that row, so beside another row it is the working tree's bare app
    # there over the ceiling row's after / before.
    ceiling_ratio = figures["ceiling"]["ratio"] if "ceiling" in figures else None
    for row, f in figures.items():
        m, p = f["rps"], f["p99_ms"]
        extra = ""
        if ceiling_ratio is not None and row != "ceiling":
            own_before = m["before"] / (m["bare"] / ceiling_ratio)
            f["own_ceiling_shares"] = {"before": own_before, "after": m["after"] / m["bare"]}
            extra = (
                f"; of each version's own ceiling {own_before:.0%} -> {m['after'] / m['bare']:.0%}"
            )
        if any(f["non_2xx"].values()):
            extra += f"; non-2xx {f['non_2xx']}"
        table.append(
            (
                row,
                f"{m['before']:,.0f} / {m['after']:,.0f}",
                f"ceiling {m['bare']:,.0f}: {m['before'] / m['bare']:.0%} -> "
                f"{m['after'] / m['bare']:.0%}; x{f['ratio']:.3f}; p99 {p['before']:.0f} -> "
                f"{p['after']:.0f} (ceiling {p['bare']:.0f}); serving thread busy "
                f"{f['thread_busy']['before']:.0%} -> {f['thread_busy']['after']:.0%}{extra}",
            )
        )
    if levels["before"] != levels["after"]:
        table.append(("log levels", f"{levels['before']} / {levels['after']}", "log.level of each"))
    shown = {w: "n/a" if n is None else f"{n:.0f}" for w, n in waits.items()}
    table.append(("loop disk waits", f"{shown['before']} / {shown['after']}", "over the whole run"))
    report("ab", table, {"args": vars(args), "figures": figures, "loop_disk_waits": waits})
    return 0
