"""The outgoing client: URL rules, the connect-time address check, signing, no redirects."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from inboxd.config import WebhooksConfig
from inboxd.errors import Unprocessable
from inboxd.webhooks.client import MAX_ANSWER_BYTES, make_client, post_event, sign, validate_url
from tests.receiver import Certs, make_certs, running_receiver


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/x",
        "https://10.1.2.3/x",
        "https://192.168.0.10/x",
        "https://172.16.5.4/x",
        "https://169.254.169.254/latest/meta-data",
        "https://[::1]/x",
        "https://[::ffff:127.0.0.1]/x",
        "https://[fd00::1]/x",
        "https://0.0.0.0/x",
        "https://localhost/x",
        "https://api.localhost/x",
        "https://intranet/x",
        # The forms the resolver also reads as loopback or private addresses.
        "https://127.1/x",
        "https://0x7f.0.0.1/x",
        "https://127.0.0.1./x",
        "https://10.1/x",
        # IPv6 that Python's is_global takes for global: site-local, and addresses that wrap a
        # loopback or private IPv4 one (IPv4-compatible, 6to4, NAT64).
        "https://[fec0::1]/x",
        "https://[::127.0.0.1]/x",
        "https://[2002:7f00:1::1]/x",
        "https://[2002:a01:203::1]/x",
        "https://[64:ff9b::7f00:1]/x",
        "https://[::ffff:0:7f00:1]/x",
        "https://[64:ff9b:1::808:808]/x",
    ],
)
def test_private_hosts_are_refused_unless_allowed(url: str) -> None:
    with pytest.raises(Unprocessable) as info:
        validate_url(url, allow_private=False)
    assert info.value.code == "invalid_url"
    assert validate_url(url, allow_private=True) == url


@pytest.mark.parametrize(
    "url",
    [
        "https://8.8.8.8/x",
        "https://[2001:4860:4860::8888]/x",
        # The same wrappers around a global IPv4 address are global.
        "https://[2002:808:808::1]/x",
        "https://[64:ff9b::808:808]/x",
    ],
)
def test_global_addresses_are_allowed(url: str) -> None:
    assert validate_url(url, allow_private=False) == url


@pytest.mark.parametrize(
    "url",
    ["https://0177.0.0.1/x", "https://\N{SNOWMAN}.example.com/x", "https://example.com/a\x00"],
)
def test_urls_httpx_cannot_send_to_are_refused_even_when_private_hosts_are_allowed(
    url: str,
) -> None:
    for allow_private in (False, True):
        with pytest.raises(Unprocessable) as info:
            validate_url(url, allow_private=allow_private)
        assert info.value.code == "invalid_url"


@pytest.mark.parametrize(
    "url", ["https://hooks.example.com/x", "https://8.8.8.8/x", "https://hooks.example.com:8443/"]
)
def test_public_https_urls_pass(url: str) -> None:
    assert validate_url(url, allow_private=False) == url


def test_signature_is_lowercase_hex_hmac_sha256_of_the_exact_body() -> None:
    body = b'{"id":"evt_1","type":"x","createdAt":"2026-01-01T00:00:00.000000Z","data":{}}'
    expected = hmac.new(b"whsec_abc", body, hashlib.sha256).hexdigest()
    assert sign("whsec_abc", body) == f"sha256={expected}"
    assert expected == expected.lower()


async def test_a_name_resolving_to_a_private_address_is_refused_at_connect_time(
    tmp_path: Path,
) -> None:
    certs = make_certs(tmp_path)
    async with running_receiver(certs) as receiver:
        port = receiver.url.split(":")[2].split("/")[0]
        # "localhost" passes no save-time check here (think of a public name whose DNS answer
        # later turns private): the connect-time guard must stop it.
        url = f"https://localhost:{port}/hook"
        guarded = make_client(WebhooksConfig(ca_file=str(certs.ca_file), allow_private_hosts=False))
        async with guarded:
            outcome = await post_event(guarded, url, "whsec_x", b"{}", "t", "dlv_1")
        assert outcome.status is None
        assert outcome.error is not None and "non-public address" in outcome.error
        assert receiver.requests == []
        allowed = make_client(WebhooksConfig(ca_file=str(certs.ca_file), allow_private_hosts=True))
        async with allowed:
            ok = await post_event(allowed, url, "whsec_x", b"{}", "t", "dlv_1")
        assert ok.ok and ok.status == 200
        assert len(receiver.requests) == 1


async def test_redirects_are_not_followed_and_tls_is_verified(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    async with running_receiver(certs) as receiver:
        receiver.statuses.append((302, {"Location": "https://127.0.0.1:1/elsewhere"}))
        client = make_client(WebhooksConfig(ca_file=str(certs.ca_file), allow_private_hosts=True))
        async with client:
            outcome = await post_event(client, receiver.url, "whsec_x", b"{}", "t", "dlv_1")
        assert outcome.status == 302 and not outcome.ok and outcome.error == "HTTP 302"
        assert len(receiver.requests) == 1
        # Without the local CA the receiver's certificate is not trusted.
        untrusting = make_client(WebhooksConfig(allow_private_hosts=True))
        async with untrusting:
            refused = await post_event(untrusting, receiver.url, "whsec_x", b"{}", "t", "dlv_2")
        assert refused.status is None and refused.error is not None
        assert len(receiver.requests) == 1


async def test_an_answer_is_read_up_to_a_bound_and_the_connection_kept_when_it_can_be(
    tmp_path: Path,
) -> None:
    """post_event goes to the transport directly: the headers a receiver sees are the same as
    through the client, a small answer leaves the connection for the next POST, and a large
    one is cut at MAX_ANSWER_BYTES and costs only its connection."""
    certs = make_certs(tmp_path)
    async with running_receiver(certs) as receiver:
        client = make_client(WebhooksConfig(ca_file=str(certs.ca_file), allow_private_hosts=True))
        async with client:
            pool = client.webhook_transport._pool
            first = await post_event(client, receiver.url, "whsec_x", b'{"a":1}', "t", "dlv_1")
            second = await post_event(client, receiver.url, "whsec_x", b'{"a":2}', "t", "dlv_2")
            assert first.ok and second.ok and first.error is None
            assert len(pool.connections) == 1  # the first connection served the second POST
            receiver.answer_body = b"x" * (4 * MAX_ANSWER_BYTES)
            big = await post_event(client, receiver.url, "whsec_x", b'{"a":3}', "t", "dlv_3")
            assert big.ok and big.status == 200
            assert len(pool.connections) == 0  # cut short: that connection was dropped
            receiver.answer_body = b"ok"
            again = await post_event(client, receiver.url, "whsec_x", b'{"a":4}', "t", "dlv_4")
            assert again.ok
        request = receiver.requests[0]
        assert request.body == b'{"a":1}' and request.signature_ok("whsec_x")
        assert request.headers["user-agent"].startswith("inboxd/")
        assert request.headers["content-type"] == "application/json"
        assert request.headers["x-svc-event"] == "t"
        assert request.headers["x-svc-delivery"] == "dlv_1"
        assert len(receiver.requests) == 4


async def _trickling_head_server(certs: Certs, task_status: trio.TaskStatus[int]) -> None:
    """A TLS server that reads a request, then sends its answer's head a byte every 5 s."""
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs.cert_file, certs.key_file)

    async def handle(stream: trio.SSLStream[trio.SocketStream]) -> None:
        await stream.receive_some()
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000:
            await stream.send_all(bytes([byte]))
            await trio.sleep(5)

    listeners = await trio.open_ssl_over_tcp_listeners(0, context, host="127.0.0.1")
    task_status.started(listeners[0].transport_listener.socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)


async def test_a_receiver_answering_a_byte_at_a_time_times_out_at_the_request_timeout(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Each read of the answer's head comes within the timeout, the head never ends: the
    delivery still ends after request_timeout (10 s), as a timeout."""
    certs = make_certs(tmp_path)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_trickling_head_server, certs)
        client = make_client(WebhooksConfig(ca_file=str(certs.ca_file), allow_private_hosts=True))
        async with client:
            started = trio.current_time()
            with trio.fail_after(60):
                outcome = await post_event(
                    client, f"https://127.0.0.1:{port}/hook", "whsec_x", b"{}", "t", "dlv_1"
                )
            waited = trio.current_time() - started
        nursery.cancel_scope.cancel()
    assert outcome.status is None and outcome.error == "timeout" and not outcome.ok
    assert 10 <= waited < 15


async def test_an_endless_answer_body_keeps_its_status_and_loses_its_connection(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The status arrived in time, the body never ends: the delivery ends at request_timeout
    with the status the receiver gave, and its connection is dropped, not reused."""
    certs = make_certs(tmp_path)
    async with running_receiver(certs) as receiver:
        receiver.trickle = 5
        client = make_client(WebhooksConfig(ca_file=str(certs.ca_file), allow_private_hosts=True))
        async with client:
            started = trio.current_time()
            with trio.fail_after(60):
                outcome = await post_event(client, receiver.url, "whsec_x", b"{}", "t", "dlv_1")
            waited = trio.current_time() - started
            assert len(client.webhook_transport._pool.connections) == 0
            receiver.trickle = None
            again = await post_event(client, receiver.url, "whsec_x", b"{}", "t", "dlv_2")
    assert outcome.status == 200 and outcome.ok
    assert 10 <= waited < 15
    assert again.ok and len(receiver.requests) == 2


async def test_a_host_that_does_not_resolve_is_a_failed_attempt_not_an_exception() -> None:
    """RFC 6761 reserves .invalid: it never resolves. The resolver's error (socket.gaierror)
    used to escape post_event, so deliverers logged and retried without recording anything."""
    client = make_client(WebhooksConfig(allow_private_hosts=False))
    async with client:
        outcome = await post_event(
            client, "https://hooks.inboxd-test.invalid/x", "whsec_x", b"{}", "t", "dlv_1"
        )
    assert outcome.status is None and not outcome.ok
    assert outcome.error is not None and "did not resolve" in outcome.error


async def test_a_url_httpx_cannot_send_to_is_a_failed_attempt_not_an_exception() -> None:
    """validate_url refuses it now; one saved before (or in a store from an older version) must
    still come back as a failure the deliverers record, not as an exception out of post_event."""
    client = make_client(WebhooksConfig(allow_private_hosts=False))
    async with client:
        outcome = await post_event(
            client, "https://\N{SNOWMAN}.example.com/hook", "whsec_x", b"{}", "t", "dlv_1"
        )
    assert outcome.status is None and not outcome.ok
    assert outcome.error is not None and outcome.error.startswith("InvalidURL")


@pytest.mark.parametrize(
    ("retry_after", "date", "seconds"),
    [
        ("120", None, 120.0),
        # An HTTP-date (RFC 9110 10.2.3), from the answer's own Date: its three forms.
        ("Tue, 24 Nov 2026 10:10:00 GMT", "Tue, 24 Nov 2026 10:00:00 GMT", 600.0),
        ("Tuesday, 24-Nov-26 10:10:00 GMT", "Tue, 24 Nov 2026 10:00:00 GMT", 600.0),
        ("Tue Nov 24 10:10:00 2026", "Tue, 24 Nov 2026 10:00:00 GMT", 600.0),
        ("Tue, 24 Nov 2026 09:59:00 GMT", "Tue, 24 Nov 2026 10:00:00 GMT", 0.0),  # past: now
        ("soon", None, None),
        ("Tue, 99 Nov 2026 10:10:00 GMT", None, None),
    ],
)
def test_retry_after_in_seconds_or_as_a_date(
    retry_after: str, date: str | None, seconds: float | None
) -> None:
    from inboxd.webhooks.client import _retry_after

    headers = {"Retry-After": retry_after, **({"Date": date} if date else {})}
    for status in (429, 503):
        assert _retry_after(httpx.Response(status, headers=headers)) == seconds
    assert _retry_after(httpx.Response(500, headers=headers)) is None


def test_a_retry_after_date_without_a_date_header_counts_from_our_clock() -> None:
    from email.utils import format_datetime

    from inboxd.webhooks.client import _retry_after

    when = format_datetime(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10), usegmt=True)
    waited = _retry_after(httpx.Response(503, headers={"Retry-After": when}))
    assert waited is not None and 590 <= waited <= 600
