"""A real HTTPS webhook receiver for tests: hypercorn on 127.0.0.1, a certificate from a local CA.

It records every request (headers and exact body bytes) and answers with the statuses a test
queues (200 once the queue is empty).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
import trustme
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve


@attrs.frozen
class Certs:
    ca_file: Path
    cert_file: Path
    key_file: Path


def make_certs(directory: Path) -> Certs:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    directory.mkdir(parents=True, exist_ok=True)
    certs = Certs(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    ca.cert_pem.write_to_path(str(certs.ca_file))
    server.cert_chain_pems[0].write_to_path(str(certs.cert_file))
    for pem in server.cert_chain_pems[1:]:
        pem.write_to_path(str(certs.cert_file), append=True)
    server.private_key_pem.write_to_path(str(certs.key_file))
    return certs


@attrs.frozen
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # trio clock

    def signature_ok(self, secret: str) -> bool:
        expected = "sha256=" + hmac.new(secret.encode(), self.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(self.headers.get("x-svc-signature", ""), expected)


@attrs.define
class Receiver:
    url: str = ""
    requests: list[Received] = attrs.Factory(list)
    statuses: list[int | tuple[int, dict[str, str]]] = attrs.Factory(list)
    # While set, requests are held unanswered (the sender times out); a plain status otherwise.
    hang: bool = False
    # Used when the statuses queue is empty.
    default_status: int = 200
    # While set, each request is answered only once this event is set (the sender waits).
    gate: trio.Event | None = None
    # The body of every answer.
    answer_body: bytes = b"ok"
    # While set, the answer's body never ends: a byte every ``trickle`` seconds after the
    # status (each read is quick, the answer is endless).
    trickle: float | None = None
    _arrived: trio.Event = attrs.Factory(trio.Event)

    async def wait_for(self, count: int, within: float = 3600) -> list[Received]:
        """Wait (on the trio clock) until ``count`` requests have arrived."""
        with trio.fail_after(within):
            while len(self.requests) < count:
                await self._arrived.wait()
        return self.requests[:count]

    async def app(
        self,
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[dict[str, Any]]],
        send: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        answer = self.statuses.pop(0) if self.statuses else self.default_status
        status, extra = answer if isinstance(answer, tuple) else (answer, {})
        self.requests.append(
            Received(
                path=scope["path"],
                headers={k.decode().lower(): v.decode() for k, v in scope["headers"]},
                body=body,
                at=trio.current_time(),
            )
        )
        self._arrived.set()
        self._arrived = trio.Event()
        if self.hang:
            await trio.sleep_forever()
        if self.gate is not None:
            await self.gate.wait()
        headers = [(b"content-type", b"text/plain")]
        headers += [(k.encode(), v.encode()) for k, v in extra.items()]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        while self.trickle is not None:
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
            await trio.sleep(self.trickle)
        await send({"type": "http.response.body", "body": self.answer_body})


@asynccontextmanager
async def running_receiver(certs: Certs) -> AsyncIterator[Receiver]:
    receiver = Receiver()
    config = HyperConfig()
    config.bind = ["127.0.0.1:0"]
    config.certfile = str(certs.cert_file)
    config.keyfile = str(certs.key_file)
    config.accesslog = None
    config.graceful_timeout = 0.1
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            lambda task_status: serve(
                receiver.app, config, shutdown_trigger=stop.wait, task_status=task_status
            )
        )
        receiver.url = urls[0] + "/hook"
        yield receiver
        stop.set()
