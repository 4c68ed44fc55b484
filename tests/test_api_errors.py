"""Every error is the JSON body of CONTRACT section 3, with the contract's status and code."""

from __future__ import annotations

import socket
from typing import Any

import h11
import httpx
import orjson
import pytest
import trio
import trio.testing
from trio_websocket import open_websocket_url

from inboxd.api.app import BODY_WAIT_SECONDS
from inboxd.config import Config, LimitsConfig, ServerConfig
from tests.conftest import Seed, auth, ingest


def assert_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


async def test_missing_key_is_401_with_www_authenticate(anon: httpx.AsyncClient) -> None:
    response = await anon.get("/api/v1/inbox/channels")
    assert_error(response, 401, "unauthorized")
    assert response.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "header", ["Bearer", "Basic dXNlcjpwYXNz", "Bearer ibx_not-a-real-key", "ibx_nobearer"]
)
async def test_malformed_or_unknown_key_is_401(anon: httpx.AsyncClient, header: str) -> None:
    response = await anon.get("/api/v1/inbox/conversations", headers={"Authorization": header})
    assert_error(response, 401, "unauthorized")


async def test_unknown_path_is_404_json(owner: httpx.AsyncClient) -> None:
    assert_error(await owner.get("/api/v1/inbox/nothing-here"), 404, "not_found")
    assert_error(await owner.get("/nowhere"), 404, "not_found")
    # An empty segment (an empty id) is no path of the API either: not a redirect that merges
    # the slashes into another path.
    assert_error(await owner.get("/api/v1/inbox/conversations//messages"), 404, "not_found")
    assert_error(await owner.post("/api/v1/inbox/conversations//block"), 404, "not_found")


async def test_plain_http_to_the_feed_says_it_is_a_websocket(owner: httpx.AsyncClient) -> None:
    response = await owner.get("/api/v1/inbox/feed")
    assert_error(response, 400, "invalid_request")
    assert "websocket" in response.json()["error"]["message"]
    assert response.headers["upgrade"] == "websocket"


async def test_wrong_method_is_405_with_allow(owner: httpx.AsyncClient) -> None:
    response = await owner.delete("/api/v1/inbox/channels")
    assert_error(response, 405, "method_not_allowed")
    assert "GET" in response.headers["allow"]


async def test_malformed_json_is_400(owner: httpx.AsyncClient) -> None:
    response = await owner.post(
        "/api/v1/messaging/messages",
        content=b'{"channelId": ',
        headers={"Content-Type": "application/json"},
    )
    assert_error(response, 400, "invalid_request")


async def test_json_that_is_not_an_object_is_400(owner: httpx.AsyncClient) -> None:
    response = await owner.post("/api/v1/messaging/messages", json=[1, 2])
    assert_error(response, 400, "invalid_request")


async def test_body_that_is_not_json_is_415(owner: httpx.AsyncClient) -> None:
    response = await owner.post(
        "/api/v1/messaging/messages", content=b"channelId=x", headers={"Content-Type": "text/plain"}
    )
    assert_error(response, 415, "unsupported_media_type")


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("application/json", 200),
        ("application/json; charset=utf-8", 200),
        ("Application/JSON", 200),
        ("application/json ;charset=UTF-8", 200),
        ("application/jsonx", 415),
        ("application/x-www-form-urlencoded", 415),
        ("text/json", 415),
    ],
)
async def test_a_body_is_json_by_its_media_type_whatever_its_case_or_parameters(
    owner: httpx.AsyncClient, seeded: Seed, content_type: str, status: int
) -> None:
    conv = (await ingest(owner, seeded.sales_id, "15550009", content="hi"))["conversationId"]
    response = await owner.patch(
        f"/api/v1/inbox/conversations/{conv}/title",
        content=b'{"title": "Renamed"}',
        headers={"Content-Type": content_type},
    )
    if status == 200:
        assert response.status_code == 200, response.text
        assert response.json()["title"] == "Renamed"
    else:
        assert_error(response, status, "unsupported_media_type")


@pytest.mark.parametrize(
    "path",
    [  # (/api/v1/inbox/conversations: test_options_needs_no_key)
        "/api/v1/messaging/messages",
        "/api/v1/channels/ch_any/webhook",
        "/api/v1/inbox/team/members",
    ],
)
async def test_options_needs_no_key_on_any_api_blueprint(
    anon: httpx.AsyncClient, path: str
) -> None:
    # CORS preflights carry no key: Quart answers them with the path's methods, also where a
    # blueprint lets only the owner's key in.
    response = await anon.options(path)
    assert response.status_code == 200, response.text
    assert "OPTIONS" in response.headers["allow"]


@pytest.fixture
def config() -> Config:
    return Config(
        server=ServerConfig(max_body_bytes=2048, lock_code=False),
        limits=LimitsConfig(requests_per_second=0),
    )


async def test_body_over_max_body_bytes_is_413(owner: httpx.AsyncClient, seeded: Seed) -> None:
    body = {
        "channelId": seeded.sales_id,
        "direction": "INBOUND",
        "contact": {"phoneNumber": "15550001"},
        "type": "TEXT",
        "content": "x" * 5000,
    }
    assert_error(
        await owner.post("/api/v1/messaging/messages", json=body), 413, "payload_too_large"
    )


@pytest.mark.parametrize(
    "params",
    [{"channelId": ""}, {"status": ""}, {"tab": ""}, {"unread": ""}, {"cursor": ""}],
)
async def test_an_optional_query_parameter_given_empty_is_absent(
    owner: httpx.AsyncClient, params: dict[str, str]
) -> None:
    response = await owner.get("/api/v1/inbox/conversations", params=params)
    assert response.status_code == 200
    assert response.json()["pagination"]["limit"] == 50


@pytest.mark.parametrize("limit", ["0", "201", "-1", "ten", "1.5", " 5", ""])
async def test_bad_limit_is_400(owner: httpx.AsyncClient, limit: str) -> None:
    response = await owner.get("/api/v1/inbox/conversations", params={"limit": limit})
    assert_error(response, 400, "invalid_request")
    assert "limit" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/v1/inbox/conversations", {"cursor": "yesterday"}),
        ("/api/v1/inbox/conversations", {"cursor": "2026-11-22T01:00:00"}),  # no offset
        ("/api/v1/inbox/conversations", {"status": "RESOLVED"}),
        ("/api/v1/inbox/conversations", {"status": "open"}),
        ("/api/v1/inbox/conversations", {"tab": "mine"}),
        ("/api/v1/inbox/conversations", {"unread": "maybe"}),
        ("/api/v1/inbox/conversations/search", {"query": "abc"}),  # channelId missing
        ("/api/v1/inbox/conversations/search", {"query": "abc", "channelId": ""}),  # as missing
    ],
)
async def test_bad_query_values_are_400(
    owner: httpx.AsyncClient, path: str, params: dict[str, str]
) -> None:
    assert_error(await owner.get(path, params=params), 400, "invalid_request")


async def test_a_search_query_with_a_nul_is_400_saying_so(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    response = await owner.get(
        "/api/v1/inbox/conversations/search",
        params={"channelId": seeded.sales_id, "query": "a\x00b"},
    )
    assert_error(response, 400, "invalid_request")
    assert response.json()["error"]["message"] == "query must not contain a NUL character"


async def test_unknown_query_parameters_are_ignored(owner: httpx.AsyncClient) -> None:
    response = await owner.get("/api/v1/inbox/conversations", params={"colour": "blue"})
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"direction": "SIDEWAYS"}, "direction"),
        ({"type": "SYSTEM"}, "SYSTEM"),
        ({"type": 5}, "type"),
        ({"contact": {"phoneNumber": "call me"}}, "phoneNumber"),
        ({"contact": {}}, "phoneNumber"),
        ({"channelId": None}, "channelId"),
        ({"sentAt": "2026-11-22 10:00"}, "sentAt"),
        ({"latitude": 91}, "latitude"),
        ({"fileSize": True}, "fileSize"),
        ({"quotedMessageId": "msg_nope"}, "quotedMessageId"),
    ],
)
async def test_bad_ingestion_fields_are_400_naming_the_field(
    owner: httpx.AsyncClient, seeded: Seed, change: dict[str, object], needle: str
) -> None:
    body: dict[str, object] = {
        "channelId": seeded.sales_id,
        "direction": "INBOUND",
        "contact": {"phoneNumber": "15550001"},
        "type": "TEXT",
        "content": "hi",
    }
    body.update(change)
    response = await owner.post("/api/v1/messaging/messages", json=body)
    assert_error(response, 400, "invalid_request")
    assert needle in response.json()["error"]["message"]


async def test_ingestion_into_unknown_channel_is_404(owner: httpx.AsyncClient) -> None:
    body = {
        "channelId": "ch_missing",
        "direction": "INBOUND",
        "contact": {"phoneNumber": "15550001"},
        "type": "TEXT",
    }
    assert_error(await owner.post("/api/v1/messaging/messages", json=body), 404, "not_found")


async def test_ingestion_with_a_user_key_is_403(owner: httpx.AsyncClient, seeded: Seed) -> None:
    body = {
        "channelId": seeded.sales_id,
        "direction": "INBOUND",
        "contact": {"phoneNumber": "15550001"},
        "type": "TEXT",
    }
    response = await owner.post(
        "/api/v1/messaging/messages", json=body, headers=auth(seeded.bob_key)
    )
    assert_error(response, 403, "forbidden")


async def test_unknown_message_status_target_is_404(owner: httpx.AsyncClient) -> None:
    response = await owner.post(
        "/api/v1/messaging/messages/msg_nope/status", json={"status": "READ"}
    )
    assert_error(response, 404, "not_found")


async def test_bad_status_word_is_400(owner: httpx.AsyncClient, seeded: Seed) -> None:
    message = await ingest(owner, seeded.sales_id, "15550001", content="hi")
    response = await owner.post(
        f"/api/v1/messaging/messages/{message['id']}/status", json={"status": "not a status!"}
    )
    assert_error(response, 400, "invalid_request")


# -- odd input never ends in a 500 ---------------------------------------------------------------


@pytest.mark.parametrize("limit", ["\u00b2", "\u0665", "\uff105", "9" * 5000])
async def test_odd_limits_are_400(owner: httpx.AsyncClient, limit: str) -> None:
    response = await owner.get("/api/v1/inbox/conversations", params={"limit": limit})
    assert_error(response, 400, "invalid_request")


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"channelId": "\\ud800x"}',
        b'{"channelId": NaN}',
        b'{"latitude": Infinity}',
        b"\xff\xfe",
        b"[" * 1_100 + b"]" * 1_100,  # deeper than a parser should follow, inside the size limit
        b"\xef\xbb\xbf{}",  # a byte order mark: RFC 8259 text has none
        '{"channelId": "x"}'.encode("utf-16"),  # JSON exchanged between systems is UTF-8
        b'{"latitude": 1e400}',  # no finite number
    ],
)
async def test_odd_json_is_400(owner: httpx.AsyncClient, raw: bytes) -> None:
    response = await owner.post(
        "/api/v1/messaging/messages", content=raw, headers={"Content-Type": "application/json"}
    )
    assert response.status_code in (400, 413), response.text
    assert response.json()["error"]["code"] in ("invalid_request", "payload_too_large")


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"fileSize": 10**30}, "fileSize"),
        ({"fileSize": 1.0}, "whole number"),
        ({"sentAt": "9999-12-31T23:59:59-23:59"}, "sentAt"),
        ({"sentAt": "0001-01-01T00:00:00+01:00"}, "sentAt"),
        ({"sentAt": "2026-01-01T00:00:00.\uff11\uff12\uff13Z"}, "sentAt"),
        ({"contact": {"phoneNumber": "\u0661\u0662\u0663\u0664\u0665"}}, "phoneNumber"),
    ],
)
async def test_odd_field_values_are_400(
    owner: httpx.AsyncClient, seeded: Seed, change: dict[str, object], needle: str
) -> None:
    body: dict[str, object] = {
        "channelId": seeded.sales_id,
        "direction": "INBOUND",
        "contact": {"phoneNumber": "15550001"},
        "type": "TEXT",
    }
    body.update(change)
    response = await owner.post("/api/v1/messaging/messages", json=body)
    assert_error(response, 400, "invalid_request")
    assert needle in response.json()["error"]["message"]


async def test_status_words_are_checked_before_upper_casing(
    owner: httpx.AsyncClient, seeded: Seed
) -> None:
    message = await ingest(owner, seeded.sales_id, "15550001", content="hi")
    for word in ("\u00df", "\ufb00"):
        response = await owner.post(
            f"/api/v1/messaging/messages/{message['id']}/status", json={"status": word}
        )
        assert_error(response, 400, "invalid_request")


@pytest.mark.parametrize("query", ["\x00\x00\x00", "x" * 300])
async def test_odd_search_queries_are_400(
    owner: httpx.AsyncClient, seeded: Seed, query: str
) -> None:
    response = await owner.get(
        "/api/v1/inbox/conversations/search", params={"channelId": seeded.sales_id, "query": query}
    )
    assert_error(response, 400, "invalid_request")


async def test_options_needs_no_key(anon: httpx.AsyncClient) -> None:
    response = await anon.options("/api/v1/inbox/conversations")
    assert response.status_code == 200
    assert "GET" in response.headers["allow"]


async def test_413_closes_the_connection(owner: httpx.AsyncClient, seeded: Seed) -> None:
    response = await owner.post(
        "/api/v1/messaging/messages",
        content=b"{" + b" " * 5000 + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert_error(response, 413, "payload_too_large")
    assert response.headers["connection"] == "close"
    # The client opens a new connection and carries on.
    assert (await owner.get("/api/v1/inbox/channels")).status_code == 200


async def _connect(base_url: str) -> trio.SocketStream:
    host, port = base_url.split("//", 1)[1].rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


def _post_head(key: str, length: int) -> bytes:
    return (
        "POST /api/v1/messaging/messages HTTP/1.1\r\nHost: inboxd\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


async def _read_responses(stream: trio.SocketStream, count: int) -> bytes:
    """Bytes until ``count`` complete responses (each with a Content-Length) or the end."""
    data = b""
    while True:
        heads = data.split(b"HTTP/1.1 ")[1:]
        done = 0
        for head in heads:
            header, _, rest = head.partition(b"\r\n\r\n")
            length = int(header.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            done += len(rest) >= length
        if done >= count:
            return data
        more = await stream.receive_some()
        if not more:
            return data
        data += more


async def _h11_exchange(
    stream: trio.SocketStream, client: h11.Connection, method: bytes, target: bytes, key: str
) -> bytes:
    """One request on a kept-alive connection; the bytes of its whole answer."""
    headers = [(b"host", b"inboxd"), (b"authorization", f"Bearer {key}".encode())]
    await stream.send_all(
        client.send(h11.Request(method=method, target=target, headers=headers))
        + client.send(h11.EndOfMessage())
    )
    received = b""
    with trio.fail_after(5):
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some()
                received += data
                client.receive_data(data)
            elif isinstance(event, h11.EndOfMessage):
                client.start_next_cycle()
                return received


async def test_an_answer_goes_out_in_one_send(
    base_url: str, seeded: Seed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """framing sends an answer's head with its body: hypercorn sent the head, the body and an
    empty end each on its own (two sends and more passes of trio's scheduler per answer)."""
    from hypercorn.events import RawData
    from hypercorn.trio.tcp_server import TCPServer

    sends: list[bytes] = []
    protocol_send = TCPServer.protocol_send

    async def recording(self: Any, event: Any) -> None:
        if isinstance(event, RawData):
            sends.append(bytes(event.data))
        await protocol_send(self, event)

    monkeypatch.setattr(TCPServer, "protocol_send", recording)
    stream = await _connect(base_url)
    client = h11.Connection(h11.CLIENT)
    answers = [
        (b"GET", b"/api/v1/inbox/channels", 200),
        (b"GET", b"/api/v1/inbox/conversations?limit=50", 200),
        (b"GET", b"/api/v1/inbox/conversations/counts", 200),
        (b"HEAD", b"/api/v1/inbox/channels", 200),  # a head and no body
        (b"GET", b"/api/v1/no/such/thing", 404),
        (b"GET", b"/healthz", 200),
    ]
    for method, target, status in answers:
        sends.clear()
        received = await _h11_exchange(stream, client, method, target, seeded.owner_key)
        assert received.startswith(f"HTTP/1.1 {status} ".encode()), received
        assert sends == [received]
    await stream.aclose()


async def test_a_head_held_when_the_app_fails_still_goes_out(nursery: trio.Nursery) -> None:
    """An app that fails after starting its answer: the held head is sent when the stream
    closes, as hypercorn alone sends it, and the connection closes (not an empty answer on a
    kept-alive connection, which some clients retry). Found by the nineteenth session's
    review; inboxd's routes start and end their answers in one go."""
    from hypercorn.config import Config as HyperConfig
    from hypercorn.trio import serve

    from inboxd.api import framing

    assert framing.install()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        headers = [(b"content-length", b"10")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        raise RuntimeError("the app fails after starting its answer")

    config = HyperConfig()
    config.bind = ["127.0.0.1:0"]
    config.errorlog = None
    binds = await nursery.start(serve, app, config)
    stream = await _connect(binds[0])
    await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    received = b""
    with trio.fail_after(5):
        while chunk := await stream.receive_some():
            received += chunk
    assert received.startswith(b"HTTP/1.1 200 ") and received.endswith(b"\r\n\r\n"), received
    await stream.aclose()


async def test_a_100_continue_goes_out_before_the_body_comes(base_url: str, seeded: Seed) -> None:
    """An informational answer is not held back for a body: the client waits for it."""
    body = b'{"channel_id": "nope"}'
    stream = await _connect(base_url)
    head = _post_head(seeded.owner_key, len(body)).replace(
        b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n"
    )
    await stream.send_all(head)
    with trio.fail_after(5):
        interim = await stream.receive_some()
    assert interim.startswith(b"HTTP/1.1 100 ") and interim.endswith(b"\r\n\r\n"), interim
    await stream.send_all(body)
    answer = await _read_responses(stream, 1)
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    await stream.aclose()


async def test_an_answer_decided_before_the_body_keeps_the_connection(
    base_url: str, seeded: Seed
) -> None:
    """A 403 decided from the headers waits for the body still under way, then the same
    connection serves the next request. (Answering first made hypercorn close the connection,
    and when the rest arrived during that close the next request waited forever.)"""
    stream = await _connect(base_url)
    body = b'{"channelId": "x"}'
    await stream.send_all(_post_head(seeded.bob_key, len(body)))
    with trio.move_on_after(0.2):  # the body is "on its way": nothing is answered meanwhile
        early = await stream.receive_some()
        raise AssertionError(f"answered before the body arrived: {early[:60]!r}")
    second = (
        "GET /api/v1/inbox/channels HTTP/1.1\r\nHost: inboxd\r\n"
        f"Authorization: Bearer {seeded.owner_key}\r\n\r\n"
    ).encode()
    await stream.send_all(body + second)
    with trio.fail_after(5):
        answers = await _read_responses(stream, 2)
    assert answers.startswith(b"HTTP/1.1 403 ")
    assert b"HTTP/1.1 200 " in answers
    assert b"connection: close" not in answers.lower()
    await stream.aclose()


async def test_a_body_that_never_comes_closes_the_connection_after_a_while(
    autojump_clock: trio.testing.MockClock, base_url: str, seeded: Seed
) -> None:
    stream = await _connect(base_url)
    await stream.send_all(_post_head(seeded.bob_key, 100))  # and never the 100 bytes
    started = trio.current_time()
    with trio.fail_after(60):
        answer = await _read_responses(stream, 1)
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert b"connection: close" in answer.lower()
    assert trio.current_time() - started >= BODY_WAIT_SECONDS
    await stream.aclose()


async def raw_bytes(base_url: str, request: bytes, within: float = 10) -> bytes:
    """Send ``request`` as it is over a new connection; what comes back until the server
    closes it (``within`` seconds, or the test fails)."""
    host, port = base_url.split("//")[1].rstrip("/").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(request)
        received = b""
        with trio.fail_after(within):
            while chunk := await stream.receive_some(65536):
                received += chunk
    return received


async def raw_bytes_in_pieces(base_url: str, pieces: list[bytes]) -> bytes:
    """``raw_bytes``, the request sent in ``pieces`` that arrive apart (no Nagle, a pause)."""
    host, port = base_url.split("//")[1].rstrip("/").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    async with stream:
        for piece in pieces:
            await stream.send_all(piece)
            await trio.sleep(0.1)
        received = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some(65536):
                received += chunk
    return received


async def raw_exchange(base_url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """``raw_bytes``, for one answer: its status, headers and body."""
    received = await raw_bytes(base_url, request)
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n",
            400,
            "invalid_request",
        ),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", 400, "invalid_request"),
        (b"NOT HTTP AT ALL\r\n\r\n", 400, "invalid_request"),
        (
            b"POST /api/v1/messaging/messages HTTP/1.1\r\nHost: x\r\n"
            b"Transfer-Encoding: gzip\r\n\r\n",
            501,
            "not_implemented",
        ),
        (
            # Headers past h11_max_incomplete_size (64 KiB), not yet ended.
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000,
            431,
            "request_header_fields_too_large",
        ),
    ],
)
async def test_malformed_http_gets_a_json_error_too(
    base_url: str, request_bytes: bytes, status: int, code: str
) -> None:
    """Requests hypercorn cannot parse never reach the app; its own answer used to be an empty
    body. CONTRACT section 3: every error response is JSON."""
    got, headers, body = await raw_exchange(base_url, request_bytes)
    assert got == status
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    error = orjson.loads(body)["error"]
    assert error["code"] == code and error["message"]


@pytest.mark.parametrize(
    "broken", [b"Transfer-Encoding: gzip\r\n", b"Content-Length: ten\r\n", b"no colon\r\n"]
)
async def test_a_head_request_that_cannot_be_parsed_gets_no_body(
    base_url: str, broken: bytes
) -> None:
    """RFC 9110 section 9.3.2: an answer to HEAD has no content, also when the rest of the
    request could not be read (h11 then cannot say what it asked for). An h11 client that
    sent HEAD reads the answer and then the end of the connection, nothing in between."""
    request = b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n" + broken + b"\r\n"
    wire = await raw_bytes(base_url, request)
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="HEAD", target="/healthz", headers=[("Host", "x")]))
    client.send(h11.EndOfMessage())
    client.receive_data(wire)
    client.receive_data(b"")
    answer = client.next_event()
    assert isinstance(answer, h11.Response) and answer.status_code in (400, 501)
    assert (b"content-type", b"application/json") in answer.headers
    assert [type(client.next_event()) for _ in range(2)] == [h11.EndOfMessage, h11.ConnectionClosed]


async def test_which_request_was_head_is_known_for_each_request_of_a_connection(
    base_url: str,
) -> None:
    """Requests sent one after another without waiting (pipelined): the broken one after a
    HEAD gets its JSON body, and a broken HEAD after a GET gets none."""
    good_head = b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    good_get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    broken = b"Content-Length: ten\r\n\r\n"
    after_head = await raw_bytes(base_url, good_head + b"GET /healthz HTTP/1.1\r\n" + broken)
    assert after_head.startswith(b"HTTP/1.1 200 ") and after_head.count(b"HTTP/1.1 400 ") == 1
    assert after_head.endswith(b'"}}') and b'"invalid_request"' in after_head
    after_get = await raw_bytes(base_url, good_get + b"HEAD /healthz HTTP/1.1\r\n" + broken)
    first, second = after_get.split(b"HTTP/1.1 400 ")
    assert first.startswith(b"HTTP/1.1 200 ")
    assert second.endswith(b"\r\n\r\n") and b"content-length: 0\r\n" in second


async def test_a_head_request_line_that_arrives_in_pieces_is_still_known(base_url: str) -> None:
    broken_head = b"HEAD /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n"
    for cut in (1, 2, 4):
        wire = await raw_bytes_in_pieces(base_url, [broken_head[:cut], broken_head[cut:]])
        assert wire.startswith(b"HTTP/1.1 400 ") and wire.endswith(b"\r\n\r\n"), (cut, wire)
        assert b"content-length: 0\r\n" in wire
    # After a GET on the same connection, and a GET broken the same way keeps its body.
    good_get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    wire = await raw_bytes_in_pieces(base_url, [good_get + b"HE", broken_head[2:]])
    first, second = wire.split(b"HTTP/1.1 400 ")
    assert first.startswith(b"HTTP/1.1 200 ") and second.endswith(b"\r\n\r\n")
    broken_get = b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n"
    wire = await raw_bytes_in_pieces(base_url, [broken_get[:1], broken_get[1:]])
    assert wire.endswith(b'"}}') and b'"invalid_request"' in wire


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /healthz HTTP/1.0\r\n\r\n",
        b"GET /api/v1/inbox/conversations HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ],
)
async def test_a_connection_the_client_asked_to_close_is_closed_after_the_answer(
    base_url: str, request_bytes: bytes
) -> None:
    """The answer to a request with "Connection: close" (or HTTP/1.0) is followed by the end
    of the connection. quart-trio used to cancel hypercorn's close half-way, so the socket
    stayed open until the client closed it or read_timeout (60 s) passed."""
    # (The read timeout is 60 s; a close takes milliseconds.)
    received = await raw_bytes(base_url, request_bytes, within=5)
    assert received.startswith((b"HTTP/1.1 200 ", b"HTTP/1.1 401 "))
    assert received.endswith(b"}")  # the whole answer came before the end


async def test_a_websocket_upgrade_to_a_plain_path_says_it_is_not_a_websocket(
    base_url: str, seeded: Seed
) -> None:
    """It said "this path is a websocket", the opposite (found by an audit)."""
    request = (
        b"GET /api/v1/inbox/channels HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Authorization: Bearer " + seeded.owner_key.encode() + b"\r\n\r\n"
    )
    received = await raw_bytes(base_url, request, within=5)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"upgrade: websocket" not in head.lower()
    assert orjson.loads(body)["error"] == {
        "code": "invalid_request",
        "message": "this path is not a websocket: the feed is at /api/v1/inbox/feed",
    }


@pytest.mark.parametrize(
    "upgrade",
    [
        b"Upgrade: websocket\r\nConnection: Upgrade\r\n",
        b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 8\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
    ],
    ids=["no key or version", "version 8"],
)
@pytest.mark.parametrize("path", [b"/api/v1/inbox/feed", b"/api/v1/inbox/channels"])
async def test_a_websocket_upgrade_hypercorn_refuses_gets_the_json_400_and_the_close(
    base_url: str, seeded: Seed, upgrade: bytes, path: bytes
) -> None:
    """hypercorn answers such an upgrade itself: it did with an empty body, and then left the
    connection open, although the answer said "connection: close", until read_timeout (60 s)
    (found by a review)."""
    request = b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + upgrade + b"\r\n"
    received = await raw_bytes(base_url, request, within=5)  # (the read timeout is 60 s)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"content-type: application/json" in head
    assert orjson.loads(body)["error"] == {
        "code": "invalid_request",
        "message": "the websocket upgrade is not valid (it needs Sec-WebSocket-Key and"
        " Sec-WebSocket-Version: 13)",
    }


def _over_http2(
    host: str,
    port: int,
    path: bytes,
    headers: list[tuple[bytes, bytes]],
    authority: bytes = b"inboxd",
    websocket: bool = False,
) -> tuple[int, bytes]:
    """One GET over HTTP/2 without TLS (prior knowledge), which hypercorn serves on the same
    port; the h2 library is hypercorn's own dependency. With ``websocket``, an RFC 8441
    extended CONNECT instead (a websocket over HTTP/2), answered as soon as it is accepted."""
    import h2.config
    import h2.connection
    import h2.events

    config = h2.config.H2Configuration(client_side=True, header_encoding=None)
    conn = h2.connection.H2Connection(config=config)
    with socket.create_connection((host, port), timeout=10) as s:
        conn.initiate_connection()
        s.sendall(conn.data_to_send())
        if websocket:  # the server's SETTINGS first: they allow the extended CONNECT
            while not any(
                isinstance(e, h2.events.RemoteSettingsChanged)
                for e in conn.receive_data(s.recv(65536))
            ):
                pass
            s.sendall(conn.data_to_send())
        stream = conn.get_next_available_stream_id()
        if websocket:
            request = [(b":method", b"CONNECT"), (b":protocol", b"websocket")]
            headers = [*headers, (b"sec-websocket-version", b"13")]
        else:
            request = [(b":method", b"GET")]
        request += [(b":path", path), (b":scheme", b"http"), (b":authority", authority)]
        conn.send_headers(stream, [*request, *headers], end_stream=not websocket)
        s.sendall(conn.data_to_send())
        status, body = 0, b""
        while True:
            data = s.recv(65536)
            if not data:
                return status, body
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    status = int(dict(event.headers)[b":status"])
                    if websocket and status == 200:
                        return status, body
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    return status, body
            s.sendall(conn.data_to_send())


async def test_a_query_string_that_is_not_utf8_gets_the_json_400(
    base_url: str, seeded: Seed
) -> None:
    """HTTP/1.1 refuses such bytes in h11; over HTTP/2 they reached Quart, which failed to
    decode them while setting the request up (before any error handler): a bare 500."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    key = [(b"authorization", f"Bearer {seeded.owner_key}".encode())]
    status, body = await trio.to_thread.run_sync(
        _over_http2, host, int(port), b"/api/v1/inbox/channels?x=\xff", key
    )
    assert status == 400, body
    assert orjson.loads(body) == {
        "error": {"code": "invalid_request", "message": "the query string is not UTF-8"}
    }
    # A good one over HTTP/2 is served as usual.
    status, body = await trio.to_thread.run_sync(
        _over_http2, host, int(port), b"/api/v1/inbox/channels?x=%C3%A9", key
    )
    assert status == 200 and isinstance(orjson.loads(body), list)
    # A websocket over HTTP/2 with such a query: the same 400 (it was a 403 with no body,
    # then with a "forbidden" one); a good one is accepted.
    feed = b"/api/v1/inbox/feed"
    status, body = await trio.to_thread.run_sync(
        lambda: _over_http2(host, int(port), feed + b"?x=\xff", key, websocket=True)
    )
    assert status == 400 and orjson.loads(body)["error"]["code"] == "invalid_request", body
    status, body = await trio.to_thread.run_sync(
        lambda: _over_http2(host, int(port), feed + b"?since=0", key, websocket=True)
    )
    assert status == 200


@pytest.mark.parametrize("host", [b".", b"a..b", b"a" * 64 + b".example", b"a" * 64 + b":80"])
@pytest.mark.parametrize("path", [b"/healthz", b"/api/v1/inbox/channels"])
async def test_a_host_that_is_not_a_host_name_gets_the_json_400(
    base_url: str, seeded: Seed, host: bytes, path: bytes
) -> None:
    """An empty label or one over 63 characters: werkzeug's IDNA encoding of the Host failed
    while Quart set the request up (before any error handler), and hypercorn answered a bare
    500 with an empty body (found by a review)."""
    request = (
        b"GET " + path + b" HTTP/1.1\r\nHost: " + host + b"\r\n"
        b"Authorization: Bearer " + seeded.owner_key.encode() + b"\r\n"
        b"Connection: close\r\n\r\n"
    )
    status, headers, body = await raw_exchange(base_url, request)
    assert (status, headers["content-type"]) == (400, "application/json"), body
    assert orjson.loads(body) == {
        "error": {
            "code": "invalid_request",
            "message": "the request's Host header is not a valid host name",
        }
    }
    # Over HTTP/2 the host comes as :authority; the same answer.
    address, port = base_url.removeprefix("http://").rsplit(":", 1)
    key = [(b"authorization", f"Bearer {seeded.owner_key}".encode())]
    status, body = await trio.to_thread.run_sync(
        lambda: _over_http2(address, int(port), path, key, authority=host)
    )
    assert status == 400 and orjson.loads(body)["error"]["code"] == "invalid_request", body


async def test_a_websocket_the_client_closes_is_closed_once(
    base_url: str, seeded: Seed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """framing's wrapper closes the stream after an upgrade hypercorn refuses; it also sent a
    second StreamClosed after every close frame of an accepted websocket, where hypercorn had
    closed the stream already (found by a review)."""
    from hypercorn.protocol.events import StreamClosed
    from hypercorn.protocol.h11 import H11Protocol

    closes: list[int] = []
    stream_send = H11Protocol.stream_send

    async def counting(self: Any, event: Any) -> None:
        if isinstance(event, StreamClosed):
            closes.append(event.stream_id)
        await stream_send(self, event)

    monkeypatch.setattr(H11Protocol, "stream_send", counting)
    url = base_url.replace("http://", "ws://") + "/api/v1/inbox/feed"
    auth_header = [("Authorization", f"Bearer {seeded.owner_key}")]
    async with open_websocket_url(url, extra_headers=auth_header) as ws:
        await trio.sleep(0.2)  # (past hypercorn's first ping, which a closing client refuses)
        await ws.aclose()
    with trio.fail_after(5):
        while not closes:  # noqa: ASYNC110
            await trio.sleep(0.01)
    await trio.sleep(0.2)  # (a second one would come at once)
    assert len(closes) == 1


def _websocket_with_early_data(host: str, port: int, key: str) -> None:
    """An extended CONNECT for the feed over HTTP/2, followed at once by a websocket frame,
    before the answer; read until the stream ends or the server stops answering."""
    import h2.config
    import h2.connection
    import h2.events

    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
    with socket.create_connection((host, port), timeout=3) as s:
        conn.initiate_connection()
        s.sendall(conn.data_to_send())
        while not any(
            isinstance(e, h2.events.RemoteSettingsChanged) for e in conn.receive_data(s.recv(65536))
        ):
            pass
        stream = conn.get_next_available_stream_id()
        request = [(b":method", b"CONNECT"), (b":protocol", b"websocket")]
        request += [(b":path", b"/api/v1/inbox/feed"), (b":scheme", b"http")]
        request += [(b":authority", b"inboxd"), (b"sec-websocket-version", b"13")]
        conn.send_headers(stream, [*request, (b"authorization", f"Bearer {key}".encode())])
        conn.send_data(stream, b"\x81\x80\x00\x00\x00\x00")  # an empty masked text frame
        s.sendall(conn.data_to_send())
        try:
            while data := s.recv(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                        return
                s.sendall(conn.data_to_send())
        except (TimeoutError, h2.exceptions.ProtocolError):
            pass


async def test_a_websocket_refused_for_early_data_leaves_no_feed_client(
    base_url: str, seeded: Seed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hypercorn refuses a frame that comes before the answer (400), while the feed's handler,
    already started for the upgrade, may accept and register; every later event of the closed
    stream was dropped, its disconnect too, so the handler stayed registered after the client
    left (found by a review). A race: on the old code this failed in about a third of runs."""
    from inboxd.feed import FeedHub

    hubs: list[FeedHub] = []
    register = FeedHub.register

    def noting(self: FeedHub, who: Any) -> Any:
        hubs.append(self)
        return register(self, who)

    monkeypatch.setattr(FeedHub, "register", noting)
    host, port = base_url.removeprefix("http://").split(":")
    await trio.to_thread.run_sync(
        lambda: _websocket_with_early_data(host, int(port), seeded.owner_key)
    )
    await trio.sleep(1.0)  # the client is gone
    assert all(not hub.clients for hub in hubs)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([], None),
        ([(b"content-length", b"12")], 12),
        ([(b"content-length", b"0")], 0),
        ([(b"content-length", b"twelve")], 0),
        ([(b"content-length", b"7"), (b"content-length", b"9")], 7),
        ([(b"transfer-encoding", b"chunked")], None),
        ([(b"transfer-encoding", b"chunked"), (b"content-length", b"5")], None),
        ([(b"content-length", b"5"), (b"transfer-encoding", b"gzip")], 5),
        ([(b"x-content-length", b"5"), (b"accept", b"*/*")], None),
    ],
)
def test_the_request_length_is_werkzeugs(
    headers: list[tuple[bytes, bytes]], expected: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """InboxRequest tells that no Content-Length was sent without werkzeug's lookups; with one
    or without, and whatever Transfer-Encoding says, it answers what Quart's own request
    class answers."""
    from quart_trio.wrappers import TrioRequest
    from werkzeug.datastructures import Headers

    from inboxd.api.app import InboxRequest

    asked: list[str] = []
    werkzeugs_get = Headers.get

    def counted_get(self: Headers, key: str, *args: Any, **kwargs: Any) -> Any:
        asked.append(key.lower())
        return werkzeugs_get(self, key, *args, **kwargs)

    monkeypatch.setattr(Headers, "get", counted_get)

    def length(cls: type[TrioRequest]) -> tuple[int | None, list[str]]:
        asked.clear()
        scope: Any = {"type": "http", "headers": [(b"host", b"inboxd"), *headers]}
        made = Headers()
        for name, value in scope["headers"]:  # as Quart builds them from the scope
            made.add(name.decode("latin1").title(), value.decode("latin1"))
        request = cls(
            "POST", "http", "/", b"", made, "", "1.1", scope, send_push_promise=lambda *a: None
        )
        return request.content_length, [k for k in asked if k.endswith("-length")]

    ours, ours_asked = length(InboxRequest)
    theirs, theirs_asked = length(TrioRequest)
    assert ours == theirs == expected
    assert theirs_asked == ["content-length"]
    sent = any(name == b"content-length" for name, _ in headers)
    assert ours_asked == (["content-length"] if sent else [])


def _adapter_request(
    method: str, scheme: str, path: str, query: bytes, host: str, root_path: str = ""
) -> Any:
    from quart_trio.wrappers import TrioRequest
    from werkzeug.datastructures import Headers

    headers = Headers([("Host", host)] if host else [])
    scope: Any = {"type": "http", "headers": []}
    return TrioRequest(
        method,
        scheme,
        path,
        query,
        headers,
        root_path,
        "1.1",
        scope,
        send_push_promise=lambda *a: None,
    )


def fields(adapter: Any) -> Any:
    """A URL adapter's fields ("refused": the app's adapter of a bad host)."""
    from werkzeug.routing import MapAdapter

    from inboxd.api.app import _RefusedHost

    if isinstance(adapter, _RefusedHost):
        return "refused"
    assert isinstance(adapter, MapAdapter)
    return {name: getattr(adapter, name) for name in _ADAPTER_FIELDS}


_ADAPTER_FIELDS = (
    "server_name",
    "script_name",
    "subdomain",
    "url_scheme",
    "path_info",
    "default_method",
    "query_args",
    "websocket",
)


@pytest.mark.parametrize(
    ("scheme", "host", "method", "path", "query"),
    [
        ("http", "127.0.0.1:8080", "GET", "/api/v1/inbox/conversations/conv_1", b""),
        ("http", "Inbox.Example.COM", "PATCH", "/api/v1/inbox/conversations/c/title", b"a=1"),
        ("http", "inbox.example:80", "GET", "/healthz", b""),  # (the default port: dropped)
        ("https", "inbox.example:443", "POST", "/api/v1/inbox/conversations/c/read", b""),
        ("http", "[::1]:9000", "GET", "/api/v1/inbox/conversations", b"limit=5&status=OPEN"),
        ("http", "bücher.example", "GET", "/readyz", b""),  # (werkzeug takes no such host)
        ("ws", "inbox.example:8080", "GET", "/api/v1/inbox/feed", b"since=0"),
        ("http", "a..b", "GET", "/healthz", b""),  # not a host name: refused
        ("http", "", "GET", "/healthz", b""),  # no Host header
    ],
)
def test_the_url_adapter_is_quarts(
    scheme: str, host: str, method: str, path: str, query: bytes
) -> None:
    """The app remembers the host name werkzeug binds each Host to: the adapter it makes, the
    first time and from what it remembered, is the one Quart's own path makes, field by field
    (and a host that is not a host name is refused both times)."""
    from inboxd.api.app import InboxApp

    app = InboxApp("adapter-test")

    def request() -> Any:
        return _adapter_request(method, scheme, path, query, host)

    quarts = fields(app._quart_url_adapter(request()))
    first = fields(app.create_url_adapter(request()))
    remembered = fields(app.create_url_adapter(request()))
    assert first == remembered == quarts
    assert list(app._bound_hosts) == [(scheme, request().host)]
    if host == "Inbox.Example.COM":
        assert quarts["server_name"] == "inbox.example.com"
    if host == "a..b":
        assert quarts == "refused"


def test_the_remembered_hosts_are_bounded_and_routing_set_up_otherwise_is_quarts() -> None:
    """At most MAX_BOUND_HOSTS remembered (then it starts afresh), none longer than a host name
    can be; a root path is the request's own; with a SERVER_NAME (or subdomains) nothing is
    remembered and Quart's own path answers."""
    from inboxd.api import app as app_module

    app = app_module.InboxApp("adapter-test")

    def adapter(host: str, root_path: str = "") -> Any:
        return app.create_url_adapter(
            _adapter_request("GET", "http", "/healthz", b"", host, root_path)
        )

    for n in range(app_module.MAX_BOUND_HOSTS):
        adapter(f"h{n}.example")
    assert len(app._bound_hosts) == app_module.MAX_BOUND_HOSTS
    adapter("one-more.example")
    assert list(app._bound_hosts) == [("http", "one-more.example")]
    # A name of valid labels but longer than a host name: bound, and not kept.
    long = ".".join(["a" * 60] * 10)
    assert fields(adapter(long))["server_name"] == long
    assert ("http", long) not in app._bound_hosts
    # Behind a root path, remembered or not, the adapter is Quart's.
    first, again = adapter("one-more.example", "/inbox"), adapter("one-more.example", "/inbox")
    quarts = app._quart_url_adapter(
        _adapter_request("GET", "http", "/healthz", b"", "one-more.example", "/inbox")
    )
    assert fields(first) == fields(again) == fields(quarts)
    assert fields(again)["script_name"] == "/inbox/"
    # Routing set up otherwise: Quart's own path, nothing remembered.
    other = app_module.InboxApp("adapter-test-2")
    other.config["SERVER_NAME"] = "inbox.example"
    request = _adapter_request("GET", "http", "/healthz", b"", "inbox.example")
    assert fields(other.create_url_adapter(request)) == fields(other._quart_url_adapter(request))
    assert other._bound_hosts == {}
