"""GET /metrics (CONTRACT section 9): Prometheus text, no key; requests, deliveries, URL states and
feed clients, each read from the running daemon."""

from __future__ import annotations

import gc
import logging
import re

import httpx
import pytest
import trio

from inboxd.config import Config
from inboxd.metrics import Metrics
from inboxd.store.commit_times import CommitTimes
from tests.conftest import Seed, ingest, webhook_config
from tests.receiver import Certs, Receiver
from tests.test_feed import feed

CONV = "/api/v1/inbox/conversations"
_SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


@pytest.fixture
def config(certs: Certs) -> Config:
    return webhook_config(certs)


async def scrape(anon: httpx.AsyncClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = await anon.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for line in response.text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, line
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
        samples[(match["name"], labels)] = float(match["value"])
    return samples


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def test_requests_are_counted_by_route_method_and_status(
    owner: httpx.AsyncClient, anon: httpx.AsyncClient, seeded: Seed
) -> None:
    conv = (await ingest(owner, seeded.sales_id, "15550001", content="hi"))["conversationId"]
    for _ in range(3):
        assert (await owner.get(CONV)).status_code == 200
    assert (await owner.get(f"{CONV}/{conv}")).status_code == 200
    assert (await owner.get(f"{CONV}/conv_nope")).status_code == 404
    assert (await anon.get("/no/such/path")).status_code == 404
    assert (await anon.get(CONV, headers={"Authorization": "Bearer ibx_nope"})).status_code == 401
    assert (await owner.delete(CONV)).status_code == 405  # no rule takes DELETE there
    samples = await scrape(anon)
    requests = "inboxd_http_requests_total"
    one = "/api/v1/inbox/conversations/<conversation_id>"
    assert value(samples, requests, route=CONV, method="GET", status="200") == 3
    assert value(samples, requests, route=one, method="GET", status="200") == 1
    assert value(samples, requests, route=one, method="GET", status="404") == 1
    assert value(samples, requests, route="unmatched", method="GET", status="404") == 1
    assert value(samples, requests, route=CONV, method="GET", status="401") == 1
    assert value(samples, requests, route="unmatched", method="DELETE", status="405") == 1
    latency = "inboxd_http_request_duration_seconds"
    assert value(samples, f"{latency}_count", route=CONV) == 4
    assert value(samples, f"{latency}_bucket", route=CONV, le="+Inf") == 4
    assert 0 < value(samples, f"{latency}_sum", route=CONV) < 3
    # The scrape itself is counted by the next one.
    again = await scrape(anon)
    assert value(again, requests, route="/metrics", method="GET", status="200") == 1
    # Methods a client makes up are one series, OTHER: it cannot add series at will.
    for i in range(5):
        assert (await anon.request(f"X{i}ZZY", "/healthz")).status_code == 405
    made_up = await scrape(anon)
    assert not [labels for name, labels in made_up if ("method", "X0ZZY") in labels]
    assert value(made_up, requests, route="unmatched", method="OTHER", status="405") == 5


async def test_each_request_is_in_the_access_log(
    owner: httpx.AsyncClient, seeded: Seed, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="inboxd.access")
    assert (await owner.get(f"{CONV}?limit=2")).status_code == 200
    assert (await owner.get(f"{CONV}/conv_nope")).status_code == 404
    records = [r for r in caplog.records if r.name == "inboxd.access"]
    assert [(r.method, r.path, r.status) for r in records] == [  # type: ignore[attr-defined]
        ("GET", CONV, 200),
        ("GET", f"{CONV}/conv_nope", 404),
    ]
    assert all(isinstance(r.ms, float) and r.ms >= 0 for r in records)  # type: ignore[attr-defined]


async def test_a_client_gone_while_its_unread_body_is_awaited_is_still_counted(
    base_url: str, anon: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    # A 401 is decided from the headers; the daemon then waits for the rest of the body (see
    # finish_request) and the client closes the connection meanwhile, which cancels that wait.
    caplog.set_level(logging.INFO, logger="inboxd.access")
    host, port = base_url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(
        b"POST /api/v1/messaging/messages HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 10\r\n\r\n12345"
    )
    await trio.sleep(0.2)
    await stream.aclose()
    route = "/api/v1/messaging/messages"
    with trio.fail_after(10):
        while True:
            samples = await scrape(anon)
            counted = value(
                samples, "inboxd_http_requests_total", route=route, method="POST", status="401"
            )
            if counted:
                break
            await trio.sleep(0.05)
    assert counted == 1
    logged = [r for r in caplog.records if r.name == "inboxd.access" and r.path == route]  # type: ignore[attr-defined]
    assert [r.status for r in logged] == [401]  # type: ignore[attr-defined]


async def test_deliveries_url_states_and_feed_clients(
    owner: httpx.AsyncClient,
    anon: httpx.AsyncClient,
    seeded: Seed,
    receiver: Receiver,
    base_url: str,
) -> None:
    assert (await owner.put("/api/v1/inbox/webhook", json={"url": receiver.url})).status_code == 200
    saved = await owner.post(
        f"/api/v1/channels/{seeded.sales_id}/webhook", json={"urls": [receiver.url]}
    )
    assert saved.status_code == 200, saved.text
    conv = (await ingest(owner, seeded.sales_id, "15550001", content="hi"))["conversationId"]
    await owner.post(f"{CONV}/{conv}/block")
    await receiver.wait_for(2, within=10)  # the message (channel URL) and the block (inbox)
    async with feed(base_url, seeded.owner_key) as ws:
        with trio.fail_after(10):
            while True:
                samples = await scrape(anon)
                if value(samples, "inboxd_inbox_webhook_deliveries_total", outcome="delivered"):
                    break
                await trio.sleep(0.01)
        assert value(samples, "inboxd_feed_clients") == 1
        await ws.ping()
    assert value(samples, "inboxd_inbox_webhook_deliveries_total", outcome="delivered") == 1
    assert (
        value(samples, "inboxd_channel_webhook_deliveries_total", kind="event", outcome="delivered")
        == 1
    )
    assert value(samples, "inboxd_channel_webhook_urls", state="delivering") == 1
    assert value(samples, "inboxd_channel_webhook_urls", state="paused") == 0
    assert value(samples, "inboxd_channel_webhook_supervisors") == 1


async def test_the_process_and_its_garbage_collector_are_exported(anon: httpx.AsyncClient) -> None:
    before = await scrape(anon)
    gc.collect()
    after = await scrape(anon)
    collections = "python_gc_collections_total"
    assert value(after, collections, generation="2") > value(before, collections, generation="2")
    assert value(after, "process_resident_memory_bytes") > 10 * 2**20
    assert value(after, "process_open_fds") > 0
    assert ("inboxd_store_loop_disk_waits_total", frozenset()) in after  # db.py's count
    # The daemon's writer process: it starts beside the daemon's other tasks.
    with trio.fail_after(10):
        while value(after, "inboxd_store_writer_starts_total") != 1:
            await trio.sleep(0.05)
            after = await scrape(anon)
    # The warm-up child holds the (small) store in memory.
    with trio.fail_after(10):
        while value(after, "inboxd_store_in_memory") != 1:
            await trio.sleep(0.05)
            after = await scrape(anon)
    # An in-process daemon (tests) never freezes the heap: only `inboxd serve` does (test_cli).
    assert value(after, "inboxd_gc_frozen_objects") == gc.get_freeze_count()


async def test_reads_are_counted_by_where_they_ran(
    anon: httpx.AsyncClient, owner: httpx.AsyncClient
) -> None:
    """``inboxd_store_reads_total``: with the store held in memory the API's reads run on the
    trio thread (inboxd/store/db.py), and each is counted there."""
    before = await scrape(anon)
    with trio.fail_after(10):
        while value(before, "inboxd_store_in_memory") != 1:
            await trio.sleep(0.05)
            before = await scrape(anon)
    for _ in range(5):
        assert (await owner.get("/api/v1/inbox/conversations/counts")).status_code == 200
    after = await scrape(anon)
    on_loop = value(after, "inboxd_store_reads_total", on="trio_thread")
    assert on_loop >= value(before, "inboxd_store_reads_total", on="trio_thread") + 5
    assert ("inboxd_store_reads_total", frozenset({("on", "worker_thread")})) in after


async def test_the_write_batches_commits_are_timed(
    owner: httpx.AsyncClient, anon: httpx.AsyncClient, seeded: Seed
) -> None:
    """``inboxd_store_commit_seconds``: each write batch's COMMIT (the WAL's fsync), timed in
    the writer process and brought back with the batch's outcomes."""
    conv = (await ingest(owner, seeded.sales_id, "15550002", content="hi"))["conversationId"]
    before = await scrape(anon)
    name = "inboxd_store_commit_seconds"
    for n in range(3):  # one after the other: a batch each
        response = await owner.patch(f"{CONV}/{conv}/title", json={"title": f"t{n}"})
        assert response.status_code == 200
    after = await scrape(anon)
    assert value(after, f"{name}_count") == value(before, f"{name}_count") + 3
    assert value(after, f"{name}_sum") > value(before, f"{name}_sum")
    bounds = ["0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5"]
    bounds += ["1.0", "+Inf"]
    assert {dict(labels)["le"] for key, labels in after if key == f"{name}_bucket"} == set(bounds)
    cumulative = [value(after, f"{name}_bucket", le=b) for b in bounds]
    assert cumulative == sorted(cumulative)  # each bucket holds the ones below it
    assert cumulative[-1] == value(after, f"{name}_count")
    # (a COMMIT here takes well under a second: the three are in the 1 s bucket)
    assert value(after, f"{name}_bucket", le="1.0") == value(before, f"{name}_bucket", le="1.0") + 3


def test_the_checkpointers_restarts_are_exported() -> None:
    """``inboxd_store_checkpoint_restart_seconds``: each RESTART checkpoint holds new writes
    back while it runs, so its time is every waiting write's (inboxd/store/db.py)."""
    restarts = CommitTimes()
    restarts.observe(0.02)
    restarts.observe(0.3)
    text = Metrics().exposition(
        url_states={},
        own_indexes={},
        feed_clients=0,
        supervisors=0,
        loop_disk_waits=0,
        reads=(0, 0),
        restart_times=restarts,
    )
    samples = {}
    for line in text.decode().splitlines():
        match = _SAMPLE.match(line)
        if match and match["name"].startswith("inboxd_store_checkpoint_restart_seconds"):
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
            samples[(match["name"], labels)] = float(match["value"])
    name = "inboxd_store_checkpoint_restart_seconds"
    assert value(samples, f"{name}_bucket", le="0.01") == 0
    assert value(samples, f"{name}_bucket", le="0.025") == 1
    assert value(samples, f"{name}_bucket", le="0.5") == 2
    assert value(samples, f"{name}_count") == 2
    assert value(samples, f"{name}_sum") == pytest.approx(0.32)
