"""HTTP API speed: requests/s and latency per endpoint, beside the framework's ceiling.

Needs a store from ``python -m bench generate`` (``--data DIR``). Starts the daemon on it and the
bare quart-trio app (bench/bare.py) with the same hypercorn setup, then loads each endpoint with
``wrk`` (32 connections; Debian's package ``wrk``) or, where wrk is missing, a slower Python
driver (say so in the output: its figures are bounded by the driver). Writes go through Lua
scripts that change the title, the assignee and the status of many conversations in turn, so
every request is a real change (SYSTEM row + event + the change in one transaction).

Beside each endpoint: its share of the ceiling's requests/s, and the storage floor: the same
store function called directly on the same file, one thread, no HTTP (for a write, as the writer
process runs it: alone in its transaction, fsync included, and 32 to a transaction). The machines this runs on
are noisy (the ceiling alone moves by 20 % between runs), so the ceiling is measured right
before each endpoint, for the same time, and each share is against that neighbouring figure;
the table also shows the median of those ceilings. Beside each write, the bare app also answers
a PATCH whose small JSON body it reads and parses: what the framework alone makes of a write;
beside each read whose answer is over 2 KB, the bare app sends that many bytes of JSON: what the
framework (and wrk, on the same cores) make of a response that large.

The daemon runs at log level warning, so without its access log, unless ``--log-level`` says
otherwise: at info, the default, it also writes a line a request (to a file here).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import httpx

from bench import machine
from bench.common import (
    add_log_level,
    commits_between,
    daemon_metric,
    loop_disk_waits,
    offloaded_reads,
    report,
    search_indexes_up_to_date,
    thread_cpu_seconds,
    timed,
    write_buckets,
)
from bench.feed import free_port, start, wait_http
from inboxd.store import accounts, actions, conversations, messages, shards
from inboxd.store.db import (
    DISK_WAIT_LOG,
    Store,
    WriteRequest,
    db_path,
    run_batch,
    writer_connection,
)
from inboxd.store.warm import (
    files_of,
    memory_for_warming,
    read_through,
    store_bytes,
    worth_warming,
)

CONNECTIONS = 32

# The targets for this table's rows (BENCHMARKS.md, "Against the targets"):
# a row's requests/s over the ceiling measured beside it, by the start of the row's name.
SHARE_TARGETS: tuple[tuple[str, float], ...] = (
    ("list page", 0.60),
    ("read one", 0.85),
    ("counts", 0.85),
    ("write:", 0.70),
)
P99_TARGET_MS = 50.0  # at 32 connections; for every row with a share target
SEARCH_P99_TARGET_MS = 50.0  # one query at a time, in each channel searched
STARTUP_TARGET_SECONDS = 2.0


def share_target(name: str) -> float | None:
    return next((share for start, share in SHARE_TARGETS if name.startswith(start)), None)


def telling(value: float, limit: float, digits: int = 1, most: int = 4) -> int:
    """The fewest decimals, from ``digits``, at which ``value`` does not round to ``limit``, so
    that a figure shown beside its target shows the side of it that the strict verdict found:
    a share of 69.992 % is shown "69.99%" beside its MISSED against 70 %, not "70.0%". A value
    equal to its limit keeps ``digits``."""
    while digits < most and value != limit and round(value, digits) == round(limit, digits):
        digits += 1
    return digits


def standard_error(shares: list[float]) -> float | None:
    """How far a row's share may be off from its slices' noise alone: the standard error of
    the mean of its slices' shares (each slice's requests over the ceiling slice's beside it;
    the slices are of equal length). None for fewer than two slices. Printed beside the share
    as points, so that a share a point or two from its line can be read as what it is
    (BENCHMARKS.md, How to run: the runs' shares of a row spread about as much as this says)."""
    if len(shares) < 2:
        return None
    return statistics.stdev(shares) / math.sqrt(len(shares))


def slices_text(shares: list[float]) -> str:
    """The row's slices as its table shows them: their range and the standard error."""
    error = standard_error(shares)
    if error is None:
        return ""
    return f" (slices {min(shares):.0%}-{max(shares):.0%}; +-{error * 100:.1f} points)"


def _verdict(
    figure: str, value: float, shown: str, target: str, met: bool, **beside: object
) -> dict[str, Any]:
    return {
        "figure": figure,
        "value": value,
        "shown": shown,
        "target": target,
        "met": met,
        **beside,
    }


def verdicts(
    results: dict[str, dict[str, Any]],
    ceilings: dict[str, dict[str, Any]],
    startup: float,
    search: dict[str, dict[str, Any]],
    loop_waits: float | None = None,
) -> list[dict[str, Any]]:
    """Each target this run measured: what, its figure (and as shown), the target, and whether
    it was met. "Met" is strict and unrounded: a share of 84.99 % misses 85 %, a p99 of 50.0 ms
    misses "under 50 ms". A row's p99 verdict also carries the p99 of the ceiling measured beside
    it (``ceiling_p99_ms``) and whether that met the same target (``ceiling_met``): where the
    bare framework itself missed it, the target asked of the row more than the framework made
    beside it (BENCHMARKS.md, "Against the issue's targets"). ``loop_waits``: the daemon's
    count of reads and writes on the trio thread that waited for the disk, over the run (None
    where it was not read): "no request ever waits on another's disk I/O on the loop" is 0."""
    limit = STARTUP_TARGET_SECONDS
    out = [
        _verdict(
            "start-up until /readyz", startup, f"{startup:.2f} s", f"< {limit:g} s", startup < limit
        )
    ]
    for name, r in results.items():
        share = share_target(name)
        if share is None:
            continue
        ratio, p99 = r["rps"] / ceilings[name]["rps"], r["p99_ms"]
        out.append(
            _verdict(
                f"{name}: share of the ceiling",
                ratio,
                f"{ratio:.{telling(ratio * 100, share * 100)}%}",
                f">= {share:.0%}",
                ratio >= share,
            )
        )
        theirs = ceilings[name].get("p99_ms")
        out.append(
            _verdict(
                f"{name}: p99",
                p99,
                f"{p99:.{telling(p99, P99_TARGET_MS)}f} ms",
                f"< {P99_TARGET_MS:g} ms",
                p99 < P99_TARGET_MS,
                ceiling_p99_ms=theirs,
                ceiling_met=None if theirs is None else theirs < P99_TARGET_MS,
            )
        )
    if loop_waits is not None:
        out.append(
            _verdict(
                "loop disk waits over the run",
                loop_waits,
                f"{loop_waits:.0f}",
                "0",
                loop_waits == 0,
            )
        )
    for size, figures in search.items():
        p99 = figures["p99_ms"]
        out.append(
            _verdict(
                f"search p99, {size} channel",
                p99,
                f"{p99:.{telling(p99, SEARCH_P99_TARGET_MS)}f} ms",
                f"< {SEARCH_P99_TARGET_MS:g} ms",
                p99 < SEARCH_P99_TARGET_MS,
            )
        )
    return out


def _verdict_text(v: dict[str, Any]) -> str:
    theirs = v.get("ceiling_p99_ms")
    beside = "" if theirs is None else f", the ceiling beside it {theirs:.1f} ms"
    return f"{v['figure']} {v['shown']} (target {v['target']}{beside})"


def ceiling_over_too(targets: list[dict[str, Any]]) -> str:
    """How many of the p99 misses came beside a ceiling whose own p99 missed the target too
    ("" if none did)."""
    missed = [v for v in targets if not v["met"] and "ceiling_met" in v]
    theirs = [v for v in missed if v["ceiling_met"] is False]
    if not theirs:
        return ""
    return (
        f"; {len(theirs)} of the {len(missed)} p99 misses {'was' if len(theirs) == 1 else 'were'}"
        " beside a ceiling whose own p99 missed the target too"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="a store made by 'python -m bench generate'")
    p.add_argument(
        "--seconds",
        type=float,
        default=24.0,
        help="load per endpoint, in slices of about 3 s, each beside a slice of the ceiling (24:"
        " eight slices; BENCHMARKS.md, How to run, says why so many)",
    )
    p.add_argument("--driver", choices=["auto", "wrk", "python"], default="auto")
    p.add_argument(
        "--only",
        default="",
        help="run only the rows whose name contains one of these comma-separated words",
    )
    p.add_argument(
        "--no-read-through",
        dest="read_through",
        action="store_false",
        help="do not read the store into the page cache before each row (see BENCHMARKS.md)",
    )
    p.add_argument(
        "--machine-seconds",
        type=float,
        default=3.0,
        help="bench machine's idle probe before and after the rows, seconds (3; 0: none)",
    )
    add_log_level(p, "the daemon's")


def store_in_memory(data: Path) -> dict[str, Any]:
    """The store's size (the database and its WAL), the memory the daemon may keep it in, and
    whether it will (store/warm.py's own reckoning: a store of at most half the memory
    available). The targets' runs in BENCHMARKS.md had the store held; every run's write rows
    grow it (their SYSTEM messages and events), so a store used for many runs may outgrow
    that, and then its reads come from the disk."""
    size = store_bytes(files_of(db_path(data)))
    available = memory_for_warming()
    return {
        "store_bytes": size,
        "available_bytes": available,
        "held": worth_warming(size, available),
    }


def _bytes(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def store_in_memory_note(fit: dict[str, Any]) -> str:
    """``store_in_memory``'s answer, as the table says it."""
    size = f"{_bytes(fit['store_bytes'])} with its WAL"
    if fit["available_bytes"] is None:
        return f"{size}; the memory available is not known here, so it is not held in memory"
    limit = f"{size}; the daemon holds at most half the {_bytes(fit['available_bytes'])} available"
    if fit["held"]:
        return f"{limit}: held in memory"
    return (
        f"{limit}: NOT held, so reads may wait for the disk (a cold store's figures; each run's"
        " writes grow the store: `bench generate` makes a fresh one, BENCHMARKS.md, How to run)"
    )


def pick(data: Path) -> dict[str, Any]:
    """Ids the requests use: the largest channel, conversations in it, search words."""
    conn = sqlite3.connect(db_path(data))
    largest_pk, largest = conn.execute(
        "SELECT c.channel_pk, ch.id FROM conversation_counts c JOIN channels ch"
        " ON ch.pk = c.channel_pk GROUP BY c.channel_pk ORDER BY sum(n) DESC LIMIT 1"
    ).fetchone()
    convs = [
        r[0]
        for r in conn.execute(
            "SELECT id FROM conversations WHERE channel_pk = ? ORDER BY sort_at DESC LIMIT 2000",
            (largest_pk,),
        )
    ]
    open_convs = [
        r[0]
        for r in conn.execute(
            "SELECT id FROM conversations WHERE channel_pk = ? AND status = 'OPEN'"
            " ORDER BY sort_at DESC LIMIT 1000",
            (largest_pk,),
        )
    ]
    # History pages of 50 messages: the channel's most recent conversations that hold more
    # than 50 messages other than SYSTEM ones, and that no write row changes. Most conversations
    # hold fewer (the store's average is 10): until the forty-second session the row read those
    # of ``convs``, whose pages held 14 messages on average on a store just built and 50 once
    # the write rows of one run had added their SYSTEM messages, so the same row cost the
    # serving thread 1.8x as much from the second run on (bench/HISTORY.md).
    # A small store (CI's) may have too few such conversations: then the fullest of the rest.
    writes_change = set(convs[:1000]) | set(open_convs)
    held = (  # its messages other than SYSTEM ones, counted up to 51
        "(SELECT count(*) FROM (SELECT 1 FROM messages m"
        " WHERE m.conversation_pk = c.pk AND m.is_system = 0 LIMIT 51))"
    )
    history_convs: list[str] = []
    for query in (  # (each walked only as far as it takes)
        f"SELECT c.id FROM conversations c WHERE c.channel_pk = ? AND {held} = 51"
        " ORDER BY c.sort_at DESC",
        f"SELECT c.id FROM conversations c WHERE c.channel_pk = ? ORDER BY {held} DESC,"
        " c.sort_at DESC",
    ):
        for (conversation,) in conn.execute(query, (largest_pk,)):
            if len(history_convs) == 500:
                break
            if conversation not in writes_change:
                writes_change.add(conversation)  # (taken: not again from the second query)
                history_convs.append(conversation)
    history_convs = history_convs or convs[:500]  # (every one of them written to)
    owner_id = conn.execute("SELECT id FROM users WHERE role = 'OWNER'").fetchone()[0]
    by_size = [
        (r[0], r[1])
        for r in conn.execute(
            "SELECT ch.id, t.n FROM channel_conversation_totals t JOIN channels ch"
            " ON ch.pk = t.channel_pk WHERE t.n > 0 ORDER BY t.n DESC"
        )
    ]
    conn.close()
    info = json.loads((data / "bench.json").read_text())
    return {
        "channel": largest,
        "conversations": convs,
        "history_conversations": history_convs,
        # Status writes close then reopen these, so every request is a real change.
        "open_conversations": open_convs,
        "owner_id": owner_id,
        # For search latency: the largest channel, the median one and the smallest.
        "search_channels": {
            "largest": by_size[0],
            "median": by_size[len(by_size) // 2],
            "smallest": by_size[-1],
        },
        "key": info["ownerKey"],
        # Words, names, a phrase and digits that match in every channel; and phrases of common
        # words that match little or nothing ("order refund": both words are frequent, never
        # side by side), which must read the whole channel's part of the index to say so: the
        # slowest kind of search there is (bench/HISTORY.md, twenty-second session).
        "queries": [
            "order",
            "refund",
            "delivery address",
            "Hopper",
            "invoice",
            "Schulz",
            "4915",
            "order refund",
            "please help",
            "the order",
        ],
    }


LUA_ROTATE = """
local paths = {%s}
local i = 0
request = function()
  i = i + 1
  return wrk.format(nil, paths[(i %% #paths) + 1])
end
"""

LUA_WRITE = """
local ids = {%s}
local kind = "%s"
local owner = "%s"
-- Each of wrk's two threads has its own Lua state and counter: give each its own half of the
-- ids (every other one), so the threads never race on one conversation (which would turn
-- requests into 409s and no-ops), also past the end of the list when it is of odd length.
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
local i = 0
request = function()
  local mine = math.floor((#ids - tid + 1) / 2)
  if mine < 1 then mine, tid = #ids, 0 end -- a single id: the threads share it
  local n = i * 2 + tid
  local id = ids[(i %% mine) * 2 + tid + 1]
  local round = math.floor(i / mine)
  i = i + 1
  local body
  local method = "PATCH"
  local path = "/api/v1/inbox/conversations/" .. id .. "/" .. kind
  if kind == "title" then
    body = '{"title": "t' .. n .. '"}'
  elseif kind == "status" then
    if round %% 2 == 0 then body = '{"status": "CLOSED"}' else body = '{"status": "OPEN"}' end
  elseif kind == "block" then
    method = "POST"
    body = "{}"
    if round %% 2 == 1 then path = "/api/v1/inbox/conversations/" .. id .. "/unblock" end
  else
    if round %% 2 == 0 then body = '{"userId": "' .. owner .. '"}' else body = '{"userId": null}' end
  end
  local headers = {}
  for k, v in pairs(wrk.headers) do headers[k] = v end
  headers["Content-Type"] = "application/json"
  return wrk.format(method, path, headers, body)
end
"""


LUA_BARE_PATCH = """
local i = 0
request = function()
  i = i + 1
  return wrk.format("PATCH", nil, {["Content-Type"] = "application/json"}, '{"title": "t' .. i .. '"}')
end
"""


def commits_text(commits: dict[str, Any], kind: str = "COMMIT", note: str = " (fsync)") -> str:
    """A write row's COMMITs as the table shows them (or, with ``kind``, its checkpointer's
    RESTARTs, from the same kind of histogram)."""
    count, within = commits["count"], commits["all_within_ms"]
    if not count:
        return f"no {kind}"
    longest = "some over 1 s" if within is None else f"all within {within:g} ms"
    return (
        f"{count:,} {kind}{'s' if count > 1 else ''}{note}, {longest}:"
        f" {commits['over_50_ms']:,} over 50 ms, {commits['over_100_ms']:,} over 100 ms"
    )


RESTART_TEXT: Final = {"kind": "RESTART", "note": " (the checkpointer's, writes held)"}


def reset_for_writes(data: Path, conversation_ids: list[str]) -> None:
    """Open, unassign and unblock the conversations a write script starts on, so that its first
    round of changes are real changes (the store allows another writer)."""
    conn = sqlite3.connect(db_path(data), timeout=30)
    marks = ",".join("?" * len(conversation_ids))
    with conn:
        conn.execute(
            "UPDATE conversations SET status = 'OPEN', assigned_to_pk = NULL, is_blocked = 0"
            f" WHERE id IN ({marks})"
            " AND (status <> 'OPEN' OR assigned_to_pk IS NOT NULL OR is_blocked <> 0)",
            conversation_ids,
        )
    conn.close()


# Appended to a wrk script when the caller wants the latency histogram: every distinct latency
# (wrk keeps them to the microsecond) and how many requests took it, one line each after the
# summary. Slices merged this way give the percentiles of all their requests (``combine``).
LUA_HISTOGRAM = """
done = function(summary, latency, requests)
  for i = 1, #latency do
    local us, n = latency(i)
    io.write(string.format("latency-us %d %d\\n", us, n))
  end
end
"""
_HISTOGRAM_LINE = re.compile(r"^latency-us (\d+) (\d+)$", re.M)


def run_wrk(
    url: str,
    seconds: float,
    key: str | None,
    script: str | None,
    connections: int = CONNECTIONS,
    histogram: bool = False,
) -> dict[str, Any]:
    """One wrk run: requests/s, p50 / p99 as wrk prints them, non-2xx answers; and with
    ``histogram`` the latencies themselves (``{microseconds: requests}``)."""
    cmd = ["wrk", f"-t{min(2, connections)}", f"-c{connections}", f"-d{seconds:.0f}s", "--latency"]
    if key:
        cmd += ["-H", f"Authorization: Bearer {key}"]
    if histogram:
        script = (script or "") + LUA_HISTOGRAM
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(script or "")
    if script:
        cmd += ["-s", fh.name]
    done = subprocess.run([*cmd, url], capture_output=True, text=True)
    Path(fh.name).unlink()
    if done.returncode != 0:  # say why (a Lua error, no connection) rather than only the status
        said = (done.stderr + done.stdout).strip()[-2000:]
        raise RuntimeError(f"wrk on {url} exited with {done.returncode}: {said}")
    out = done.stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    lat = {}
    for q, value, unit in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M):
        lat[q] = float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    figures: dict[str, Any] = {
        "rps": rps,
        "p50_ms": lat.get("50", 0.0),
        "p99_ms": lat.get("99", 0.0),
        "non_2xx": float(non2xx.group(1)) if non2xx else 0.0,
    }
    if histogram:
        figures["histogram"] = {int(us): int(n) for us, n in _HISTOGRAM_LINE.findall(out)}
    return figures


def run_python(
    url: str,
    seconds: float,
    key: str | None,
    paths: list[str] | None,
    connections: int = CONNECTIONS,
    method: str = "GET",
    body: Callable[[int], bytes] | None = None,
    histogram: bool = False,
) -> dict[str, Any]:
    """A plain driver for machines without wrk (CI's smoke run): GETs, or ``method`` with
    ``body(i)`` as the i-th request's JSON body. ``histogram`` as for ``run_wrk``."""
    import trio

    latencies: list[float] = []
    failed = 0

    async def worker(client: httpx.AsyncClient, deadline: float, offset: int) -> None:
        nonlocal failed
        i = offset
        while time.perf_counter() < deadline:
            path = paths[i % len(paths)] if paths else ""
            t = time.perf_counter()
            if body is None:
                answer = await client.request(method, url + path)
            else:
                content, kind = body(i), {"Content-Type": "application/json"}
                answer = await client.request(method, url + path, content=content, headers=kind)
            latencies.append(time.perf_counter() - t)
            failed += not answer.is_success
            i += 1

    async def main() -> float:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with httpx.AsyncClient(headers=headers, timeout=30) as client:
            started = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for w in range(connections):
                    nursery.start_soon(worker, client, started + seconds, w)
            return time.perf_counter() - started

    took = trio.run(main)
    latencies_us = dict(Counter(round(t * 1e6) for t in latencies))
    figures: dict[str, Any] = {
        "rps": len(latencies) / took,
        "p50_ms": percentile_ms(latencies_us, 50),
        "p99_ms": percentile_ms(latencies_us, 99),
        "non_2xx": float(failed),
    }
    if histogram:
        figures["histogram"] = latencies_us
    return figures


def percentile_ms(histogram: dict[int, int], q: float) -> float:
    """The ``q``-th percentile (0-100) of the latencies in ``histogram`` ({us: requests}), in
    ms, ranked as wrk ranks its own (``stats_percentile``: the request at rank
    ``round(q / 100 * N + 0.5)`` of N, that is ``floor(q / 100 * N) + 1``, at most N)."""
    total = sum(histogram.values())
    if total == 0:
        return 0.0
    rank, seen = min(total, math.floor(q / 100 * total) + 1), 0
    for us in sorted(histogram):
        seen += histogram[us]
        if seen >= rank:
            return us / 1000
    return max(histogram) / 1000


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Slices of one measurement: mean requests/s; p50 and p99 of all the slices' requests
    together where every slice kept its latencies (``histogram``), else the median slice's p50
    and the worst slice's p99; ``percentiles_of`` says which. The median slice's p50 and the
    worst slice's p99 are kept beside them (how the sessions before the seventeenth reported
    them)."""
    p50s = sorted(r["p50_ms"] for r in runs)
    median_p50, worst_p99 = p50s[len(p50s) // 2], max(r["p99_ms"] for r in runs)
    figures = {
        "rps": sum(r["rps"] for r in runs) / len(runs),
        "p50_ms": median_p50,
        "p99_ms": worst_p99,
        "non_2xx": sum(r["non_2xx"] for r in runs),
        "median_slice_p50_ms": median_p50,
        "worst_slice_p99_ms": worst_p99,
        "percentiles_of": "the slices",
    }
    if all("thread_cpu_us" in r for r in runs):  # the serving thread's CPU a request
        figures["thread_cpu_us"] = sum(r["thread_cpu_us"] for r in runs) / len(runs)
    if all(r.get("histogram") for r in runs):
        merged: Counter[int] = Counter()
        for r in runs:
            merged.update(r["histogram"])
        figures["p50_ms"] = percentile_ms(merged, 50)
        figures["p99_ms"] = percentile_ms(merged, 99)
        figures["percentiles_of"] = "all requests"
    return figures


def search_latency(data: Path, ids: dict[str, Any], rounds: int = 15) -> dict[str, Any]:
    """Search one query at a time in the largest, the median and the smallest channel: every
    query of the list ``rounds`` times each, timed at the store (the API adds its ~1 ms).

    The first run of each query is kept apart: it may read its index pages from the disk, and
    whether it does depends on what the OS cache holds after the previous benchmarks (copies of
    the store evict it), which made the p99 of the smallest channel swing from 28 to 53 ms
    between two runs. p50 and p99 are of the other runs; the slowest first run is reported."""
    store = Store.open(data, readers=1)
    out: dict[str, Any] = {}
    try:
        who = store.read_sync(accounts.authenticate, ids["key"])
        for size, (channel, _) in ids["search_channels"].items():
            times: list[float] = []
            per_query: dict[str, float] = {}
            first: dict[str, float] = {}
            for query in ids["queries"]:
                mine = []
                for _ in range(rounds + 1):
                    started = time.perf_counter()
                    store.read_sync(conversations.search, who, channel, query, 50)
                    mine.append((time.perf_counter() - started) * 1000)
                first[query] = mine.pop(0)
                per_query[query] = max(mine)
                times += mine
            times.sort()
            channel_pk = store.read_sync(
                lambda c, i: c.execute("SELECT pk FROM channels WHERE id = ?", (i,)).fetchone()[0],
                channel,
            )
            out[size] = {
                # Searched in an index of its own (store/shards.py), else in the shared one.
                "own_index": store.read_sync(shards.has_ready_shard, channel_pk),
                "p50_ms": times[len(times) // 2],
                "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))],
                "slowest_ms_by_query": per_query,
                "first_run_ms_by_query": first,
                "slowest_first_run_ms": max(first.values()),
            }
    finally:
        store.close()
    return out


def floor_us(data: Path, ids: dict[str, Any], fn: Any, *args: Any, repeat: int = 300) -> float:
    """Microseconds per call of a store function, directly on the file."""
    store = Store.open(data, readers=1)
    try:
        who = store.read_sync(accounts.authenticate, ids["key"])
        started = time.perf_counter()
        for i in range(repeat):
            store.read_sync(fn, who, *[a(i) if callable(a) else a for a in args])
        return (time.perf_counter() - started) / repeat * 1e6
    finally:
        store.close()


def write_call(
    kind: str, who: Any, conversation: str, round_: int, owner_id: str, n: int
) -> tuple[Any, tuple[Any, ...]]:
    """The store function and arguments of one write of ``kind``, as the route calls it (its
    answer encoded where it runs) with the arguments the Lua scripts make: each round over the
    conversations changes them one way, the next round back."""
    now = time.time_ns() // 1000
    if kind == "title":
        return actions.RENAME_ANSWERED, (who, conversation, f"floor {n}", now)
    if kind == "status":
        status = "CLOSED" if round_ % 2 == 0 else "OPEN"
        return actions.SET_STATUS_ANSWERED, (who, conversation, status, now)
    if kind == "assignee":
        user = owner_id if round_ % 2 == 0 else None
        return actions.ASSIGN_ANSWERED, (who, conversation, user, now)
    return actions.SET_BLOCKED_ANSWERED, (who, conversation, round_ % 2 == 0, now)


def write_floor_us(
    data: Path,
    ids: dict[str, Any],
    kind: str,
    targets: list[str],
    writes: int = 256,
    batch: int = 32,
) -> dict[str, float]:
    """Microseconds per write of ``kind`` at the store, directly on the file, as the writer
    process runs them (db.run_batch on a connection of its own): each write alone in its
    transaction (its COMMIT's fsync included), and ``batch`` writes to a transaction, as group
    commit makes them under load."""
    reset_for_writes(data, targets)
    store = Store.open(data, readers=1)
    conn = writer_connection(store.path)
    conn.execute("PRAGMA wal_autocheckpoint = 0")  # as in the writer process (the daemon's
    try:  # checkpointer does that work, apart)
        who = store.read_sync(accounts.authenticate, ids["key"])
        n = 0

        def requests(count: int) -> list[WriteRequest]:
            nonlocal n
            out = []
            for _ in range(count):
                fn, fn_args = write_call(
                    kind, who, targets[n % len(targets)], n // len(targets), ids["owner_id"], n
                )
                out.append(WriteRequest(fn, fn_args))
                n += 1
            return out

        def timed_batches(size: int) -> float:
            batches = [requests(size) for _ in range(writes // size)]
            started = time.perf_counter()
            for b in batches:
                run_batch(conn, b)
            elapsed = time.perf_counter() - started
            failed = [r.error for b in batches for r in b if r.error is not None]
            if failed:
                raise RuntimeError(f"write floor ({kind}): {failed[0]!r}")
            return elapsed / (len(batches) * size) * 1e6

        return {"alone": timed_batches(1), f"batches of {batch}": timed_batches(batch)}
    finally:
        conn.close()
        store.close()
        reset_for_writes(data, targets)


def disk_waits_logged(log: bytes) -> list[tuple[str, int | None]]:
    """The daemon's log lines for its loop disk waits, in order (one line a JSON object; other
    lines are passed over): the function each names, and the trio thread's major page faults
    by then (None from a revision that did not log them)."""
    out = []
    for line in log.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("msg") == DISK_WAIT_LOG:
            faults = entry.get("major_faults")
            out.append((str(entry.get("function")), faults if isinstance(faults, int) else None))
    return out


def run(args: argparse.Namespace) -> int:
    data = Path(args.data)
    search_indexes_up_to_date(data)
    fit = store_in_memory(data)
    if not fit["held"]:  # (said before the run's minutes, so that it can be stopped)
        print(f"bench http: the store is {store_in_memory_note(fit)}", file=sys.stderr)
    ids = pick(data)
    driver = args.driver
    if driver == "auto":
        driver = "wrk" if shutil.which("wrk") else "python"
    convs = ids["conversations"]
    history = ids["history_conversations"]
    ch = ids["channel"]
    q = ids["queries"]
    reads: list[tuple[str, list[str], Any]] = [
        ("list page (50)", ["/api/v1/inbox/conversations?limit=50"],
         (conversations.list_page_json, conversations.ListQuery(limit=50))),
        ("list page, channel+OPEN", [f"/api/v1/inbox/conversations?limit=50&channelId={ch}&status=OPEN"],
         (conversations.list_page_json, conversations.ListQuery(limit=50, channel_id=ch, status="OPEN"))),
        ("list page, tab=unassigned", ["/api/v1/inbox/conversations?limit=50&tab=unassigned"],
         (conversations.list_page_json, conversations.ListQuery(limit=50, tab="unassigned"))),
        ("read one", [f"/api/v1/inbox/conversations/{c}" for c in convs[:500]],
         (conversations.get_json, lambda i: convs[i % 500])),
        ("counts", ["/api/v1/inbox/conversations/counts"], (conversations.counts, None)),
        ("search (largest channel)", [f"/api/v1/inbox/conversations/search?channelId={ch}&query={w.replace(' ', '%20')}" for w in q],
         (conversations.search, ch, lambda i: q[i % len(q)], 50)),
        ("history page (50)", [f"/api/v1/inbox/conversations/{c}/messages?limit=50" for c in history],
         (messages.history_json, lambda i: history[i % len(history)], "all", 50, None)),
    ]  # fmt: skip
    writes = ["title", "status", "assignee", "block"]  # block: block and unblock in turn
    # How steadily the machine ran fixed work, before the rows and after (bench/machine.py): a
    # row's p99 is read beside it.
    steadiness = (
        {"before": machine.idle_probe(args.machine_seconds)} if args.machine_seconds else {}
    )
    port, bare_port = free_port(), free_port()
    # Start-up on this store: from launching the process until /readyz answers (imports,
    # opening and migrating the store, the supervisors and deliverers started).
    launched = time.perf_counter()
    # The daemon's log (warnings up, unless --log-level), kept so that a loop disk wait can say
    # what it was: a wait is a warning where the store is held in memory (as it is here), info
    # where it is not.
    daemon_log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally, with the daemon)
    daemon = start(
        ["-m", "inboxd", "serve", "--data", str(data), "--bind", f"127.0.0.1:{port}"],
        {"INBOXD_LIMITS_REQUESTS_PER_SECOND": "0", "INBOXD_LOG_LEVEL": args.log_level},
        log=daemon_log,
    )
    results: dict[str, dict[str, Any]] = {}
    ceilings: dict[str, dict[str, Any]] = {}
    patch_ceilings: dict[str, dict[str, Any]] = {}
    sized_ceilings: dict[str, dict[str, Any]] = {}
    sizes: dict[str, int] = {}
    slice_shares: dict[str, list[float]] = {}
    read_seconds: dict[str, float] = {}
    write_targets: dict[str, list[str]] = {}
    row_waits: dict[str, float] = {}  # loop disk waits while each row ran (its warm-up too)
    row_offloaded: dict[str, float] = {}  # reads run in worker threads while each row ran
    # A write row's batches' COMMITs (the WAL's fsync) over its recorded slices: a disk that
    # stalls holds every write of the batch, and those queued behind it, for as long.
    row_commits: dict[str, dict[str, Any]] = {}
    # And its checkpointer's RESTARTs, each holding new writes back while it ran (a revision
    # before the forty-second session's does not time them).
    row_restarts: dict[str, dict[str, Any]] = {}
    bare = None
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/readyz")
        startup = time.perf_counter() - launched
        bare = start(["-m", "bench.bare", str(bare_port)])
        wait_http(f"http://127.0.0.1:{bare_port}/healthz")

        def load(
            url: str, paths: list[str] | None, key: str | None, script: str | None, seconds: float
        ) -> dict[str, Any]:
            if driver == "wrk":
                if script is None and paths and len(paths) > 1:
                    script = LUA_ROTATE % ", ".join(json.dumps(p) for p in paths)
                    return run_wrk(url, seconds, key, script, histogram=True)
                path = url + (paths[0] if paths else "")
                return run_wrk(path, seconds, key, script, histogram=True)
            return run_python(url, seconds, key, paths, histogram=True)

        ceiling_url = f"http://127.0.0.1:{bare_port}/ceiling"
        bare_pid = bare.pid

        def on_cpu(
            pid: int,
            url: str,
            paths: list[str] | None,
            key: str | None,
            script: str | None,
            seconds: float,
        ) -> dict[str, Any]:
            """``load``, with the serving thread's CPU time a request (its main thread, /proc):
            what each request cost the server, beside requests/s, which the machine's other
            work moves too."""
            cpu = thread_cpu_seconds(pid)
            result = load(url, paths, key, script, seconds)
            if result["rps"] > 0:
                spent = thread_cpu_seconds(pid) - cpu
                result["thread_cpu_us"] = spent / (result["rps"] * seconds) * 1e6
            return result

        def measure(
            name: str, paths: list[str] | None, script: str | None, reset: list[str] | None = None
        ) -> None:
            """Alternate the ceiling and the endpoint in short slices; sum them up. First the
            store is read through, so that each row starts from a warm page cache: on a
            machine that pages out what was not touched for a while (BENCHMARKS.md, The
            machine), a row otherwise pays for the rows before it having moved elsewhere.
            Then one slice of the row's own load, not recorded (as ``bench ab`` does): the
            first write row's first slice made 47-74 % of the ceiling in five full runs of
            the twelfth to fourteenth sessions against 61-82 % for its later ones
            (bench/HISTORY.md, fourteenth session), the writer child having sat idle through
            every read row before it."""
            if args.read_through:
                store_files = [db_path(data), Path(f"{db_path(data)}-wal")]
                read_seconds[name] = round(timed(read_through, store_files), 2)
            waits_before = loop_disk_waits(base)
            offloaded_before = offloaded_reads(base)
            slices = max(1, int(args.seconds // 3))
            each = max(1.0, args.seconds / slices)
            mine, theirs, patches, sized = [], [], [], []
            size = 0
            if paths:  # a read: also the bare app answering with as many bytes, for context
                first = httpx.get(
                    base + paths[0], headers={"Authorization": f"Bearer {ids['key']}"}
                )
                size = len(first.content)
                sizes[name] = size
            if reset:
                reset_for_writes(data, reset)
            load(base, paths, ids["key"], script, each)  # warm-up, not recorded
            commits_before, restarts_before = write_buckets(base) if reset else (None, None)
            for _ in range(slices):
                theirs.append(on_cpu(bare_pid, ceiling_url, None, None, None, each))
                if size > 2048:
                    sized.append(load(f"{ceiling_url}/{size}", None, None, None, each))
                if reset:  # a write: also the bare app reading a JSON body, for context
                    patches.append(on_cpu(bare_pid, ceiling_url, None, None, LUA_BARE_PATCH, each))
                    reset_for_writes(data, reset)
                mine.append(on_cpu(daemon.pid, base, paths, ids["key"], script, each))
            ceilings[name] = combine(theirs)
            if patches:
                patch_ceilings[name] = combine(patches)
            if sized:
                sized_ceilings[name] = combine(sized)
            results[name] = combine(mine)
            # Each slice over the ceiling's slice just before it: how far the machine moved the
            # share within the row (the share itself is of the sums, above).
            slice_shares[name] = [
                m["rps"] / t["rps"] for m, t in zip(mine, theirs, strict=True) if t["rps"] > 0
            ]
            waits_after = loop_disk_waits(base)
            if waits_before is not None and waits_after is not None:
                row_waits[name] = waits_after - waits_before
            offloaded_after = offloaded_reads(base)
            if offloaded_before is not None and offloaded_after is not None:
                row_offloaded[name] = offloaded_after - offloaded_before
            if reset:
                commits_after, restarts_after = write_buckets(base)
                if commits_before is not None and commits_after is not None:
                    row_commits[name] = commits_between(commits_before, commits_after)
                if restarts_before is not None and restarts_after is not None:
                    row_restarts[name] = commits_between(restarts_before, restarts_after)

        def wanted(name: str) -> bool:
            words = [w.strip() for w in args.only.split(",") if w.strip()]
            return not words or any(w in name for w in words)

        for name, paths, _ in reads:
            if wanted(name):
                measure(name, paths, None)
        for kind in writes:
            if wanted(f"write: {kind}"):
                targets = ids["open_conversations"] if kind == "status" else convs[:1000]
                write_targets[f"write: {kind}"] = targets
        if driver == "wrk":  # (the Python driver cannot run the write scripts)
            for name, targets in write_targets.items():
                kind = name.removeprefix("write: ")
                id_list = ", ".join(json.dumps(c) for c in targets)
                script = LUA_WRITE % (id_list, kind, ids["owner_id"])
                measure(f"write: {kind}", None, script, reset=targets)
        waits = loop_disk_waits(base)
        kept = daemon_metric(base, "inboxd_store_in_memory")
    finally:
        try:
            daemon.terminate()
            daemon.wait(15)
            if bare is not None:
                bare.terminate()
                bare.wait(15)
        finally:
            daemon_log.seek(0)
            waited_in = disk_waits_logged(daemon_log.read())
            daemon_log.close()
    floors = {name: floor_us(data, ids, *spec) for name, _, spec in reads if name in results}
    write_floors = {
        name: write_floor_us(data, ids, name.removeprefix("write: "), targets)
        for name, targets in write_targets.items()
    }
    search = search_latency(data, ids)
    if steadiness:
        steadiness["after"] = machine.idle_probe(args.machine_seconds)
    targets = verdicts(results, ceilings, startup, search, waits)
    by_figure = {v["figure"]: v for v in targets}

    def mark(figure: str) -> str:
        """'target X: met' (or MISSED) for a figure held to a target."""
        v = by_figure[figure]
        text = f"target {v['target']}: {'met' if v['met'] else 'MISSED'}"
        if v.get("ceiling_p99_ms") is not None:
            text += f", the ceiling's own {v['ceiling_p99_ms']:.1f} ms"
        return text

    def p99_shown(name: str, r: dict[str, Any]) -> str:
        held = by_figure.get(f"{name}: p99")
        return held["shown"].removesuffix(" ms") if held else f"{r['p99_ms']:.1f}"

    median = sorted(c["rps"] for c in ceilings.values())[len(ceilings) // 2] if ceilings else 0.0
    rows = [
        (
            "endpoint",
            "req/s  p50 / p99 ms",
            "ceiling before it; share (its slices; the standard error); store floor",
        ),
        ("ceiling (median)", f"{median:,.0f}", ""),
        (
            "start-up until /readyz",
            f"{startup:.2f} s",
            mark("start-up until /readyz"),
        ),
        (
            "the store, as the run began",
            "held" if fit["held"] else "NOT held",
            store_in_memory_note(fit),
        ),
        (
            "the daemon's log level",
            args.log_level,
            "an access-log line a request"
            + (" (the default level)" if args.log_level == "info" else "")
            if args.log_level in ("debug", "info")
            else "no access log (the default, info, writes a line a request: --log-level info)",
        ),
    ]
    for name, r in results.items():
        ceiling = ceilings[name]["rps"]
        # As the verdict shows it where there is one: to as many decimals as tell its side.
        held = by_figure.get(f"{name}: share of the ceiling")
        shown = held["shown"] if held else f"{r['rps'] / ceiling:.1%}"
        share = f"{ceiling:,.0f}; {shown}"
        share += slices_text(slice_shares.get(name, []))
        floor = f"; floor {floors[name]:.0f} us" if name in floors else ""
        errors = f"; {r['non_2xx']:.0f} non-2xx" if r["non_2xx"] else ""
        if share_target(name) is not None:
            share += f" ({mark(f'{name}: share of the ceiling')}; p99 {mark(f'{name}: p99')})"
        if name in sized_ceilings:
            same = sized_ceilings[name]["rps"]
            floor += (
                f"; bare {sizes[name] / 1024:.0f} KB {same:,.0f} ({same / ceiling:.0%} of the"
                f" ceiling): this {r['rps'] / same:.0%} of it"
            )
        if name in patch_ceilings:
            patch = patch_ceilings[name]["rps"]
            floor = (
                f"; bare PATCH {patch:,.0f} ({patch / ceiling:.0%} of the ceiling):"
                f" this {r['rps'] / patch:.0%} of it"
            )
        if name in write_floors:
            alone, batched = write_floors[name].values()
            floor += f"; floor {alone:.0f} us alone, {batched:.0f} us batched"
        if name in row_commits:
            floor += "; " + commits_text(row_commits[name])
        if name in row_restarts:
            floor += "; " + commits_text(row_restarts[name], **RESTART_TEXT)
        if "thread_cpu_us" in r and "thread_cpu_us" in ceilings[name]:
            floor += (
                f"; serving thread {r['thread_cpu_us']:.0f} us a request (ceiling's"
                f" {ceilings[name]['thread_cpu_us']:.0f}"
            )
            if "thread_cpu_us" in patch_ceilings.get(name, {}):
                floor += f", bare PATCH's {patch_ceilings[name]['thread_cpu_us']:.0f}"
            floor += ")"
        rows.append(
            (
                name,
                f"{r['rps']:,.0f}  {r['p50_ms']:.1f} / {p99_shown(name, r)}",
                share + floor + errors,
            )
        )
    for name, figures in write_floors.items():
        if name not in results:  # (not loaded over HTTP without wrk)
            alone, batched = figures.values()
            rows.append(
                (f"{name}, store floor only", "", f"{alone:.0f} us alone, {batched:.0f} us batched")
            )
    if read_seconds:
        rows.append(
            (
                "store read through before each row",
                f"{min(read_seconds.values()):.1f}-{max(read_seconds.values()):.1f} s",
                "a warm page cache for each row (--no-read-through: as the previous rows left it)",
            )
        )
    if waits is not None:
        where = ""  # (a revision before inboxd_store_in_memory: not said)
        if kept is not None:
            where = f"; at the end the store was {'' if kept else 'not '}held in memory"
        if waits:  # where they came, and what they were (as far as the log at warning says)
            during = [f"{n:.0f} in {name}" for name, n in row_waits.items() if n]
            outside = waits - sum(row_waits.values())
            if outside:
                during.append(f"{outside:.0f} outside the rows (start-up, between rows)")
            named = Counter(function for function, _ in waited_in)
            if named:
                during.append(
                    "in " + "; ".join(f"{f} x{n}" if n > 1 else f for f, n in named.items())
                )
            # Whether each was a page of code (or of a mapped file) brought back in: the trio
            # thread's major page faults moved by then; else a read of the store's files.
            faults = [str(n) for _, n in waited_in if n is not None]
            if faults:
                during.append(f"the trio thread's major page faults by each: {', '.join(faults)}")
            if len(waited_in) < waits:
                during.append(f"{waits - len(waited_in):.0f} not named (logged at info)")
            where += f" ({', '.join(during)})"
        rows.append(
            (
                "loop disk waits over the run",
                f"{waits:.0f}",
                f"reads and writes on the trio thread that waited for the disk{where};"
                f" {mark('loop disk waits over the run')}",
            )
        )
    if row_offloaded:
        sent = {name: n for name, n in row_offloaded.items() if n}
        rows.append(
            (
                "reads in worker threads",
                f"{sum(row_offloaded.values()):,.0f}",
                "the rows' reads (their warm-up slices' too) that the daemon ran off the trio"
                " thread: over the thread's budget"
                " (5 ms of CPU, 25 ms) or on a busy store, after a disk wait, during a warm-up,"
                " or for the second after one of those (inboxd/store/db.py)"
                + (
                    ": " + ", ".join(f"{n:,.0f} in {name}" for name, n in sent.items())
                    if sent
                    else ""
                ),
            )
        )
    for size, figures in search.items():
        _, conversations_in_it = ids["search_channels"][size]
        rows.append(
            (
                f"search p50 / p99, {size} channel",
                f"{figures['p50_ms']:.1f} / {figures['p99_ms']:.1f} ms",
                f"{conversations_in_it:,} conversations"
                f"{', its own index' if figures['own_index'] else ''};"
                " one query at a time, store level;"
                f" slowest first run {figures['slowest_first_run_ms']:.1f} ms;"
                f" p99 {mark(f'search p99, {size} channel')}",
            )
        )
    if steadiness:
        before, after = steadiness["before"], steadiness["after"]
        rows.append(
            (
                "the machine, idle, before / after",
                f"{before['slow_share']:.1%} / {after['slow_share']:.1%}",
                "of the time fixed work ran at under"
                f" 1/{machine.SLOW:g} of its usual speed, every CPU busy (bench machine);"
                f" the longest stretch {before['longest_stretch_ms']:.1f} /"
                f" {after['longest_stretch_ms']:.1f} ms",
            )
        )
    missed = [v for v in targets if not v["met"]]
    verdict = "missed: " + "; ".join(_verdict_text(v) for v in missed) if missed else "all met"
    verdict += ceiling_over_too(targets)
    if driver != "wrk":
        verdict += (
            "; the Python driver's figures are bounded by the driver, and it loads no writes"
            " (install wrk for a run held to the targets)"
        )
    rows.append(
        (
            "targets met in this run",
            f"{len(targets) - len(missed)} of {len(targets)} measured",
            verdict,
        )
    )
    report(
        "http",
        rows,
        {
            "args": {**vars(args), "driver": driver},
            "results": results,
            "ceilings": ceilings,
            "patch_ceilings": patch_ceilings,
            "sized_ceilings": sized_ceilings,
            "response_bytes": sizes,
            "floor_us": floors,
            "write_floor_us": write_floors,
            "startup_seconds": startup,
            "store_in_memory": fit,
            "search_latency": search,
            "read_through_seconds": read_seconds,
            "targets": targets,
            "slice_shares": slice_shares,
            "share_standard_errors": {
                name: standard_error(shares) for name, shares in slice_shares.items()
            },
            "loop_disk_waits_by_row": row_waits,
            "offloaded_reads_by_row": row_offloaded,
            "commits_by_row": row_commits,
            "restarts_by_row": row_restarts,
            "loop_disk_wait_functions": [function for function, _ in waited_in],
            "loop_disk_wait_major_faults": [faults for _, faults in waited_in],
            "machine_steadiness": steadiness,
        },
    )
    return 0
