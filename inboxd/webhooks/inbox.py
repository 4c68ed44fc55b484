"""The inbox webhook's deliverer: one task per account, events one at a time in commit order.

::

    loop:
        next events after the delivery cursor (up to PREFETCH), or a queued redelivery?
            none -> wait until the account commits an event, or its webhook or a
                    redelivery is saved
        for each (until the webhook is saved, rotated or deleted: then read again):
            attempt 1..N+1: POST it signed with the secret current at that moment
                2xx            -> delivered, cursor moves past it
                anything else  -> logged; sleep retry_schedule[i] (+ up to 20 % jitter, at
                                  least a Retry-After, capped at 2 h more) and try again;
                                  a saved, rotated or deleted webhook ends the sleep
                after the last -> given up, cursor moves past it, the next event goes

The cursor lives in the store, so a restart resumes at the first event not yet delivered
(at-least-once: an event whose 2xx was not yet recorded is sent again; receivers dedupe on the
envelope id). Errors are caught here: a failing store or receiver never takes the daemon down.

Recording a finished delivery (its log row and the cursor, one commit with its fsync) overlaps
the next event's POST: the task keeps its own cursor in memory and hands the record to a recorder
task, which gathers records for 10 ms and writes them in one transaction, in order (a
transaction per delivery was a fifth of the deliverer's CPU). Events are read a hundred
at a time. So a backlog drains at the speed of the HTTPS round trips (bench/delivery.py). Failed
attempts and redeliveries are recorded before anything else happens.
"""

from __future__ import annotations

import logging
import random
from typing import Final

import trio

from inboxd import ids
from inboxd.clock import Clock
from inboxd.config import InboxWebhookConfig
from inboxd.logs import log_failure
from inboxd.metrics import Metrics
from inboxd.store import webhooks
from inboxd.store.db import Appended, Store
from inboxd.webhooks.client import Outcome, WebhookClient, post_event

log = logging.getLogger("inboxd.inbox_webhook")

JITTER: Final = 0.2
RETRY_AFTER_CAP: Final = 2 * 3600.0
STORE_ERROR_BACKOFF: Final = 5.0
# Events read from the journal at once; a saved, rotated or deleted webhook drops the rest.
PREFETCH: Final = 100
# How long the recorder lets records gather before writing them together. A crash in that
# window only means those events are sent again (at-least-once), as for any record not yet
# committed.
RECORD_GATHER_SECONDS: Final = 0.01


def retry_delay(
    schedule: tuple[float, ...], attempt: int, outcome: Outcome, rng: random.Random
) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
    base = schedule[attempt - 1]
    delay = base * (1 + rng.uniform(0, JITTER))
    if outcome.retry_after is not None:
        delay = max(delay, min(outcome.retry_after, base + RETRY_AFTER_CAP))
    return delay


def series_id(event_id: str, redelivery_pk: int | None) -> str:
    """The X-Svc-Delivery of an event's attempt series: the same on every retry (CONTRACT
    section 6), also after a crash that cut an attempt off before it was recorded, so it is made
    from the event rather than drawn at random; a redelivery (POST .../redeliver) is a series of
    its own."""
    if redelivery_pk is None:
        return ids.derived_id("dlv", "inbox", event_id)
    return ids.derived_id("dlv", "inbox", event_id, "redelivery", str(redelivery_pk))


class InboxWebhookDeliverer:
    def __init__(
        self,
        store: Store,
        client: WebhookClient,
        config: InboxWebhookConfig,
        account_pk: int,
        clock: Clock,
        rng: random.Random | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._metrics = metrics
        self._clock = clock
        self._store = store
        self._client = client
        self._schedule = config.retry_schedule
        self._account_pk = account_pk
        self._rng = rng or random.Random()
        # The last journal event this task finished (delivered or gave up), which the store's
        # cursor reaches once its record commits.
        self._cursor = 0
        # Woken by the account's new events (the journal listener) and by a saved webhook or
        # a queued redelivery; the second only by a saved, rotated or deleted webhook.
        self._work = store.signal(webhooks.work_queued(account_pk))
        self._config = store.signal(webhooks.config_changed(account_pk))
        store.add_journal_listener(self._on_journal)
        # Whether a webhook was saved at the last look: without one, the account's events are
        # never sent (saving one wakes this task), so they need not wake it either.
        self._hooked = True
        self._unrecorded: list[tuple[webhooks.Attempt, int | None, trio.Event]] = []
        self._recorder_running = False
        self._nursery: trio.Nursery | None = None
        # Whether the first event since the start was looked up for a series a stop cut short.
        self._resumed = False

    def _on_journal(self, appended: list[Appended]) -> None:
        if self._hooked and any(a.account_pk == self._account_pk for a in appended):
            self._work.bump()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            while True:
                version, config = self._work.version, self._config.version
                # Listen to the account's events while reading: one that commits after the
                # read's snapshot, just after a webhook was saved, must wake the next read.
                self._hooked = True
                try:
                    work = await self._store.read(
                        webhooks.next_work, self._account_pk, self._cursor, PREFETCH
                    )
                    self._hooked = work is not None
                    if not work:
                        await self._work.wait_past(version)
                        continue
                    for item in work:
                        if self._config.version != config:
                            break  # saved, rotated or deleted meanwhile: read it again
                        await self._deliver(item)
                except Exception:
                    log_failure(log, "inbox webhook delivery failed; retrying shortly")
                    self._resumed = False  # the series under way may have been cut short
                    await trio.sleep(STORE_ERROR_BACKOFF)

    def _record(self, attempt: webhooks.Attempt, redelivery_pk: int | None) -> trio.Event:
        """Queue one attempt for the store, after those before it; the event is set once it has
        committed (or failed)."""
        done = trio.Event()
        self._unrecorded.append((attempt, redelivery_pk, done))
        if not self._recorder_running:
            self._recorder_running = True
            assert self._nursery is not None, "records are written from run()"
            self._nursery.start_soon(self._recorder)
        return done

    async def _recorder(self) -> None:
        """Write the queued attempts in order, those gathered within RECORD_GATHER_SECONDS in one
        transaction: under a backlog one commit records about five deliveries."""
        try:
            while self._unrecorded:
                # A record already decided is written even while the daemon stops.
                with trio.CancelScope(shield=True):
                    await trio.sleep(RECORD_GATHER_SECONDS)  # let the next few join it
                batch, self._unrecorded = self._unrecorded, []
                try:
                    with trio.CancelScope(shield=True):
                        await self._store.write(
                            webhooks.record_attempts,
                            self._account_pk,
                            [(attempt, redelivery_pk) for attempt, redelivery_pk, _ in batch],
                        )
                except Exception:
                    # The deliveries happened; without their record they are sent again after
                    # a restart.
                    log_failure(log, "could not record inbox webhook attempts")
                finally:
                    for _, _, done in batch:
                        done.set()
        finally:
            self._recorder_running = False

    async def _resume(
        self, event_seq: int, delivery_id: str, attempts: int
    ) -> tuple[int, float] | None:
        """For the first event or redelivery since the start: if a stop cut its attempt series
        short, the next attempt's number and the seconds until it is due (as the schedule has it
        from the last attempt, and at least the Retry-After its answer gave)."""
        self._resumed = True
        prior = await self._store.read(
            webhooks.series_so_far, self._account_pk, event_seq, delivery_id
        )
        if prior is None:
            return None
        done = min(prior.attempts, attempts - 1)
        last = Outcome(None, None, 0.0, retry_after=prior.retry_after)
        delay = retry_delay(self._schedule, done, last, self._rng)
        due_us = prior.last_at + round(delay * 1_000_000)
        return done + 1, max(0.0, (due_us - self._clock.now_us()) / 1_000_000)

    async def _deliver(self, work: webhooks.Work) -> None:
        event = work.event
        delivery_id = series_id(event.id, work.redelivery_pk)
        attempts = len(self._schedule) + 1
        first, wait = 1, 0.0
        if not self._resumed:
            # A stop between two attempts (of the event's series or of a redelivery's): go on
            # with that series (its count, its schedule), not start over from attempt 1 at once.
            resumed = await self._resume(event.seq, delivery_id, attempts)
            if resumed is not None:
                first, wait = resumed
        for attempt in range(first, attempts + 1):
            config = self._config.version
            if wait > 0:
                # (As between attempts: a saved, rotated or deleted webhook ends the wait.)
                with trio.move_on_after(wait):
                    await self._config.wait_past(config)
                wait = 0.0
            # The first attempt goes out with what next_work just read; a retry, minutes later,
            # reads the webhook again (its URL or secret may have changed meanwhile).
            hook: webhooks.InboxWebhook | None = work.hook
            if attempt > 1:
                hook = await self._store.read(webhooks.get, self._account_pk)
                if work.redelivery_pk is not None and not await self._store.read(
                    webhooks.redelivery_queued, work.redelivery_pk
                ):
                    return  # dropped with the webhook it was queued for
            if hook is None:
                return  # deleted: later changes are not delivered until a URL is saved again
            if work.redelivery_pk is None and hook.delivered_seq >= event.seq:
                self._cursor = max(self._cursor, hook.delivered_seq)
                return  # the webhook was saved anew after this event
            outcome = await post_event(
                self._client, hook.url, hook.secret, event.body, event.type, delivery_id
            )
            final = attempt == attempts
            result = "delivered" if outcome.ok else "given_up" if final else "failed"
            record = webhooks.Attempt(
                event_seq=event.seq,
                delivery_id=delivery_id,
                attempt=attempt,
                outcome=result,
                status=outcome.status,
                error=outcome.error,
                duration_ms=outcome.duration_ms,
                at=self._clock.now_us(),
                webhook_created_at=hook.created_at,
                retry_after=outcome.retry_after,
            )
            if self._metrics is not None:
                self._metrics.inbox_deliveries.labels(result).inc()
            recorded = self._record(record, work.redelivery_pk)
            if result != "failed" and work.redelivery_pk is None:
                self._cursor = max(self._cursor, event.seq)  # on to the next one meanwhile
            else:
                await recorded.wait()
            log.info(
                "inbox webhook attempt",
                extra={
                    "event": event.id,
                    "type": event.type,
                    "attempt": attempt,
                    "outcome": result,
                    "status": outcome.status,
                    "error": outcome.error,
                    "ms": outcome.duration_ms,
                },
            )
            if result != "failed":
                return
            # Until the retry is due, or the webhook is saved, rotated or deleted: then the next
            # attempt reads it at once (a fixed URL is tried without waiting out the pause; a
            # deleted or newly saved one drops this event instead of holding the queue).
            with trio.move_on_after(retry_delay(self._schedule, attempt, outcome, self._rng)):
                await self._config.wait_past(config)
