"""The websocket feed and the same stream for REST clients (CONTRACT sections 6 and 8)."""

from __future__ import annotations

import json
import sqlite3
from typing import Final, cast

import attrs
import orjson
import trio
from quart import Blueprint, Response, request, websocket

from inboxd.api.app import authenticate, principal, state, take_rate
from inboxd.api.http import arg_limit, encoded_json
from inboxd.errors import InvalidRequest, RateLimited, Unauthorized
from inboxd.feed import (
    CLOSE_POLICY,
    CLOSE_TRY_AGAIN_LATER,
    FeedClient,
    FeedEvent,
    concerns_user,
    frame_of,
    from_journal,
    may_see,
    visible,
)
from inboxd.model import Principal
from inboxd.store import accounts, events
from inboxd.store.db import journal_end
from inboxd.store.events import USER_CHANNELS_CHANGED

blueprint = Blueprint("feed", __name__, url_prefix="/api/v1/inbox")
blueprint.before_request(authenticate)  # HTTP routes only; the websocket authenticates itself

AUTH_FRAME_SECONDS: Final = 10.0
REPLAY_BATCH: Final = 500
RESET_FRAME: Final = '{"type":"feed.reset"}'
_JSON_BOOL: Final = {True: b"true", False: b"false"}


SEQ_MAX: Final = 10**18 - 1  # the largest ``since`` / ``after`` taken: 18 digits


def _seq_arg(name: str, raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > len(str(SEQ_MAX)):
        raise InvalidRequest(f"{name} must be a whole number (a seq from the feed)")
    return int(raw)


async def _principal_from_header() -> Principal | None:
    header = websocket.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    who = None
    if scheme.lower() == "bearer" and token.strip():
        who = await state().store.read(accounts.authenticate, token.strip())
    if who is None:
        raise Unauthorized("the API key is missing, unknown or revoked")
    take_rate(who)  # over the key's rate: 429 before the upgrade
    return who


async def _principal_from_first_frame() -> Principal | None:
    with trio.move_on_after(AUTH_FRAME_SECONDS):
        raw = await websocket.receive()
        try:
            # orjson, as for request bodies: it refuses nesting past 1,024 levels with a
            # ValueError, where json.loads recursed until RecursionError (a frame of 4 KB).
            message = orjson.loads(raw)
        except (ValueError, TypeError):
            return None
        if not isinstance(message, dict) or message.get("type") != "auth":
            return None
        token = message.get("token")
        # A key is ASCII; JSON can carry text that is not even valid UTF-8 (a lone surrogate),
        # which hashing it would choke on.
        if not isinstance(token, str) or not token or not token.isascii():
            return None
        return cast(Principal | None, await state().store.read(accounts.authenticate, token))
    return None


@blueprint.websocket("/feed")
async def feed() -> None:
    since = _seq_arg("since", websocket.args.get("since"))
    who = await _principal_from_header()  # a bad header is refused before the upgrade (401)
    await websocket.accept()
    if who is None:
        who = await _principal_from_first_frame()
        if who is None:
            await websocket.close(CLOSE_POLICY, "authenticate with a valid API key")
            return
        try:
            take_rate(who)
        except RateLimited as exc:
            await websocket.close(CLOSE_TRY_AGAIN_LATER, exc.message)
            return
    hub = state().feed_hub
    assert hub is not None
    client = hub.register(who)
    try:  # whatever ends the handler from here, a cancellation at any await too, unregisters
        # Before the key is read again below: a revocation committed after this is seen
        # (_revoked).
        client.keys = state().keys
        client.auth_epoch = await client.keys.current_epoch()
        # From here every access change reaches the client; one committed since the key was
        # read above (while the upgrade went on, say) did not: read the key's access again.
        if await _refresh(client):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_drain_incoming, nursery.cancel_scope)
                await _send_events(client, since)
                nursery.cancel_scope.cancel()
        if client.close_code is not None:
            await websocket.close(client.close_code, client.close_reason)
    finally:
        hub.unregister(client)


async def _drain_incoming(scope: trio.CancelScope) -> None:
    """Read (and ignore) what the client sends; its going away ends the handler."""
    try:
        while True:
            await websocket.receive()
    finally:
        scope.cancel()


async def _send_events(client: FeedClient, since: int | None) -> None:
    """Replay from ``since`` (registered first, so nothing committed meanwhile is missed), then
    send live events, skipping what the replay already sent."""
    last = -1
    if since is not None:
        last = await _replay(client, since)
        if client.close_code is not None:
            # Closed during the replay (the key revoked, the queue full, a shutdown): stop at
            # the last event sent; a client that may resume does so from it, with no gap.
            return
    async for event in client.events:
        if event.seq <= last:
            continue
        if await _revoked(client):
            return
        if not await _allowed(client, event):
            if client.close_code is not None:
                return
            continue
        await client.take_turn()
        await websocket.send(event.frame)


async def _revoked(client: FeedClient) -> bool:
    """Whether the key was revoked (or its member removed) since it was last found live; then
    the client is closed with 1008. Checked before each event sent: a key revoked by the CLI
    (another process) gets nothing committed after it (CONTRACT section 4: revocation takes
    effect on the next request); the API's own revocations close the socket at once, and the
    hub's sweep would only come within seconds. The key is read again only when the store's
    auth_epoch moved (KeyCache reads that once per commit, for every client)."""
    if client.keys.known_epoch() == client.auth_epoch:  # (no commit since: most events)
        return False
    epoch = await client.keys.current_epoch()
    if epoch == client.auth_epoch:
        return False
    client.auth_epoch = epoch
    return await _live_principal(client) is None


async def _live_principal(client: FeedClient) -> Principal | None:
    """The client's key as it is now; None (and the client closed with 1008) once it is
    revoked or its member removed."""
    who = await state().store.read(accounts.principal_of_key, client.who.key_pk)
    if who is None:
        client.close(CLOSE_POLICY, "the API key was revoked or its member removed")
    return who


async def _allowed(client: FeedClient, event: FeedEvent, *, live: bool = True) -> bool:
    """Whether to send ``event``. A live one is judged by the access its user had when it
    happened; a replayed one, like ``GET /events``, by the access the key has now (README)."""
    if concerns_user(event, client.who.user_id) and not await _refresh(
        client, event if live else None
    ):
        return False
    return visible(client.who, event)


async def _refresh(client: FeedClient, change: FeedEvent | None = None) -> bool:
    """Read what the client's key may see again; False (and the client closed with 1008) once
    the key is revoked or its member removed.

    ``change``: the client's own ``inbox.user.channels_changed`` it has reached. The channels it
    names are the ones the user could open from then on; the store's may be a later change's,
    committed while this client lagged behind, and the events in between are judged by the
    access at their moment (README, "Live feed")."""
    who = await _live_principal(client)
    if who is None:
        return False
    if change is not None and change.type == USER_CHANNELS_CHANGED and not who.is_owner:
        channel_ids = json.loads(change.frame)["data"]["channelIds"]
        then = await state().store.read(accounts.existing_channel_pks, who.account_pk, channel_ids)
        who = attrs.evolve(who, channel_pks=then)
    client.who = who
    return True


def _first_batch(
    conn: sqlite3.Connection, account_pk: int, since: int, oldest_kept: int, want: int
) -> tuple[int | None, list[events.JournalEvent]]:
    """The account's first ``want`` events after ``since``, in one snapshot with the check that
    they are all still there: (None, events), or (the journal's end, []) when ``since`` is beyond
    the last seq ever given, events after it were pruned, or the first event after it is older
    than ``oldest_kept`` (feed.retention ago). The client must then refetch what it keeps and go
    on from the end (``feed.reset``; ``"reset": true`` on GET /events)."""
    end = journal_end(conn)
    batch = events.read_after(conn, account_pk, since, want)
    if (
        since > end
        or since < events.pruned_through(conn)
        or (batch and batch[0].created_at < oldest_kept)
    ):
        return end, []
    return None, batch


async def _replay(client: FeedClient, since: int) -> int:
    """Send the journal's events after ``since``; returns the last seq looked at. Stops as soon
    as the client is closed (its key revoked, say): events committed after that are not its."""
    store = state().store
    end, batch = await store.read(
        _first_batch, client.who.account_pk, since, state().oldest_kept_us(), REPLAY_BATCH
    )
    if end is not None:
        await websocket.send(RESET_FRAME)  # the gap cannot be filled: the client refetches
        # The live events up to ``end`` are skipped, access changes among them too: read the
        # key's access as it is now.
        await _refresh(client)
        return end
    last = since
    while client.close_code is None:
        for journal_event in batch:
            if await _revoked(client):
                return last
            event = from_journal(journal_event, client.who.account_pk)
            if await _allowed(client, event, live=False):
                await client.take_turn()
                await websocket.send(event.frame)
            if client.close_code is not None:
                return last
            last = event.seq
        if len(batch) < REPLAY_BATCH:
            break
        batch = await store.read(events.read_after, client.who.account_pk, last, REPLAY_BATCH)
    return last


@blueprint.get("/events")
async def list_events() -> Response:
    """The feed's events for REST clients, oldest first, with the same visibility.

    The page is joined from the journal's committed bytes, never decoded: one character beyond
    ASCII would otherwise make Python hold the whole page at up to four bytes a character. The
    first read asks for one event more than the page (all of them, for an owner's key, tell
    whether there is more); a key that sees only some channels reads on in larger batches.
    """
    who = principal()
    after = _seq_arg("after", request.args.get("after")) or 0
    limit = arg_limit()
    store = state().store
    # As the feed's feed.reset: events after ``after`` are gone (pruned, past feed.retention) or
    # ``after`` is beyond every seq given. Nothing is listed; the client refetches what it keeps
    # and goes on from the journal's end, so the next page is not a reset again.
    want = limit + 1
    end, batch = await store.read(
        _first_batch, who.account_pk, after, state().oldest_kept_us(), want
    )
    if end is not None:
        return encoded_json(b'{"events":[],"nextAfter":%d,"hasMore":false,"reset":true}' % end)
    frames: list[bytes] = []
    last = after
    has_more = False
    while not has_more:
        for journal_event in batch:
            if may_see(who, journal_event.channel_pk):
                if len(frames) == limit:
                    has_more = True
                    break
                frames.append(frame_of(journal_event.seq, journal_event.body))
            last = journal_event.seq
        if has_more or len(batch) < want:
            break
        want = REPLAY_BATCH
        batch = await store.read(events.read_after, who.account_pk, last, want)
    body = b'{"events":[%s],"nextAfter":%d,"hasMore":%s,"reset":false}' % (
        b",".join(frames),
        last,
        _JSON_BOOL[has_more],
    )
    return encoded_json(body)
