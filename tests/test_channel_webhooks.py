"""Channel webhook URLs (CONTRACT section 7): delivery, failures, pause, probes, emails.

Real HTTPS receivers (hypercorn with a trustme certificate), the real daemon on loopback, mail
through the outbox (.eml files); every timer runs on trio's MockClock with the spec's defaults.
"""

from __future__ import annotations

import email
import email.policy
import json
import sqlite3
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from inboxd import daemon
from inboxd.config import Config
from inboxd.store.writer import WriterProcess
from tests.conftest import (
    Seed,
    auth,
    ingest,
    owner_client,
    restartable_daemon,
    webhook_config,
)
from tests.openapi_check import check_webhook_request
from tests.receiver import Certs, Receiver, running_receiver

MIN = 60.0
HOUR = 60 * MIN


@pytest.fixture
def config(certs: Certs) -> Config:
    return webhook_config(certs)


@pytest.fixture
async def second(certs: Certs) -> AsyncIterator[Receiver]:
    async with running_receiver(certs) as r:
        yield r
    for request in r.requests:
        check_webhook_request(request.headers, request.body)


def hook(channel_id: str) -> str:
    return f"/api/v1/channels/{channel_id}/webhook"


def settings_path(channel_id: str) -> str:
    return f"/api/v1/channels/{channel_id}/settings"


async def save_urls(owner: httpx.AsyncClient, channel_id: str, *urls: str) -> dict[str, Any]:
    response = await owner.post(hook(channel_id), json={"urls": list(urls)})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def url_settings(owner: httpx.AsyncClient, channel_id: str, url: str) -> dict[str, Any]:
    body = (await owner.get(settings_path(channel_id))).json()
    found: dict[str, Any] = next(w for w in body["webhooks"] if w["url"] == url)
    return found


async def until(
    owner: httpx.AsyncClient, channel_id: str, url: str, **expected: Any
) -> dict[str, Any]:
    """Wait (virtual time) until the URL's settings show the expected values."""
    with trio.fail_after(30 * HOUR):
        while True:
            s = await url_settings(owner, channel_id, url)
            if all(s[k] == v for k, v in expected.items()):
                return s
            await trio.sleep(15)


def mails(data_dir: Path) -> list[email.message.Message]:
    outbox = data_dir / "mail" / "outbox"
    if not outbox.exists():
        return []
    return [
        email.message_from_bytes(p.read_bytes(), policy=email.policy.default)
        for p in sorted(outbox.glob("*.eml"))
    ]


def body_of(message: email.message.Message) -> str:
    payload = message.get_payload(decode=True)
    assert isinstance(payload, bytes)
    return payload.decode()


async def send(owner: httpx.AsyncClient, seeded: Seed, text: str, **kw: Any) -> dict[str, Any]:
    msg: dict[str, Any] = await ingest(owner, seeded.sales_id, "15550001", content=text, **kw)
    return msg


# -- configuration -------------------------------------------------------------------------------


async def paused_after_failing(
    owner: httpx.AsyncClient, seeded: Seed, receiver: Receiver, first: str = "m0"
) -> dict[str, Any]:
    """Save the receiver's URL, make it fail on everything and send ``first``: once the URL is
    paused (10 minutes of failures), its settings."""
    await save_urls(owner, seeded.sales_id, receiver.url)
    receiver.default_status = 503
    await send(owner, seeded, first)
    return await until(owner, seeded.sales_id, receiver.url, state="paused")


async def test_saving_and_reading_the_url_list(owner: httpx.AsyncClient, seeded: Seed) -> None:
    first = await save_urls(
        owner, seeded.sales_id, "https://a.example.com/h", "https://b.example.com/h"
    )
    assert first["secret"].startswith("whsec_") and first["secretPrefix"] == first["secret"][:12]
    assert [w["url"] for w in first["webhooks"]] == [
        "https://a.example.com/h",
        "https://b.example.com/h",
    ]
    assert all(w["state"] == "delivering" and w["backlog"] == 0 for w in first["webhooks"])
    assert first["notifications"] == {"email": True}
    again = await save_urls(owner, seeded.sales_id, "https://b.example.com/h")
    assert "secret" not in again and again["secretPrefix"] == first["secretPrefix"]
    assert (await owner.get(hook(seeded.sales_id))).json() == {"urls": ["https://b.example.com/h"]}
    rotated = (await owner.post(f"{hook(seeded.sales_id)}/secret")).json()
    assert rotated["secret"] != first["secret"]
    off = await owner.patch(
        settings_path(seeded.sales_id), json={"notifications": {"email": False}}
    )
    assert off.json()["notifications"] == {"email": False}
    w = again["webhooks"][0]
    assert set(w) == {
        "url", "state", "failureCount", "firstFailureAt", "lastFailureAt", "lastStatus",
        "lastError", "lastSuccessAt", "pausedAt", "nextProbeAt", "probesDone", "disabledAt",
        "backlog",
    }  # fmt: skip


async def test_the_first_url_list_returns_the_secret_after_a_settings_change(
    owner: httpx.AsyncClient, seeded: Seed, receiver: Receiver
) -> None:
    """The owner may turn mails off before saving any URL; the secret is still issued by, and
    returned once from, the first URL list saved (it used to be created unseen)."""
    off = await owner.patch(
        settings_path(seeded.sales_id), json={"notifications": {"email": False}}
    )
    assert off.status_code == 200 and off.json()["secretPrefix"] is None
    assert (await owner.post(f"{hook(seeded.sales_id)}/secret")).status_code == 404
    first = await save_urls(owner, seeded.sales_id, receiver.url)
    secret = first["secret"]
    assert secret.startswith("whsec_") and first["secretPrefix"] == secret[:12]
    assert first["notifications"] == {"email": False}
    assert "secret" not in await save_urls(owner, seeded.sales_id, receiver.url)
    await send(owner, seeded, "hello", direction="OUTBOUND")
    (delivered,) = await receiver.wait_for(1, within=10)
    assert delivered.signature_ok(secret)


async def test_url_list_validation_and_access(owner: httpx.AsyncClient, seeded: Seed) -> None:
    for url in ("http://a.example.com", "https://\N{SNOWMAN}.example.com/hook"):
        bad_url = await owner.post(hook(seeded.sales_id), json={"urls": [url]})
        assert bad_url.status_code == 422 and bad_url.json()["error"]["code"] == "invalid_url"
    too_many = [f"https://h{i}.example.com/" for i in range(11)]
    assert (await owner.post(hook(seeded.sales_id), json={"urls": too_many})).status_code == 400
    assert (await owner.post(hook(seeded.sales_id), json={"urls": "x"})).status_code == 400
    assert (await owner.post(hook("ch_missing"), json={"urls": []})).status_code == 404
    ann = auth(seeded.ann_key)
    assert (await owner.get(settings_path(seeded.sales_id), headers=ann)).status_code == 403
    assert (await owner.post(f"{hook(seeded.sales_id)}/secret")).status_code == 404


# -- delivery ------------------------------------------------------------------------------------


async def test_messages_and_statuses_are_delivered_signed(
    owner: httpx.AsyncClient, seeded: Seed, receiver: Receiver
) -> None:
    secret = (await save_urls(owner, seeded.sales_id, receiver.url))["secret"]
    msg = await send(owner, seeded, "hello", direction="OUTBOUND")
    await owner.post(f"/api/v1/messaging/messages/{msg['id']}/status", json={"status": "DELIVERED"})
    await ingest(owner, seeded.support_id, "15550002", content="other channel")
    await owner.post(f"/api/v1/inbox/conversations/{msg['conversationId']}/block")  # SYSTEM row
    created, status = await receiver.wait_for(2, within=10)
    for request in (created, status):
        assert request.signature_ok(secret)
        assert request.headers["content-type"] == "application/json"
    first, second = json.loads(created.body), json.loads(status.body)
    assert first["type"] == created.headers["x-svc-event"] == "message.created"
    assert first["data"] == msg
    assert second["type"] == "message.status_changed"
    assert second["data"]["status"] == "DELIVERED" and second["data"]["id"] == msg["id"]
    with trio.move_on_after(0.5):
        await receiver.wait_for(3)
    assert len(receiver.requests) == 2


async def test_two_failures_send_one_warning_and_delivery_continues(
    autojump_clock: trio.testing.MockClock,
    owner: httpx.AsyncClient,
    seeded: Seed,
    receiver: Receiver,
) -> None:
    await save_urls(owner, seeded.sales_id, receiver.url)
    receiver.statuses += [503, 500, 502]
    await send(owner, seeded, "one")
    got = await receiver.wait_for(4)
    assert [json.loads(r.body)["data"]["content"] for r in got] == ["one"] * 4
    # Retried +10 s and +30 s into the episode (head of line), then delivered at +2 min.
    assert [round(r.at - got[0].at) for r in got] == [0, 10, 30, 120]
    s = await until(owner, seeded.sales_id, receiver.url, failureCount=0)
    assert s["state"] == "delivering" and s["lastStatus"] == 200 and s["lastSuccessAt"]
    (warning,) = mails(seeded.data_dir)
    assert warning["To"] == "owner@example.com"
    assert receiver.url in warning["Subject"]
    assert warning["List-Unsubscribe"].startswith("<http")
    assert warning["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert (
        "If the URL keeps failing for 10 minutes,\ndelivery to it pauses and is checked again"
        " after 15 minutes, 1 hour and 6 hours." in body_of(warning).replace("\r\n", "\n")
    )


def test_the_warning_tells_the_daemons_own_pause_and_probe_settings() -> None:
    from inboxd.webhooks.notices import warning
    from inboxd.webhooks.policy import Policy

    def text(pause_s: float, probes_s: tuple[float, ...]) -> str:
        policy = Policy(round(pause_s * 1e6), tuple(round(p * 1e6) for p in probes_s))
        return warning("Sales", "ch_1", "https://h.example.com/", 2, "HTTP 503", "l", policy).body

    five = text(300, (90, 2 * 86400))
    assert "failing for 5 minutes,\ndelivery to it pauses and is checked again" in five
    assert "after 90 seconds and 2 days." in five
    assert "failing for 30 seconds,\ndelivery to it pauses and is checked again after 1 hour." in (
        text(30, (3600,))
    )
    assert "pauses and stops until the URL is saved again." in text(600, ())


async def test_ten_minutes_of_failures_pause_then_probes_then_disabled(
    autojump_clock: trio.testing.MockClock,
    owner: httpx.AsyncClient,
    seeded: Seed,
    receiver: Receiver,
) -> None:
    paused = await paused_after_failing(owner, seeded, receiver, "first")
    assert paused["pausedAt"] and paused["nextProbeAt"] and paused["probesDone"] == 0
    attempts = list(receiver.requests)
    assert len(attempts) == 6  # 0, +10 s, +30 s, +2 min, +5 min, +10 min into the episode
    assert [round(a.at - attempts[0].at) for a in attempts] == [0, 10, 30, 120, 300, 600]
    # While paused, new messages are kept, not sent.
    await send(owner, seeded, "second")
    await send(owner, seeded, "third")
    kept = await url_settings(owner, seeded.sales_id, receiver.url)
    assert kept["backlog"] == 3
    assert len(receiver.requests) == 6
    # Probes 15 min, 1 h and 6 h after the pause, each re-sending the oldest kept message.
    disabled = await until(owner, seeded.sales_id, receiver.url, state="disabled")
    probes = receiver.requests[6:]
    assert [round(p.at - attempts[-1].at) for p in probes] == [15 * 60, 3600, 6 * 3600]
    assert all(json.loads(p.body)["data"]["content"] == "first" for p in probes)
    assert (
        disabled["probesDone"] == 3 and disabled["disabledAt"] and disabled["nextProbeAt"] is None
    )
    warning, stopped = mails(seeded.data_dir)
    assert "failing" in warning["Subject"] and "stopped" in stopped["Subject"]
    assert "3 message(s) are kept undelivered" in body_of(stopped)
    # Nothing more goes to a disabled URL.
    await send(owner, seeded, "fourth")
    await trio.sleep(HOUR)
    assert len(receiver.requests) == 9
    assert len(mails(seeded.data_dir)) == 2
    # Saving the URL again re-enables it and delivers what was kept, in order.
    receiver.default_status = 200
    again = await save_urls(owner, seeded.sales_id, receiver.url)
    assert again["webhooks"][0]["state"] == "delivering"
    got = await receiver.wait_for(9 + 4, within=HOUR)
    assert [json.loads(r.body)["data"]["content"] for r in got[9:]] == [
        "first",
        "second",
        "third",
        "fourth",
    ]


@pytest.mark.parametrize("successful_probe", [0, 1, 2])
async def test_a_2xx_probe_resumes_and_kept_messages_follow_in_order(
    autojump_clock: trio.testing.MockClock,
    owner: httpx.AsyncClient,
    seeded: Seed,
    receiver: Receiver,
    successful_probe: int,
) -> None:
    paused = await paused_after_failing(owner, seeded, receiver)
    await send(owner, seeded, "m1")
    await send(owner, seeded, "m2")
    for _ in range(successful_probe):
        before = len(receiver.requests)
        await receiver.wait_for(before + 1, within=7 * HOUR)
    receiver.default_status = 200
    await until(owner, seeded.sales_id, receiver.url, state="delivering", backlog=0)
    tail = [json.loads(r.body)["data"]["content"] for r in receiver.requests[-3:]]
    assert tail == ["m0", "m1", "m2"]
    assert paused["pausedAt"] is not None
    assert len(mails(seeded.data_dir)) == 1  # the warning only


async def test_statuses_that_are_not_failures_end_the_message_without_retry(
    autojump_clock: trio.testing.MockClock,
    owner: httpx.AsyncClient,
    seeded: Seed,
    receiver: Receiver,
) -> None:
    await save_urls(owner, seeded.sales_id, receiver.url)
    receiver.statuses += [400, 422, 302, 600]  # (600: a status, not a 5xx)
    for text in ("a", "b", "c", "d", "e"):
        await send(owner, seeded, text)
    got = await receiver.wait_for(5)
    assert [json.loads(r.body)["data"]["content"] for r in got] == ["a", "b", "c", "d", "e"]
    await trio.sleep(HOUR)
    assert len(receiver.requests) == 5
    s = await url_settings(owner, seeded.sales_id, receiver.url)
    assert s["state"] == "delivering" and s["failureCount"] == 0
    assert mails(seeded.data_dir) == []


async def test_a_503_with_an_unreadable_retry_after_is_retried_on_schedule(
    autojump_clock: trio.testing.MockClock,
    owner: httpx.AsyncClient,
    seeded: Seed,
    receiver: Receiver,
) -> None:
    """A Retry-After of "²" (a digit to str.isdigit, not to float) used to escape post_event:
    the supervisor retried every 5 s with nothing on record."""
    await save_urls(owner, seeded.sales_id, receiver.url)
    receiver.statuses += [(503, {"retry-after": "\N{SUPERSCRIPT TWO}"})]
    await send(owner, seeded, "m0")
    got = await receiver.wait_for(2, within=600)
    assert 10 - 1e-6 <= got[1].at - got[0].at <= 10.5
    await trio.sleep(1)
    s = await url_settings(owner, seeded.sales_id, receiver.url)
    assert s["lastStatus"] == 200 and s["lastFailureAt"] is not None


async def test_a_url_saved_in_place_of_a_paused_one_starts_fresh(
    autojump_clock: trio.testing.MockClock,
    owner: httpx.AsyncClient,
    seeded: Seed,
    receiver: Receiver,
    second: Receiver,
) -> None:
    """Replacing a broken URL with a working one in one request: the new one gets messages at
    once (it used to inherit the removed one's pk, supervisor and 15-minute probe timer)."""
    await paused_after_failing(owner, seeded, receiver)
    await save_urls(owner, seeded.sales_id, second.url)
    replaced_at = trio.current_time()
    await send(owner, seeded, "m1")
    (got,) = await second.wait_for(1, within=HOUR)
    assert json.loads(got.body)["data"]["content"] == "m1"
    assert got.at - replaced_at < 5


async def test_a_removed_urls_probe_in_flight_is_not_recorded_on_its_replacement(
    autojump_clock: trio.testing.MockClock,
    owner: httpx.AsyncClient,
    seeded: Seed,
    receiver: Receiver,
    second: Receiver,
) -> None:
    await paused_after_failing(owner, seeded, receiver)
    await receiver.wait_for(6 + 2, within=2 * HOUR)  # the 15 min and 1 h probes failed
    receiver.hang = True  # the last probe (6 h) hangs until its timeout
    await receiver.wait_for(6 + 3, within=6 * HOUR)
    # Replaced while that probe is in flight (a fresh client: the old keep-alive connection
    # idled through hours of virtual time).
    async with httpx.AsyncClient(
        base_url=owner.base_url, headers=owner.headers, timeout=None
    ) as fresh:
        await save_urls(fresh, seeded.sales_id, second.url)
    await trio.sleep(60)
    new = await url_settings(owner, seeded.sales_id, second.url)
    assert (new["state"], new["failureCount"], new["probesDone"]) == ("delivering", 0, 0)
    assert not any(second.url in m["Subject"] for m in mails(seeded.data_dir))


async def test_a_hanging_url_never_delays_a_working_one(
    autojump_clock: trio.testing.MockClock,
    owner: httpx.AsyncClient,
    seeded: Seed,
    receiver: Receiver,
    second: Receiver,
) -> None:
    receiver.hang = True  # answers nothing: every request times out after 10 s
    await save_urls(owner, seeded.sales_id, receiver.url, second.url)
    sent_at = []
    for i in range(5):
        sent_at.append(trio.current_time())
        await send(owner, seeded, f"m{i}")
        await trio.sleep(3)
    got = await second.wait_for(5)
    lags = [r.at - t for r, t in zip(got, sent_at, strict=True)]
    assert max(lags) < 0.5, lags  # the working URL gets each message at once
    s = await until(owner, seeded.sales_id, receiver.url, failureCount=2)
    assert s["lastError"] == "timeout"


async def pause_and_stop(run_daemon: Any, seeded: Seed, receiver: Receiver) -> dict[str, Any]:
    """One run of a ``restartable_daemon``: the receiver's URL saved and failing on everything,
    a message sent, the URL paused, the daemon stopped. The URL's settings when it paused."""
    receiver.default_status = 503
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(run_daemon, stop)
        async with owner_client(urls[0], seeded) as c:
            await save_urls(c, seeded.sales_id, receiver.url)
            await send(c, seeded, "x")
            paused = await until(c, seeded.sales_id, receiver.url, state="paused")
        stop.set()
    return paused


async def test_restart_mid_pause_keeps_the_probe_deadline(
    autojump_clock: trio.testing.MockClock, seeded: Seed, config: Config, certs: Certs
) -> None:
    run_daemon = restartable_daemon(seeded, config)
    async with running_receiver(certs) as receiver:
        paused = await pause_and_stop(run_daemon, seeded, receiver)
        paused_attempts = len(receiver.requests)
        pausing_attempt = receiver.requests[-1]
        await trio.sleep(5 * MIN)  # the daemon is down for 5 minutes
        restarted_at = trio.current_time()
        second_stop = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(run_daemon, second_stop)
            probe = (await receiver.wait_for(paused_attempts + 1, within=HOUR))[-1]
            second_stop.set()
    # Probed 15 minutes after the pause (about 10 after the restart), not 15 after the restart.
    assert abs(probe.at - pausing_attempt.at - 15 * MIN) < 1
    assert restarted_at < probe.at < restarted_at + 11 * MIN
    assert paused["nextProbeAt"] is not None


async def test_unsubscribed_owner_gets_no_mail(
    autojump_clock: trio.testing.MockClock,
    owner: httpx.AsyncClient,
    anon: httpx.AsyncClient,
    seeded: Seed,
    receiver: Receiver,
) -> None:
    await save_urls(owner, seeded.sales_id, receiver.url)
    receiver.statuses += [503, 503]
    await send(owner, seeded, "one")
    await receiver.wait_for(3)
    (warning,) = mails(seeded.data_dir)
    link = warning["List-Unsubscribe"].strip("<>")
    path = link.split("://", 1)[1].split("/", 1)[1]
    page = await anon.get(f"/{path}")
    assert page.status_code == 200 and "Unsubscribe" in page.text
    assert (await owner.get(settings_path(seeded.sales_id))).json()["notifications"]["email"]
    done = await anon.post(f"/{path}", data={"List-Unsubscribe": "One-Click"})
    assert done.status_code == 200
    assert not (await owner.get(settings_path(seeded.sales_id))).json()["notifications"]["email"]
    wrong = await anon.post(f"/api/v1/channels/{seeded.sales_id}/unsubscribe?token=nope")
    assert wrong.status_code == 404
    mangled = await anon.post(f"/api/v1/channels/{seeded.sales_id}/unsubscribe?token=n%C3%B6pe")
    assert mangled.status_code == 404  # a token with non-ASCII characters is just wrong
    # A new failure episode: no warning this time.
    receiver.statuses += [503, 503]
    await send(owner, seeded, "two")
    await receiver.wait_for(6)
    await trio.sleep(MIN)
    assert len(mails(seeded.data_dir)) == 1


async def test_a_probe_answered_without_a_2xx_does_not_resume_delivery(
    autojump_clock: trio.testing.MockClock,
    owner: httpx.AsyncClient,
    seeded: Seed,
    receiver: Receiver,
) -> None:
    """Spec: "Without a 2xx, reconfiguring the URL is the only way to resume." A 400 to the
    probe used to resume delivery, and each later 400 dropped one kept message."""
    await paused_after_failing(owner, seeded, receiver, "m0")
    await send(owner, seeded, "m1")
    await send(owner, seeded, "m2")
    before = len(receiver.requests)
    receiver.default_status = 400  # the URL answers, but never with a 2xx
    await receiver.wait_for(before + 1, within=20 * MIN)  # the 15-minute probe
    await trio.sleep(MIN)
    s = await url_settings(owner, seeded.sales_id, receiver.url)
    sent_after = [json.loads(r.body)["data"]["content"] for r in receiver.requests[before:]]
    assert (s["state"], s["probesDone"], s["lastStatus"], s["backlog"]) == ("paused", 1, 400, 3)
    assert sent_after == ["m0"]


async def test_probes_missed_while_the_daemon_was_stopped_go_out_one_at_a_time(
    autojump_clock: trio.testing.MockClock, seeded: Seed, config: Config, certs: Certs
) -> None:
    """Stopped through all three probe times, the daemon used to send the three probes back to
    back on its start and disable the URL within a second. It now probes once on the start and
    keeps the schedule's gaps (45 min, then 5 h) for the other two."""
    run_daemon = restartable_daemon(seeded, config)
    async with running_receiver(certs) as receiver:
        await pause_and_stop(run_daemon, seeded, receiver)
        paused_attempts = len(receiver.requests)
        await trio.sleep(7 * HOUR)  # stopped through all three probe times
        restarted = trio.current_time()
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(run_daemon, stop)
            async with owner_client(urls[0], seeded) as c:
                await trio.sleep(5 * MIN)
                early = await url_settings(c, seeded.sales_id, receiver.url)
                await until(c, seeded.sales_id, receiver.url, state="disabled")
            stop.set()
    probes = [round(r.at - restarted) for r in receiver.requests[paused_attempts:]]
    assert (early["state"], early["probesDone"]) == ("paused", 1)
    assert probes == [0, 45 * 60, 45 * 60 + 5 * 3600]
    assert len([m for m in mails(seeded.data_dir) if "stopped" in m["Subject"].lower()]) == 1


async def test_a_delivering_urls_owed_message_survives_a_stop_longer_than_the_retention(
    autojump_clock: trio.testing.MockClock, seeded: Seed, config: Config, certs: Certs
) -> None:
    """``backlog_retention`` bounds what a paused URL keeps. A delivering URL in the middle of
    a failure episode when the daemon stopped for longer used to lose the message silently."""
    run_daemon = restartable_daemon(seeded, config)

    async with running_receiver(certs) as receiver:
        receiver.statuses += [503]
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(run_daemon, stop)
            async with owner_client(urls[0], seeded) as c:
                await save_urls(c, seeded.sales_id, receiver.url)
                await send(c, seeded, "m0")
                await receiver.wait_for(1)  # failed; its retry is due in 10 s
                assert (await url_settings(c, seeded.sales_id, receiver.url))["backlog"] == 1
            stop.set()
        await trio.sleep(25 * HOUR)
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(run_daemon, stop)
            async with owner_client(urls[0], seeded) as c:
                s = await until(c, seeded.sales_id, receiver.url, failureCount=0, backlog=0)
            stop.set()
    assert [json.loads(r.body)["data"]["content"] for r in receiver.requests] == ["m0", "m0"]
    assert s["state"] == "delivering" and s["lastStatus"] == 200


async def test_what_a_disabled_url_kept_past_the_retention_is_not_sent_when_saved_again(
    autojump_clock: trio.testing.MockClock,
    owner: httpx.AsyncClient,
    seeded: Seed,
    receiver: Receiver,
) -> None:
    """CONTRACT section 7: re-enabled, a URL delivers what it kept, at most backlog_retention
    (24 h) old: the rest is dropped as it starts delivering again, not owed again."""
    await paused_after_failing(owner, seeded, receiver, "old")
    await until(owner, seeded.sales_id, receiver.url, state="disabled")
    await trio.sleep(25 * HOUR)
    # (A fresh client: the old keep-alive connection idled through a day of virtual time.)
    async with httpx.AsyncClient(
        base_url=owner.base_url, headers=owner.headers, timeout=None
    ) as fresh:
        await send(fresh, seeded, "new")
        assert (await url_settings(fresh, seeded.sales_id, receiver.url))["backlog"] == 1
        before = len(receiver.requests)
        receiver.default_status = 200
        await save_urls(fresh, seeded.sales_id, receiver.url)
        # In order: had "old" still been owed, it would have gone first.
        got = await receiver.wait_for(before + 1)
        assert json.loads(got[before].body)["data"]["content"] == "new"
        s = await until(fresh, seeded.sales_id, receiver.url, backlog=0)
    assert s["state"] == "delivering" and len(receiver.requests) == before + 1


async def test_a_retry_after_a_restart_keeps_the_delivery_id(
    autojump_clock: trio.testing.MockClock, seeded: Seed, config: Config, certs: Certs
) -> None:
    """CONTRACT sections 6 and 7: X-Svc-Delivery is the same on every retry of one event, and
    a URL's state survives a restart. The id was made afresh by each run of the daemon."""
    run_daemon = restartable_daemon(seeded, config)
    async with running_receiver(certs) as receiver, running_receiver(certs) as other:
        receiver.statuses += [503]
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(run_daemon, stop)
            async with owner_client(urls[0], seeded) as c:
                await save_urls(c, seeded.sales_id, receiver.url, other.url)
                await send(c, seeded, "m0")
                await receiver.wait_for(1)  # failed; its retry is due in 10 s
                await other.wait_for(1)
            stop.set()
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(run_daemon, stop)
            await receiver.wait_for(2, within=MIN)
            stop.set()
    first, retry = (r.headers["x-svc-delivery"] for r in receiver.requests)
    assert [json.loads(r.body)["data"]["content"] for r in receiver.requests] == ["m0", "m0"]
    assert first == retry and first.startswith("dlv_")
    # Another URL's delivery of the same message is a series of its own.
    assert other.requests[0].headers["x-svc-delivery"] != first
    assert other.requests[0].body == receiver.requests[0].body


async def save_and_leave(base_url: str, seeded: Seed, url: str, after: float) -> None:
    """Send the request that saves ``url`` as the sales channel's list, and close the
    connection ``after`` seconds, without waiting for the answer."""
    host, port = base_url.removeprefix("http://").split(":")
    body = json.dumps({"urls": [url]}).encode()
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(
        f"POST {hook(seeded.sales_id)} HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {seeded.owner_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await trio.sleep(after)
    await stream.aclose()  # the client gives up


async def sent_once_saved(c: httpx.AsyncClient, seeded: Seed, receiver: Receiver) -> None:
    """Once the receiver's URL is the saved list, send a message "after" and wait up to 10 s
    for the receiver to get something."""
    with trio.fail_after(10):
        while (await c.get(hook(seeded.sales_id))).json()["urls"] != [receiver.url]:  # noqa: ASYNC110
            await trio.sleep(0.05)
    await send(c, seeded, "after")
    with trio.move_on_after(10):
        await receiver.wait_for(1)


async def test_a_url_list_saved_for_a_client_that_left_is_delivered_to(
    seeded: Seed, config: Config, certs: Certs
) -> None:
    """The route saves the list, then starts the URL's supervisor. A client that went away
    while the write ran had the request cancelled at that second step: the list was saved and
    shown as delivering, but nothing ever delivered to it until another list was saved or the
    daemon restarted (found by a review). The real clock and store threads, as the daemon runs;
    another connection holds SQLite's write lock so that the write waits a moment."""
    stop = trio.Event()
    async with running_receiver(certs) as receiver, trio.open_nursery() as nursery:
        urls = await nursery.start(
            partial(daemon.run, seeded.data_dir, config, stop, bind="127.0.0.1:0")
        )
        blocker = sqlite3.connect(seeded.data_dir / "inboxd.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            await save_and_leave(urls[0], seeded, receiver.url, 0.5)  # waiting for the lock
            await trio.sleep(0.2)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        async with httpx.AsyncClient(base_url=urls[0], headers=auth(seeded.owner_key)) as c:
            await sent_once_saved(c, seeded, receiver)  # (it commits once the lock is free)
        stop.set()
    assert [json.loads(r.body)["data"]["content"] for r in receiver.requests] == ["after"]


async def test_a_url_list_saved_in_another_writes_batch_for_a_client_that_left_is_delivered_to(
    seeded: Seed, config: Config, certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same when the list's write waits for a batch another request leads: that wait was
    cancelled when the client left, while the batch committed the list (the review of the
    fix above found it). Each batch is made to take half a second (a slow disk's fsync)."""
    run = WriterProcess.run

    async def slow_run(self: WriterProcess, batch: Any) -> Any:
        await trio.sleep(0.5)
        return await run(self, batch)

    monkeypatch.setattr(WriterProcess, "run", slow_run)
    stop = trio.Event()
    async with running_receiver(certs) as receiver, trio.open_nursery() as nursery:
        urls = await nursery.start(
            partial(daemon.run, seeded.data_dir, config, stop, bind="127.0.0.1:0")
        )
        async with httpx.AsyncClient(base_url=urls[0], headers=auth(seeded.owner_key)) as c:

            async def other_write(email: bool) -> None:
                other = await c.patch(
                    settings_path(seeded.support_id), json={"notifications": {"email": email}}
                )
                assert other.status_code == 200, other.text

            async with trio.open_nursery() as writes:
                writes.start_soon(other_write, False)  # leads the first batch (0.5 s)
                await trio.sleep(0.1)
                writes.start_soon(other_write, True)  # will lead the next: it and the list
                await trio.sleep(0.1)
                # The second batch runs until about 1.0 s: the client leaves meanwhile.
                await save_and_leave(urls[0], seeded, receiver.url, 0.5)
            await sent_once_saved(c, seeded, receiver)
        stop.set()
    assert [json.loads(r.body)["data"]["content"] for r in receiver.requests] == ["after"]
