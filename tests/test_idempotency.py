"""Idempotency-Key (CONTRACT section 6): a retry gets the first response and changes nothing."""

from __future__ import annotations

import httpx
import pytest

from inboxd.store.db import Store
from tests import arrange
from tests.conftest import Seed, auth, ingest

CONV = "/api/v1/inbox/conversations"


async def test_repeat_returns_the_first_response_and_changes_nothing(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    conv = (await ingest(owner, seeded.sales_id, "15550001", content="hi"))["conversationId"]
    key = {"Idempotency-Key": "close-1"}
    first = await owner.patch(f"{CONV}/{conv}/status", json={"status": "CLOSED"}, headers=key)
    assert first.status_code == 200
    again = await owner.patch(f"{CONV}/{conv}/status", json={"status": "CLOSED"}, headers=key)
    assert again.status_code == 200  # without the key this would be 409 status_unchanged
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert arrange.event_types(store).count("inbox.conversation.status_changed") == 1
    plain = await owner.patch(f"{CONV}/{conv}/status", json={"status": "CLOSED"})
    assert plain.status_code == 409


async def test_same_key_with_another_body_is_422(owner: httpx.AsyncClient, seeded: Seed) -> None:
    conv = (await ingest(owner, seeded.sales_id, "15550001", content="hi"))["conversationId"]
    key = {"Idempotency-Key": "k-1"}
    await owner.patch(f"{CONV}/{conv}/title", json={"title": "A"}, headers=key)
    other = await owner.patch(f"{CONV}/{conv}/title", json={"title": "B"}, headers=key)
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    elsewhere = await owner.post(f"{CONV}/{conv}/block", headers=key)
    assert elsewhere.status_code == 422


async def test_errors_are_replayed_too_and_keys_are_per_user(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    conv = (await ingest(owner, seeded.sales_id, "15550001", content="hi"))["conversationId"]
    key = {"Idempotency-Key": "unblock-1"}
    first = await owner.post(f"{CONV}/{conv}/unblock", headers=key)
    assert first.status_code == 409
    await owner.post(f"{CONV}/{conv}/block")
    replay = await owner.post(f"{CONV}/{conv}/unblock", headers=key)
    assert replay.status_code == 409 and replay.json() == first.json()
    as_bob = await owner.post(f"{CONV}/{conv}/unblock", headers={**key, **auth(seeded.bob_key)})
    assert as_bob.status_code == 200


async def test_ingestion_retry_with_a_key(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    body = {
        "channelId": seeded.sales_id,
        "direction": "INBOUND",
        "contact": {"phoneNumber": "15550001"},
        "type": "TEXT",
        "content": "no externalId here",
    }
    key = {"Idempotency-Key": "msg-1"}
    first = await owner.post("/api/v1/messaging/messages", json=body, headers=key)
    again = await owner.post("/api/v1/messaging/messages", json=body, headers=key)
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    count = store.read_sync(lambda c: c.execute("SELECT count(*) FROM messages").fetchone()[0])
    assert count == 1


async def test_bad_keys_are_400(owner: httpx.AsyncClient, seeded: Seed) -> None:
    conv = (await ingest(owner, seeded.sales_id, "15550001", content="hi"))["conversationId"]
    for bad in ("", "has space", "x" * 256):
        r = await owner.post(f"{CONV}/{conv}/block", headers={"Idempotency-Key": bad})
        assert r.status_code == 400, bad


async def test_a_change_whose_response_was_lost_is_never_applied_twice(
    seeded: Seed, tmp_path: object
) -> None:
    """The daemon dies after the change commits and before the response is stored: a retry
    after a minute is refused rather than run again (the mark commits with the change)."""
    from inboxd.errors import Conflict
    from inboxd.store import accounts, actions, idempotency, messages
    from inboxd.store.db import IDEMPOTENT_WRITE
    from inboxd.store.db import Store as StoreClass

    store = StoreClass.open(seeded.data_dir, readers=1, offload=False)
    try:
        who = store.read_sync(accounts.authenticate, seeded.owner_key)
        assert who is not None
        new = arrange.inbound_text(seeded.sales_id, "15550001")
        conv = store.write_sync(messages.ingest, who, new, 1).message.conversation_id
        assert await store.write(idempotency.claim, who.user_pk, "k", b"fp", 1_000) is None
        IDEMPOTENT_WRITE.set((who.user_pk, "k"))
        await store.write(actions.rename, who, conv, "Applied once", 1_000)
        # ... the process dies here: no idempotency.complete().
        with pytest.raises(Conflict) as refused:
            await store.write(idempotency.claim, who.user_pk, "k", b"fp", 1_000 + 61 * 10**6)
        assert refused.value.code == "idempotency_key_applied"
        with pytest.raises(Conflict) as running:
            await store.write(idempotency.claim, who.user_pk, "k", b"fp", 2_000)
        assert running.value.code == "idempotency_in_progress"
    finally:
        store.close()


async def test_a_repeat_gets_no_new_key_or_secret_and_none_is_stored(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    """Keys are shown once and stored only as a hash; a webhook secret is never returned after
    the response that made it: the Idempotency-Key record keeps them as null."""
    key = {"Idempotency-Key": "mint-1"}
    created = await owner.post("/api/v1/inbox/keys", headers=key)
    assert created.status_code == 201
    again = await owner.post("/api/v1/inbox/keys", headers=key)
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.json() == {**created.json(), "apiKey": None}
    hook = {"Idempotency-Key": "hook-1"}
    url = {"url": "https://hooks.example.com/inbox"}
    saved = await owner.put("/api/v1/inbox/webhook", json=url, headers=hook)
    assert saved.status_code == 200 and saved.json()["secret"].startswith("whsec_")
    replayed = await owner.put("/api/v1/inbox/webhook", json=url, headers=hook)
    assert replayed.json() == {**saved.json(), "secret": None}
    bodies = store.read_sync(
        lambda c: [bytes(r[0] or b"") for r in c.execute("SELECT body FROM idempotency_keys")]
    )
    for secret in (created.json()["apiKey"], saved.json()["secret"]):
        assert not any(secret.encode() in body for body in bodies)


async def test_a_401_from_a_key_revoked_meanwhile_is_not_kept_for_the_users_other_keys(
    owner: httpx.AsyncClient, seeded: Seed, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write whose key is revoked while it runs answers 401 and changes nothing (README). That
    401 used to be kept under the Idempotency-Key and replayed for 24 h to the same user's
    valid keys (without WWW-Authenticate): the change could not be made under that key."""
    from inboxd.api import inbox as inbox_api
    from inboxd.store import accounts

    conv = (await ingest(owner, seeded.sales_id, "15550001", content="hi"))["conversationId"]
    second = (await owner.post("/api/v1/inbox/keys", headers=auth(seeded.ann_key))).json()
    keys = (await owner.get("/api/v1/inbox/keys", headers=auth(second["apiKey"]))).json()
    first_key_id = next(k["keyId"] for k in keys if k["keyId"] != second["keyId"])
    account_pk = store.read_sync(accounts.the_account_pk)
    real = inbox_api.json_body

    async def revoked_meanwhile(**how: object) -> object:
        store.write_sync(accounts.revoke_key, account_pk, first_key_id, 1)
        return await real(**how)

    monkeypatch.setattr(inbox_api, "json_body", revoked_meanwhile)
    rename = f"/api/v1/inbox/conversations/{conv}/title"
    once = {"Idempotency-Key": "rename-1"}
    refused = await owner.patch(
        rename, json={"title": "X"}, headers={**once, **auth(seeded.ann_key)}
    )
    assert refused.status_code == 401
    monkeypatch.setattr(inbox_api, "json_body", real)
    retried = await owner.patch(
        rename, json={"title": "X"}, headers={**once, **auth(second["apiKey"])}
    )
    assert retried.status_code == 200, retried.text
    assert "Idempotent-Replayed" not in retried.headers
    assert retried.json()["title"] == "X"
