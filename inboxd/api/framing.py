"""A JSON body on the answers hypercorn gives to HTTP it cannot parse; closes that finish.

A request whose framing is broken (a Content-Length that is not a number, a header line without
a colon, headers past ``h11_max_incomplete_size``) never reaches the app: hypercorn's HTTP/1.1
protocol answers it itself, with an empty body, and closes the connection. CONTRACT section 3
says every error response is JSON, so ``install`` gives that answer the usual error object:
``invalid_request`` for 400, and for the other statuses h11 hints at (431 for headers past the
limit, 501 for a Transfer-Encoding other than chunked) a code made from the status's phrase.
hypercorn passes on only the status, not h11's reason, so the message names the kind of fault.

A HEAD request gets the same status and headers with no body (RFC 9110 section 9.3.2). h11
cannot say what a request it failed to parse asked for, so the protocol notes whether each
request's first five bytes are ``HEAD ``: as they arrive (``handle``; the request line may
come in pieces), or, when they came with the request before (pipelined), once that one's
exchange is done (``_maybe_recycle``). Per request that is a slice or two, no copy of h11's
buffer.

hypercorn has no setting for this: ``install`` replaces ``H11Protocol._send_error_response``
and wraps ``handle`` and ``_maybe_recycle`` (hypercorn 0.18). Should a later hypercorn drop
any of them, ``install`` logs so and changes nothing rather than failing the daemon, and
tests/test_api_errors.py fails.

A websocket upgrade that hypercorn's ``WSStream`` refuses itself (no ``Sec-WebSocket-Key``, a
``Sec-WebSocket-Version`` other than 13) got an empty 400 too, and its connection then stayed
open, although the answer said ``connection: close``, until ``read_timeout``: the stream was
never closed. ``install`` gives those answers the error object as well (``WSStream``'s
``_send_error_response``) and closes the stream after them (a wrapped ``WSStream.handle``).

``install`` also shields hypercorn's closing of a connection (``TCPServer._close``). A request
with ``Connection: close`` (or HTTP/1.0) is answered, and hypercorn then closes the socket from
within the app's last ``send``; quart-trio meanwhile sees the request end and cancels that
send's task, so the close stopped half-way and the socket stayed open until the client closed
it or ``read_timeout`` (60 s) passed. The close (a shutdown and a close, or a TLS goodbye) now
finishes, within ``CLOSE_SECONDS``.

And ``install`` sends an answer's head with its body. hypercorn sends every h11 event on its
own: the head, the body, and the end of a body with a Content-Length (no bytes at all). Each is
a ``send_all`` under the connection's send lock, so each is two or three passes of trio's
scheduler and, for the head and the body, a ``sendto`` of its own, and the client gets the
head and must wait for the rest. ``install`` replaces ``H11Protocol._send_h11_event`` so the
head waits for the first bytes of the body (or its end) and goes with them, and an event with
no bytes sends nothing: one ``send_all`` for a whole answer with a Content-Length, which is
every answer inboxd gives (a chunked one's end carries bytes and goes on its own;
bench/HISTORY.md, nineteenth session). An answer that streams sends its head with its first
chunk; an informational answer (100 Continue, a websocket's 101) goes at once. A head held when
the stream closes (the app failed after starting its answer) is sent then, as hypercorn would
have.
"""

from __future__ import annotations

import logging
import time
from http import HTTPStatus
from itertools import chain
from typing import Any, Final

import h11
import orjson
import trio

log = logging.getLogger("inboxd.api")

_INSTALLED = "_inboxd_json_errors"
CLOSE_SECONDS = 5.0  # at most, for a close that has to wait (a TLS goodbye to a stalled peer)


_MESSAGES = {
    400: "the request is not valid HTTP/1.1 (its request line, headers or framing)",
    431: "the request's headers are too large",
    501: "the request's Transfer-Encoding is not supported (chunked is)",
}


def error_body(status: int) -> bytes:
    """The CONTRACT's error object for a request hypercorn could not parse."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Bad Request"
    code = "invalid_request" if status == 400 else phrase.lower().replace(" ", "_")
    message = _MESSAGES.get(status, f"the request could not be read ({phrase.lower()})")
    return orjson.dumps({"error": {"code": code, "message": message}})


_WEBSOCKET_ERRORS: Final = {
    400: (
        "invalid_request",
        "the websocket upgrade is not valid (it needs Sec-WebSocket-Key and"
        " Sec-WebSocket-Version: 13)",
    ),
    403: ("forbidden", "the websocket upgrade was refused"),
    404: ("not_found", "there is no such resource"),
    500: ("internal_error", "the server failed; it is logged"),
}


def websocket_error_body(status: int) -> bytes:
    """The CONTRACT's error object for a websocket upgrade that hypercorn answers itself."""
    code, message = _WEBSOCKET_ERRORS.get(
        status, ("http_error", f"websocket upgrade refused ({status})")
    )
    return orjson.dumps({"error": {"code": code, "message": message}})


def install() -> bool:
    """Make hypercorn's own error answers JSON, its closes finish and each answer go out in
    one send (once per process); whether it could."""
    try:
        from hypercorn.events import RawData
        from hypercorn.protocol.events import Body, EndBody, Response, StreamClosed
        from hypercorn.protocol.h11 import H11Protocol
        from hypercorn.protocol.ws_stream import WSStream
        from hypercorn.trio.tcp_server import TCPServer
    except ImportError:  # pragma: no cover (hypercorn is a dependency)
        return False
    original = getattr(H11Protocol, "_send_error_response", None)
    handle = getattr(H11Protocol, "handle", None)
    recycle = getattr(H11Protocol, "_maybe_recycle", None)
    close = getattr(TCPServer, "_close", None)
    ws_handle = getattr(WSStream, "handle", None)
    ws_error = getattr(WSStream, "_send_error_response", None)
    if (
        getattr(H11Protocol, "_send_h11_event", None) is None
        or original is None
        or handle is None
        or recycle is None
        or close is None
        or ws_handle is None
        or ws_error is None
    ):
        log.warning(
            "this hypercorn is not the one framing.py knows: its answers to malformed requests"
            " keep their empty bodies, a close a request asked for may wait for the client,"
            " and each answer's head and body go out apart"
        )
        return False
    if getattr(original, _INSTALLED, False):
        return True

    async def sending_head_with_body(self: Any, event: Any) -> None:
        # hypercorn's own, but a response's head is held for the bytes after it.
        try:
            data = self.connection.send(event)
        except h11.LocalProtocolError:
            if self.connection.their_state != h11.ERROR:
                raise
            return
        if type(event) is h11.Response:
            self._inboxd_head = data
            return
        head = getattr(self, "_inboxd_head", None)
        if head is not None:
            self._inboxd_head = None
            data = head + data
        if data:
            await self.send(RawData(data=data))

    async def noting_head(self: Any, event: Any) -> None:
        # Bytes of a request not yet parsed arrive: keep its first five (the request line may
        # come in pieces); once there are five, nothing more to do for this request.
        if isinstance(event, RawData) and self.connection.their_state is h11.IDLE:
            start = getattr(self, "_inboxd_start", b"")
            if len(start) < 5:
                self._inboxd_start = start + event.data[: 5 - len(start)]
        await handle(self, event)

    async def noting_next_head(self: Any) -> None:
        # The stream is closed. A head still held (an app that failed after starting its
        # answer) goes now, as hypercorn would have sent it: the client sees an answer cut
        # short, not an empty one, which some clients retry on a kept-alive connection.
        if (head := getattr(self, "_inboxd_head", None)) is not None:
            self._inboxd_head = None
            await self.send(RawData(data=head))
        # The exchange is over and the next begins: its first bytes, if they came already,
        # are h11's unread data (usually none). (Before the original: it lets the reading
        # task run on.)
        if self.connection.their_state is h11.DONE:
            self._inboxd_start = self.connection.trailing_data[0][:5]
        await recycle(self)

    async def send_json_error(self: Any, status_code: int) -> None:
        head = getattr(self, "_inboxd_start", b"") == b"HEAD "
        body = b"" if head else error_body(status_code)
        await self._send_h11_event(
            h11.Response(
                status_code=status_code,
                headers=list(
                    chain(
                        [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"),
                        ],
                        self.config.response_headers("h11"),
                    )
                ),
            )
        )
        if body:
            await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())

    async def ws_send_json_error(self: Any, status_code: int) -> None:
        # As hypercorn's WSStream answers, with the JSON body.
        body = websocket_error_body(status_code)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await self.send(
            Response(stream_id=self.stream_id, status_code=status_code, headers=headers)
        )
        await self.send(Body(stream_id=self.stream_id, data=body))
        await self.send(EndBody(stream_id=self.stream_id))
        await self.config.log.access(
            self.scope, {"status": status_code, "headers": []}, time.time() - self.start_time
        )

    async def ws_closing_refusals(self: Any, event: Any) -> None:
        # An upgrade WSStream refuses itself (no Sec-WebSocket-Key, a version other than 13)
        # is answered and marked closed, but the stream is never closed, so the connection
        # stayed open after its "connection: close" until read_timeout (60 s).
        # Only a refusal, judged by the state before the call: once accepted, hypercorn closes
        # the stream itself after a close frame, from within this call; but an app started for
        # the upgrade may accept while a refusal of early data is being sent (HTTP/2). Such an
        # app is told the client is gone: hypercorn drops every later event of a closed stream,
        # its disconnect included, and the feed's handler stayed registered.
        closed = self.closed
        handshake = getattr(self, "handshake", None)
        accepted = handshake is not None and handshake.accepted
        await ws_handle(self, event)
        if self.closed and not closed and not accepted and not isinstance(event, StreamClosed):
            await self.send(StreamClosed(stream_id=self.stream_id))
            if self.app_put is not None:
                await self.app_put({"type": "websocket.disconnect", "code": 1006})

    async def close_whole(self: Any) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_SECONDS):
            await close(self)

    setattr(send_json_error, _INSTALLED, True)
    TCPServer._close = close_whole  # type: ignore[method-assign]
    H11Protocol.handle = noting_head  # type: ignore[method-assign]
    H11Protocol._send_h11_event = sending_head_with_body  # type: ignore[method-assign]
    H11Protocol._maybe_recycle = noting_next_head  # type: ignore[method-assign]
    H11Protocol._send_error_response = send_json_error  # type: ignore[method-assign]
    WSStream.handle = ws_closing_refusals  # type: ignore[method-assign]
    WSStream._send_error_response = ws_send_json_error  # type: ignore[method-assign]
    return True
