"""Shared fixtures.

Rules for every test here: a real SQLite file under pytest's tmp_path, the real daemon serving real
HTTP on 127.0.0.1 with port 0, real clients (httpx); no sleeping on the wall clock. Every response
the shared clients get, and every webhook request the shared receiver gets, is checked against the
OpenAPI document (tests/openapi_check.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing

from inboxd import daemon
from inboxd.clock import TrioClock
from inboxd.config import Config, LimitsConfig, ServerConfig, WebhooksConfig
from inboxd.store import accounts
from inboxd.store.db import Store
from inboxd.timeutil import now_us
from tests.openapi_check import check_response_hook, check_webhook_request
from tests.receiver import Certs, Receiver, make_certs, running_receiver


@attrs.frozen
class Seed:
    """A store with an owner, two channels and operators with different access."""

    data_dir: Path
    account_id: str
    owner_id: str
    owner_key: str
    sales_id: str  # channel both operators can open
    support_id: str  # channel only the owner and ann can open
    ann_id: str
    ann_key: str  # operator on sales and support
    bob_id: str
    bob_key: str  # operator on sales only
    eve_key: str  # operator with no channels


def seed_store(data_dir: Path) -> Seed:
    store = Store.open(data_dir, create=True, readers=1)
    try:

        def seed(conn: Any) -> Seed:
            now = now_us()
            acct = accounts.create_account(conn, "owner@example.com", "Olivia Owner", now)
            account_pk = accounts.the_account_pk(conn)
            sales = accounts.create_channel(conn, account_pk, "Sales", "WHATSAPP", now)
            support = accounts.create_channel(conn, account_pk, "Support", "WHATSAPP", now)
            ann = accounts.create_operator(
                conn, account_pk, "ann@example.com", "Ann", [sales.id, support.id], now
            )
            bob = accounts.create_operator(
                conn, account_pk, "bob@example.com", "Bob", [sales.id], now
            )
            eve = accounts.create_operator(conn, account_pk, "eve@example.com", "Eve", [], now)
            return Seed(
                data_dir=data_dir,
                account_id=acct.account_id,
                owner_id=acct.owner_user_id,
                owner_key=acct.api_key,
                sales_id=sales.id,
                support_id=support.id,
                ann_id=ann.user_id,
                ann_key=ann.api_key,
                bob_id=bob.user_id,
                bob_key=bob.api_key,
                eve_key=eve.api_key,
            )

        return store.write_sync(seed)
    finally:
        store.close()


def test_config(**limits: Any) -> Config:
    # Rate limiting is off unless a test turns it on: tests ingest hundreds of messages quickly.
    # The daemons tests run in this process leave its memory unlocked (server.lock_code): a
    # lock would outlive them, and test_resident looks at this process's locks; the CLI's
    # daemon, a process of its own, locks its code as the default says.
    return Config(
        server=ServerConfig(lock_code=False),
        limits=LimitsConfig(requests_per_second=0, burst=1, **limits),
    )


test_config.__test__ = False  # type: ignore[attr-defined]


@pytest.fixture
def seeded(tmp_path: Path) -> Seed:
    return seed_store(tmp_path / "data")


@pytest.fixture
def config() -> Config:
    return test_config()


def on_mock_clock() -> bool:
    return isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock)


@pytest.fixture
async def base_url(seeded: Seed, config: Config) -> AsyncIterator[str]:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            lambda task_status: daemon.run(
                seeded.data_dir,
                config,
                shutdown,
                bind="127.0.0.1:0",
                offload_store=not on_mock_clock(),
                clock=TrioClock(),
                task_status=task_status,
            )
        )
        yield urls[0]
        shutdown.set()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def client_timeout() -> httpx.Timeout:
    # Under MockClock's autojump the trio clock leaps ahead whenever every task waits, including
    # while the daemon's SQLite work runs in a thread: a client timeout would fire at random, so
    # timer tests use none (their own fail_after bounds them on the virtual clock).
    if on_mock_clock():
        return httpx.Timeout(None)
    return httpx.Timeout(10.0)


# httpx event hooks that hold every response to the OpenAPI document.
OPENAPI_HOOKS: dict[str, list[Any]] = {"response": [check_response_hook]}


def restartable_daemon(seeded: Seed, config: Config) -> Any:
    """``run(shutdown, task_status)`` for a test that stops the daemon and starts it again
    (``await nursery.start(run, shutdown)`` answers its URLs): the store's SQL on the trio
    thread (MockClock) and one wall clock across its runs, as the real one would be."""
    clock = TrioClock()

    async def run(shutdown: trio.Event, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await daemon.run(
            seeded.data_dir,
            config,
            shutdown,
            bind="127.0.0.1:0",
            offload_store=False,
            clock=clock,
            task_status=task_status,
        )

    return run


def owner_client(url: str, seeded: Seed) -> httpx.AsyncClient:
    """A client with the owner's key for a daemon a test started itself (no timeout: MockClock)."""
    return httpx.AsyncClient(
        base_url=url, headers=auth(seeded.owner_key), timeout=None, event_hooks=OPENAPI_HOOKS
    )


@pytest.fixture
async def owner(base_url: str, seeded: Seed) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=base_url,
        headers=auth(seeded.owner_key),
        timeout=client_timeout(),
        event_hooks=OPENAPI_HOOKS,
    ) as client:
        yield client


@pytest.fixture
async def anon(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=base_url, timeout=client_timeout(), event_hooks=OPENAPI_HOOKS
    ) as client:
        yield client


@pytest.fixture
def store(seeded: Seed) -> Iterator[Store]:
    """A second connection to the test's store, for arranging state the API cannot set yet."""
    s = Store.open(seeded.data_dir, readers=1)
    yield s
    s.close()


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    """A local CA and a certificate for 127.0.0.1 and localhost (for HTTPS receivers)."""
    return make_certs(tmp_path / "tls")


def webhook_config(certs: Certs) -> Config:
    """Trust the local CA, allow loopback receivers, no rate limit."""
    return Config(
        webhooks=WebhooksConfig(ca_file=str(certs.ca_file), allow_private_hosts=True),
        limits=LimitsConfig(requests_per_second=0),
    )


@pytest.fixture
async def receiver(certs: Certs) -> AsyncIterator[Receiver]:
    async with running_receiver(certs) as r:
        yield r
    for request in r.requests:
        check_webhook_request(request.headers, request.body)


def message_body(channel_id: str, phone: str, **extra: Any) -> dict[str, Any]:
    """A messaging API report: an inbound text unless ``extra`` says otherwise."""
    return {
        "channelId": channel_id,
        "direction": extra.pop("direction", "INBOUND"),
        "contact": {"phoneNumber": phone, **extra.pop("contact", {})},
        "type": extra.pop("type", "TEXT"),
        **extra,
    }


async def ingest(client: httpx.AsyncClient, channel_id: str, phone: str, **extra: Any) -> Any:
    response = await client.post(
        "/api/v1/messaging/messages", json=message_body(channel_id, phone, **extra)
    )
    assert response.status_code in (200, 201), response.text
    return response.json()
