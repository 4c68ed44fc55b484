"""The live feed: one hub fanning committed journal events out to websocket clients.

::

    store commit ──> FeedHub._on_journal ──put_nowait──> client queue (bounded) ──> its socket
                                                          full: close 1013, never wait

The hub runs on the trio thread right after each commit, in commit order, and never blocks: a
client whose queue is full is closed with 1013 instead of slowing the API or anyone else. Each
client's own task filters what it may see (its key's channels, asked again from the store when an
``inbox.user.*`` event changes its user's access) and writes frames to its socket, a few clients
at a time (``FeedClient.take_turn``), so that API requests on the same thread are not held up
behind a whole fan-out.

A frame is the webhook envelope with ``seq`` in front: ``{"seq": 42, "id": ..., "type": ...,
"createdAt": ..., "data": ...}``, made from the committed bytes without re-encoding.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final

import attrs
import trio

from inboxd.model import Principal
from inboxd.store.accounts import dead_keys
from inboxd.store.db import Appended, Store
from inboxd.store.events import JournalEvent

log = logging.getLogger("inboxd.feed")

QUEUE_BOUND: Final = 1000
# How many clients start writing a frame in each pass of trio's scheduler (FeedClient.take_turn).
SEND_TURNS: Final = 8
REVOCATION_SWEEP_SECONDS: Final = 15.0
CLOSE_GOING_AWAY: Final = 1001
CLOSE_POLICY: Final = 1008
CLOSE_TRY_AGAIN_LATER: Final = 1013
# Events after which a client asks the store again what its key may see.
ACCESS_EVENTS: Final = frozenset({"inbox.user.channels_changed", "inbox.user.removed"})


@attrs.frozen
class FeedEvent:
    seq: int
    account_pk: int
    channel_pk: int | None
    type: str
    created_at: int
    # The frame as text, decoded once here rather than once per client.
    frame: str


def frame_of(seq: int, body: bytes) -> bytes:
    """``{"seq":N,`` + the envelope's members: the committed bytes, not re-encoded."""
    return b'{"seq":%d,%s' % (seq, body[1:])


def from_journal(e: JournalEvent, account_pk: int) -> FeedEvent:
    return FeedEvent(
        e.seq, account_pk, e.channel_pk, e.type, e.created_at, frame_of(e.seq, e.body).decode()
    )


def visible(who: Principal, event: FeedEvent) -> bool:
    return event.account_pk == who.account_pk and may_see(who, event.channel_pk)


def may_see(who: Principal, channel_pk: int | None) -> bool:
    """Whether a key may see an event of its own account about this channel (or none)."""
    if channel_pk is None:
        return who.is_owner  # inbox.user.* events: owner keys only
    return who.can_open(channel_pk)


def concerns_user(event: FeedEvent, user_id: str) -> bool:
    """Whether an access-changing event is about this user."""
    if event.type not in ACCESS_EVENTS:
        return False
    data = json.loads(event.frame)["data"]
    return bool(data.get("userId") == user_id)


class FeedClient:
    def __init__(self, who: Principal, bound: int, turns: trio.Semaphore) -> None:
        self.who = who
        self._turns = turns
        self._send, self.events = trio.open_memory_channel[FeedEvent](bound)
        self.close_code: int | None = None
        self.close_reason = ""
        # The store's auth_epoch when the key was last found live, and the app's key cache
        # that tells it (api/feed.py, _revoked).
        self.auth_epoch = -1
        self.keys: Any = None

    def offer(self, event: FeedEvent) -> None:
        if self.close_code is not None:
            return
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:
            self.close(CLOSE_TRY_AGAIN_LATER, "the client does not keep up; resume with since")

    async def take_turn(self) -> None:
        """Wait for this client's turn to write a frame.

        A commit wakes every client's task at once, and a frame's write is a few steps of trio's
        scheduler, about 100 us of CPU in all. With 1,000 clients each pass of the scheduler
        would run 1,000 such steps, and an API request on the same thread waits for a whole
        pass at each of its own steps: its p99 was about 150 ms while frames fanned out
        (``bench feed``). Through the turns, ``SEND_TURNS`` clients start a write per pass, in
        the order they asked (trio's semaphore is FIFO), and a pass stays short. The turn is
        given back before the write, so a client whose socket does not drain holds nobody up.
        """
        async with self._turns:
            pass

    def close(self, code: int, reason: str) -> None:
        """Ask the client's task to close its socket (after what it has queued)."""
        if self.close_code is None:
            self.close_code, self.close_reason = code, reason
            self._send.close()


class FeedHub:
    def __init__(self, store: Store, bound: int = QUEUE_BOUND) -> None:
        self.store = store
        self.bound = bound
        self.clients: set[FeedClient] = set()
        self._turns = trio.Semaphore(SEND_TURNS)
        self.closing = False
        store.add_journal_listener(self._on_journal)

    def _on_journal(self, appended: list[Appended]) -> None:
        if not self.clients:
            return
        for a in appended:
            event = FeedEvent(
                a.seq,
                a.account_pk,
                a.channel_pk,
                a.type,
                a.created_at,
                frame_of(a.seq, a.body).decode(),
            )
            for client in list(self.clients):
                if client.who.account_pk == a.account_pk:
                    client.offer(event)

    def register(self, who: Principal) -> FeedClient:
        client = FeedClient(who, self.bound, self._turns)
        if self.closing:
            client.close(CLOSE_GOING_AWAY, "the server is shutting down")
        self.clients.add(client)
        return client

    def unregister(self, client: FeedClient) -> None:
        self.clients.discard(client)

    def close_key(self, key_pk: int) -> None:
        """A key was revoked: its sockets close at once."""
        for client in list(self.clients):
            if client.who.key_pk == key_pk:
                client.close(CLOSE_POLICY, "the API key was revoked")

    async def sweep_revoked(self, every: float = REVOCATION_SWEEP_SECONDS) -> None:
        """Close sockets whose key was revoked elsewhere (the CLI, another process): the API's
        own revocations close them at once; this catches the rest within ``every`` seconds."""
        while True:
            await trio.sleep(every)
            live_keys = {client.who.key_pk for client in self.clients}
            if not live_keys:
                continue
            try:
                dead = await self.store.read(dead_keys, sorted(live_keys))
            except Exception:
                log.exception("could not check the feed's keys")
                continue
            for key_pk in dead:
                self.close_key(key_pk)

    def close_all(self) -> None:
        """Shutdown: every socket closes with 1001 (so hypercorn need not wait for them)."""
        self.closing = True
        for client in list(self.clients):
            client.close(CLOSE_GOING_AWAY, "the server is shutting down")
