"""The inbox webhook: configuration (spec 13-16) and signed delivery (CONTRACT section 6).

A real HTTPS receiver (hypercorn, certificate from a trustme CA passed as webhooks.ca_file) gets
the deliveries. Retry timing runs on trio's MockClock (the ``autojump_clock`` fixture).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from inboxd import daemon
from inboxd.clock import SystemClock
from inboxd.config import Config, InboxWebhookConfig
from inboxd.store.db import Appended, Store
from inboxd.timeutil import format_us, parse_instant
from inboxd.webhooks import catalog, inbox
from tests.conftest import (
    OPENAPI_HOOKS,
    Seed,
    auth,
    ingest,
    owner_client,
    restartable_daemon,
    seed_store,
    webhook_config,
)
from tests.receiver import Certs, Receiver, running_receiver

HOOK = "/api/v1/inbox/webhook"
CONV = "/api/v1/inbox/conversations"


@pytest.fixture
def config(certs: Certs) -> Config:
    return webhook_config(certs)


async def save(owner: httpx.AsyncClient, url: str) -> dict[str, Any]:
    response = await owner.put(HOOK, json={"url": url})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def new_conversation(owner: httpx.AsyncClient, seeded: Seed, phone: str = "15550001") -> str:
    return str((await ingest(owner, seeded.sales_id, phone, content="hi"))["conversationId"])


async def recorded_outcomes(owner: httpx.AsyncClient, count: int) -> list[str]:
    """The newest ``count`` outcomes, once the newest is a delivery (the receiver sees a request
    a moment before the daemon records its answer)."""
    with trio.fail_after(60):
        while True:
            log = (await owner.get(f"{HOOK}/deliveries", params={"limit": count})).json()
            outcomes = [d["outcome"] for d in log["deliveries"]]
            if len(outcomes) == count and outcomes[0] == "delivered":
                return outcomes
            await trio.sleep(0.01)


async def fail_once_and_stop(run_daemon: Any, seeded: Seed, receiver: Receiver) -> None:
    """One run of a ``restartable_daemon``: the receiver's URL saved, one event made, its first
    attempt answered as the receiver is told and recorded (well before a retry is due), the
    daemon stopped."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(run_daemon, stop)
        async with owner_client(urls[0], seeded) as c:
            await save(c, receiver.url)
            conv = await new_conversation(c, seeded)
            await c.post(f"{CONV}/{conv}/block")
            await receiver.wait_for(1)
            with trio.fail_after(5):  # the attempt is recorded a moment after its answer
                while not (await c.get(f"{HOOK}/deliveries")).json()["deliveries"]:  # noqa: ASYNC110
                    await trio.sleep(0.01)
        stop.set()


# -- configuration -------------------------------------------------------------------------------


async def test_configuration_lifecycle(owner: httpx.AsyncClient) -> None:
    empty = (await owner.get(HOOK)).json()
    assert empty["url"] is None and empty["secretPrefix"] is None
    assert empty["lastDeliveryAt"] is None and empty["lastDeliveryStatus"] is None
    assert "secret" not in empty
    assert [e["type"] for e in empty["events"]] == [t for t, _, _ in catalog.EVENTS]
    assert len(empty["events"]) == 11
    # The body's shape with the spec's types (it was each field described in a string).
    envelope = empty["envelope"]
    assert set(envelope) == {"id", "type", "createdAt", "data"}
    assert envelope["type"] == catalog.EVENTS[0][0] and envelope["id"].startswith("evt_")
    assert format_us(parse_instant(envelope["createdAt"])) == envelope["createdAt"]
    assert isinstance(envelope["data"], dict)
    assert envelope["data"] == empty["events"][0]["example"]

    created = await save(owner, "https://hooks.example.com/inbox")
    assert created["created"] is True
    secret = created["secret"]
    assert secret.startswith("whsec_") and len(secret) >= 6 + 43
    assert created["secretPrefix"] == secret[:12]
    assert created["url"] == "https://hooks.example.com/inbox"

    read = (await owner.get(HOOK)).json()
    assert "secret" not in read and read["secretPrefix"] == secret[:12]
    assert secret not in json.dumps(read)

    updated = await save(owner, "https://hooks.example.com/v2")
    assert updated["created"] is False and "secret" not in updated
    assert updated["secretPrefix"] == secret[:12] and updated["url"].endswith("/v2")

    rotated = (await owner.post(f"{HOOK}/secret")).json()
    assert rotated["created"] is False
    assert rotated["secret"] != secret and rotated["secretPrefix"] == rotated["secret"][:12]

    assert (await owner.delete(HOOK)).json() == {"removed": True}
    assert (await owner.delete(HOOK)).json() == {"removed": False}
    missing = await owner.post(f"{HOOK}/secret")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "webhook_not_found"
    again = await save(owner, "https://hooks.example.com/inbox")
    assert again["created"] is True


async def test_user_keys_cannot_change_the_webhook(owner: httpx.AsyncClient, seeded: Seed) -> None:
    ann = auth(seeded.ann_key)
    for method, path in (("PUT", HOOK), ("DELETE", HOOK), ("POST", f"{HOOK}/secret")):
        response = await owner.request(
            method, path, json={"url": "https://hooks.example.com/x"}, headers=ann
        )
        assert response.status_code == 403, path
        assert response.json()["error"]["code"] == "forbidden"
    assert (await owner.get(HOOK, headers=ann)).status_code == 200
    # The delivery log and redelivery are the owner's too, each saying what was refused.
    for method, path, doing in (
        ("GET", f"{HOOK}/deliveries", "see the inbox webhook's deliveries"),
        ("POST", f"{HOOK}/deliveries/evt_x/redeliver", "redeliver inbox webhook events"),
    ):
        response = await owner.request(method, path, headers=ann)
        assert response.status_code == 403, path
        assert response.json()["error"] == {
            "code": "forbidden",
            "message": f"only the account owner's key may {doing}",
        }


@pytest.mark.parametrize(
    "url",
    [
        "http://hooks.example.com/x",
        "https://user:pass@hooks.example.com/x",
        "https://user@hooks.example.com/x",
        "https://hooks.example.com:99999/x",
        "https://",
        "not a url",
        "https://hooks.example.com/" + "x" * 2100,
        "ftp://hooks.example.com",
        # Hosts no delivery could ever reach (found by an audit): an empty label, a hyphen at
        # either end of one, a label over 63 characters.
        "https://.com/x",
        "https://hooks..example.com/x",
        "https://-hooks.example.com/x",
        "https://hooks-.example.com/x",
        "https://" + "h" * 64 + ".example.com/x",
    ],
)
async def test_invalid_urls_are_422(owner: httpx.AsyncClient, url: str) -> None:
    response = await owner.put(HOOK, json={"url": url})
    assert response.status_code == 422, url
    assert response.json()["error"]["code"] == "invalid_url"


async def test_missing_url_is_400(owner: httpx.AsyncClient) -> None:
    assert (await owner.put(HOOK, json={})).status_code == 400
    assert (await owner.put(HOOK, json={"url": 7})).status_code == 400


# -- delivery ------------------------------------------------------------------------------------


async def test_every_change_is_delivered_signed_in_commit_order(
    owner: httpx.AsyncClient, seeded: Seed, receiver: Receiver
) -> None:
    secret = (await save(owner, receiver.url))["secret"]
    conv = await new_conversation(owner, seeded)
    await owner.patch(f"{CONV}/{conv}/assignee", json={"userId": seeded.ann_id})
    await owner.patch(f"{CONV}/{conv}/status", json={"status": "CLOSED"})
    await owner.patch(f"{CONV}/{conv}/status", json={"status": "OPEN"})
    await owner.post(f"{CONV}/{conv}/block")
    await owner.post(f"{CONV}/{conv}/unblock")
    await owner.patch(f"{CONV}/{conv}/title", json={"title": "VIP"})
    await owner.patch(f"{CONV}/{conv}/assignee", json={"userId": None})
    got = await receiver.wait_for(7, within=10)
    envelopes = [json.loads(r.body) for r in got]
    assert [e["type"] for e in envelopes] == [
        "inbox.conversation.assigned",
        "inbox.conversation.status_changed",
        "inbox.conversation.status_changed",
        "inbox.conversation.blocked",
        "inbox.conversation.unblocked",
        "inbox.conversation.title_changed",
        "inbox.conversation.unassigned",
    ]
    examples = {t: e for t, _, e in catalog.EVENTS}
    for request, envelope in zip(got, envelopes, strict=True):
        assert request.signature_ok(secret)
        assert request.headers["content-type"] == "application/json"
        assert request.headers["x-svc-event"] == envelope["type"]
        assert request.headers["x-svc-delivery"]
        assert set(envelope) == {"id", "type", "createdAt", "data"}
        assert set(envelope["data"]) == set(examples[envelope["type"]])
        assert envelope["data"]["conversationId"] == conv
    assert len({e["id"] for e in envelopes}) == len(envelopes)
    assert await recorded_outcomes(owner, 7) == ["delivered"] * 7
    status = (await owner.get(HOOK)).json()
    assert status["lastDeliveryStatus"] == 200 and status["lastDeliveryError"] is None
    assert status["lastDeliveryAt"] is not None


async def test_a_burst_is_delivered_once_each_in_order_and_fully_recorded(
    owner: httpx.AsyncClient, seeded: Seed, receiver: Receiver, store: Store
) -> None:
    """Records of finished deliveries are written while the next POST is out; the deliverer's
    own cursor must neither skip nor repeat an event, and the stored one catches up."""
    await save(owner, receiver.url)
    conv = await new_conversation(owner, seeded)

    async def rename(i: int) -> None:
        response = await owner.patch(f"{CONV}/{conv}/title", json={"title": f"burst {i}"})
        assert response.status_code == 200

    async with trio.open_nursery() as nursery:  # concurrent writes share commits
        for i in range(40):
            nursery.start_soon(rename, i)
    got = await receiver.wait_for(40, within=30)
    with trio.move_on_after(0.3):
        await receiver.wait_for(41)
    assert len(receiver.requests) == 40
    seqs = store.read_sync(
        lambda c: [
            r[0]
            for r in c.execute(
                "SELECT id FROM events WHERE type = 'inbox.conversation.title_changed' ORDER BY seq"
            )
        ]
    )
    assert [json.loads(r.body)["id"] for r in got] == seqs
    assert await recorded_outcomes(owner, 40) == ["delivered"] * 40
    stored, last = store.read_sync(
        lambda c: c.execute(
            "SELECT (SELECT delivered_seq FROM inbox_webhooks), (SELECT max(seq) FROM events"
            " WHERE type = 'inbox.conversation.title_changed')"
        ).fetchone()
    )
    assert stored == last


async def test_messages_and_read_are_not_sent_to_the_inbox_webhook(
    owner: httpx.AsyncClient, seeded: Seed, receiver: Receiver
) -> None:
    await save(owner, receiver.url)
    conv = await new_conversation(owner, seeded)
    await owner.post(f"{CONV}/{conv}/read")
    await owner.post(f"{CONV}/{conv}/block")
    (only,) = await receiver.wait_for(1, within=10)
    assert json.loads(only.body)["type"] == "inbox.conversation.blocked"
    with trio.move_on_after(0.3):
        await receiver.wait_for(2)
    assert len(receiver.requests) == 1


async def test_events_committed_while_no_url_is_saved_are_never_sent(
    owner: httpx.AsyncClient, seeded: Seed, receiver: Receiver
) -> None:
    conv = await new_conversation(owner, seeded)
    await owner.post(f"{CONV}/{conv}/block")
    await save(owner, receiver.url)
    await owner.post(f"{CONV}/{conv}/unblock")
    (only,) = await receiver.wait_for(1, within=10)
    assert json.loads(only.body)["type"] == "inbox.conversation.unblocked"
    await owner.delete(HOOK)
    await owner.post(f"{CONV}/{conv}/block")
    await save(owner, receiver.url)
    await owner.post(f"{CONV}/{conv}/unblock")
    got = await receiver.wait_for(2, within=10)
    assert [json.loads(r.body)["type"] for r in got] == [
        "inbox.conversation.unblocked",
        "inbox.conversation.unblocked",
    ]


async def test_rotation_signs_later_deliveries_with_the_new_secret_only(
    owner: httpx.AsyncClient, seeded: Seed, receiver: Receiver
) -> None:
    old = (await save(owner, receiver.url))["secret"]
    conv = await new_conversation(owner, seeded)
    await owner.post(f"{CONV}/{conv}/block")
    await receiver.wait_for(1, within=10)
    new = (await owner.post(f"{HOOK}/secret")).json()["secret"]
    await owner.post(f"{CONV}/{conv}/unblock")
    first, second = await receiver.wait_for(2, within=10)
    assert first.signature_ok(old)
    assert second.signature_ok(new) and not second.signature_ok(old)


async def test_a_rotation_also_reaches_events_already_read_ahead(
    owner: httpx.AsyncClient, seeded: Seed, receiver: Receiver
) -> None:
    """The deliverer reads up to a hundred events at once. A secret rotated while it works
    through them signs every POST that starts after the rotation has committed."""
    old = (await save(owner, receiver.url))["secret"]
    conv = await new_conversation(owner, seeded)
    first_gate = receiver.gate = trio.Event()
    await owner.post(f"{CONV}/{conv}/block")
    await receiver.wait_for(1, within=10)  # held: the next events commit meanwhile
    for i in range(5):
        await owner.patch(f"{CONV}/{conv}/title", json={"title": f"ahead {i}"})
    second_gate = receiver.gate = trio.Event()
    first_gate.set()
    await receiver.wait_for(2, within=10)  # the five were read together; the first is held
    new = (await owner.post(f"{HOOK}/secret")).json()["secret"]
    receiver.gate = None
    second_gate.set()
    got = await receiver.wait_for(6, within=10)
    assert [json.loads(r.body)["type"] for r in got] == [
        "inbox.conversation.blocked",
        *["inbox.conversation.title_changed"] * 5,
    ]
    assert got[0].signature_ok(old) and got[1].signature_ok(old)
    assert all(r.signature_ok(new) and not r.signature_ok(old) for r in got[2:])


async def test_failures_are_retried_on_schedule_and_later_events_wait(
    autojump_clock: trio.testing.MockClock,
    owner: httpx.AsyncClient,
    seeded: Seed,
    receiver: Receiver,
) -> None:
    await save(owner, receiver.url)
    conv = await new_conversation(owner, seeded)
    receiver.statuses += [500, (429, {"Retry-After": "120"}), 200]
    await owner.post(f"{CONV}/{conv}/block")
    await owner.post(f"{CONV}/{conv}/unblock")
    first = await receiver.wait_for(1)
    got = await receiver.wait_for(4)
    types = [json.loads(r.body)["type"] for r in got]
    assert types == [
        "inbox.conversation.blocked",
        "inbox.conversation.blocked",
        "inbox.conversation.blocked",
        "inbox.conversation.unblocked",
    ]
    # Same delivery id and the same bytes on every attempt of one event.
    assert len({r.headers["x-svc-delivery"] for r in got[:3]}) == 1
    assert len({r.body for r in got[:3]}) == 1
    assert got[3].headers["x-svc-delivery"] != got[0].headers["x-svc-delivery"]
    # 10 s (+ up to 20 % jitter), then 1 min but at least the 120 s Retry-After.
    assert 10 - 1e-6 <= got[1].at - first[0].at <= 12.5
    assert 120 - 1e-6 <= got[2].at - got[1].at <= 125
    await recorded_outcomes(owner, 4)  # records follow their deliveries by a few ms
    status = (await owner.get(HOOK)).json()
    assert status["lastDeliveryStatus"] == 200 and status["lastDeliveryError"] is None
    log = (await owner.get(f"{HOOK}/deliveries")).json()
    assert [(d["type"], d["attempt"], d["outcome"], d["status"]) for d in log["deliveries"]] == [
        ("inbox.conversation.unblocked", 1, "delivered", 200),
        ("inbox.conversation.blocked", 3, "delivered", 200),
        ("inbox.conversation.blocked", 2, "failed", 429),
        ("inbox.conversation.blocked", 1, "failed", 500),
    ]


async def test_an_event_is_given_up_after_the_last_retry(
    autojump_clock: trio.testing.MockClock,
    owner: httpx.AsyncClient,
    seeded: Seed,
    receiver: Receiver,
    config: Config,
) -> None:
    await save(owner, receiver.url)
    conv = await new_conversation(owner, seeded)
    attempts = len(config.inbox_webhook.retry_schedule) + 1
    receiver.statuses += [503] * attempts
    await owner.post(f"{CONV}/{conv}/block")
    await owner.post(f"{CONV}/{conv}/unblock")
    await receiver.wait_for(1)
    # Every attempt fails alike, so once one is recorded the status shows the failure.
    # (Under autojump the clock may leap to the next retry while the store works in a thread.)
    with trio.fail_after(86400):
        while not (await owner.get(f"{HOOK}/deliveries")).json()["deliveries"]:  # noqa: ASYNC110 (polling the API)
            await trio.sleep(0.001)
    failing = (await owner.get(HOOK)).json()
    assert failing["lastDeliveryStatus"] == 503
    assert failing["lastDeliveryError"] == "HTTP 503"
    got = await receiver.wait_for(attempts + 1, within=10 * 86400)
    assert [json.loads(r.body)["type"] for r in got].count("inbox.conversation.blocked") == attempts
    assert json.loads(got[-1].body)["type"] == "inbox.conversation.unblocked"
    spent = got[attempts - 1].at - got[0].at
    assert (
        sum(config.inbox_webhook.retry_schedule)
        <= spent
        <= 1.2 * sum(config.inbox_webhook.retry_schedule)
    )
    outcomes = await recorded_outcomes(owner, 2)
    assert outcomes == ["delivered", "given_up"]


async def test_redeliver_queues_one_event_again(
    owner: httpx.AsyncClient, seeded: Seed, receiver: Receiver
) -> None:
    await save(owner, receiver.url)
    conv = await new_conversation(owner, seeded)
    await owner.post(f"{CONV}/{conv}/block")
    (first,) = await receiver.wait_for(1, within=10)
    event_id = json.loads(first.body)["id"]
    response = await owner.post(f"{HOOK}/deliveries/{event_id}/redeliver")
    assert response.status_code == 202
    _, again = await receiver.wait_for(2, within=10)
    assert again.body == first.body
    assert again.headers["x-svc-delivery"] != first.headers["x-svc-delivery"]
    missing = await owner.post(f"{HOOK}/deliveries/evt_nope/redeliver")
    assert missing.status_code == 404


def types_of(requests: list[Any]) -> list[str]:
    return [json.loads(r.body)["type"] for r in requests]


async def test_a_redelivery_goes_before_events_committed_after_it_was_asked_for(
    owner: httpx.AsyncClient, seeded: Seed, receiver: Receiver
) -> None:
    """ "After the events waiting": later events do not overtake it (on an account whose events
    kept coming, a redelivery used to wait for a moment with none waiting)."""
    await save(owner, receiver.url)
    conv = await new_conversation(owner, seeded)
    await owner.post(f"{CONV}/{conv}/block")
    (first,) = await receiver.wait_for(1, within=10)
    gate = receiver.gate = trio.Event()
    await owner.post(f"{CONV}/{conv}/unblock")  # waiting: held at the receiver
    await receiver.wait_for(2, within=10)
    redeliver = await owner.post(f"{HOOK}/deliveries/{json.loads(first.body)['id']}/redeliver")
    assert redeliver.status_code == 202
    await owner.patch(f"{CONV}/{conv}/title", json={"title": "later"})
    receiver.gate = None
    gate.set()
    got = await receiver.wait_for(4, within=10)
    assert types_of(got) == [
        "inbox.conversation.blocked",
        "inbox.conversation.unblocked",
        "inbox.conversation.blocked",  # the redelivery
        "inbox.conversation.title_changed",
    ]
    assert got[2].body == first.body


async def test_a_webhook_saved_anew_does_not_wait_for_a_dropped_events_retry(
    autojump_clock: trio.testing.MockClock,
    owner: httpx.AsyncClient,
    seeded: Seed,
    receiver: Receiver,
) -> None:
    """An event's 4th attempt failed (the 5th is 30 min away); the webhook is deleted and saved
    again: the next change goes out at once, not after that timer."""
    await save(owner, receiver.url)
    conv = await new_conversation(owner, seeded)
    receiver.statuses += [500, 500, 500, 500]
    await owner.post(f"{CONV}/{conv}/block")
    await receiver.wait_for(4)
    await trio.sleep(1)  # (the 4th attempt's record commits)
    assert (await owner.delete(HOOK)).json() == {"removed": True}
    await save(owner, receiver.url)
    saved_at = trio.current_time()
    await owner.post(f"{CONV}/{conv}/unblock")
    got = await receiver.wait_for(5, within=3 * 3600)
    assert types_of(got)[4] == "inbox.conversation.unblocked"
    assert got[4].at - saved_at < 5


async def test_a_fixed_url_is_tried_at_once(
    autojump_clock: trio.testing.MockClock,
    owner: httpx.AsyncClient,
    seeded: Seed,
    receiver: Receiver,
) -> None:
    """An event failing (its next try 30 min away) goes out as soon as the URL is changed, and
    a redelivery dropped with a deleted webhook is not sent to the one saved after it."""
    await save(owner, receiver.url)
    conv = await new_conversation(owner, seeded)
    receiver.statuses += [500, 500, 500, 500]
    await owner.post(f"{CONV}/{conv}/block")
    await receiver.wait_for(4)
    await trio.sleep(1)
    changed_at = trio.current_time()
    await save(owner, receiver.url + "?fixed=1")  # the same receiver, a new URL
    got = await receiver.wait_for(5, within=3 * 3600)
    assert types_of(got)[4] == "inbox.conversation.blocked"
    assert got[4].at - changed_at < 5
    # A redelivery failing, then its webhook deleted and saved again: it is not sent again.
    receiver.statuses += [500]
    event_id = json.loads(got[0].body)["id"]
    assert (await owner.post(f"{HOOK}/deliveries/{event_id}/redeliver")).status_code == 202
    await receiver.wait_for(6)
    await trio.sleep(1)
    await owner.delete(HOOK)
    await save(owner, receiver.url)
    await owner.post(f"{CONV}/{conv}/unblock")
    got = await receiver.wait_for(7, within=3 * 3600)
    await trio.sleep(3 * 3600)
    assert types_of(receiver.requests[6:]) == ["inbox.conversation.unblocked"]


async def test_a_committed_event_survives_a_crash_before_delivery(
    seeded: Seed, config: Config, certs: Certs
) -> None:
    async with running_receiver(certs) as receiver:
        receiver.statuses.append(500)  # the first attempt fails, then the daemon dies
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(
                lambda task_status: daemon.run(
                    seeded.data_dir,
                    config,
                    trio.Event(),
                    bind="127.0.0.1:0",
                    task_status=task_status,
                )
            )
            async with httpx.AsyncClient(
                base_url=urls[0], headers=auth(seeded.owner_key), event_hooks=OPENAPI_HOOKS
            ) as c:
                await save(c, receiver.url)
                conv = await new_conversation(c, seeded)
                await c.post(f"{CONV}/{conv}/block")
                await receiver.wait_for(1, within=10)
            nursery.cancel_scope.cancel()  # no graceful stop: as abrupt as trio allows
        shutdown = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: daemon.run(
                    seeded.data_dir, config, shutdown, bind="127.0.0.1:0", task_status=task_status
                )
            )
            _, redelivered = await receiver.wait_for(2, within=30)
            assert json.loads(redelivered.body)["type"] == "inbox.conversation.blocked"
            shutdown.set()
    store = Store.open(seeded.data_dir, readers=1)
    try:
        outcomes = store.read_sync(
            lambda c: [
                r[0] for r in c.execute("SELECT outcome FROM webhook_deliveries ORDER BY pk")
            ]
        )
    finally:
        store.close()
    # The first attempt's failure may or may not have been recorded before the crash.
    assert outcomes in (["failed", "delivered"], ["delivered"])


async def test_an_event_committed_during_a_read_wakes_the_deliverer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A webhook saved, then an event committing after the deliverer's read took its snapshot:
    the journal listener must wake it even though the read before found no webhook (it once
    listened only while a webhook was known, and the event waited for the next one)."""
    store = Store.open(seed_store(tmp_path / "data").data_dir)
    deliverer = inbox.InboxWebhookDeliverer(
        store,
        None,
        InboxWebhookConfig(),
        1,
        SystemClock(),  # type: ignore[arg-type]
    )
    woken: list[bool] = []
    three = trio.Event()
    original = inbox.webhooks.next_work

    def next_work(conn: Any, *args: Any) -> Any:
        work = original(conn, *args)  # no webhook saved: None
        if three.is_set():
            return work  # enough: let the deliverer wait
        before = store.signal(inbox.webhooks.work_queued(1)).version
        deliverer._on_journal(
            [Appended(10**9, 1, None, "inbox.conversation.opened", False, 1, b"{}")]
        )
        woken.append(store.signal(inbox.webhooks.work_queued(1)).version > before)
        if len(woken) == 3:
            three.set()
        return work

    monkeypatch.setattr(inbox.webhooks, "next_work", next_work)
    try:
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                await nursery.start(deliverer.run)
                await three.wait()
                nursery.cancel_scope.cancel()
    finally:
        store.close()
    assert woken[:3] == [True, True, True]


def test_redeliveries_queued_before_schema_v12_go_after_the_journal_of_then(
    tmp_path: Path,
) -> None:
    """Migrating to v12 gives each queued redelivery the journal's end as its place."""
    import sqlite3

    from inboxd.store.db import db_path, migrate
    from inboxd.store.schema import MIGRATIONS

    conn = sqlite3.connect(db_path(tmp_path), isolation_level=None)
    for number, script in enumerate(MIGRATIONS[:11], start=1):
        conn.executescript(f"BEGIN; {script}\nPRAGMA user_version = {number}; COMMIT;")
    for seq in (1, 2, 3):
        conn.execute(
            "INSERT INTO events (seq, id, account_pk, type, created_at, body)"
            " VALUES (?, ?, 1, 'inbox.conversation.blocked', 0, x'7b7d')",
            (seq, f"evt_{seq}"),
        )
    conn.execute(
        "INSERT INTO webhook_redeliveries (account_pk, event_seq, requested_at) VALUES (1, 1, 0)"
    )
    assert migrate(conn) == len(MIGRATIONS) - 11
    assert conn.execute("SELECT after_seq FROM webhook_redeliveries").fetchall() == [(3,)]
    # v14 rebuilt the table (AUTOINCREMENT) with its rows as they were.
    assert conn.execute("SELECT pk, event_seq FROM webhook_redeliveries").fetchall() == [(1, 1)]
    assert (
        "AUTOINCREMENT"
        in conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'webhook_redeliveries'"
        ).fetchone()[0]
    )
    conn.close()


def test_a_redelivery_pk_is_never_given_again(store: Store) -> None:
    """A redelivery queued after the webhook was deleted and saved again gets a new pk: an
    attempt still in flight for the dropped one (whose record deletes its redelivery by pk)
    used to find the new one under the same pk and drop it unsent (schema v14)."""
    from inboxd.store import accounts, events, webhooks

    def queue(conn: Any) -> tuple[int, int]:
        account_pk = accounts.the_account_pk(conn)
        if webhooks.get(conn, account_pk) is None:
            webhooks.put(conn, account_pk, "https://example.com/hook", 1)
        seq = events.append(conn, account_pk, None, "inbox.conversation.blocked", {}, 1)
        event_id = conn.execute("SELECT id FROM events WHERE seq = ?", (seq,)).fetchone()[0]
        return webhooks.queue_redelivery(conn, account_pk, event_id, 1), seq

    first, first_seq = store.write_sync(queue)
    store.write_sync(lambda c: webhooks.delete(c, accounts.the_account_pk(c)))
    second, _ = store.write_sync(queue)
    assert second != first
    # The dropped redelivery's attempt, recorded late, leaves the new one queued.
    late = webhooks.Attempt(first_seq, "dlv_late", 1, "delivered", 200, None, 1.0, 2, 1)
    store.write_sync(lambda c: webhooks.record_attempt(c, accounts.the_account_pk(c), late, first))
    assert store.read_sync(webhooks.redelivery_queued, second)


async def test_an_attempt_to_a_deleted_webhook_is_not_recorded_on_the_one_saved_after_it(
    owner: httpx.AsyncClient, seeded: Seed, receiver: Receiver, certs: Certs
) -> None:
    """An attempt in flight to the old URL while the webhook is deleted and saved again used
    to fill the new webhook's lastDelivery fields with a delivery it never had."""
    assert (await owner.put(HOOK, json={"url": receiver.url})).status_code == 200
    conv = (await ingest(owner, seeded.sales_id, "15550001"))["conversationId"]
    receiver.gate = trio.Event()  # the old URL answers only when told
    receiver.statuses.append(500)
    await owner.post(f"{CONV}/{conv}/block")
    await receiver.wait_for(1, within=10)
    assert (await owner.delete(HOOK)).json() == {"removed": True}
    async with running_receiver(certs) as other:
        created = (await owner.put(HOOK, json={"url": other.url})).json()
        assert created["created"] is True and created["lastDeliveryStatus"] is None
        receiver.gate.set()  # the old attempt ends now (500)
        with trio.fail_after(10):  # until its record has committed
            while not (await owner.get(f"{HOOK}/deliveries")).json()["deliveries"]:  # noqa: ASYNC110
                await trio.sleep(0.01)
        now = (await owner.get(HOOK)).json()
        assert other.requests == []
    # The attempt is in the account's log, not on the webhook saved after it.
    assert (now["url"], now["lastDeliveryAt"], now["lastDeliveryStatus"]) == (other.url, None, None)
    assert now["lastDeliveryError"] is None


async def test_an_attempt_series_cut_short_by_a_stop_goes_on_after_the_start(
    autojump_clock: trio.testing.MockClock, seeded: Seed, config: Config, certs: Certs
) -> None:
    """Stopped between two attempts of one event, the daemon used to start the event over on
    its start: attempt 1 again at once, under a new X-Svc-Delivery (so an event failing across
    restarts was never given up). It now goes on with the series: the same delivery id, the
    next attempt's number, when the schedule has it due (10 s after the first, with up to
    20 % jitter)."""
    run_daemon = restartable_daemon(seeded, config)

    async with running_receiver(certs) as receiver:
        receiver.statuses.append(500)
        await fail_once_and_stop(run_daemon, seeded, receiver)
        assert len(receiver.requests) == 1
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(run_daemon, stop)
            first, retry = await receiver.wait_for(2, within=60)
            async with owner_client(urls[0], seeded) as c:
                await recorded_outcomes(c, 2)
                log = (await c.get(f"{HOOK}/deliveries")).json()["deliveries"]
            stop.set()
    assert json.loads(first.body)["id"] == json.loads(retry.body)["id"]
    assert retry.headers["x-svc-delivery"] == first.headers["x-svc-delivery"]
    assert 10 - 1e-6 <= retry.at - first.at <= 12.5
    assert [(d["attempt"], d["outcome"]) for d in log] == [(2, "delivered"), (1, "failed")]


async def test_a_retry_after_is_kept_across_a_stop(
    autojump_clock: trio.testing.MockClock, seeded: Seed, config: Config, certs: Certs
) -> None:
    """CONTRACT section 6: a retry waits at least a 429/503's Retry-After. A series resumed
    after a stop used to wait only what the schedule said (10 s here), sending the retry well
    before the receiver asked."""
    run_daemon = restartable_daemon(seeded, config)

    async with running_receiver(certs) as receiver:
        receiver.statuses.append((503, {"Retry-After": "300"}))
        await fail_once_and_stop(run_daemon, seeded, receiver)
        await trio.sleep(30)  # stopped for 30 s: the schedule's 10 s has passed, not the 300
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(run_daemon, stop)
            first, retry = await receiver.wait_for(2, within=3600)
            stop.set()
    assert retry.headers["x-svc-delivery"] == first.headers["x-svc-delivery"]
    assert 300 - 1e-6 <= retry.at - first.at <= 301


async def test_a_redelivery_cut_short_by_a_stop_goes_on_after_the_start(
    autojump_clock: trio.testing.MockClock, seeded: Seed, config: Config, certs: Certs
) -> None:
    """A redelivery is a series of its own, and a stop does not start it over either: it went
    out again at once after the start, as attempt 1 under the same id, without waiting for the
    Retry-After its 503 gave (found by a review)."""
    run_daemon = restartable_daemon(seeded, config)
    async with running_receiver(certs) as receiver:
        await fail_once_and_stop(run_daemon, seeded, receiver)  # answered 200: delivered
        event_id = json.loads(receiver.requests[0].body)["id"]
        receiver.statuses.append((503, {"Retry-After": "300"}))
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(run_daemon, stop)
            async with owner_client(urls[0], seeded) as c:
                redeliver = await c.post(f"{HOOK}/deliveries/{event_id}/redeliver")
                assert redeliver.status_code == 202
                await receiver.wait_for(2)
                with trio.fail_after(5):
                    while len((await c.get(f"{HOOK}/deliveries")).json()["deliveries"]) < 2:  # noqa: ASYNC110
                        await trio.sleep(0.01)
            stop.set()
        await trio.sleep(30)
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(run_daemon, stop)
            _, failed, retry = await receiver.wait_for(3, within=3600)
            async with owner_client(urls[0], seeded) as c:
                await recorded_outcomes(c, 3)
                log = (await c.get(f"{HOOK}/deliveries")).json()["deliveries"]
            stop.set()
    assert retry.headers["x-svc-delivery"] == failed.headers["x-svc-delivery"]
    assert failed.headers["x-svc-delivery"] != receiver.requests[0].headers["x-svc-delivery"]
    assert [(d["attempt"], d["outcome"]) for d in log] == [
        (2, "delivered"),
        (1, "failed"),
        (1, "delivered"),
    ]
    assert 300 - 1e-6 <= retry.at - failed.at <= 301
