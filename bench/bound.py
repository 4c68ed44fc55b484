"""What a write could reach with no store work at all, and what the key cache's check costs.

Starts the bare ceiling app and two daemons, each on its own copy of the store: inboxd as it is,
and inboxd whose renames return a cached row without touching the store
(``bench.cached_writes``). Then alternates slices of title writes on each daemon (32
connections, the same requests as ``bench http``) with the ceiling's GET, and reports for each
requests/s, its share of the ceiling in the same round, and the serving thread's CPU per
request (/proc). The cached daemon's share is what a write makes with no store work at all:
the rest of a write is HTTP, the body, the key and the answer. Since the writer process (store/
writer.py) took the store's work off the trio thread, what is left between the real daemon and
the cached one is the hand-off: the batch's pickles, the pipe and the group commit's bookkeeping.
Beside each: how busy the serving thread was, and for the real daemon its writer process's CPU
per write (/proc). Also times the hand-off itself, one thread, idle: pickling a title write as
the daemon sends it, and reading its answer as the writer sends it back.

Also times ``Store.commit_stamp`` both ways on the store (the WAL index header SQLite has
mapped, and the ``PRAGMA data_version`` fallback), the check every authenticated request makes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pickle
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.ab import _stop, store_copies
from bench.common import child_pid, report, thread_cpu_seconds
from bench.feed import free_port, start, wait_http
from bench.http import LUA_WRITE, pick, reset_for_writes, run_python, run_wrk
from inboxd import wire
from inboxd.store import accounts, actions, conversations, writer
from inboxd.store.db import Store, WriteRequest, run_batch, writer_connection


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="a store from 'bench generate' (copied twice)")
    p.add_argument("--slices", type=int, default=4, help="rounds of the three (4)")
    p.add_argument("--seconds", type=float, default=4.0, help="seconds per slice (4)")


def stamp_costs(data: Path, calls: int = 100_000) -> dict[str, float]:
    """Microseconds per ``commit_stamp`` call: mapped header, then the pragma."""
    store = Store.open(data)
    try:
        costs = {}
        header = store._wal_header
        for way in ("wal_index", "pragma"):
            store._wal_header = header if way == "wal_index" else None
            if way == "wal_index" and header is None:
                continue  # not found here: the fallback is all there is
            started = time.perf_counter()
            for _ in range(calls):
                store.commit_stamp()
            costs[way] = (time.perf_counter() - started) / calls * 1e6
        store._wal_header = header
        return costs
    finally:
        store.close()


def handoff_costs(data: Path, ids: dict[str, Any], calls: int = 20_000) -> dict[str, float]:
    """Microseconds the trio thread spends handing a title write to the writer process and
    reading its outcome back, as store/writer.py does it (one thread, idle): the request's
    pickle, then the answer's frame and the result inside it."""
    store = Store.open(data, readers=1)
    conn = writer_connection(store.path)
    try:
        who = store.read_sync(accounts.authenticate, ids["key"])
        args = (who, ids["conversations"][0], f"handoff {time.time_ns()}", time.time_ns() // 1000)
        request = WriteRequest(writer._PickledResult(actions.RENAME_ANSWERED), args)
        run_batch(conn, [request])
        if request.error is not None:
            raise RuntimeError(f"hand-off: {request.error!r}")
        answer = writer.outcome_pickle([(request.result, None, request.appended, request.wakes)])
        started = time.perf_counter()
        for _ in range(calls):
            pickle.dumps((actions.RENAME_ANSWERED, args, None), pickle.HIGHEST_PROTOCOL)
        sent = time.perf_counter()
        for _ in range(calls):
            pickle.loads(pickle.loads(answer)[0][0])
        read = time.perf_counter()
        # What the title route did with a row before the writer answered with its JSON
        # (actions.Answered): that work is the child's now.
        row = store.read_sync(conversations.get, who, ids["conversations"][0])
        for _ in range(calls):
            orjson.dumps(wire.conversation(row, with_contact=False))
        encoded = time.perf_counter()
        return {
            "request_us": (sent - started) / calls * 1e6,
            "outcome_us": (read - sent) / calls * 1e6,
            "outcome_bytes": len(answer),
            "encoding_us": (encoded - read) / calls * 1e6,
        }
    finally:
        conn.close()
        store.close()


def run(args: argparse.Namespace) -> int:
    source = Path(args.data)
    ids = pick(source)
    convs = ids["conversations"][:1000]
    script = LUA_WRITE % (", ".join(json.dumps(c) for c in convs), "title", ids["owner_id"])
    wrk = shutil.which("wrk") is not None
    work = Path(tempfile.mkdtemp(prefix="inboxd-bound-"))
    servers: dict[str, Any] = {}
    rounds: list[dict[str, dict[str, float]]] = []
    with contextlib.ExitStack() as cleanup:
        stores = store_copies(cleanup, source, work, ("real", "cached"))
        cleanup.callback(_stop, servers)
        stamps = stamp_costs(stores["real"])
        handoff = handoff_costs(stores["real"], ids)
        ports = {name: free_port() for name in ("real", "cached", "bare")}
        env = {"INBOXD_LIMITS_REQUESTS_PER_SECOND": "0", "INBOXD_LOG_LEVEL": "warning"}
        modules = {"real": "inboxd", "cached": "bench.cached_writes"}
        for name, module in modules.items():
            command = ["-m", module, "serve", "--data", str(stores[name])]
            servers[name] = start([*command, "--bind", f"127.0.0.1:{ports[name]}"], env)
            wait_http(f"http://127.0.0.1:{ports[name]}/readyz", process=servers[name])
        deadline = time.monotonic() + 10  # it starts beside the daemon's other tasks
        while (writer_pid := child_pid(servers["real"].pid, b"inboxd.store.writer")) is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        servers["bare"] = start(["-m", "bench.bare", str(ports["bare"])])
        wait_http(f"http://127.0.0.1:{ports['bare']}/healthz")

        def load(name: str) -> dict[str, float]:
            """One slice on one server: its figures and its serving thread's CPU per request."""
            base = f"http://127.0.0.1:{ports[name]}"
            if name != "bare":
                reset_for_writes(stores[name], convs)  # every rename a real change
            before = thread_cpu_seconds(servers[name].pid)
            child = writer_pid if name == "real" else None
            child_before = 0.0 if child is None else thread_cpu_seconds(child)
            started = time.perf_counter()
            if name == "bare":
                url, key, lua = f"{base}/ceiling", None, None
                paths: list[str] = []
            else:
                url, key, lua = base, ids["key"], script
                paths = [f"/api/v1/inbox/conversations/{c}/title" for c in convs]
            if wrk:
                figures = run_wrk(url, args.seconds, key, lua)
            elif name == "bare":
                figures = run_python(url, args.seconds, None, None)
            else:
                figures = run_python(
                    url, args.seconds, key, paths, method="PATCH",
                    body=lambda i: json.dumps({"title": f"t{i}"}).encode(),
                )  # fmt: skip
            cpu = thread_cpu_seconds(servers[name].pid) - before
            elapsed = time.perf_counter() - started  # (the driver's start and end included)
            requests = figures["rps"] * args.seconds
            figures["cpu_us_per_request"] = cpu / requests * 1e6
            figures["thread_busy"] = cpu / elapsed
            if child is not None:
                figures["writer_cpu_us_per_request"] = (
                    (thread_cpu_seconds(child) - child_before) / requests * 1e6
                )
            return figures

        for name in ("real", "cached"):  # warm-up: first uses, and the cache's first renames
            load(name)
        for i in range(args.slices):
            order = ("bare", "real", "cached") if i % 2 == 0 else ("bare", "cached", "real")
            rounds.append({name: load(name) for name in order})

    table = [("figure", "value", "note")]
    for name, what in (
        ("bare", "ceiling (bare GET, 1 KB)"),
        ("real", "title write"),
        ("cached", "title write, store work cached away"),
    ):
        rps = [r[name]["rps"] for r in rounds]
        cpu = [r[name]["cpu_us_per_request"] for r in rounds]
        busy = [r[name]["thread_busy"] for r in rounds]
        note = (
            f"CPU per request {min(cpu):,.0f}-{max(cpu):,.0f} us, serving thread busy"
            f" {min(busy):.0%}-{max(busy):.0%}"
        )
        if name == "real" and writer_pid is not None:
            child = [r[name]["writer_cpu_us_per_request"] for r in rounds]
            note += f"; writer process CPU per write {min(child):,.0f}-{max(child):,.0f} us"
        if name != "bare":
            shares = [r[name]["rps"] / r["bare"]["rps"] for r in rounds]
            note = (
                f"{statistics.median(shares):.0%} of the ceiling (median round;"
                f" {min(shares):.0%}-{max(shares):.0%}); " + note
            )
            errors = sum(r[name]["non_2xx"] for r in rounds)
            note += f"; {errors:.0f} non-2xx" if errors else ""
        table.append((what, f"{statistics.median(rps):,.0f} req/s", note))
    for way, us in stamps.items():
        what = "WAL index header" if way == "wal_index" else "PRAGMA data_version (fallback)"
        table.append((f"commit_stamp: {what}", f"{us:.2f} us", "per call, one thread, idle"))
    table.append(
        (
            "writer hand-off: request / outcome",
            f"{handoff['request_us']:.1f} / {handoff['outcome_us']:.1f} us",
            f"pickling a title write, reading its answer ({handoff['outcome_bytes']:,.0f} bytes);"
            " per write, one thread, idle",
        )
    )
    table.append(
        (
            "encoding the answer, in the writer",
            f"{handoff['encoding_us']:.1f} us",
            "the title route's JSON of the row (wire + orjson): the trio thread's before the"
            " writer answered with it; per write, one thread, idle",
        )
    )
    report(
        "bound",
        table,
        {
            "args": vars(args),
            "rounds": rounds,
            "commit_stamp_us": stamps,
            "handoff": handoff,
            "writer_pid_found": writer_pid is not None,
        },
    )
    return 0
