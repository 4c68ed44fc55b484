"""The daemon's root nursery: the design card in code.

::

    run()
    └── nursery
        ├── hypercorn (trio worker) serving the quart-trio app    (API and websocket feed)
        ├── inbox webhook deliverer, one per account                (webhooks/inbox.py)
        ├── channel webhook hub: one supervisor per URL              (webhooks/channel.py)
        ├── mailer: sends the mail outbox after commit               (mailer.py)
        ├── page cache warm-up at start, when the store fits         (store/warm.py)
        ├── the daemon's own code, locked in memory                  (resident.py)
        ├── search upkeep, hourly: large channels' own indexes,      (store/shards.py)
        │   search indexes' b-trees merged                           (store/tidy.py)
        ├── housekeeping: lastUsedAt in batches, old Idempotency-Keys
        └── the access log's lines, held and written 50 ms at a time (logs.py)

``run`` reports the bound URLs through ``task_status`` once the API accepts connections, and returns
after ``shutdown`` is set: hypercorn stops accepting, lets in-flight requests finish (at most
``server.shutdown_timeout``), the other tasks are cancelled, pending writes are flushed and the store
is closed. Every long-running task handles its own errors, so one failing task never takes the API
down with it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import stat
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.config import Sockets
from hypercorn.trio import serve

from inboxd.api import framing
from inboxd.api.app import AppState, create_app
from inboxd.clock import Clock, SystemClock
from inboxd.config import Config
from inboxd.errors import StoreError
from inboxd.feed import FeedHub
from inboxd.logs import hold_access_lines, log_failure
from inboxd.mailer import Mailer
from inboxd.resident import keep_code_in_memory
from inboxd.store import accounts, events, idempotency, shards, tidy, warm, webhooks
from inboxd.store.db import Store
from inboxd.store.writer import WriterProcess
from inboxd.webhooks.channel import ChannelWebhookHub
from inboxd.webhooks.client import make_client
from inboxd.webhooks.inbox import InboxWebhookDeliverer

log = logging.getLogger("inboxd.daemon")

KEY_USAGE_FLUSH_SECONDS: Final = 30.0
JOURNAL_PRUNE_BATCH: Final = 5_000
FEED_PING_SECONDS: Final = 20.0
# How often the daemon sees to the search indexes (channels due an index of their own,
# store/shards.py; the b-trees of the contact index and of those own indexes, store/tidy.py),
# the first time a minute after it starts; and its pause between two steps of that work, which
# leaves the writer to the API's writes most of the time.
SEARCH_CHECK_SECONDS: Final = 3600.0
SEARCH_FIRST_CHECK_SECONDS: Final = 60.0
SEARCH_STEP_PAUSE_SECONDS: Final = 0.01


# A peer that takes nothing it is sent for this long (its receive window stays shut, or what was
# sent stays unacknowledged) is dropped by the kernel (TCP_USER_TIMEOUT, on Linux). hypercorn
# shields its writes from cancellation, so a client that stopped reading (a feed client, or one
# that asked for a large answer) would otherwise hold its connection and its tasks for good.
STALLED_PEER_SECONDS: Final = 60.0
# After a stop, hypercorn cancels what is left of its connections at server.shutdown_timeout; a
# connection whose write is still stuck this much later is cut (cut_connections), so that the
# daemon exits within the CONTRACT's 10 s whatever its clients do.
CUT_AFTER_TIMEOUT_SECONDS: Final = 0.5


class _HyperConfig(HyperConfig):
    def create_sockets(self) -> Sockets:
        sockets = super().create_sockets()
        timeout = getattr(socket, "TCP_USER_TIMEOUT", None)
        for sock in [*sockets.secure_sockets, *sockets.insecure_sockets]:
            # Accepted connections inherit it from the listening socket.
            if timeout is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, timeout, round(STALLED_PEER_SECONDS * 1000))
        return sockets


def api_connections(ports: set[int]) -> list[socket.socket]:
    """A duplicate of each TCP connection of this process whose local port is one of ``ports``
    (the API's), listening sockets left out; the caller closes them (closing a duplicate leaves
    the connection as it was).

    hypercorn keeps its connections to itself: they are found among the process's open files
    (``/proc/self/fd``, ``/dev/fd`` elsewhere)."""
    fd_dir = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    found = []
    ours: set[int] = set()  # (a duplicate may take the number of a file listed, closed since)
    for name in os.listdir(fd_dir):
        if int(name) in ours or not _is_socket(int(name)):
            # Only sockets are duplicated: closing a duplicate of the database file (or of any
            # file SQLite locks) would drop every POSIX lock the process holds on it.
            continue
        try:
            dup = os.dup(int(name))
        except OSError:  # (closed meanwhile)
            continue
        ours.add(dup)
        if not _is_socket(dup):  # (closed and opened again as something else meanwhile)
            continue  # left open rather than closed, for the reason above
        try:
            sock = socket.socket(fileno=dup)
        except OSError:  # (a socket Python cannot take: closing a socket's duplicate is harmless)
            os.close(dup)
            continue
        try:
            if (
                sock.family in (socket.AF_INET, socket.AF_INET6)
                and sock.type == socket.SOCK_STREAM
                and sock.getsockname()[1] in ports
                and sock.getpeername()  # a listening socket has none (OSError)
            ):
                found.append(sock)
                continue
        except OSError:
            pass
        sock.close()
    return found


def _is_socket(fd: int) -> bool:
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:  # (closed meanwhile)
        return False


def cut_connections(ports: set[int]) -> int:
    """Shut down both ways every connection of the API on ``ports``; returns how many. A write
    blocked on one of them then fails at once, and hypercorn ends the connection."""
    connections = api_connections(ports)
    for sock in connections:
        with sock, contextlib.suppress(OSError):  # (OSError: gone meanwhile)
            sock.shutdown(socket.SHUT_RDWR)
    return len(connections)


def _ports(urls: list[str]) -> set[int]:
    return {port for url in urls if (port := urlsplit(url).port) is not None}


def hypercorn_config(config: Config, bind: str) -> HyperConfig:
    hc = _HyperConfig()
    hc.bind = [bind]
    hc.accesslog = None  # the app writes its own JSON access log
    hc.errorlog = logging.getLogger("hypercorn.error")
    hc.graceful_timeout = config.server.shutdown_timeout
    hc.h11_max_incomplete_size = 64 * 1024
    # A client that stops sending (or whose oversized body we refused to read) is disconnected
    # instead of holding its socket forever. The feed's pings keep live websockets busier.
    hc.read_timeout = 60
    # hypercorn pings every websocket; a closed socket's ping task sleeps out its interval, so a
    # shutdown shortly after a feed client left takes up to shutdown_timeout (within 10 s).
    hc.websocket_ping_interval = FEED_PING_SECONDS
    hc.server_names = []
    return hc


async def _flush_key_usage(app_state: AppState) -> None:
    if not app_state.key_usage:
        return
    used, app_state.key_usage = app_state.key_usage, {}
    try:
        await app_state.store.write(accounts.touch_keys, used)
    except Exception:  # lastUsedAt is informational: never let it stop the daemon
        log_failure(log, "could not record key usage")


async def _housekeeping(app_state: AppState) -> None:
    """Now and then: record keys' lastUsedAt, forget Idempotency-Keys older than 24 h, prune the
    journal past feed.retention."""
    while True:
        await trio.sleep(KEY_USAGE_FLUSH_SECONDS)
        await _flush_key_usage(app_state)
        try:
            await app_state.store.write(idempotency.prune, app_state.clock.now_us())
        except Exception:
            log_failure(log, "could not prune idempotency keys")
        await prune_journal(app_state)


async def prune_journal(app_state: AppState) -> int:
    """Delete the events older than feed.retention that nothing owes, a batch per transaction
    (so other writes go in between); returns how many went."""
    before = app_state.oldest_kept_us()
    total = 0
    try:
        while True:
            done = await app_state.store.write(events.prune, before, JOURNAL_PRUNE_BATCH)
            total += done
            if done < JOURNAL_PRUNE_BATCH:
                break
    except Exception:
        log_failure(log, "could not prune the journal")
    if total:
        log.info("journal pruned", extra={"events": total})
    return total


async def _search_upkeep(app_state: AppState) -> None:
    await trio.sleep(SEARCH_FIRST_CHECK_SECONDS)
    while True:
        try:
            await maintain_search_shards(app_state.store, app_state.clock)
        except Exception:  # searches still have the shared index: try again next time
            log_failure(log, "could not make a channel's search index")
        try:
            await tidy_search_indexes(app_state.store)
        except Exception:  # searches read the indexes as they are: try again next time
            log_failure(log, "could not merge a search index")
        await trio.sleep(SEARCH_CHECK_SECONDS)


async def tidy_search_indexes(store: Store, pages: int | None = None) -> dict[str, int]:
    """Merge the b-trees of the contact index and of the large channels' own message indexes
    (store/tidy.py), a step (one write of about ``pages`` pages: tidy.STEP_PAGES) at a time
    with a pause between, until nothing is left to merge or tidy.PASS_STEPS have been taken on
    an index (rows arriving all the time give it new b-trees: the rest waits for the next
    pass); returns the steps that did work, by index."""
    pages = tidy.STEP_PAGES if pages is None else pages
    done = {}
    for index in await store.read(tidy.indexes):
        started, steps = time.monotonic(), 0
        before = await store.read(tidy.btrees, index)
        while steps < tidy.PASS_STEPS and await store.write(tidy.step, index, pages):
            steps += 1
            await trio.sleep(SEARCH_STEP_PAUSE_SECONDS)
        done[index] = steps
        if steps:
            log.info(
                "search index merged",
                extra={
                    "index": index,
                    "steps": steps,
                    "seconds": round(time.monotonic() - started, 1),
                    "btrees_before": before,
                    "btrees": await store.read(tidy.btrees, index),
                    # False: the pass stopped at tidy.PASS_STEPS; the next one goes on.
                    "complete": steps < tidy.PASS_STEPS,
                },
            )
    return done


async def maintain_search_shards(
    store: Store, clock: Clock, threshold: int | None = None, step_rows: int | None = None
) -> list[int]:
    """Give each channel past ``threshold`` messages (shards.SHARD_MESSAGES) a search index of
    its own and fill the unfinished ones, a step (one write, ``step_rows`` messages:
    shards.STEP_ROWS) at a time with a pause between; returns the channels whose index it made
    ready. The work survives a stop: the next run goes on from there. Each channel's size is
    read apart (a read has a deadline; counting every channel's at once could pass it)."""
    threshold = shards.SHARD_MESSAGES if threshold is None else threshold
    step_rows = shards.STEP_ROWS if step_rows is None else step_rows
    for channel_pk in await store.read(shards.candidates):
        if await store.read(shards.held, channel_pk, threshold) < threshold:
            continue
        if await store.write(shards.start, channel_pk, clock.now_us()):
            log.info(
                "search index of its own: started",
                extra={"channel": await store.read(shards.channel_id, channel_pk)},
            )
    made = []
    for channel_pk in await store.read(shards.unfinished):
        started, steps = time.monotonic(), 1
        while await store.write(shards.step, channel_pk, clock.now_us(), step_rows):
            steps += 1
            await trio.sleep(SEARCH_STEP_PAUSE_SECONDS)
        log.info(
            "search index of its own: ready",
            extra={
                "channel": await store.read(shards.channel_id, channel_pk),
                "steps": steps,
                "seconds": round(time.monotonic() - started, 1),
            },
        )
        made.append(channel_pk)
    return made


LOCK_FILE: Final = "inboxd.lock"


@contextlib.contextmanager
def hold_store(data_dir: Path) -> Iterator[None]:
    """Hold the store's lock file (``flock``, released when the process ends, however it ends)
    while the daemon runs: two daemons on one store would deliver every webhook event twice, and
    each one's feed would miss the other's writes. The file holds the holder's pid. ``serve``
    takes it before it migrates the store (and tells ``run`` so); the CLI's other commands,
    which may run beside the daemon, do not take it."""
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise StoreError(
                f"another inboxd daemon is serving the store in {data_dir}"
                + (f" (pid {holder})" if holder.isdigit() else "")
                + "; stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


async def run(
    data_dir: Path,
    config: Config,
    shutdown: trio.Event,
    *,
    bind: str | None = None,
    offload_store: bool = True,
    clock: Clock | None = None,
    held: bool = False,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until ``shutdown`` is set. Reports the bound URLs when ready (none if ``shutdown``
    came first: it stopped while it started). One daemon at a time serves a store: another one
    running raises ``StoreError`` (``held``: the caller holds the store with ``hold_store``).

    ``offload_store=False`` keeps SQLite on the trio thread and ``clock=TrioClock()`` makes wall
    time follow trio's clock; only tests on MockClock want those (see ``Store`` and clock.py).
    """
    with contextlib.nullcontext() if held else hold_store(data_dir):
        await _run(data_dir, config, shutdown, bind, offload_store, clock, task_status)


async def _run(
    data_dir: Path,
    config: Config,
    shutdown: trio.Event,
    bind: str | None,
    offload_store: bool,
    clock: Clock | None,
    task_status: trio.TaskStatus[list[str]],
) -> None:
    clock = clock or SystemClock()
    store = await trio.to_thread.run_sync(
        partial(Store.open, data_dir, create=False, offload=offload_store)
    )
    app = create_app(store, config, clock)
    app_state: AppState = app.extensions["inboxd"]
    hc = hypercorn_config(config, bind or config.server.bind)
    framing.install()  # hypercorn's own 400s get a JSON body; closes finish; answers go whole
    client = make_client(config.webhooks)
    channel_client = make_client(config.webhooks, max_connections=None)
    if offload_store:  # (not on MockClock tests: there every write stays on the trio thread)
        store.writer_process = WriterProcess(store.path)
    started = False
    try:
        async with client, channel_client, trio.open_nursery() as nursery:
            if store.writer_process is not None:  # it imports while the rest starts
                nursery.start_soon(store.writer_process.start)
            nursery.start_soon(store.lead_batches)
            nursery.start_soon(hold_access_lines)

            async def serve_api(
                task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
            ) -> None:
                await serve(app, hc, shutdown_trigger=shutdown.wait, task_status=task_status)
                # hypercorn has drained its connections: the rest of the daemon can stop now.
                nursery.cancel_scope.cancel()

            feed_hub = app_state.feed_hub = FeedHub(store, config.feed.queue_bound)

            async def close_feed_on_shutdown() -> None:
                # Open websockets would hold hypercorn's graceful stop for its whole timeout.
                await shutdown.wait()
                feed_hub.close_all()

            nursery.start_soon(close_feed_on_shutdown)
            nursery.start_soon(feed_hub.sweep_revoked)
            if warming := config.server.warm_cache and store.offload:  # (not on MockClock tests)
                store.set_in_memory(False)  # reads leave the loop until the warm-up has looked
            urls: list[str] = await nursery.start(serve_api)

            async def cut_what_outlasts_the_stop() -> None:
                await shutdown.wait()
                await trio.sleep(config.server.shutdown_timeout + CUT_AFTER_TIMEOUT_SECONDS)
                # (this task is cancelled with the rest once hypercorn has drained)
                if cut := cut_connections(_ports(urls)):
                    log.warning(
                        "cut connections still open after the shutdown timeout",
                        extra={"connections": cut},
                    )

            nursery.start_soon(cut_what_outlasts_the_stop)
            nursery.start_soon(_housekeeping, app_state)
            nursery.start_soon(_search_upkeep, app_state)
            nursery.start_soon(store.checkpoint_forever)
            if config.server.lock_code and store.offload:  # (not on MockClock tests)
                nursery.start_soon(keep_code_in_memory)
            if warming:
                nursery.start_soon(
                    partial(
                        warm.warm,
                        store.path,
                        lock=config.server.lock_cache,
                        in_memory=store.set_in_memory,
                    )
                )
            await nursery.start(Mailer(store, config.mail, data_dir, clock).run)
            hub = ChannelWebhookHub(
                store,
                channel_client,
                config.channel_webhooks,
                clock,
                base_url=config.server.public_url or urls[0],
                metrics=app_state.metrics,
            )
            # Known to the API before its first reconcile: a URL list saved meanwhile is then
            # either read by that reconcile or reconciled by its own request (after it).
            app_state.channel_hub = hub
            await nursery.start(hub.run)
            for account_pk in await store.read(webhooks.account_pks):
                deliverer = InboxWebhookDeliverer(
                    store,
                    client,
                    config.inbox_webhook,
                    account_pk,
                    clock,
                    metrics=app_state.metrics,
                )
                await nursery.start(deliverer.run)
            # A stop that came while it started (hypercorn may still be draining, or already
            # done) is reported below, with no URL, once everything has stopped: whether this
            # line ran before hypercorn finished must not decide what the caller is told.
            if not shutdown.is_set():
                log.info("listening", extra={"urls": urls, "data": str(data_dir)})
                task_status.started(urls)
                started = True
    finally:
        with trio.CancelScope(shield=True):
            await _flush_key_usage(app_state)
            if store.writer_process is not None:
                await store.writer_process.aclose()
                store.writer_process = None
        store.close()
        log.info("stopped")
    if not started:
        if not shutdown.is_set():  # (hypercorn returned on its own: not a stop we asked for)
            raise RuntimeError("the API stopped serving before the daemon was ready")
        # Stopped while it started (a signal right after the API answered /readyz): a stop
        # like any other, not a start that failed. No URL serves any more.
        task_status.started([])
