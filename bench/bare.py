"""The framework's ceilings: a bare quart-trio app on hypercorn's trio worker, set up like the
daemon. ``GET /ceiling`` returns 1 KB of JSON (the HTTP ceiling), ``GET /ceiling/N`` about N bytes
of JSON (the same for a response as large as a page), ``PATCH /ceiling`` does the same
after reading a small JSON body (what a write costs the framework); ``POST /broadcast`` sends its
body to every websocket on ``/feed`` through a per-client queue, like inboxd's feed.

Run as ``python -m bench.bare PORT``. With ``BENCH_BARE_PASSES`` set to a file, it also times
each pass of trio's scheduler (``Passes``; for ``bench machine``) and writes them there on SIGUSR1.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from types import FrameType

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart import Response, request, websocket
from quart_trio import QuartTrio

from inboxd import heap
from inboxd.api import framing

app = QuartTrio("bare")
clients: set[trio.MemorySendChannel[str]] = set()


@app.get("/healthz")
async def healthz() -> str:
    return "ok"


_KB_OF_JSON = {"items": [{"id": f"item_{i:04d}", "name": "x" * 20} for i in range(19)]}


@app.get("/ceiling")
async def ceiling() -> dict[str, object]:
    return _KB_OF_JSON


_SIZED: dict[int, bytes] = {}


@app.get("/ceiling/<int:size>")
async def ceiling_sized(size: int) -> Response:
    """JSON of about ``size`` bytes, encoded once: the framework's ceiling for a response as
    large as a list page."""
    body = _SIZED.get(size)
    if body is None:
        item = json.dumps({"id": "item_0000", "name": "x" * 20}).encode()
        count = max(1, size // (len(item) + 1))
        body = _SIZED[size] = b'{"items":[' + b",".join([item] * count) + b"]}"
    return Response(body, content_type="application/json")


@app.patch("/ceiling")
async def ceiling_write() -> dict[str, object]:
    """The same answer to a PATCH with a small JSON body, read and parsed (a write's framework
    cost without the store)."""
    body = await request.get_json()
    return {**_KB_OF_JSON, "got": body}


@app.post("/broadcast")
async def broadcast() -> dict[str, int]:
    frame = (await request.get_data()).decode()
    for channel in list(clients):
        try:
            channel.send_nowait(frame)
        except trio.WouldBlock:
            clients.discard(channel)
    return {"clients": len(clients)}


@app.websocket("/feed")
async def feed() -> None:
    await websocket.accept()
    send, receive = trio.open_memory_channel[str](1000)
    clients.add(send)
    try:
        async for frame in receive:
            await websocket.send(frame)
    finally:
        clients.discard(send)


async def main(port: int) -> None:
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.websocket_ping_interval = 20
    framing.install()  # the daemon's changes to hypercorn (inboxd/api/framing.py): the same setup
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve, app, config))
        heap.settle()  # the daemon's collector settings (inboxd/heap.py): the same setup


class Passes(trio.abc.Instrument):
    """Each pass of the scheduler (from one I/O wait to the next): its wall time, its task
    steps and their median duration, so that a pass slow for the machine (the same steps run
    slower) can be told from one with more work (bench/machine.py). Costs two clock reads a
    step. On SIGUSR1 the passes so far go to ``path`` as JSON and recording starts afresh."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.passes: list[list[float]] = []
        self.steps: list[float] = []
        self.began: float | None = None
        self.step_began = 0.0

    def after_io_wait(self, timeout: float) -> None:
        self.began = time.perf_counter()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.step_began = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps.append(time.perf_counter() - self.step_began)

    def before_io_wait(self, timeout: float) -> None:
        if self.began is not None and self.steps:
            wall = time.perf_counter() - self.began
            self.passes.append([wall, len(self.steps), statistics.median(self.steps)])
        self.steps = []

    def dump(self, signum: int, frame: FrameType | None) -> None:
        passes, self.passes = self.passes, []
        # Whole or not at all: the reader waits for the file to appear.
        partial_file = self.path.with_suffix(".partial")
        partial_file.write_text(json.dumps(passes))
        partial_file.replace(self.path)


if __name__ == "__main__":
    instruments = []
    if os.environ.get("BENCH_BARE_PASSES"):
        passes = Passes(Path(os.environ["BENCH_BARE_PASSES"]))
        signal.signal(signal.SIGUSR1, passes.dump)
        instruments.append(passes)
    trio.run(main, int(sys.argv[1]), instruments=instruments)
