"""The framework's ceilings: a bare quart-trio app on hypercorn's trio worker, set up like the
daemon. ``GET /ceiling`` returns 1 KB of JSON (the HTTP ceiling); ``POST /broadcast`` sends its
body to every websocket on ``/feed`` through a per-client queue, like inboxd's feed.

Run as ``python -m bench.bare PORT``.
"""

from __future__ import annotations

import sys

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart import request, websocket
from quart_trio import QuartTrio

app = QuartTrio("bare")
clients: set[trio.MemorySendChannel[str]] = set()


@app.get("/healthz")
async def healthz() -> str:
    return "ok"


_KB_OF_JSON = {"items": [{"id": f"item_{i:04d}", "name": "x" * 20} for i in range(19)]}


@app.get("/ceiling")
async def ceiling() -> dict[str, object]:
    return _KB_OF_JSON


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
    await serve(app, config)


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]))
