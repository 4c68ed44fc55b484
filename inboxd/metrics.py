"""Prometheus metrics for ``GET /metrics`` (CONTRACT section 9), one registry per daemon.

Counted as things happen: HTTP requests by route, method and status with a latency histogram per
route, inbox webhook attempts by outcome, channel webhook attempts by outcome. Read when scraped:
channel webhook URLs by state (from the store), open feed clients, webhook supervisors, waits
for the disk on the trio thread, whether the store is held in memory, how long the write
batches' COMMITs took, and the process's memory, CPU and garbage collector.

Routes are labelled by their rule (``/api/v1/inbox/conversations/<conversation_id>``), never by
the path a client sent, so the number of series stays fixed; a path no rule matches is
``unmatched``.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from inboxd.store.commit_times import COMMIT_BUCKETS, CommitTimes
from inboxd.store.db import WAL_LIMIT_BYTES, WAL_RESTART_WAIT_MS
from inboxd.webhooks.policy import URL_STATES

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
# Seconds: the API's answers take from a fraction of a millisecond to a few hundred (search).
LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _StoreCounters(Collector):
    """Counters the store keeps as plain ints, read when scraped."""

    def __init__(self) -> None:
        self.loop_disk_waits = 0
        self.writer_starts = 0
        self.in_memory = False
        self.reads = (0, 0)  # (on the trio thread, in worker threads)
        self.commit_times = CommitTimes()
        self.restart_times = CommitTimes()

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "inboxd_store_loop_disk_waits",
            "Reads and writes on the trio thread that had to read from the disk; each sends its"
            " kind of read or write to worker threads for a second (inboxd/store/db.py).",
            value=self.loop_disk_waits,
        )
        reads = CounterMetricFamily(
            "inboxd_store_reads",
            "Reads of the store by where they ran: on the trio thread within its budget, or in a"
            " worker thread (over the budget, after a disk wait, during a warm-up, or sent there"
            " for a second after one of those; inboxd/store/db.py).",
            labels=["on"],
        )
        reads.add_metric(["trio_thread"], self.reads[0])
        reads.add_metric(["worker_thread"], self.reads[1])
        yield reads
        yield GaugeMetricFamily(
            "inboxd_store_in_memory",
            "1 while the warm-up child holds the whole database file in memory (reads run on the"
            " trio thread); 0 while it reads it in or reads part back, or when it does not keep"
            " the store (inboxd/store/warm.py).",
            value=int(self.in_memory),
        )
        yield _histogram(
            "inboxd_store_commit_seconds",
            "The COMMIT of each batch of writes: its pages appended to the WAL and the fsync"
            " that makes them durable (and, before the checkpointer runs, now and then SQLite's"
            " own checkpoint); every write of the batch waits for it: a slow disk shows here"
            " first (inboxd/store/db.py).",
            self.commit_times,
        )
        yield _histogram(
            "inboxd_store_checkpoint_restart_seconds",
            "Each RESTART checkpoint, which the checkpointer runs once the WAL holds more than"
            f" {WAL_LIMIT_BYTES >> 20} MiB so that the log starts over: new writes wait while it"
            f" runs. Counted also when it gives up, after waiting {WAL_RESTART_WAIT_MS} ms for"
            " readers, and the log goes on (inboxd/store/db.py).",
            self.restart_times,
        )
        yield CounterMetricFamily(
            "inboxd_store_writer_starts",
            "Writer processes started (inboxd/store/writer.py): 1 once it is up, one more for"
            " each that died and was replaced; 0 while the daemon writes from its own process.",
            value=self.writer_starts,
        )


def _histogram(name: str, documentation: str, times: CommitTimes) -> HistogramMetricFamily:
    """A histogram over COMMIT_BUCKETS from counts kept as plain numbers."""
    bounds = [*map(floatToGoString, COMMIT_BUCKETS), "+Inf"]  # ("le" as the library writes it)
    cumulative, buckets = 0, []
    for bound, count in zip(bounds, times.counts, strict=True):
        cumulative += count
        buckets.append((bound, cumulative))
    return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=times.total)


class Metrics:
    def __init__(self) -> None:
        # (route, method, status) -> the two series a request moves; routes are rules, so this
        # stays as small as the metric's own series.
        self._request_children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "inboxd_http_requests",
            "HTTP requests answered, by route, method and status.",
            ["route", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "inboxd_http_request_duration_seconds",
            "Time from the request's arrival in the app to its response, by route.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inbox_deliveries = Counter(
            "inboxd_inbox_webhook_deliveries",
            "Inbox webhook attempts by outcome (delivered, failed: will retry, given_up).",
            ["outcome"],
            registry=r,
        )
        self.channel_deliveries = Counter(
            "inboxd_channel_webhook_deliveries",
            "Channel webhook attempts by kind (event, probe) and outcome (delivered, failed).",
            ["kind", "outcome"],
            registry=r,
        )
        self.url_states = Gauge(
            "inboxd_channel_webhook_urls",
            "Channel webhook URLs by state, read from the store when scraped.",
            ["state"],
            registry=r,
        )
        self.search_own_indexes = Gauge(
            "inboxd_search_own_indexes",
            "Channels' own message search indexes by state (filling, ready), read from the store"
            " when scraped.",
            ["state"],
            registry=r,
        )
        self.feed_clients = Gauge("inboxd_feed_clients", "Open websocket feed clients.", registry=r)
        self.supervisors = Gauge(
            "inboxd_channel_webhook_supervisors",
            "Running channel webhook URL supervisor tasks.",
            registry=r,
        )
        # The process (memory, CPU, file descriptors) and its garbage collector, as the default
        # registry would have them; see inboxd/heap.py for the collector's settings.
        self._store = _StoreCounters()
        r.register(self._store)
        ProcessCollector(registry=r)
        GCCollector(registry=r)
        Gauge(
            "inboxd_gc_frozen_objects",
            "Objects start-up left, moved out of the collector's way (0 until start-up is done).",
            registry=r,
        ).set_function(gc.get_freeze_count)

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        key = (route, method, status)
        children = self._request_children.get(key)
        if children is None:
            # labels() takes a lock and builds its key each time: look each series up once.
            children = self._request_children[key] = (
                self.requests.labels(route, method, str(status)),
                self.latency.labels(route),
            )
        children[0].inc()
        children[1].observe(seconds)

    def exposition(
        self,
        url_states: dict[str, int],
        own_indexes: dict[str, int],
        feed_clients: int,
        supervisors: int,
        loop_disk_waits: int,
        reads: tuple[int, int],
        writer_starts: int = 0,
        in_memory: bool = False,
        commit_times: CommitTimes | None = None,
        restart_times: CommitTimes | None = None,
    ) -> bytes:
        self._store.loop_disk_waits = loop_disk_waits
        self._store.reads = reads
        self._store.in_memory = in_memory
        self._store.writer_starts = writer_starts
        self._store.commit_times = commit_times or CommitTimes()
        self._store.restart_times = restart_times or CommitTimes()
        for state in URL_STATES:
            self.url_states.labels(state).set(url_states.get(state, 0))
        for state in ("filling", "ready"):
            self.search_own_indexes.labels(state).set(own_indexes.get(state, 0))
        self.feed_clients.set(feed_clients)
        self.supervisors.set(supervisors)
        return generate_latest(self.registry)
