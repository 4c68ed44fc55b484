"""Team and keys (CONTRACT sections 4 and 6): invites with mail, members, channels, removal."""

from __future__ import annotations

import email
import email.policy
import json
import re
from pathlib import Path
from typing import Any

import httpx
import trio

from inboxd.model import MAX_EMAIL, email_address
from inboxd.store.db import Store
from tests.conftest import Seed, auth, ingest

TEAM = "/api/v1/inbox/team"
KEYS = "/api/v1/inbox/keys"
CONV = "/api/v1/inbox/conversations"


def user_events(store: Store) -> list[dict[str, Any]]:
    rows = store.read_sync(
        lambda c: c.execute(
            "SELECT body FROM events WHERE type LIKE 'inbox.user.%' ORDER BY seq"
        ).fetchall()
    )
    return [json.loads(r[0]) for r in rows]


async def outbox_mails(data_dir: Path, count: int) -> list[email.message.Message]:
    outbox = data_dir / "mail" / "outbox"
    with trio.fail_after(10):
        while len(list(outbox.glob("*.eml")) if outbox.exists() else []) < count:  # noqa: ASYNC110
            await trio.sleep(0.01)
    return [
        email.message_from_bytes(p.read_bytes(), policy=email.policy.default)
        for p in sorted(outbox.glob("*.eml"))
    ]


def token_of(message: email.message.Message) -> str:
    match = re.search(r'"token": "([^"]+)"', message.get_payload(decode=True).decode())
    assert match is not None
    return match.group(1)


async def test_invite_mail_accept_and_events(
    owner: httpx.AsyncClient, anon: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    created = await owner.post(
        f"{TEAM}/invites", json={"email": "new@example.com", "channelIds": [seeded.sales_id]}
    )
    assert created.status_code == 201, created.text
    invite = created.json()
    assert invite["status"] == "PENDING" and invite["channelIds"] == [seeded.sales_id]
    (mail,) = await outbox_mails(seeded.data_dir, 1)
    assert mail["To"] == "new@example.com"
    token = token_of(mail)
    for name in ("   ", " " + "N" * 201 + " "):  # 1 to 200 characters once trimmed
        refused = await anon.post(f"{TEAM}/invites/accept", json={"token": token, "name": name})
        assert refused.status_code == 400, name
    # The spaces around a name do not count against its 200 characters.
    padded = " " + "N" * 200 + " "
    accepted = await anon.post(f"{TEAM}/invites/accept", json={"token": token, "name": padded})
    assert accepted.status_code == 201, accepted.text
    member = accepted.json()
    listed = (await owner.get(f"{TEAM}/members")).json()
    assert [m["name"] for m in listed if m["userId"] == member["userId"]] == ["N" * 200]
    assert set(member) == {"memberId", "userId", "apiKey"}
    # The new operator works with their key and sees only the invited channel.
    channels = await anon.get("/api/v1/inbox/channels", headers=auth(member["apiKey"]))
    assert [c["id"] for c in channels.json()] == [seeded.sales_id]
    # A token works once.
    again = await anon.post(f"{TEAM}/invites/accept", json={"token": token, "name": "Neo"})
    assert again.status_code == 404
    listed = (await owner.get(f"{TEAM}/invites")).json()
    assert [i["status"] for i in listed] == ["ACCEPTED"]
    assert [e["type"] for e in user_events(store)] == ["inbox.user.invited", "inbox.user.added"]
    invited, added = user_events(store)
    assert invited["data"] == {
        "inviteId": invite["inviteId"],
        "email": "new@example.com",
        "channelIds": [seeded.sales_id],
        "actorUserId": seeded.owner_id,
    }
    assert added["data"] == {
        "memberId": member["memberId"],
        "userId": member["userId"],
        "email": "new@example.com",
        "channelIds": [seeded.sales_id],
    }


async def test_revoking_an_invite(
    owner: httpx.AsyncClient, anon: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    invite = (
        await owner.post(f"{TEAM}/invites", json={"email": "x@example.com", "channelIds": []})
    ).json()
    revoked = await owner.delete(f"{TEAM}/invites/{invite['inviteId']}")
    assert revoked.status_code == 200 and revoked.json()["status"] == "REVOKED"
    again = await owner.delete(f"{TEAM}/invites/{invite['inviteId']}")
    assert again.status_code == 409
    (mail,) = await outbox_mails(seeded.data_dir, 1)
    refused = await anon.post(f"{TEAM}/invites/accept", json={"token": token_of(mail), "name": "X"})
    assert refused.status_code == 404
    assert user_events(store)[-1]["data"] == {
        "inviteId": invite["inviteId"],
        "email": "x@example.com",
        "actorUserId": seeded.owner_id,
    }


async def test_invite_validation_and_owner_only(owner: httpx.AsyncClient, seeded: Seed) -> None:
    bad = [
        ({"email": "nope", "channelIds": []}, 400),
        ({"email": "a" * 309 + "@example.com", "channelIds": []}, 400),  # 321 characters
        ({"email": "a@example.com"}, 400),
        ({"email": "a@example.com", "channelIds": [1]}, 400),
        ({"email": "a@example.com", "channelIds": ["ch_missing"]}, 404),
        ({"email": "ann@example.com", "channelIds": []}, 409),
    ]
    for body, status in bad:
        assert (await owner.post(f"{TEAM}/invites", json=body)).status_code == status, body
    ann = auth(seeded.ann_key)
    for method, path in (
        ("POST", f"{TEAM}/invites"),
        ("GET", f"{TEAM}/invites"),
        ("GET", f"{TEAM}/members"),
    ):
        r = await owner.request(
            method, path, json={"email": "b@example.com", "channelIds": []}, headers=ann
        )
        assert r.status_code == 403, path
    # The permission comes before the body: an operator's key is 403 whatever it sends.
    members = (await owner.get(f"{TEAM}/members")).json()
    for method, path in (
        ("POST", f"{TEAM}/invites"),
        ("PUT", f"{TEAM}/members/{members[0]['memberId']}/channels"),
    ):
        r = await owner.request(method, path, content=b"{not json", headers=ann)
        assert r.status_code == 403, path
        assert r.json()["error"]["message"] == "only the account owner's key may manage the team"


async def test_members_channel_change_unassigns_lost_conversations(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    members = (await owner.get(f"{TEAM}/members")).json()
    ann = next(m for m in members if m["userId"] == seeded.ann_id)
    assert ann["channelIds"] == [seeded.sales_id, seeded.support_id]
    in_support = (await ingest(owner, seeded.support_id, "15550001", content="x"))["conversationId"]
    in_sales = (await ingest(owner, seeded.sales_id, "15550002", content="y"))["conversationId"]
    for conv in (in_support, in_sales):
        await owner.patch(f"{CONV}/{conv}/assignee", json={"userId": seeded.ann_id})
    changed = await owner.put(
        f"{TEAM}/members/{ann['memberId']}/channels", json={"channelIds": [seeded.sales_id]}
    )
    assert changed.status_code == 200 and changed.json()["channelIds"] == [seeded.sales_id]
    assert (await owner.get(f"{CONV}/{in_support}")).json()["assignedTo"] is None
    assert (await owner.get(f"{CONV}/{in_sales}")).json()["assignedTo"] == seeded.ann_id
    hidden = await owner.get(f"{CONV}/{in_support}", headers=auth(seeded.ann_key))
    assert hidden.status_code == 404
    assert user_events(store)[-1]["data"] == {
        "memberId": ann["memberId"],
        "userId": seeded.ann_id,
        "channelIds": [seeded.sales_id],
        "actorUserId": seeded.owner_id,
    }
    system = (await owner.get(f"{CONV}/{in_support}/messages", params={"kind": "system"})).json()
    assert "lost access" in system["messages"][0]["content"]
    unassigned = store.read_sync(
        lambda c: c.execute(
            "SELECT count(*) FROM events WHERE type = 'inbox.conversation.unassigned'"
        ).fetchone()[0]
    )
    assert unassigned == 1


async def test_removing_a_member_stops_their_keys_and_unassigns(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    members = (await owner.get(f"{TEAM}/members")).json()
    bob = next(m for m in members if m["userId"] == seeded.bob_id)
    conv = (await ingest(owner, seeded.sales_id, "15550001", content="x"))["conversationId"]
    await owner.patch(f"{CONV}/{conv}/assignee", json={"userId": seeded.bob_id})
    assert (await owner.get(KEYS, headers=auth(seeded.bob_key))).status_code == 200
    removed = await owner.delete(f"{TEAM}/members/{bob['memberId']}")
    assert removed.status_code == 200
    assert (await owner.get(KEYS, headers=auth(seeded.bob_key))).status_code == 401
    assert (await owner.get(f"{CONV}/{conv}")).json()["assignedTo"] is None
    assert bob["memberId"] not in [
        m["memberId"] for m in (await owner.get(f"{TEAM}/members")).json()
    ]
    assert user_events(store)[-1]["data"] == {
        "memberId": bob["memberId"],
        "userId": seeded.bob_id,
        "actorUserId": seeded.owner_id,
    }
    assert (await owner.delete(f"{TEAM}/members/{bob['memberId']}")).status_code == 404


async def test_keys_over_the_api(owner: httpx.AsyncClient, seeded: Seed) -> None:
    ann = auth(seeded.ann_key)
    mine = (await owner.get(KEYS, headers=ann)).json()
    assert len(mine) == 1 and "apiKey" not in mine[0] and mine[0]["userId"] == seeded.ann_id
    created = await owner.post(KEYS, headers=ann)
    assert created.status_code == 201
    new = created.json()
    assert set(new) == {"apiKey", "keyId", "prefix"} and new["apiKey"].startswith(new["prefix"])
    assert (await owner.get(KEYS, headers=auth(new["apiKey"]))).status_code == 200
    # An operator cannot mint keys for others or revoke theirs.
    assert (await owner.post(KEYS, json={"userId": seeded.bob_id}, headers=ann)).status_code == 403
    owners_keys = (await owner.get(KEYS)).json()
    assert (await owner.delete(f"{KEYS}/{owners_keys[0]['keyId']}", headers=ann)).status_code == 404
    # The owner may create a key for a teammate.
    for_bob = await owner.post(KEYS, json={"userId": seeded.bob_id})
    assert for_bob.status_code == 201
    bobs = (
        await owner.get("/api/v1/inbox/channels", headers=auth(for_bob.json()["apiKey"]))
    ).json()
    assert [c["id"] for c in bobs] == [seeded.sales_id]
    # A user id nobody has is 404 at any length (it is a string, as asked: not a 400).
    for unknown in ("usr_nobody", "u" * 1000):
        missing = await owner.post(KEYS, json={"userId": unknown})
        assert missing.status_code == 404, missing.text
        assert missing.json()["error"]["code"] == "not_found"
    revoked = await owner.delete(f"{KEYS}/{new['keyId']}", headers=ann)
    assert revoked.status_code == 200
    assert (await owner.get(KEYS, headers=auth(new["apiKey"]))).status_code == 401


async def test_a_removed_member_cannot_come_back_through_an_older_pending_invite(
    owner: httpx.AsyncClient, anon: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    """Two invites to one address; the member joins through the first and is removed: the
    second, still pending, is revoked with them (it used to let them back in)."""
    for _ in range(2):
        sent = await owner.post(
            f"{TEAM}/invites", json={"email": "twice@example.com", "channelIds": []}
        )
        assert sent.status_code == 201
    first, second = await outbox_mails(seeded.data_dir, 2)
    joined = await anon.post(
        f"{TEAM}/invites/accept", json={"token": token_of(first), "name": "Twice"}
    )
    assert joined.status_code == 201
    removed = await owner.delete(f"{TEAM}/members/{joined.json()['memberId']}")
    assert removed.status_code == 200
    back = await anon.post(
        f"{TEAM}/invites/accept", json={"token": token_of(second), "name": "Twice"}
    )
    assert back.status_code == 404
    statuses = [i["status"] for i in (await owner.get(f"{TEAM}/invites")).json()]
    assert sorted(statuses) == ["ACCEPTED", "REVOKED"]
    types = [e["type"] for e in user_events(store)]
    assert types[-2:] == ["inbox.user.invite_revoked", "inbox.user.removed"]


async def test_the_invite_endpoint_takes_emails_by_the_shared_rule(
    owner: httpx.AsyncClient,
) -> None:
    """The endpoint goes through model.email_address: 320 characters once trimmed, and a
    domain of one label, are taken (it used to count the spaces and to want a dot)."""
    longest = "b" * 308 + "@example.com"
    for sent, stored in ((f"  {longest} ", longest), ("ops@intranet", "ops@intranet")):
        created = await owner.post(f"{TEAM}/invites", json={"email": sent, "channelIds": []})
        assert created.status_code == 201, created.text
        assert created.json()["email"] == stored


def test_emails_are_checked_once_trimmed_by_the_api_and_the_cli_alike() -> None:
    """One rule (model.email_address) for the invite endpoint and the CLI: the spaces around
    an address do not count against its 320 characters (the API used to count them)."""
    longest = "a" * 308 + "@example.com"
    assert len(longest) == MAX_EMAIL
    assert email_address(f"  {longest} \t") == longest
    assert email_address(longest + "a") is None
    assert email_address(" new@example.com ") == "new@example.com"
    assert email_address("owner@localhost") == "owner@localhost"  # init's default
    for bad in (
        "",
        "   ",
        "nope",
        "a@",
        "@b",
        "a b@example.com",
        "a@@example.com",
        "a@exa\x00mple.com",
    ):
        assert email_address(bad) is None, bad
