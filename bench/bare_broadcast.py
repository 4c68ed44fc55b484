"""The framework's ceiling for the feed: a bare quart-trio app on hypercorn's trio worker that
broadcasts one frame to every connected websocket, through a per-client queue like inboxd's.

Run as ``python -m bench.bare_broadcast PORT``; POST /broadcast with the frame as the body.
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
