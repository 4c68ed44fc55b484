"""A JSON body on the answers hypercorn gives to HTTP it cannot parse.

A request whose framing is broken (a Content-Length that is not a number, a header line without
a colon, headers past ``h11_max_incomplete_size``) never reaches the app: hypercorn's HTTP/1.1
protocol answers it itself, with an empty body, and closes the connection. CONTRACT section 3
says every error response is JSON, so ``install`` gives that answer the usual error object:
``invalid_request`` for 400, and for the other statuses h11 hints at (431 for headers past the
limit, 501 for a Transfer-Encoding other than chunked) a code made from the status's phrase.
hypercorn passes on only the status, not h11's reason, so the message names the kind of fault.

hypercorn has no setting for this: ``install`` replaces ``H11Protocol._send_error_response``
(hypercorn 0.18). Should a later hypercorn drop that method, ``install`` logs that these bodies
stay empty rather than failing the daemon, and tests/test_api_errors.py fails.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from itertools import chain
from typing import Any

import h11
import orjson

log = logging.getLogger("inboxd.api")

_INSTALLED = "_inboxd_json_errors"


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


def install() -> bool:
    """Make hypercorn's own error answers JSON (once per process); whether it could."""
    try:
        from hypercorn.protocol.h11 import H11Protocol
    except ImportError:  # pragma: no cover (hypercorn is a dependency)
        return False
    original = getattr(H11Protocol, "_send_error_response", None)
    if original is None:
        log.warning("hypercorn's malformed-request answers keep their empty bodies here")
        return False
    if getattr(original, _INSTALLED, False):
        return True

    async def send_json_error(self: Any, status_code: int) -> None:
        body = error_body(status_code)
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
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())

    setattr(send_json_error, _INSTALLED, True)
    H11Protocol._send_error_response = send_json_error  # type: ignore[method-assign]
    return True
