"""The mailer: sends what the store's mail outbox holds, after the deciding transaction commits.

With ``mail.smtp_host`` empty, each mail is written as ``DATA/mail/outbox/<n>.eml`` (the name comes
from the outbox row, so writing it twice after a crash still leaves one file). Otherwise it goes
to the SMTP server (STARTTLS and login when configured). A failing mail server never blocks
anything else: the mail is retried with growing pauses until it goes, and every mail carries a
stable Message-ID so that a resend after a crash can be recognised as the same mail.
"""

from __future__ import annotations

import email.policy
import logging
import os
import smtplib
import ssl
from collections.abc import Callable
from email.message import EmailMessage
from email.utils import formatdate
from pathlib import Path
from typing import Final

import trio

from inboxd.clock import Clock
from inboxd.config import MailConfig
from inboxd.logs import log_failure
from inboxd.store import mail
from inboxd.store.db import Store

log = logging.getLogger("inboxd.mailer")

RETRY_PAUSES: Final = (30.0, 120.0, 600.0, 1800.0, 3600.0)
BATCH: Final = 50
SMTP_TIMEOUT: Final = 30.0


def outbox_dir(data_dir: Path) -> Path:
    return data_dir / "mail" / "outbox"


# SMTP line endings; headers fold only past RFC 5322's 998 characters (a List-Unsubscribe URL has no
# place to fold, and
# folding at 78 would turn it into an encoded word that mail clients do not recognise).
_POLICY: Final = email.policy.SMTP.clone(max_line_length=998)


def build_message(m: mail.Mail, config: MailConfig) -> EmailMessage:
    msg = EmailMessage(policy=_POLICY)
    msg["From"] = config.from_
    msg["To"] = m.to_addr
    msg["Subject"] = m.subject
    msg["Date"] = formatdate(usegmt=True)
    domain = config.from_.rpartition("@")[2] or "inboxd.local"
    msg["Message-ID"] = f"<inboxd-mail-{m.pk}@{domain}>"
    for name, value in m.headers.items():
        msg[name] = value
    msg.set_content(m.body)
    return msg


def _send_smtp(msg: EmailMessage, config: MailConfig) -> None:
    with smtplib.SMTP(config.smtp_host, config.smtp_port, timeout=SMTP_TIMEOUT) as smtp:
        if config.starttls:
            smtp.starttls(context=ssl.create_default_context())
        if config.username:
            smtp.login(config.username, config.password)
        smtp.send_message(msg)


def _write_eml(msg: EmailMessage, directory: Path, pk: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{pk:010d}.eml"
    tmp = target.with_suffix(".eml.tmp")
    tmp.write_bytes(bytes(msg))
    os.replace(tmp, target)
    return target


class Mailer:
    def __init__(self, store: Store, config: MailConfig, data_dir: Path, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._config = config
        self._outbox = outbox_dir(data_dir)
        self._retry_at: dict[int, float] = {}  # outbox pk -> trio time of the next try

    async def send(self, m: mail.Mail) -> None:
        msg = build_message(m, self._config)
        if not self._config.smtp_host:
            await self._blocking(_write_eml, msg, self._outbox, m.pk)
        else:
            await self._blocking(_send_smtp, msg, self._config)

    async def _blocking(self, fn: Callable[..., object], *args: object) -> None:
        # Off the loop, like the store; inline only where the store is (MockClock tests).
        if self._store.offload:
            await trio.to_thread.run_sync(fn, *args)
        else:
            fn(*args)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        queued = self._store.signal(mail.QUEUED)
        while True:
            version = queued.version
            try:
                waiting = await self._round()
            except Exception:
                log_failure(log, "mail outbox round failed")
                waiting = trio.current_time() + RETRY_PAUSES[0]
            with trio.move_on_at(waiting):
                await queued.wait_past(version)

    async def _round(self) -> float:
        """Send every due mail; return the trio time of the next retry (inf if none).

        Walks the whole outbox a batch at a time: mails waiting for their retry stay in it, and
        a batch full of them must not hide the mails queued after them (an invite to a good
        address behind 50 refused ones waited for as long as those were refused)."""
        after = 0
        while True:
            pending = await self._store.read(mail.pending, after, BATCH)
            for m in pending:
                await self._try(m)
            if len(pending) < BATCH:
                return min(self._retry_at.values(), default=float("inf"))
            after = pending[-1].pk

    async def _try(self, m: mail.Mail) -> None:
        """Send one mail unless its retry is not due yet; record what happened."""
        if self._retry_at.get(m.pk, 0.0) > trio.current_time():
            return
        try:
            await self.send(m)
        except Exception as exc:  # the mail server, not us: retry later
            pause = RETRY_PAUSES[min(m.attempts, len(RETRY_PAUSES) - 1)]
            self._retry_at[m.pk] = trio.current_time() + pause
            await self._store.write(mail.mark_failed, m.pk, f"{type(exc).__name__}: {exc}")
            log.warning(
                "mail not sent; will retry",
                extra={"mail": m.pk, "to": m.to_addr, "error": str(exc), "retry_in": pause},
            )
            return
        # The server has the mail: record that even if the daemon is stopping (a stop that
        # came during the send cancelled the record, and the next run sent the mail again).
        with trio.CancelScope(shield=True):
            await self._store.write(mail.mark_sent, m.pk, self._clock.now_us())
        self._retry_at.pop(m.pk, None)
        log.info("mail sent", extra={"mail": m.pk, "to": m.to_addr, "subject": m.subject})
