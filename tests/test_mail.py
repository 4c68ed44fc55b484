"""Mail through a real SMTP server (aiosmtpd): invites arrive with their token."""

from __future__ import annotations

import email
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio
from aiosmtpd.controller import Controller

from inboxd.config import Config, LimitsConfig, MailConfig
from tests.conftest import Seed
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
