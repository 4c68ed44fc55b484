"""Channel webhook delivery: a hub, and one supervisor task per URL (CONTRACT section 7).

::

    ChannelWebhookHub.run
    └── nursery
        ├── UrlSupervisor(url 1)     each owns its retry timer and probe schedule
        ├── UrlSupervisor(url 2)
        └── ...

A supervisor loops: read its URL's row; sleep until its deadline (a retry or a probe) if it has
one; take the oldest message it still owes (or wait until its channel commits one); POST it;
let ``policy.decide`` say what that means; record the decision, the cursor and any email in one
transaction. Supervisors share nothing but the HTTP client (no connection limit, so a hanging URL
never holds up another), so a slow or dead URL delays no other URL, the API or the inbox webhook.

The hub starts and stops supervisors to match the stored URL list (``reconcile``, called after
each change of a list) and wakes the supervisors of a channel when a commit appends messaging
events to it. Every state and deadline is read from the store on each turn, so a restart
continues where the last run stopped.
"""

from __future__ import annotations

import json
import logging
from typing import Final

import attrs
import trio

from inboxd import ids
from inboxd.clock import Clock
from inboxd.config import ChannelWebhooksConfig
from inboxd.logs import log_failure
from inboxd.metrics import Metrics
from inboxd.store import channel_webhooks as cw
from inboxd.store.db import Appended, CommitSignal, Store
from inboxd.store.events import JournalEvent, encode_envelope
from inboxd.webhooks.client import WebhookClient, post_event
from inboxd.webhooks.policy import DISABLED, PAUSED, Policy, classify, decide, wake_at

log = logging.getLogger("inboxd.channel_webhooks")

STORE_ERROR_BACKOFF: Final = 5.0
PROBE_TYPE: Final = "webhook.probe"


def channel_body(event: JournalEvent) -> tuple[str, bytes]:
    """The channel webhook envelope of a journal event: the same id, time and data, with the
    type ``message.created`` / ``message.status_changed``. Deterministic, so every attempt
    sends the same bytes."""
    envelope = json.loads(event.body)
    type_ = str(envelope["type"]).removeprefix("inbox.")
    return type_, encode_envelope(envelope["id"], type_, event.created_at, envelope["data"])


@attrs.define
class _Running:
    generation: int
    scope: trio.CancelScope


class ChannelWebhookHub:
    def __init__(
        self,
        store: Store,
        client: WebhookClient,
        config: ChannelWebhooksConfig,
        clock: Clock,
        base_url: str,
        metrics: Metrics | None = None,
    ) -> None:
        self.metrics = metrics
        self.store = store
        self.client = client
        self.clock = clock
        self.base_url = base_url
        self.policy = Policy(
            pause_after_us=round(config.pause_after * 1_000_000),
            probe_schedule_us=tuple(round(d * 1_000_000) for d in config.probe_schedule),
        )
        self.retention_us = round(config.backlog_retention * 1_000_000)
        self._signals: dict[int, CommitSignal] = {}
        self._running: dict[int, _Running] = {}
        self._nursery: trio.Nursery | None = None
        self._reconcile_lock = trio.Lock()
        store.add_journal_listener(self._on_journal)

    def signal(self, channel_pk: int) -> CommitSignal:
        signal = self._signals.get(channel_pk)
        if signal is None:
            signal = self._signals[channel_pk] = CommitSignal()
        return signal

    def _on_journal(self, appended: list[Appended]) -> None:
        for channel_pk in {a.channel_pk for a in appended if a.for_channel_webhooks}:
            if channel_pk is not None and channel_pk in self._signals:
                self._signals[channel_pk].bump()

    def min_created_at(self) -> int:
        return self.clock.now_us() - self.retention_us

    @property
    def supervisors(self) -> int:
        return len(self._running)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self.reconcile()
            task_status.started()
            await trio.sleep_forever()

    async def reconcile(self) -> None:
        """Run exactly one supervisor per stored URL, restarting those saved again. Before
        ``run`` has started this does nothing: run's first reconcile reads the store after it."""
        if self._nursery is None:
            return
        async with self._reconcile_lock:
            wanted = await self.store.read(cw.all_urls)
            for pk, running in list(self._running.items()):
                if wanted.get(pk) != running.generation:
                    running.scope.cancel()
                    del self._running[pk]
            for pk, generation in wanted.items():
                if pk not in self._running:
                    scope = trio.CancelScope()
                    self._running[pk] = _Running(generation, scope)
                    self._nursery.start_soon(self._supervise, pk, scope)

    async def _supervise(self, pk: int, scope: trio.CancelScope) -> None:
        with scope:
            await UrlSupervisor(self, pk).run()
        running = self._running.get(pk)
        if running is not None and running.scope is scope:
            del self._running[pk]


class UrlSupervisor:
    """Delivers one URL's messages in order, one request at a time."""

    def __init__(self, hub: ChannelWebhookHub, pk: int) -> None:
        self.hub = hub
        self.pk = pk

    async def run(self) -> None:
        while True:
            try:
                if not await self._turn():
                    return
            except Exception:
                log_failure(log, "channel webhook supervisor failed; retrying", url=self.pk)
                await trio.sleep(STORE_ERROR_BACKOFF)

    async def _turn(self) -> bool:
        """One step; False when there is nothing more to do (removed or disabled)."""
        hub = self.hub
        row = await hub.store.read(cw.get_url, self.pk)
        if row is None or row.state.state == DISABLED:
            return False
        deadline = wake_at(row.state)
        if deadline is not None and deadline > hub.clock.now_us():
            await hub.clock.sleep_until(deadline)
            return True
        signal = hub.signal(row.channel_pk)
        version = signal.version
        head = await hub.store.read(
            cw.head_event,
            row.channel_pk,
            row.delivered_seq,
            cw.kept_since(row.state.state, hub.min_created_at()),
        )
        if head is None and row.state.state != PAUSED:
            await signal.wait_past(version)  # nothing owed: wait for the channel's next message
            return True
        secret = await hub.store.read(cw.secret_of, row.channel_pk)
        if secret is None:
            return False
        if head is None:
            # A probe with nothing kept (it all outlived backlog_retention): a probe event.
            type_ = PROBE_TYPE
            body = encode_envelope(
                ids.new_id("evt"),
                type_,
                hub.clock.now_us(),
                {"channelId": row.channel_id, "url": row.url},
            )
            delivery_id = ids.new_id("dlv")
        else:
            type_, body = channel_body(head)
            # The same on every retry of this message to this URL (CONTRACT section 6), also
            # after a restart, with nothing stored: made from the URL's row and the event.
            delivery_id = ids.derived_id("dlv", str(self.pk), row.url, head.id)
        outcome = await post_event(hub.client, row.url, secret, body, type_, delivery_id)
        if hub.metrics is not None:
            hub.metrics.channel_deliveries.labels(
                "probe" if head is None else "event",
                "delivered"
                if outcome.status is not None and 200 <= outcome.status < 300
                else "failed",
            ).inc()
        now = hub.clock.now_us()
        decision = decide(row.state, classify(outcome.status, outcome.error), now, hub.policy)
        advance_to = head.seq if decision.advance and head is not None else None
        recorded = await hub.store.write(
            cw.record,
            self.pk,
            row.generation,
            decision,
            advance_to,
            now,
            cw.NoticeContext(
                base_url=hub.base_url, min_created_at=hub.min_created_at(), policy=hub.policy
            ),
        )
        log.info(
            "channel webhook attempt",
            extra={
                "url": row.url,
                "type": type_,
                "status": outcome.status,
                "error": outcome.error,
                "state": decision.state.state,
                "ms": outcome.duration_ms,
            },
        )
        return recorded or True
