"""The local HTTPS receiver of the delivery benchmarks, in a process of its own.

The inbox webhook sends one event at a time (CONTRACT section 6), so the receiver's own time is
part of every round trip, and the figure should be the sender's. Served by hypercorn's trio
worker in the benchmark's process, as before the thirteenth session, the receiver took 663 us of
CPU per request, and a bare sequential sender made 881-917 requests/s against it; served here by
uvicorn with uvloop and httptools, 196-223 us and 1,374-1,615/s (both measured by hand, the
receiver alone with the bare sender, two runs each). `bench delivery` prints this receiver's CPU
per request beside its figures; bench/HISTORY.md (thirteenth session, item 2) has the runs.

It checks every signature (HMAC-SHA256 of the body with the webhook's secret) and reports each
request as one JSON line on stdout, written as it arrives: ``{"at": T, "id": ..., "title": ...}``
for a good one (``T`` is ``time.monotonic()``, the clock the benchmark reads too), ``{"bad":
true}`` for a bad signature, which it answers 401.

Run as ``python -m bench.receiver PORT SECRET CERT_FILE KEY_FILE``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio

from bench.feed import ROOT

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def make_app(secret: str) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    key = secret.encode()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # a sender stopped mid-request (delivery-ab stops daemons mid-backlog)
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        at = time.monotonic()
        signature = dict(scope["headers"]).get(b"x-svc-signature", b"").decode()
        expected = "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()
        ok = hmac.compare_digest(signature, expected)
        if ok:
            event = json.loads(body)
            line = json.dumps({"at": at, "id": event["id"], "title": event["data"].get("title")})
        else:
            line = '{"bad": true}'
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        await send({"type": "http.response.start", "status": 200 if ok else 401, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return app


class Receiver:
    """Starts the receiver process and keeps what it reports: each event id's arrival and each
    title's (``time.monotonic()``), and the count of bad signatures."""

    def __init__(self, secret: str, port: int, cert_file: Path, key_file: Path) -> None:
        self.argv = [
            sys.executable,
            "-m",
            "bench.receiver",
            str(port),
            secret,
            str(cert_file),
            str(key_file),
        ]
        self.port = port
        self.arrivals: dict[str, float] = {}
        self.titles: dict[str, float] = {}
        self.bad_signatures = 0
        self.changed = trio.Event()
        self.pid = 0

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the receiver until cancelled; started once it accepts connections."""
        async with trio.open_nursery() as nursery:
            process: trio.Process = await nursery.start(
                partial(trio.run_process, self.argv, cwd=ROOT, stdout=subprocess.PIPE, check=False)
            )
            self.pid = process.pid
            nursery.start_soon(self._read, process)
            with trio.fail_after(30):
                while True:
                    try:
                        stream = await trio.open_tcp_stream("127.0.0.1", self.port)
                    except OSError:
                        if process.returncode is not None:
                            raise RuntimeError("the receiver exited at start") from None
                        await trio.sleep(0.05)
                    else:
                        await stream.aclose()
                        break
            task_status.started()

    async def _read(self, process: trio.Process) -> None:
        assert process.stdout is not None
        pending = b""
        async for chunk in process.stdout:
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                report = json.loads(line)
                if report.get("bad"):
                    self.bad_signatures += 1
                    continue
                self.arrivals.setdefault(report["id"], report["at"])
                if report["title"] is not None:
                    self.titles.setdefault(report["title"], report["at"])
            if lines:
                self.changed.set()
                self.changed = trio.Event()
        raise RuntimeError(f"the receiver exited (status {await process.wait()})")

    async def wait_for(self, count: int) -> None:
        """Until ``count`` distinct events have arrived."""
        while len(self.arrivals) < count:
            await self.changed.wait()


def main(argv: list[str]) -> None:
    import uvicorn

    port, secret, cert_file, key_file = int(argv[0]), argv[1], argv[2], argv[3]
    uvicorn.run(
        make_app(secret),
        host="127.0.0.1",
        port=port,
        ssl_certfile=cert_file,
        ssl_keyfile=key_file,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main(sys.argv[1:])
