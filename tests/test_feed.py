"""The websocket feed (CONTRACT section 8) with real trio-websocket clients over loopback."""

from __future__ import annotations

import contextlib
import fcntl
import json
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import trio
import trio.testing
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    WebSocketConnection,
    open_websocket_url,
)

from inboxd import daemon
from inboxd.api import feed as feed_api
from inboxd.api.app import KeyCache
from inboxd.config import Config, FeedConfig, LimitsConfig, ServerConfig
from inboxd.feed import SEND_TURNS, FeedClient, FeedHub
from inboxd.store import accounts, events
from inboxd.store.db import Store
from tests.conftest import Seed, auth, ingest, owner_client, restartable_daemon
from tests.openapi_check import check_feed_frame

CONV = "/api/v1/inbox/conversations"


def ws_url(base_url: str, **params: Any) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return (
        base_url.replace("http://", "ws://") + "/api/v1/inbox/feed" + (f"?{query}" if query else "")
    )


@asynccontextmanager
async def feed(
    base_url: str, key: str | None, *, header: bool = True, **params: Any
) -> AsyncIterator[WebSocketConnection]:
    headers = [(b"Authorization", f"Bearer {key}".encode())] if key and header else []
    async with open_websocket_url(ws_url(base_url, **params), extra_headers=headers) as ws:
        if key and not header:
            await ws.send_message(json.dumps({"type": "auth", "token": key}))
        yield ws
        if not ws.closed:
            # hypercorn pings right after the upgrade; trio-websocket crashes if that ping
            # arrives while it is closing (python-trio/trio-websocket#184) and the crash surfaces
            # as a Cancelled that ends the test early. A ping round trip first drains it.
            await ws.ping()


async def frames(ws: WebSocketConnection, count: int, within: float = 10) -> list[dict[str, Any]]:
    out = []
    with trio.fail_after(within):
        while len(out) < count:
            frame = json.loads(await ws.get_message())
            check_feed_frame(frame)
            out.append(frame)
    return out


async def read_until_closed(ws: WebSocketConnection, within: float = 10) -> tuple[int, int]:
    """Read what is left until the server closes the socket: how many frames, and the code."""
    received = 0
    with pytest.raises(ConnectionClosed) as closed, trio.fail_after(within):
        while True:
            await ws.get_message()
            received += 1
    assert closed.value.reason is not None
    return received, closed.value.reason.code


async def nothing_more(ws: WebSocketConnection, wait: float = 0.3) -> None:
    with trio.move_on_after(wait):
        extra = await ws.get_message()
        raise AssertionError(f"unexpected frame {extra}")


async def test_every_change_arrives_as_a_frame_in_commit_order(
    owner: httpx.AsyncClient, base_url: str, seeded: Seed
) -> None:
    async with feed(base_url, seeded.owner_key) as ws:
        msg = await ingest(owner, seeded.sales_id, "15550001", content="hi")
        conv = msg["conversationId"]
        await owner.post(f"/api/v1/messaging/messages/{msg['id']}/status", json={"status": "READ"})
        await owner.post(f"{CONV}/{conv}/read")
        await owner.patch(f"{CONV}/{conv}/assignee", json={"userId": seeded.ann_id})
        await owner.patch(f"{CONV}/{conv}/status", json={"status": "CLOSED"})
        got = await frames(ws, 7)
    assert [f["type"] for f in got] == [
        "inbox.message.created",
        "inbox.message.status_changed",
        "inbox.conversation.read",
        "inbox.message.created",  # the SYSTEM row of the assignment
        "inbox.conversation.assigned",
        "inbox.message.created",  # the SYSTEM row of the close
        "inbox.conversation.status_changed",
    ]
    assert all(set(f) == {"seq", "id", "type", "createdAt", "data"} for f in got)
    seqs = [f["seq"] for f in got]
    assert seqs == sorted(seqs) and len(set(seqs)) == 7
    assert got[0]["data"] == msg


async def test_visibility_per_key(owner: httpx.AsyncClient, base_url: str, seeded: Seed) -> None:
    async with feed(base_url, seeded.bob_key) as bob, feed(base_url, seeded.ann_key) as ann:
        await ingest(owner, seeded.support_id, "15550002", content="support only")
        await ingest(owner, seeded.sales_id, "15550001", content="sales")
        await owner.post(
            "/api/v1/inbox/team/invites", json={"email": "z@example.com", "channelIds": []}
        )
        (bob_frame,) = await frames(bob, 1)
        assert bob_frame["data"]["content"] == "sales"
        await nothing_more(bob)
        ann_frames = await frames(ann, 2)
        assert [f["data"]["content"] for f in ann_frames] == ["support only", "sales"]
        await nothing_more(ann)  # inbox.user.* events go to owner keys only


async def test_auth_by_first_frame_and_refusals(
    base_url: str, seeded: Seed, owner: httpx.AsyncClient
) -> None:
    async with feed(base_url, seeded.owner_key, header=False) as ws:
        await ingest(owner, seeded.sales_id, "15550001", content="hi")
        assert (await frames(ws, 1))[0]["type"] == "inbox.message.created"
    with pytest.raises(ConnectionRejected) as rejected:
        async with feed(base_url, "ibx_wrong"):
            pass
    assert rejected.value.status_code == 401
    async with open_websocket_url(ws_url(base_url)) as ws:
        await ws.send_message(json.dumps({"type": "auth", "token": "ibx_wrong"}))
        with pytest.raises(ConnectionClosed) as closed:
            await ws.get_message()
    assert closed.value.reason.code == 1008


@pytest.mark.parametrize("config", [Config(limits=LimitsConfig(requests_per_second=1, burst=2))])
async def test_opening_the_feed_counts_against_the_keys_rate(
    base_url: str, seeded: Seed, config: Config
) -> None:
    """An upgrade is a request: a key over its rate gets 429 and Retry-After before the upgrade,
    or, authenticating by its first frame, a 1013 close."""
    async with feed(base_url, seeded.ann_key):
        pass
    async with feed(base_url, seeded.ann_key):
        pass  # the burst of two is spent
    with pytest.raises(ConnectionRejected) as rejected:
        async with feed(base_url, seeded.ann_key):
            pass
    assert rejected.value.status_code == 429
    headers = {k.decode().lower(): v.decode() for k, v in rejected.value.headers or []}
    assert int(headers["retry-after"]) >= 1
    assert json.loads(rejected.value.body or b"{}")["error"]["code"] == "rate_limited"
    async with open_websocket_url(ws_url(base_url)) as ws:
        await ws.send_message(json.dumps({"type": "auth", "token": seeded.ann_key}))
        with pytest.raises(ConnectionClosed) as closed:
            await ws.get_message()
    assert closed.value.reason.code == 1013
    async with feed(base_url, seeded.bob_key):  # another key has its own bucket
        pass


async def test_no_auth_frame_within_10_s_closes(
    autojump_clock: trio.testing.MockClock, base_url: str
) -> None:
    async with open_websocket_url(ws_url(base_url)) as ws:
        started = trio.current_time()
        with pytest.raises(ConnectionClosed) as closed:
            await ws.get_message()
    assert closed.value.reason.code == 1008
    assert 10 <= trio.current_time() - started < 11


async def test_a_client_gone_while_its_handler_waits_after_registering_is_unregistered(
    base_url: str, seeded: Seed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler registers the client, then reads the key's epoch, which may wait (the store
    read in a worker thread, while the store is being read into memory). A client gone then
    cancels the handler there: that await was outside the try that unregisters, and the client
    stayed registered for good (found when reads began to leave the loop during a warm-up)."""
    hubs: list[FeedHub] = []
    register = FeedHub.register
    waiting = trio.Event()

    def noting(self: FeedHub, who: Any) -> Any:
        hubs.append(self)
        return register(self, who)

    current_epoch = KeyCache.current_epoch

    async def slow_after_registering(self: KeyCache) -> int:
        if hubs:  # the read right after register: wait, as a read in a thread would
            waiting.set()
            await trio.sleep_forever()
        return await current_epoch(self)

    monkeypatch.setattr(FeedHub, "register", noting)
    monkeypatch.setattr(KeyCache, "current_epoch", slow_after_registering)
    async with feed(base_url, seeded.owner_key):  # (it pings before closing: see there)
        with trio.fail_after(10):
            await waiting.wait()
        assert len(hubs[0].clients) == 1
    gone = False
    with trio.move_on_after(10):  # the client closed: its handler is cancelled where it waits
        while not (gone := not hubs[0].clients):  # noqa: ASYNC110 (the hub has no event)
            await trio.sleep(0.01)
    assert gone, "the client stayed registered"


async def test_since_replays_then_goes_live_without_gap_or_duplicate(
    owner: httpx.AsyncClient, base_url: str, seeded: Seed
) -> None:
    first = await ingest(owner, seeded.sales_id, "15550001", content="m0")
    async with feed(base_url, seeded.owner_key) as probe:
        await ingest(owner, seeded.sales_id, "15550001", content="m1")
        since = (await frames(probe, 1))[0]["seq"] - 1
    del first
    total = 120

    async def writer() -> None:
        for i in range(2, total):
            await ingest(owner, seeded.sales_id, "15550001", content=f"m{i}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        await trio.sleep(0.05)  # connect while the writer is busy
        async with feed(base_url, seeded.owner_key, since=since) as ws:
            got = await frames(ws, total - 1, within=30)
    contents = [f["data"]["content"] for f in got]
    assert contents == [f"m{i}" for i in range(1, total)]
    seqs = [f["seq"] for f in got]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


async def reset_then_live(
    owner: httpx.AsyncClient, base_url: str, seeded: Seed, *, since: int, content: str
) -> dict[str, Any]:
    """Open the owner's feed at ``since``: a feed.reset first, then the next message live."""
    async with feed(base_url, seeded.owner_key, since=since) as ws:
        (reset,) = await frames(ws, 1)
        assert reset == {"type": "feed.reset"}
        await ingest(owner, seeded.sales_id, "15550001", content=content)
        (live,) = await frames(ws, 1)
    assert live["data"]["content"] == content
    return live


async def test_since_older_than_retention_gets_feed_reset(
    autojump_clock: trio.testing.MockClock, owner: httpx.AsyncClient, base_url: str, seeded: Seed
) -> None:
    await ingest(owner, seeded.sales_id, "15550001", content="old")
    await trio.sleep(8 * 86400)
    # Housekeeping has pruned the journal past feed.retention (7 days) meanwhile.
    gone = (await owner.get("/api/v1/inbox/events")).json()
    assert gone["reset"] is True and gone["events"] == [] and gone["hasMore"] is False
    # The client goes on from the journal's end: the next page is no reset again.
    assert gone["nextAfter"] > 0
    again = (await owner.get("/api/v1/inbox/events", params={"after": gone["nextAfter"]})).json()
    assert again == {"events": [], "nextAfter": gone["nextAfter"], "hasMore": False, "reset": False}
    live = await reset_then_live(owner, base_url, seeded, since=0, content="new")
    after = (await owner.get("/api/v1/inbox/events", params={"after": gone["nextAfter"]})).json()
    assert [e["data"]["content"] for e in after["events"]] == ["new"]
    assert after["reset"] is False  # nothing after that seq was pruned
    assert after["nextAfter"] == live["seq"]


async def test_a_seq_beyond_the_journal_gets_a_reset_on_the_feed_and_the_rest_events(
    owner: httpx.AsyncClient, base_url: str, seeded: Seed
) -> None:
    """A seq from elsewhere (another store, a backup restored since) would otherwise make a
    client wait, missing every event, until the journal reached it."""
    async with feed(base_url, seeded.owner_key) as ws:
        await ingest(owner, seeded.sales_id, "15550001", content="seen")
        (seen,) = await frames(ws, 1)
    end = seen["seq"]
    beyond = end + 5
    page = (await owner.get("/api/v1/inbox/events", params={"after": beyond})).json()
    assert page == {"events": [], "nextAfter": end, "hasMore": False, "reset": True}
    live = await reset_then_live(owner, base_url, seeded, since=beyond, content="after the reset")
    page = (await owner.get("/api/v1/inbox/events", params={"after": page["nextAfter"]})).json()
    assert [e["data"]["content"] for e in page["events"]] == ["after the reset"]
    assert page["reset"] is False and page["nextAfter"] == live["seq"]
    # Up to the end is no reset: a caught-up client waits for what comes next.
    page = (await owner.get("/api/v1/inbox/events", params={"after": live["seq"]})).json()
    assert page == {"events": [], "nextAfter": live["seq"], "hasMore": False, "reset": False}


async def test_revoking_a_key_closes_its_sockets(
    owner: httpx.AsyncClient, base_url: str, seeded: Seed
) -> None:
    new = (await owner.post("/api/v1/inbox/keys", headers=auth(seeded.ann_key))).json()
    async with feed(base_url, new["apiKey"]) as ws:
        await owner.delete(f"/api/v1/inbox/keys/{new['keyId']}", headers=auth(seeded.ann_key))
        with pytest.raises(ConnectionClosed) as closed, trio.fail_after(5):
            await ws.get_message()
    assert closed.value.reason.code == 1008


async def test_losing_a_channel_stops_its_events_and_removal_closes(
    owner: httpx.AsyncClient, base_url: str, seeded: Seed
) -> None:
    members = (await owner.get("/api/v1/inbox/team/members")).json()
    ann = next(m for m in members if m["userId"] == seeded.ann_id)
    async with feed(base_url, seeded.ann_key) as ws:
        await ingest(owner, seeded.support_id, "15550002", content="visible")
        await owner.put(
            f"/api/v1/inbox/team/members/{ann['memberId']}/channels",
            json={"channelIds": [seeded.sales_id]},
        )
        await ingest(owner, seeded.support_id, "15550002", content="hidden now")
        await ingest(owner, seeded.sales_id, "15550003", content="still visible")
        got = await frames(ws, 2)
        assert [f["data"]["content"] for f in got] == ["visible", "still visible"]
        await owner.delete(f"/api/v1/inbox/team/members/{ann['memberId']}")
        await ingest(owner, seeded.sales_id, "15550003", content="after removal")
        with pytest.raises(ConnectionClosed) as closed, trio.fail_after(5):
            await ws.get_message()
    assert closed.value.reason.code == 1008


@pytest.fixture
def config() -> Config:
    # A short shutdown_timeout: hypercorn's ping task of a closed websocket sleeps out its 20 s
    # interval and holds a graceful stop until this timeout (see daemon.py).
    return Config(
        server=ServerConfig(shutdown_timeout=0.2, lock_code=False),
        feed=FeedConfig(queue_bound=20),
        limits=LimitsConfig(requests_per_second=0),
    )


async def test_a_client_that_does_not_keep_up_is_closed_with_1013(
    owner: httpx.AsyncClient, base_url: str, seeded: Seed
) -> None:
    big = "x" * 100_000  # large frames fill the socket buffers of a client that stops reading
    async with feed(base_url, seeded.owner_key) as slow, feed(base_url, seeded.owner_key) as fast:
        for i in range(200):
            await ingest(owner, seeded.sales_id, "15550001", content=f"{i} {big}")
            got = await frames(fast, 1)  # the fast client keeps up, and is never closed
            assert got[0]["data"]["content"].startswith(f"{i} ")
        received, code = await read_until_closed(slow)
    assert code == 1013
    assert received < 200


async def test_clients_that_stop_reading_hold_up_nobody_else(
    owner: httpx.AsyncClient, base_url: str, seeded: Seed
) -> None:
    """Clients write frames a few at a time (FeedClient.take_turn), and a turn is given back
    before the write: more clients stuck in a write than there are turns must not stop the
    frames of a client that reads."""
    big = "x" * 100_000
    async with AsyncExitStack() as stack:
        stuck = [
            await stack.enter_async_context(feed(base_url, seeded.owner_key))
            for _ in range(SEND_TURNS + 2)
        ]
        reader = await stack.enter_async_context(feed(base_url, seeded.owner_key))
        for i in range(200):
            await ingest(owner, seeded.sales_id, "15550001", content=f"{i} {big}")
            got = await frames(reader, 1)
            assert got[0]["data"]["content"].startswith(f"{i} ")
        for ws in stuck:  # each stopped reading after the first frames; the queue bound closed it
            received, code = await read_until_closed(ws)
            assert code == 1013
            assert received < 200


class Passes(trio.abc.Instrument):
    """Counts passes of trio's scheduler (one I/O check before each batch of tasks)."""

    def __init__(self) -> None:
        self.count = 0

    def after_io_wait(self, timeout: float) -> None:
        self.count += 1


async def test_clients_start_their_writes_a_few_per_pass_of_the_scheduler(
    seeded: Seed,
) -> None:
    """What the turns are for: forty clients woken at once start their writes SEND_TURNS per
    pass of the scheduler, in turn, rather than all in one pass that every request on the
    thread would wait for."""
    store = Store.open(seeded.data_dir, readers=1)
    try:
        who = store.read_sync(accounts.authenticate, seeded.owner_key)
        assert who is not None
        hub = FeedHub(store)
        clients = [hub.register(who) for _ in range(40)]
        passes = Passes()
        started: list[int] = []

        async def write(client: FeedClient) -> None:
            await client.take_turn()
            started.append(passes.count)

        trio.lowlevel.add_instrument(passes)
        try:
            async with trio.open_nursery() as nursery:
                for client in clients:
                    nursery.start_soon(write, client)
        finally:
            trio.lowlevel.remove_instrument(passes)
        per_pass = Counter(started)
        assert sum(per_pass.values()) == 40
        assert max(per_pass.values()) == SEND_TURNS
        assert len(per_pass) == 40 // SEND_TURNS
    finally:
        store.close()


async def test_rest_events_same_stream_and_visibility(
    owner: httpx.AsyncClient, seeded: Seed, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(5):
        await ingest(
            owner, seeded.sales_id if i % 2 else seeded.support_id, f"1555000{i}", content=f"m{i}"
        )
    reads: list[int] = []
    read_after = events.read_after

    def counted(*args: Any) -> Any:
        reads.append(args[-1])
        return read_after(*args)

    monkeypatch.setattr(events, "read_after", counted)
    page = (await owner.get("/api/v1/inbox/events", params={"limit": 3})).json()
    assert [e["data"]["content"] for e in page["events"]] == ["m0", "m1", "m2"]
    assert page["hasMore"] is True
    assert reads == [4]  # the page and one more, to know there is more: one read of the journal
    rest = (await owner.get("/api/v1/inbox/events", params={"after": page["nextAfter"]})).json()
    assert [e["data"]["content"] for e in rest["events"]] == ["m3", "m4"]
    assert rest["hasMore"] is False
    bobs = (await owner.get("/api/v1/inbox/events", headers=auth(seeded.bob_key))).json()
    assert [e["data"]["content"] for e in bobs["events"]] == ["m1", "m3"]
    assert all(set(e) == {"seq", "id", "type", "createdAt", "data"} for e in bobs["events"])
    assert (await owner.get("/api/v1/inbox/events", params={"after": "x"})).status_code == 400


async def test_rest_events_pages_walk_the_stream_exactly(
    owner: httpx.AsyncClient, seeded: Seed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every page but the last is full and says hasMore; the last says none. Bob's key sees
    only every other event, and the route's reads are made small here, so his pages end
    inside the route's reads of the journal as well as on their ends."""
    monkeypatch.setattr(feed_api, "REPLAY_BATCH", 4)
    texts = [f"{i} ¿Dónde está? 🚚 お願いします" for i in range(9)]
    for i, text in enumerate(texts):
        channel = seeded.sales_id if i % 2 else seeded.support_id
        await ingest(owner, channel, f"1555010{i}", content=text)
    for key, expected in ((seeded.owner_key, texts), (seeded.bob_key, texts[1::2])):
        for limit in (1, 2, 3, 4, 9, 10):
            seen: list[str] = []
            after = 0
            while True:
                response = await owner.get(
                    "/api/v1/inbox/events",
                    params={"after": after, "limit": limit},
                    headers=auth(key),
                )
                assert response.status_code == 200
                page = response.json()
                seen += [e["data"]["content"] for e in page["events"]]
                assert page["nextAfter"] >= after
                after = page["nextAfter"]
                if not page["hasMore"]:
                    break
                assert len(page["events"]) == limit
            assert seen == expected, (key, limit)
            tail = (
                await owner.get("/api/v1/inbox/events", params={"after": after}, headers=auth(key))
            ).json()
            assert tail == {"events": [], "nextAfter": after, "hasMore": False, "reset": False}


async def test_shutdown_closes_sockets_with_1001_and_exits(seeded: Seed) -> None:
    shutdown = trio.Event()
    with trio.fail_after(10):  # CONTRACT section 1: exit within 10 s
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(
                lambda task_status: daemon.run(
                    seeded.data_dir, Config(), shutdown, bind="127.0.0.1:0", task_status=task_status
                )
            )
            async with feed(urls[0], seeded.owner_key) as ws:
                await ws.ping()
                stopped_at = trio.current_time()
                shutdown.set()
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.get_message()
                assert trio.current_time() - stopped_at < 1
    assert closed.value.reason.code == 1001


def stuck_client(url: str, request: bytes) -> socket.socket:
    """A client that sends ``request`` and then reads nothing, with a small receive buffer: what
    the server sends it soon stops being taken."""
    parts = urlsplit(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((parts.hostname, parts.port))
    sock.sendall(request)
    return sock


async def test_clients_that_stop_reading_cannot_hold_up_a_stop(
    autojump_clock: trio.testing.MockClock, seeded: Seed, config: Config
) -> None:
    """CONTRACT section 1: a stop ends within 10 s. hypercorn shields its writes from
    cancellation, so a write to a client that takes nothing held the daemon for as long as the
    client lived (the feed's frames, or a large answer); what is left at the shutdown timeout
    (5 s) is now cut half a second later. Each connection also carries TCP_USER_TIMEOUT: the
    kernel drops a peer that has taken nothing for 60 s (checked by hand: 3.3 s for a 3 s
    setting on this kernel)."""
    run = restartable_daemon(seeded, config)
    socks: list[socket.socket] = []
    # Without the cut the stop waits for the clients, and the virtual clock need not move
    # meanwhile: after 20 s of wall time they go, so that the test ends (and fails on the wall
    # time it took).
    release = threading.Timer(20, lambda: [sock.close() for sock in socks])
    try:
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(run, shutdown := trio.Event())
            key = seeded.owner_key.encode()
            socks.append(
                stuck_client(
                    urls[0],
                    b"GET /api/v1/inbox/feed HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                    b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    b"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer " + key + b"\r\n\r\n",
                )
            )
            for _ in range(2):
                socks.append(
                    stuck_client(urls[0], b"GET /api/v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
                )
            async with owner_client(urls[0], seeded) as owner:
                for i in range(40):  # 4 MB of frames: more than any socket buffer takes
                    await ingest(
                        owner, seeded.sales_id, "15550001", content=f"{i} " + "x" * 100_000
                    )
            (port,) = {sock.getpeername()[1] for sock in socks}
            theirs = {sock.getsockname() for sock in socks}
            served = daemon.api_connections({port})
            try:
                stuck = [sock for sock in served if sock.getpeername() in theirs]
                assert len(stuck) == len(socks)
                for sock in stuck:
                    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 60_000
            finally:
                for sock in served:
                    sock.close()
            stopped_at = trio.current_time()
            release.start()
            started = time.monotonic()
            shutdown.set()
        took = trio.current_time() - stopped_at
    finally:
        release.cancel()
    assert time.monotonic() - started < 20
    assert took < config.server.shutdown_timeout + 1 < 10
    for sock in socks:  # each was cut: after what was on its way, the end of the stream
        sock.settimeout(5)
        with contextlib.suppress(ConnectionResetError):
            while sock.recv(1 << 16):
                pass
        sock.close()


def test_finding_the_connections_leaves_the_process_s_file_locks_alone(tmp_path: Path) -> None:
    """Closing any descriptor of a file drops every POSIX lock the process holds on it, SQLite's
    on the database among them (a review found the search for hypercorn's connections closing a
    duplicate of each file it looked at)."""
    locked = tmp_path / "locked"
    with locked.open("wb") as held:
        fcntl.lockf(held, fcntl.LOCK_EX)
        for sock in daemon.api_connections({1}):
            sock.close()
        other = subprocess.run(
            [
                sys.executable,
                "-c",
                "import fcntl, sys; f = open(sys.argv[1], 'wb');"
                " fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)",
                str(locked),
            ],
            capture_output=True,
            text=True,
        )
    assert other.returncode != 0 and "BlockingIOError" in other.stderr  # still held


def revoke_from_outside(store: Any, user_id: str) -> None:
    """Revoke the user's key straight in the store, as ``inboxd key revoke`` (another process)
    does: no API call tells the daemon."""
    from inboxd.store import accounts

    key_id = store.read_sync(
        lambda c: c.execute(
            "SELECT k.id FROM api_keys k JOIN users u ON u.pk = k.user_pk WHERE u.id = ?",
            (user_id,),
        ).fetchone()[0]
    )
    store.write_sync(accounts.revoke_key, store.read_sync(accounts.the_account_pk), key_id, 1)


async def test_a_key_revoked_by_the_cli_closes_its_socket_soon(
    autojump_clock: trio.testing.MockClock, base_url: str, seeded: Seed, store: Any
) -> None:
    async with feed(base_url, seeded.bob_key) as ws:
        revoke_from_outside(store, seeded.bob_id)
        started = trio.current_time()
        with pytest.raises(ConnectionClosed) as closed:
            await ws.get_message()
    assert closed.value.reason.code == 1008
    assert trio.current_time() - started <= 16


async def test_a_key_revoked_by_the_cli_gets_nothing_committed_after(
    owner: httpx.AsyncClient, base_url: str, seeded: Seed, store: Any
) -> None:
    """CONTRACT section 4: revocation takes effect on the next request. A key revoked from
    another process (the CLI) used to be sent every event until the hub's sweep, up to 15 s
    later; the next event now finds it revoked and the socket closes with 1008."""
    async with feed(base_url, seeded.bob_key) as ws:
        revoke_from_outside(store, seeded.bob_id)
        revoked = await owner.get("/api/v1/inbox/channels", headers=auth(seeded.bob_key))
        assert revoked.status_code == 401
        await ingest(owner, seeded.sales_id, "15550001", content="after the revocation")
        with pytest.raises(ConnectionClosed) as closed, trio.fail_after(5):
            extra = await ws.get_message()
            raise AssertionError(f"a revoked key was sent {extra[:120]}")
    assert closed.value.reason.code == 1008


async def test_a_key_revoked_by_the_cli_during_its_replay_gets_nothing_more(
    owner: httpx.AsyncClient,
    base_url: str,
    seeded: Seed,
    store: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found in review: the first check's baseline was read after the replay, so a revocation
    committed while the replay ran was already in it and live events went on."""
    for i in range(3):
        await ingest(owner, seeded.sales_id, "15550001", content=f"before {i}")
    reached, go = hold_the_replay(monkeypatch)
    async with feed(base_url, seeded.bob_key, since=0) as ws:
        with trio.fail_after(5):
            await reached.wait()
        revoke_from_outside(store, seeded.bob_id)
        go.set()
        with pytest.raises(ConnectionClosed) as closed, trio.fail_after(5):
            while True:  # (whatever the replay sent before it noticed)
                frame = json.loads(await ws.get_message())
                assert frame["data"].get("content", "").startswith("before"), frame
    assert closed.value.reason.code == 1008


@pytest.mark.parametrize(
    "frame",
    [
        '{"type": "auth", "token": "\\ud800"}',
        "[" * 2000 + "]" * 2000,
    ],
    ids=["lone surrogate", "nested 2,000 deep"],
)
async def test_a_first_frame_that_is_not_a_usable_token_is_a_bad_key(
    base_url: str, frame: str
) -> None:
    """Each of these crashed the handler (a key is not needed to send them), and with the first
    its error handler too (no request context in a websocket): the socket closed 1000, not
    1008. A lone surrogate in the token is valid JSON but not UTF-8; a frame nested 2,000 deep
    (4 KB) made json.loads raise RecursionError (found by a review)."""
    async with open_websocket_url(ws_url(base_url)) as ws:
        await ws.send_message(frame)
        with pytest.raises(ConnectionClosed) as closed, trio.fail_after(5):
            await ws.get_message()
    assert closed.value.reason.code == 1008


def hold_the_replay(monkeypatch: pytest.MonkeyPatch) -> tuple[trio.Event, trio.Event]:
    """Hold a client's first event (replayed or live) until ``go`` (the daemon runs in this
    process): what a backlog of thousands of events or a slow reader does in real use, made
    exact. Returns (reached, go)."""
    reached, go = trio.Event(), trio.Event()
    allowed = feed_api._allowed

    async def held(client: Any, event: Any, **how: Any) -> bool:
        if not reached.is_set():
            reached.set()
            await go.wait()
        return await allowed(client, event, **how)

    monkeypatch.setattr(feed_api, "_allowed", held)
    monkeypatch.setattr(feed_api, "REPLAY_BATCH", 2)
    return reached, go


async def until_closed(ws: WebSocketConnection) -> tuple[list[dict[str, Any]], int]:
    got = []
    with trio.fail_after(10):
        while True:
            try:
                got.append(json.loads(await ws.get_message()))
            except ConnectionClosed as closed:
                return got, closed.reason.code


@pytest.mark.parametrize("loses_access_by", ["revoking the key", "removing the member"])
async def test_access_lost_during_a_replay_ends_it(
    owner: httpx.AsyncClient,
    base_url: str,
    seeded: Seed,
    monkeypatch: pytest.MonkeyPatch,
    loses_access_by: str,
) -> None:
    """Nothing committed after the key lost its access goes out, however long the replay."""
    key = (await owner.post("/api/v1/inbox/keys", headers=auth(seeded.ann_key))).json()
    for i in range(3):
        await ingest(owner, seeded.sales_id, "15550001", content=f"before {i}")
    reached, go = hold_the_replay(monkeypatch)
    async with feed(base_url, key["apiKey"], since=0) as ws:
        with trio.fail_after(5):
            await reached.wait()
        if loses_access_by == "revoking the key":
            gone = await owner.delete(
                f"/api/v1/inbox/keys/{key['keyId']}", headers=auth(seeded.ann_key)
            )
        else:
            members = (await owner.get("/api/v1/inbox/team/members")).json()
            ann = next(m for m in members if m["userId"] == seeded.ann_id)
            gone = await owner.delete(f"/api/v1/inbox/team/members/{ann['memberId']}")
        assert gone.status_code in (200, 204)
        await ingest(owner, seeded.sales_id, "15550001", content="after")
        go.set()
        got, code = await until_closed(ws)
    assert code == 1008
    contents = [f["data"].get("content") for f in got]
    assert "after" not in contents
    assert contents == ["before 0", "before 1", "before 2"][: len(contents)]


async def test_a_full_queue_during_a_replay_leaves_no_gap_on_resume(
    owner: httpx.AsyncClient, base_url: str, seeded: Seed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue overflows (1013) while the replay is held; resuming from the last seq received
    gives every event exactly once."""
    for i in range(5):
        await ingest(owner, seeded.sales_id, "15550001", content=f"old {i}")
    reached, go = hold_the_replay(monkeypatch)
    async with feed(base_url, seeded.owner_key, since=0) as ws:
        with trio.fail_after(5):
            await reached.wait()
        for i in range(25):  # more than the queue holds (feed.queue_bound = 20 here)
            await ingest(owner, seeded.sales_id, "15550001", content=f"new {i}")
        go.set()
        first, code = await until_closed(ws)
    assert code == 1013
    monkeypatch.undo()
    resume_from = first[-1]["seq"] if first else 0
    async with feed(base_url, seeded.owner_key, since=resume_from) as ws:
        rest = await frames(ws, 30 - len(first))
        await nothing_more(ws)
    every = [f["data"]["content"] for f in first + rest]
    assert every == [f"old {i}" for i in range(5)] + [f"new {i}" for i in range(25)]


async def test_an_access_change_while_the_socket_opens_is_applied(
    owner: httpx.AsyncClient, base_url: str, seeded: Seed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ann loses Support between her key's check and her socket's joining the feed: Support's
    events do not reach her (before, the socket kept the old channels for its whole life)."""
    checked, go = trio.Event(), trio.Event()
    principal_from_header = feed_api._principal_from_header

    async def held() -> Any:
        who = await principal_from_header()
        checked.set()
        await go.wait()
        return who

    monkeypatch.setattr(feed_api, "_principal_from_header", held)
    members = (await owner.get("/api/v1/inbox/team/members")).json()
    ann = next(m for m in members if m["userId"] == seeded.ann_id)

    async def take_support() -> None:
        await checked.wait()
        changed = await owner.put(
            f"/api/v1/inbox/team/members/{ann['memberId']}/channels",
            json={"channelIds": [seeded.sales_id]},
        )
        assert changed.status_code == 200
        go.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take_support)
        async with feed(base_url, seeded.ann_key) as ws:
            await go.wait()
            await ingest(owner, seeded.support_id, "15550002", content="support: not for ann")
            await ingest(owner, seeded.sales_id, "15550003", content="sales: for ann")
            (got,) = await frames(ws, 1)
            assert got["data"]["content"] == "sales: for ann"
            await nothing_more(ws)


async def test_a_caught_up_client_is_not_reset_when_the_journal_was_pruned_empty(
    autojump_clock: trio.testing.MockClock, owner: httpx.AsyncClient, base_url: str, seeded: Seed
) -> None:
    async with feed(base_url, seeded.owner_key) as ws:
        await ingest(owner, seeded.sales_id, "15550001", content="the last one seen")
        (seen,) = await frames(ws, 1)
    await trio.sleep(8 * 86400)  # a quiet week: housekeeping prunes the whole journal
    rest = (await owner.get("/api/v1/inbox/events", params={"after": seen["seq"]})).json()
    assert rest == {"events": [], "nextAfter": seen["seq"], "hasMore": False, "reset": False}
    async with feed(base_url, seeded.owner_key, since=seen["seq"]) as ws:
        await ingest(owner, seeded.sales_id, "15550001", content="new")
        (first,) = await frames(ws, 1)
    assert first["data"]["content"] == "new"  # no feed.reset: nothing was missed


async def test_a_lagging_client_judges_each_event_by_the_access_at_its_moment(
    owner: httpx.AsyncClient, base_url: str, seeded: Seed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ann's socket task is held (as a slow reader's is) while she loses Support, a Support
    message arrives and she gets Support back. Reaching her removal, the task used to read her
    access as it was by then (Support again) and send her the message of the time she could
    not open Support."""
    reached, go = hold_the_replay(monkeypatch)
    members = (await owner.get("/api/v1/inbox/team/members")).json()
    ann = next(m for m in members if m["userId"] == seeded.ann_id)
    channels = f"/api/v1/inbox/team/members/{ann['memberId']}/channels"
    async with feed(base_url, seeded.ann_key) as ws:
        lost = await owner.put(channels, json={"channelIds": [seeded.sales_id]})
        assert lost.status_code == 200
        with trio.fail_after(5):
            await reached.wait()
        await ingest(owner, seeded.support_id, "15550002", content="while she could not see it")
        back = await owner.put(channels, json={"channelIds": [seeded.sales_id, seeded.support_id]})
        assert back.status_code == 200
        await ingest(owner, seeded.support_id, "15550002", content="after she got it back")
        go.set()
        (frame,) = await frames(ws, 1)
        await nothing_more(ws)
    # (inbox.user.* events go to owner keys only: her own removal's event is not hers.)
    assert frame["type"] == "inbox.message.created"
    assert frame["data"]["content"] == "after she got it back"


async def test_a_replay_shows_what_the_key_can_open_now_like_the_rest_events(
    owner: httpx.AsyncClient, base_url: str, seeded: Seed
) -> None:
    """README: the replay, like ``GET /events``, shows the events of the channels the key can
    open when it runs. Judging live events by the access at their moment must not make the
    replay follow the member's past changes (found in review: it sent a channel taken away)."""
    members = (await owner.get("/api/v1/inbox/team/members")).json()
    bob = next(m for m in members if m["userId"] == seeded.bob_id)
    channels = f"/api/v1/inbox/team/members/{bob['memberId']}/channels"
    both = [seeded.sales_id, seeded.support_id]
    assert (await owner.put(channels, json={"channelIds": both})).status_code == 200
    await ingest(owner, seeded.support_id, "15550002", content="support while bob had it")
    assert (await owner.put(channels, json={"channelIds": [seeded.sales_id]})).status_code == 200
    await ingest(owner, seeded.sales_id, "15550003", content="sales marker")
    rest = (await owner.get("/api/v1/inbox/events", headers=auth(seeded.bob_key))).json()
    assert [e["data"].get("content") for e in rest["events"]] == ["sales marker"]
    async with feed(base_url, seeded.bob_key, since=0) as ws:
        (replayed,) = await frames(ws, 1)
        await nothing_more(ws)
    assert replayed["data"]["content"] == "sales marker"
