"""Mail through a real SMTP server (aiosmtpd): invites arrive with their token."""

from __future__ import annotations

import asyncio
import email
import socket
import threading
from collections.abc import Iterator
from functools import partial
from typing import Any

import httpx
import pytest
import trio
from aiosmtpd.controller import Controller

from inboxd import daemon, mailer
from inboxd.clock import TrioClock
from inboxd.config import Config, LimitsConfig, MailConfig, WebhooksConfig
from inboxd.store.db import Store
from tests.conftest import OPENAPI_HOOKS, Seed, auth, ingest, owner_client, restartable_daemon
from tests.receiver import Certs, make_certs, running_receiver
from tests.test_team import TEAM, token_of


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Inbox:
    def __init__(self) -> None:
        self.messages: list[email.message.Message] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(email.message_from_bytes(envelope.content))
        return "250 OK"


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


@pytest.fixture
def config(smtp: tuple[Inbox, int]) -> Config:
    return Config(
        mail=MailConfig(smtp_host="127.0.0.1", smtp_port=smtp[1], from_="inbox@example.com"),
        limits=LimitsConfig(requests_per_second=0),
    )


async def test_invite_mail_goes_through_smtp_when_configured(
    owner: httpx.AsyncClient, seeded: Seed, smtp: tuple[Inbox, int]
) -> None:
    inbox, _ = smtp
    await owner.post(f"{TEAM}/invites", json={"email": "smtp@example.com", "channelIds": []})
    with trio.fail_after(10):
        while not inbox.messages:  # noqa: ASYNC110 (the SMTP server runs in its own thread)
            await trio.sleep(0.01)
    (message,) = inbox.messages
    assert message["To"] == "smtp@example.com"
    assert message["From"] == "inbox@example.com"
    assert message["Message-ID"].startswith("<inboxd-mail-")
    assert token_of(message).startswith("inv_")
    assert not (seeded.data_dir / "mail" / "outbox").exists()
    # Once sent, the outbox keeps no copy of the body and its token (stored only as a hash).
    store = Store.open(seeded.data_dir, readers=1)

    def bodies(conn: Any) -> list[str]:
        return [r[0] for r in conn.execute("SELECT body FROM mail_outbox")]

    try:
        with trio.fail_after(10):
            while store.read_sync(bodies) != [""]:  # noqa: ASYNC110 (polling the store)
                await trio.sleep(0.01)
    finally:
        store.close()


class PickyInbox(Inbox):
    """Refuses recipients whose address starts with "nobody" (550), as servers do for mailboxes
    that do not exist; counts the refusals."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: list[str] = []

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: Any
    ) -> str:
        if address.startswith("nobody"):
            self.refused.append(address)
            return "550 5.1.1 no such mailbox"
        envelope.rcpt_tos.append(address)
        return "250 OK"


async def test_mails_waiting_for_a_retry_do_not_hold_back_later_ones(seeded: Seed) -> None:
    """A whole batch of refused mails (each waiting 30 s for its retry) before a good one: the
    mailer still reaches the good one (it used to read the same first batch every round)."""
    inbox, port = PickyInbox(), free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    config = Config(
        mail=MailConfig(smtp_host="127.0.0.1", smtp_port=port, from_="in@example.com"),
        limits=LimitsConfig(requests_per_second=0),
    )
    stop = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(
                lambda task_status: daemon.run(
                    seeded.data_dir, config, stop, bind="127.0.0.1:0", task_status=task_status
                )
            )
            async with httpx.AsyncClient(
                base_url=urls[0], headers=auth(seeded.owner_key), timeout=30
            ) as owner:
                refused = [f"nobody{i}@example.com" for i in range(mailer.BATCH)]
                for address in refused:
                    invited = await owner.post(
                        f"{TEAM}/invites", json={"email": address, "channelIds": []}
                    )
                    assert invited.status_code == 201
                with trio.fail_after(20):
                    while len(inbox.refused) < len(refused):  # noqa: ASYNC110 (SMTP thread)
                        await trio.sleep(0.02)
                invited = await owner.post(
                    f"{TEAM}/invites", json={"email": "good@example.com", "channelIds": []}
                )
                assert invited.status_code == 201
                with trio.fail_after(10):
                    while not inbox.messages:  # noqa: ASYNC110 (the SMTP server is a thread)
                        await trio.sleep(0.02)
            stop.set()
    finally:
        controller.stop()
    assert [m["To"] for m in inbox.messages] == ["good@example.com"]
    assert sorted(inbox.refused) == sorted(refused)  # each tried once: retries are 30 s away


@pytest.fixture
def down_port() -> int:
    return free_port()  # nothing listens here until the test starts a server


def mail_via(smtp_port: int, certs: Certs) -> Config:
    """A daemon's config that mails through this port and delivers webhooks to test receivers."""
    return Config(
        webhooks=WebhooksConfig(ca_file=str(certs.ca_file), allow_private_hosts=True),
        mail=MailConfig(smtp_host="127.0.0.1", smtp_port=smtp_port),
        limits=LimitsConfig(requests_per_second=0),
    )


async def test_a_mail_server_that_is_down_delays_only_the_mail(
    autojump_clock: Any, tmp_path: Any, seeded: Seed, down_port: int
) -> None:
    certs = make_certs(tmp_path / "tls")
    config = mail_via(down_port, certs)
    stop = trio.Event()
    async with running_receiver(certs) as receiver, trio.open_nursery() as nursery:
        urls = await nursery.start(
            lambda task_status: daemon.run(
                seeded.data_dir,
                config,
                stop,
                bind="127.0.0.1:0",
                offload_store=False,
                clock=TrioClock(),
                task_status=task_status,
            )
        )
        async with httpx.AsyncClient(
            base_url=urls[0],
            headers=auth(seeded.owner_key),
            timeout=None,
            event_hooks=OPENAPI_HOOKS,
        ) as owner:
            saved = await owner.post(
                f"/api/v1/channels/{seeded.sales_id}/webhook", json={"urls": [receiver.url]}
            )
            assert saved.status_code == 200
            receiver.statuses += [503, 503]
            await ingest(owner, seeded.sales_id, "15550001", content="one")
            # Delivery goes on (and succeeds) while the warning mail cannot be sent.
            await receiver.wait_for(3)
            await ingest(owner, seeded.sales_id, "15550001", content="two")
            await receiver.wait_for(4, within=60)
            inbox = Inbox()
            controller = Controller(inbox, hostname="127.0.0.1", port=down_port)
            controller.start()
            try:
                with trio.fail_after(3600):
                    while not inbox.messages:  # noqa: ASYNC110 (the SMTP server is a thread)
                        await trio.sleep(5)
            finally:
                controller.stop()
        stop.set()
    (warning,) = inbox.messages
    assert "failing" in warning["Subject"]


async def test_a_notice_waiting_for_the_mail_server_is_not_sent_after_the_owner_unsubscribed(
    autojump_clock: Any, tmp_path: Any, seeded: Seed
) -> None:
    """CONTRACT section 7: channel webhook emails "are not sent once the owner has
    unsubscribed". A warning queued while the mail server was down used to go out once it
    came back, after the owner had unsubscribed. An invite queued beside it still goes (the
    mailer did retry)."""
    down_port = free_port()
    certs = make_certs(tmp_path / "tls")
    config = mail_via(down_port, certs)
    stop = trio.Event()
    inbox = Inbox()
    async with running_receiver(certs) as receiver, trio.open_nursery() as nursery:
        urls = await nursery.start(restartable_daemon(seeded, config), stop)
        async with owner_client(urls[0], seeded) as owner:
            channel = seeded.sales_id
            saved = await owner.post(
                f"/api/v1/channels/{channel}/webhook", json={"urls": [receiver.url]}
            )
            assert saved.status_code == 200
            receiver.statuses += [503, 503]
            await ingest(owner, channel, "15550001", content="one")
            await receiver.wait_for(3)  # two failures (the warning is queued), then a 200
            off = await owner.patch(
                f"/api/v1/channels/{channel}/settings", json={"notifications": {"email": False}}
            )
            assert off.status_code == 200 and off.json()["notifications"] == {"email": False}
            invited = await owner.post(
                f"{TEAM}/invites", json={"email": "later@example.com", "channelIds": []}
            )
            assert invited.status_code == 201
            controller = Controller(inbox, hostname="127.0.0.1", port=down_port)
            controller.start()
            try:
                await trio.sleep(3600)  # the mailer retries meanwhile
                with trio.move_on_after(5):
                    while not inbox.messages:  # noqa: ASYNC110
                        await trio.sleep(1)
            finally:
                controller.stop()
        stop.set()
    assert [m["To"] for m in inbox.messages] == ["later@example.com"]


class SlowInbox(Inbox):
    """Takes a second to accept each mail, as a busy mail server may."""

    def __init__(self) -> None:
        super().__init__()
        self.taking = threading.Event()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.taking.set()
        await asyncio.sleep(1.0)
        return await super().handle_DATA(server, session, envelope)


async def test_a_mail_the_server_took_while_the_daemon_stopped_is_not_sent_again(
    seeded: Seed,
) -> None:
    """The daemon stopped while the mail server was taking a mail: the server accepted it, but
    recording it as sent was cancelled by the stop, so the next start sent it again (CONTRACT
    section 7: exactly one email per transition; found by a review). The real clock and the
    store's worker threads, as the daemon runs: the send is in a thread a stop waits for."""
    inbox, port = SlowInbox(), free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    config = Config(
        mail=MailConfig(smtp_host="127.0.0.1", smtp_port=port),
        limits=LimitsConfig(requests_per_second=0),
    )
    stop = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(
                partial(daemon.run, seeded.data_dir, config, stop, bind="127.0.0.1:0")
            )
            async with httpx.AsyncClient(base_url=urls[0], headers=auth(seeded.owner_key)) as c:
                invite = {"email": "slow@example.com", "channelIds": []}
                assert (await c.post(f"{TEAM}/invites", json=invite)).status_code == 201
            with trio.fail_after(10):
                while not inbox.taking.is_set():  # noqa: ASYNC110 (the server's thread)
                    await trio.sleep(0.01)
            stop.set()  # while the server takes the mail
    finally:
        controller.stop()
    assert len(inbox.messages) == 1
    store = Store.open(seeded.data_dir, readers=1)
    try:
        unsent = store.read_sync(
            lambda conn: conn.execute(
                "SELECT count(*) FROM mail_outbox WHERE sent_at IS NULL"
            ).fetchone()[0]
        )
    finally:
        store.close()
    assert unsent == 0  # so the next start sends nothing
