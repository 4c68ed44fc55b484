"""The live feed at 1,000 clients: commit-to-last-client latency, beside a bare broadcast.

Starts the real daemon (a subprocess, its own store) and connects N websocket clients from this
process. Each round reports one outbound message through the messaging API (one journal event,
so one frame per client) and times until the last client has its ``inbox.message.created`` frame
(from sending the request, and from the response, which comes after the commit). The same clients then measure the ceiling: a bare quart-trio app broadcasting a
frame of the same size (bench/bare.py). While the rounds run, another task reads one
conversation over and over, from a process of its own: the API's latency while the feed is
busy, beside the same reads idle.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from bench.common import ROOT, report


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clients", type=int, default=1000, help="websocket clients (1000)")
    p.add_argument("--rounds", type=int, default=60, help="changes broadcast (60)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def start(
    args: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT, log: Any = None
) -> subprocess.Popen[bytes]:
    """``python ARGS`` from ``cwd`` (which ``-m`` imports from first). Its stderr (a daemon's
    log) goes to the terminal with ``BENCH_DAEMON_STDERR`` set, else to the file ``log`` if
    given, else nowhere."""
    stderr: Any = subprocess.DEVNULL if log is None else log
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=None if os.environ.get("BENCH_DAEMON_STDERR") else stderr,
    )


def wait_http(
    url: str, timeout: float = 30.0, process: subprocess.Popen[bytes] | None = None
) -> None:
    """Until ``url`` answers 200; fails at once if ``process`` (the server) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server for {url} exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


class Clients:
    """N sockets; each notes when it sees a frame that contains the current marker."""

    def __init__(self) -> None:
        self.marker = ""
        self.seen: list[float] = []
        self.done = trio.Event()
        self.expected = 0

    async def run_one(self, ws: WebSocketConnection) -> None:
        while True:
            frame = await ws.get_message()
            if self.marker and self.marker in frame:
                self.seen.append(time.perf_counter())
                if len(self.seen) == self.expected:
                    self.done.set()

    async def round(self, marker: str, count: int) -> None:
        self.marker, self.seen, self.done, self.expected = marker, [], trio.Event(), count


async def connect_all(
    nursery: trio.Nursery,
    url: str,
    count: int,
    headers: list[tuple[bytes, bytes]],
    clients: Clients,
) -> list[WebSocketConnection]:
    sockets: list[WebSocketConnection] = []

    async def one(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with open_websocket_url(url, extra_headers=headers) as ws:
            sockets.append(ws)
            task_status.started()
            await clients.run_one(ws)

    limiter = trio.CapacityLimiter(50)
    async with trio.open_nursery() as opening:
        for _ in range(count):

            async def start_one() -> None:
                async with limiter:
                    await nursery.start(one)

            opening.start_soon(start_one)
    return sockets


# The API reader runs in a process of its own: in this one, each frame's arrival at 1,000
# trio-websocket clients would hold its requests up as well as the daemon's fan-out does.
# Reads 200 times idle and prints "idle [seconds, ...]"; after a line on stdin reads every 10 ms
# until the next line, then prints "busy [...]".
READER = """
import json, sys, threading, time
import httpx
base, key, path = sys.argv[1:4]
headers = {"Authorization": f"Bearer {key}"} if key else {}
def timed(client):
    t = time.perf_counter()
    response = client.get(path)
    assert response.status_code == 200, response.status_code
    return time.perf_counter() - t
with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
    print("idle", json.dumps([timed(client) for _ in range(200)]), flush=True)
    sys.stdin.readline()
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    busy = []
    while not stop.is_set():
        busy.append(timed(client))
        time.sleep(0.01)
    print("busy", json.dumps(busy), flush=True)
"""


def start_reader(base: str, key: str | None, path: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", READER, base, key or "", path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def stop(reader: subprocess.Popen[str]) -> None:
    """The reader has printed its figures (or the measurement failed): end it."""
    if reader.poll() is None:
        reader.kill()
    reader.wait(15)


async def reader_line(reader: subprocess.Popen[str], kind: str) -> list[float]:
    assert reader.stdout is not None
    line = await trio.to_thread.run_sync(reader.stdout.readline)
    name, _, values = line.partition(" ")
    if name != kind:
        raise RuntimeError(f"the API reader said {line!r}, not its {kind} figures")
    return [float(v) for v in json.loads(values)]


async def measure(
    base: str,
    ws_url: str,
    key: str | None,
    reader: subprocess.Popen[str],
    channel_id: str | None,
    bare: str | None,
    n: int,
    rounds: int,
) -> dict[str, Any]:
    headers = [(b"Authorization", f"Bearer {key}".encode())] if key else []
    clients = Clients()
    results: dict[str, Any] = {
        "from_request": [],
        "from_response": [],
        "api_busy": [],
        "api_idle": [],
    }
    assert reader.stdin is not None
    async with httpx.AsyncClient(base_url=base, headers=dict(headers), timeout=30) as api:
        # The API idle, before any client connects.
        results["api_idle"] = await reader_line(reader, "idle")
        async with trio.open_nursery() as nursery:
            await connect_all(nursery, ws_url, n, headers, clients)
            reader.stdin.write("go\n")
            reader.stdin.flush()
            for i in range(rounds):
                marker = f"round-{i}-{time.time_ns()}"
                await clients.round(marker, n)
                t0 = time.perf_counter()
                if bare is None:
                    response = await api.post(
                        "/api/v1/messaging/messages",
                        json={
                            "channelId": channel_id,
                            "direction": "OUTBOUND",
                            "contact": {"phoneNumber": "4915112345678"},
                            "type": "TEXT",
                            "content": marker,
                        },
                    )
                else:
                    response = await api.post("/broadcast", content=bare.replace("MARKER", marker))
                t1 = time.perf_counter()
                assert response.status_code in (200, 201), response.text
                with trio.fail_after(30):
                    await clients.done.wait()
                last = max(clients.seen)
                results["from_request"].append(last - t0)
                results["from_response"].append(last - t1)
                await trio.sleep(0.2)
            reader.stdin.write("stop\n")
            reader.stdin.flush()
            results["api_busy"] = await reader_line(reader, "busy")
            nursery.cancel_scope.cancel()
    return results


def build_store(data: Path) -> tuple[str, str, str]:
    from inboxd.store import accounts, messages
    from inboxd.store.db import Store
    from inboxd.timeutil import now_us

    store = Store.open(data, create=True, readers=1)
    try:
        new = store.write_sync(accounts.create_account, "owner@example.com", "Owner", now_us())
        who = store.read_sync(accounts.authenticate, new.api_key)
        assert who is not None
        channel = store.write_sync(
            lambda c: accounts.create_channel(c, who.account_pk, "Sales", "WHATSAPP", now_us())
        )
        msg = messages.NewMessage(
            channel_id=channel.id,
            direction="INBOUND",
            phone_number="4915112345678",
            contact_name="Ada",
            contact_avatar=None,
            type="TEXT",
            content="hello",
        )
        conv = store.write_sync(messages.ingest, who, msg, now_us()).message.conversation_id
    finally:
        store.close()
    return new.api_key, conv, channel.id


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        key, conv, channel_id = build_store(Path(tmp) / "data")
        port = free_port()
        daemon = start(
            [
                "-m",
                "inboxd",
                "serve",
                "--data",
                str(Path(tmp) / "data"),
                "--bind",
                f"127.0.0.1:{port}",
            ],
            {"INBOXD_LIMITS_REQUESTS_PER_SECOND": "0", "INBOXD_LOG_LEVEL": "warning"},
        )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_http(f"{base}/readyz")
            reader = start_reader(base, key, f"/api/v1/inbox/conversations/{conv}")
            try:
                inboxd = trio.run(
                    measure, base, f"ws://127.0.0.1:{port}/api/v1/inbox/feed", key, reader,
                    channel_id, None, args.clients, args.rounds,
                )  # fmt: skip
            finally:
                stop(reader)
            sample = httpx.get(
                f"{base}/api/v1/inbox/events", params={"limit": 200},
                headers={"Authorization": f"Bearer {key}"},
            ).json()["events"]  # fmt: skip
            frame = next(e for e in reversed(sample) if e["type"] == "inbox.message.created")
        finally:
            daemon.terminate()
            daemon.wait(15)
        # The same frame, size for size, from the bare app.
        text = json.dumps(frame, separators=(",", ":"))
        template = text.replace(frame["data"]["content"], "MARKER")
        bare_port = free_port()
        bare_proc = start(["-m", "bench.bare", str(bare_port)])
        try:
            bare_base = f"http://127.0.0.1:{bare_port}"
            wait_http(f"{bare_base}/healthz")
            reader = start_reader(bare_base, None, "/healthz")
            try:
                bare = trio.run(
                    measure, bare_base, f"ws://127.0.0.1:{bare_port}/feed", None, reader, None,
                    template, args.clients, args.rounds,
                )  # fmt: skip
            finally:
                stop(reader)
        finally:
            bare_proc.terminate()
            bare_proc.wait(15)

    def ms(v: float) -> str:
        return f"{v * 1000:.1f} ms"

    f50, f99 = pct(inboxd["from_response"], 0.5), pct(inboxd["from_response"], 0.99)
    r50, r99 = pct(inboxd["from_request"], 0.5), pct(inboxd["from_request"], 0.99)
    b50, b99 = pct(bare["from_request"], 0.5), pct(bare["from_request"], 0.99)
    i50, i99 = pct(inboxd["api_idle"], 0.5), pct(inboxd["api_idle"], 0.99)
    a50, a99 = pct(inboxd["api_busy"], 0.5), pct(inboxd["api_busy"], 0.99)
    rows = [
        ("clients", f"{args.clients:,}", f"{args.rounds} changes"),
        ("request -> last client p50", ms(r50), f"bare broadcast {ms(b50)}: ratio {r50 / b50:.2f} (target <= 1.3)"),
        ("request -> last client p99", ms(r99), f"bare broadcast {ms(b99)}: ratio {r99 / b99:.2f}"),
        ("response -> last client p50", ms(f50), "from the API's response (< 0: clients had it first)"),
        ("response -> last client p99", ms(f99), ""),
        ("API read p50 while busy", ms(a50), f"idle {ms(i50)}: ratio {a50 / i50:.2f}"),
        ("API read p99 while busy", ms(a99), f"idle {ms(i99)}: ratio {a99 / i99:.2f}"),
    ]  # fmt: skip
    summary = {
        "inboxd": {k: {"p50": pct(v, 0.5), "p99": pct(v, 0.99)} for k, v in inboxd.items()},
        "bare": {k: {"p50": pct(v, 0.5), "p99": pct(v, 0.99)} for k, v in bare.items() if v},
        "ratio_p50": r50 / b50,
        "mean_from_request": statistics.mean(inboxd["from_request"]),
    }
    report("feed", rows, {"args": vars(args), "figures": summary})
    return 0
