"""Spec endpoints 8-12 and their state tables: one SYSTEM row and one event per real change."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from inboxd import wire
from inboxd.errors import Conflict, Unprocessable
from inboxd.model import Conversation
from inboxd.store import accounts, actions, conversations, messages
from inboxd.store.db import Store
from tests.conftest import Seed, auth, ingest, seed_store

CONV = "/api/v1/inbox/conversations"


def journal(store: Store) -> list[dict[str, Any]]:
    rows = store.read_sync(lambda c: c.execute("SELECT body FROM events ORDER BY seq").fetchall())
    return [json.loads(r[0]) for r in rows]


def system_rows(store: Store, conversation_id: str) -> list[dict[str, Any]]:
    return store.read_sync(
        lambda c: [
            dict(r)
            for r in c.execute(
                "SELECT m.content, m.system_event_source, m.system_event_operator_name,"
                " m.system_event_operator_email, m.assignment_event, m.author_user_pk"
                " FROM messages m JOIN conversations c ON c.pk = m.conversation_pk"
                " WHERE c.id = ? AND m.is_system = 1 ORDER BY m.pk",
                (conversation_id,),
            )
        ]
    )


@pytest.fixture
async def conv_id(owner: httpx.AsyncClient, seeded: Seed) -> str:
    msg = await ingest(owner, seeded.sales_id, "15550001", contact={"name": "Ada"}, content="hi")
    return str(msg["conversationId"])


def conversation_events(store: Store) -> list[dict[str, Any]]:
    return [e for e in journal(store) if e["type"].startswith("inbox.conversation.")]


async def test_assign_writes_system_row_with_assignment_event_and_journals(
    owner: httpx.AsyncClient, seeded: Seed, store: Store, conv_id: str
) -> None:
    response = await owner.patch(f"{CONV}/{conv_id}/assignee", json={"userId": seeded.ann_id})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["assignedTo"] == seeded.ann_id
    assert body["assignedUser"] == {"id": seeded.ann_id, "name": "Ann", "avatar": None}
    assert "contact" not in body
    history = (await owner.get(f"{CONV}/{conv_id}/messages", params={"kind": "system"})).json()
    (row,) = history["messages"]
    assert row["type"] == "SYSTEM"
    assert row["systemEventSource"] == "API"
    assert row["systemEventOperatorName"] == "Olivia Owner"
    assert row["systemEventOperatorEmail"] == "owner@example.com"
    assert row["author"] == {"id": seeded.owner_id, "name": "Olivia Owner", "avatar": None}
    assert row["assignmentEvent"] == {
        "kind": "assign",
        "actor": {"id": seeded.owner_id, "name": "Olivia Owner", "avatar": None},
        "target": {"id": seeded.ann_id, "name": "Ann", "avatar": None},
    }
    (event,) = conversation_events(store)
    assert event["type"] == "inbox.conversation.assigned"
    assert event["data"] == {
        "conversationId": conv_id,
        "channelId": seeded.sales_id,
        "assigneeUserId": seeded.ann_id,
        "previousAssigneeUserId": None,
        "actorUserId": seeded.owner_id,
    }


async def test_same_assignee_is_a_no_op(
    owner: httpx.AsyncClient, seeded: Seed, store: Store, conv_id: str
) -> None:
    for _ in range(3):
        response = await owner.patch(f"{CONV}/{conv_id}/assignee", json={"userId": seeded.bob_id})
        assert response.status_code == 200
    unassigned = await owner.patch(f"{CONV}/{conv_id}/assignee", json={"userId": None})
    assert unassigned.json()["assignedTo"] is None
    again = await owner.patch(f"{CONV}/{conv_id}/assignee", json={"userId": None})
    assert again.status_code == 200
    assert [e["type"] for e in conversation_events(store)] == [
        "inbox.conversation.assigned",
        "inbox.conversation.unassigned",
    ]
    assert len(system_rows(store, conv_id)) == 2
    assert conversation_events(store)[1]["data"] == {
        "conversationId": conv_id,
        "channelId": seeded.sales_id,
        "assigneeUserId": None,
        "previousAssigneeUserId": seeded.bob_id,
        "actorUserId": seeded.owner_id,
    }


async def test_assignee_who_cannot_open_the_channel_is_422(
    owner: httpx.AsyncClient, seeded: Seed, store: Store
) -> None:
    msg = await ingest(owner, seeded.support_id, "15550002", content="hi")
    # An unknown id is 422 at any length (not a 400 for a long one: it is a string, as asked).
    for user_id in (seeded.bob_id, "usr_unknown", "u" * 1000):
        response = await owner.patch(
            f"{CONV}/{msg['conversationId']}/assignee", json={"userId": user_id}
        )
        assert response.status_code == 422
        assert response.json()["error"]["code"] == "assignee_not_allowed"
    assert conversation_events(store) == []
    owner_ok = await owner.patch(
        f"{CONV}/{msg['conversationId']}/assignee", json={"userId": seeded.owner_id}
    )
    assert owner_ok.status_code == 200


async def test_assignee_body_is_validated(owner: httpx.AsyncClient, conv_id: str) -> None:
    for body in ({}, {"userId": 5}, {"user": "x"}):
        response = await owner.patch(f"{CONV}/{conv_id}/assignee", json=body)
        assert response.status_code == 400, body


async def test_status_table(
    owner: httpx.AsyncClient, seeded: Seed, store: Store, conv_id: str
) -> None:
    url = f"{CONV}/{conv_id}/status"
    same = await owner.patch(url, json={"status": "OPEN"})
    assert same.status_code == 409 and same.json()["error"]["code"] == "status_unchanged"
    closed = await owner.patch(url, json={"status": "CLOSED"})
    assert closed.status_code == 200 and closed.json()["status"] == "CLOSED"
    assert "contact" not in closed.json()
    again = await owner.patch(url, json={"status": "CLOSED"})
    assert again.status_code == 409
    opened = await owner.patch(url, json={"status": "OPEN"})
    assert opened.json()["status"] == "OPEN"
    for bad in ({"status": "RESOLVED"}, {"status": "closed"}, {}):
        assert (await owner.patch(url, json=bad)).status_code == 400
    events = conversation_events(store)
    assert [(e["data"]["previousStatus"], e["data"]["status"]) for e in events] == [
        ("OPEN", "CLOSED"),
        ("CLOSED", "OPEN"),
    ]
    assert all(e["data"]["actorUserId"] == seeded.owner_id for e in events)
    assert len(system_rows(store, conv_id)) == 2


async def test_block_table_and_inbound_rejection(
    owner: httpx.AsyncClient, seeded: Seed, store: Store, conv_id: str
) -> None:
    blocked = await owner.post(f"{CONV}/{conv_id}/block")
    assert blocked.status_code == 200 and blocked.json()["isBlocked"] is True
    assert "contact" not in blocked.json()
    again = await owner.post(f"{CONV}/{conv_id}/block")
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_blocked"
    rejected = await owner.post(
        "/api/v1/messaging/messages",
        json={
            "channelId": seeded.sales_id,
            "direction": "INBOUND",
            "contact": {"phoneNumber": "15550001"},
            "type": "TEXT",
            "content": "hello?",
        },
    )
    assert rejected.status_code == 422 and rejected.json()["error"]["code"] == "contact_blocked"
    unblocked = await owner.post(f"{CONV}/{conv_id}/unblock")
    assert unblocked.status_code == 200 and unblocked.json()["isBlocked"] is False
    not_blocked = await owner.post(f"{CONV}/{conv_id}/unblock")
    assert not_blocked.status_code == 409
    assert not_blocked.json()["error"]["code"] == "not_blocked"
    await ingest(owner, seeded.sales_id, "15550001", content="works again")
    assert [e["type"] for e in conversation_events(store)] == [
        "inbox.conversation.blocked",
        "inbox.conversation.unblocked",
    ]
    assert conversation_events(store)[0]["data"] == {
        "conversationId": conv_id,
        "channelId": seeded.sales_id,
        "actorUserId": seeded.owner_id,
    }


async def test_rename(owner: httpx.AsyncClient, seeded: Seed, store: Store, conv_id: str) -> None:
    url = f"{CONV}/{conv_id}/title"
    first = await owner.patch(url, json={"title": "VIP order"})
    assert first.status_code == 200 and first.json()["title"] == "VIP order"
    await owner.patch(url, json={"title": "VIP order"})  # the same again: written too (spec)
    await owner.patch(url, json={"title": "Refund"})
    for bad in (
        {"title": ""},
        {"title": "   "},
        {"title": None},
        {"title": 3},
        {"title": "x" * 201},
    ):
        assert (await owner.patch(url, json=bad)).status_code == 400, bad
    # 1 to 200 characters after trimming: the spaces around a title do not count.
    longest = await owner.patch(url, json={"title": "  " + "y" * 200 + "  "})
    assert longest.status_code == 200 and longest.json()["title"] == "y" * 200
    await owner.patch(url, json={"title": "Refund"})
    events = conversation_events(store)
    assert [(e["data"]["previousTitle"], e["data"]["title"]) for e in events] == [
        (None, "VIP order"),
        ("VIP order", "VIP order"),
        ("VIP order", "Refund"),
        ("Refund", "y" * 200),
        ("y" * 200, "Refund"),
    ]
    assert [r["content"] for r in system_rows(store, conv_id)] == [
        'Olivia Owner renamed the conversation to "VIP order"',
        'Olivia Owner renamed the conversation to "VIP order"',
        'Olivia Owner renamed the conversation to "Refund"',
        f'Olivia Owner renamed the conversation to "{"y" * 200}"',
        'Olivia Owner renamed the conversation to "Refund"',
    ]


async def test_user_key_acts_as_its_user_and_sees_only_its_channels(
    owner: httpx.AsyncClient, seeded: Seed, store: Store, conv_id: str
) -> None:
    bob = auth(seeded.bob_key)
    response = await owner.patch(
        f"{CONV}/{conv_id}/assignee", json={"userId": seeded.bob_id}, headers=bob
    )
    assert response.status_code == 200
    assert conversation_events(store)[0]["data"]["actorUserId"] == seeded.bob_id
    assert system_rows(store, conv_id)[0]["system_event_operator_name"] == "Bob"
    hidden = await ingest(owner, seeded.support_id, "15550009", content="secret")
    for method, path, body in (
        ("PATCH", "assignee", {"userId": None}),
        ("PATCH", "status", {"status": "CLOSED"}),
        ("POST", "block", None),
        ("POST", "unblock", None),
        ("PATCH", "title", {"title": "x"}),
    ):
        r = await owner.request(
            method, f"{CONV}/{hidden['conversationId']}/{path}", json=body, headers=bob
        )
        assert r.status_code == 404, path
    missing = await owner.post(f"{CONV}/conv_nope/block")
    assert missing.status_code == 404


class ActionsMachine(RuleBasedStateMachine):
    """Random sequences of actions against the store; the model says what must have happened."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        seed = seed_store(Path(self.tmp.name) / "data")
        self.seed = seed
        self.store = Store.open(seed.data_dir, readers=1)
        who = self.store.read_sync(accounts.authenticate, seed.owner_key)
        assert who is not None
        self.who = who
        new = messages.NewMessage(
            channel_id=seed.support_id,
            direction="INBOUND",
            phone_number="1234567",
            contact_name=None,
            contact_avatar=None,
            type="TEXT",
            content="x",
        )
        self.conv = self.store.write_sync(messages.ingest, who, new, 1).message.conversation_id
        self.model: dict[str, Any] = {
            "status": "OPEN",
            "assignee": None,
            "blocked": False,
            "title": None,
        }
        self.changes = 0

    def teardown(self) -> None:
        self.store.close()
        self.tmp.cleanup()

    def returned(self, conv: Conversation) -> None:
        """An action returns the conversation as the store now holds it (built without reading
        it back), and its SYSTEM row's event carries the row as the store holds it."""
        assert conv == self.store.read_sync(lambda c: conversations.load(c, [conv.pk])[0])
        pk, body = self.store.read_sync(
            lambda c: c.execute(
                "SELECT (SELECT max(pk) FROM messages WHERE is_system = 1), (SELECT body FROM"
                " events WHERE type = 'inbox.message.created' ORDER BY seq DESC LIMIT 1)"
            ).fetchone()
        )
        if pk is not None:
            stored = self.store.read_sync(lambda c: messages.load_one(c, pk))
            assert json.loads(body)["data"] == wire.message(stored)

    @rule(user=st.sampled_from(["owner", "ann", "bob", None]))
    def assign(self, user: str | None) -> None:
        user_id = {
            "owner": self.seed.owner_id,
            "ann": self.seed.ann_id,
            "bob": self.seed.bob_id,
            None: None,
        }[user]
        try:
            self.returned(self.store.write_sync(actions.assign, self.who, self.conv, user_id, 2))
        except Unprocessable:
            assert user == "bob"  # bob cannot open the support channel
            return
        if user_id != self.model["assignee"]:
            self.changes += 1
        self.model["assignee"] = user_id

    @rule(status=st.sampled_from(["OPEN", "CLOSED"]))
    def set_status(self, status: str) -> None:
        try:
            self.returned(self.store.write_sync(actions.set_status, self.who, self.conv, status, 2))
        except Conflict:
            assert status == self.model["status"]
            return
        assert status != self.model["status"]
        self.model["status"] = status
        self.changes += 1

    @rule(blocked=st.booleans())
    def block(self, blocked: bool) -> None:
        try:
            self.returned(
                self.store.write_sync(actions.set_blocked, self.who, self.conv, blocked, 2)
            )
        except Conflict:
            assert blocked == self.model["blocked"]
            return
        self.model["blocked"] = blocked
        self.changes += 1

    @rule(title=st.sampled_from(["a", "b", "c"]))
    def rename(self, title: str) -> None:
        self.returned(self.store.write_sync(actions.rename, self.who, self.conv, title, 2))
        self.changes += 1  # every rename writes, also to the current title (spec)
        self.model["title"] = title

    @invariant()
    def matches_model(self) -> None:
        row = self.store.read_sync(
            lambda c: c.execute(
                "SELECT c.status, u.id, c.is_blocked, c.title FROM conversations c"
                " LEFT JOIN users u ON u.pk = c.assigned_to_pk WHERE c.id = ?",
                (self.conv,),
            ).fetchone()
        )
        assert tuple(row) == (
            self.model["status"],
            self.model["assignee"],
            int(self.model["blocked"]),
            self.model["title"],
        )
        system, conv_events, counted = self.store.read_sync(
            lambda c: (
                c.execute("SELECT count(*) FROM messages WHERE is_system = 1").fetchone()[0],
                c.execute(
                    "SELECT count(*) FROM events WHERE type LIKE 'inbox.conversation.%'"
                ).fetchone()[0],
                c.execute(
                    "SELECT status, assignee_pk FROM conversation_counts WHERE n = 1"
                ).fetchall(),
            )
        )
        assert system == conv_events == self.changes
        assert len(counted) == 1 and counted[0][0] == self.model["status"]
        per_account = self.store.read_sync(
            lambda c: c.execute(
                "SELECT status, assignee_pk FROM account_conversation_counts WHERE n <> 0"
            ).fetchall()
        )
        assert [tuple(r) for r in per_account] == [tuple(counted[0])]


TestActionsMachine = ActionsMachine.TestCase
TestActionsMachine.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)


@pytest.mark.parametrize(
    ("change", "refused"), [("remove the member", 401), ("take the member's channels", 404)]
)
async def test_a_write_acts_for_the_key_as_it_is_when_the_write_runs(
    owner: httpx.AsyncClient,
    seeded: Seed,
    monkeypatch: pytest.MonkeyPatch,
    change: str,
    refused: int,
) -> None:
    """Bob's request is authenticated, then held before its body is read (what a slow client,
    or a batch ahead of it in the writer, does); meanwhile the owner removes Bob or takes his
    channels. His write must not happen (it used to, with the principal of the request's start)."""
    import trio

    from inboxd.api import inbox as inbox_api

    conv = (await ingest(owner, seeded.sales_id, "15550001", content="x"))["conversationId"]
    members = (await owner.get("/api/v1/inbox/team/members")).json()
    bob = next(m for m in members if m["userId"] == seeded.bob_id)
    held, go = trio.Event(), trio.Event()
    json_body = inbox_api.json_body

    async def held_body(*args: Any, **kwargs: Any) -> Any:
        held.set()
        await go.wait()
        return await json_body(*args, **kwargs)

    monkeypatch.setattr(inbox_api, "json_body", held_body)
    answers: list[httpx.Response] = []

    async def bobs_write() -> None:
        answers.append(
            await owner.patch(
                f"{CONV}/{conv}/status", json={"status": "CLOSED"}, headers=auth(seeded.bob_key)
            )
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(bobs_write)
        with trio.fail_after(10):
            await held.wait()
        if change == "remove the member":
            done = await owner.delete(f"/api/v1/inbox/team/members/{bob['memberId']}")
        else:
            done = await owner.put(
                f"/api/v1/inbox/team/members/{bob['memberId']}/channels", json={"channelIds": []}
            )
        assert done.status_code == 200
        go.set()
    (answer,) = answers
    assert answer.status_code == refused, answer.text
    assert (await owner.get(f"{CONV}/{conv}")).json()["status"] == "OPEN"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PATCH", "/api/v1/inbox/conversations/{conv}/title", {"title": "after"}),
        ("PUT", "/api/v1/inbox/webhook", {"url": "https://hooks.example.com/after"}),
        ("POST", "/api/v1/inbox/webhook/secret", {}),
        ("POST", "/api/v1/channels/{channel}/webhook", {"urls": ["https://crm.example.com/x"]}),
        ("PATCH", "/api/v1/channels/{channel}/settings", {"notifications": {"email": False}}),
    ],
)
async def test_an_owner_write_under_way_when_its_key_is_revoked_changes_nothing(
    base_url: str, owner: httpx.AsyncClient, seeded: Seed, method: str, path: str, body: Any
) -> None:
    """A second owner key sends its request's headers (authenticated), then its body after
    the key was revoked. The webhook and channel settings writes, whose store functions take
    the account or channel, went through with the revoked key (a review found it): the inbox
    webhook pointed elsewhere, its new secret handed over, the owner's emails turned off."""
    import trio
    import trio.testing

    conv = (await ingest(owner, seeded.sales_id, "15550001", content="x"))["conversationId"]
    await owner.put("/api/v1/inbox/webhook", json={"url": "https://hooks.example.com/before"})
    await owner.post(f"/api/v1/channels/{seeded.sales_id}/webhook", json={"urls": []})

    async def state() -> list[Any]:
        return [
            (await owner.get(f"{CONV}/{conv}")).json()["title"],
            (await owner.get("/api/v1/inbox/webhook")).json(),
            (await owner.get(f"/api/v1/channels/{seeded.sales_id}/settings")).json(),
        ]

    before = await state()
    key = (await owner.post("/api/v1/inbox/keys", json={})).json()
    raw = json.dumps(body).encode()
    host, port = base_url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(
            f"{method} {path.format(conv=conv, channel=seeded.sales_id)} HTTP/1.1\r\n"
            f"Host: x\r\nAuthorization: Bearer {key['apiKey']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n".encode()
        )
        await trio.testing.wait_all_tasks_blocked(cushion=0.2)  # waiting for its body
        assert (await owner.delete(f"/api/v1/inbox/keys/{key['keyId']}")).status_code == 200
        await stream.send_all(raw)
        answer = b""
        with trio.fail_after(10):
            while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
                answer += await stream.receive_some()
    assert answer.startswith(b"HTTP/1.1 401 "), answer
    assert await state() == before
