"""Channel webhook supervisors at scale: memory per supervisor and idle CPU.

Builds a store with N webhook URLs over many channels (most delivering with nothing to send,
a share paused with a probe hours away), starts the real ChannelWebhookHub (one trio task per URL)
and measures, once every supervisor waits:

- memory per supervisor: Python heap growth (tracemalloc) and RSS growth, divided by N;
- idle CPU: process CPU time over a quiet interval, as a share of one core.

The ceiling beside each figure is the issue's target (< 10 KB, < 1 % of a core for 10,000).
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
import tracemalloc
from pathlib import Path

import trio

from bench.common import cpu_seconds, report, rss_bytes
from inboxd.clock import SystemClock
from inboxd.config import ChannelWebhooksConfig, WebhooksConfig
from inboxd.store import accounts
from inboxd.store import channel_webhooks as cw
from inboxd.store.db import Store
from inboxd.timeutil import now_us
from inboxd.webhooks.channel import ChannelWebhookHub
from inboxd.webhooks.client import make_client

TARGET_BYTES = 10 * 1024
TARGET_CPU = 0.01


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--urls", type=int, default=10_000, help="webhook URLs (default 10000)")
    p.add_argument("--channels", type=int, default=1_000, help="channels they spread over")
    p.add_argument("--paused", type=float, default=0.3, help="share of URLs paused (0.3)")
    p.add_argument("--idle-seconds", type=float, default=10.0, help="quiet interval measured")


def build(data_dir: Path, urls: int, channels: int, paused_share: float) -> None:
    store = Store.open(data_dir, create=True, readers=1)
    try:

        def fill(conn: object) -> None:
            import sqlite3

            assert isinstance(conn, sqlite3.Connection)
            now = now_us()
            accounts.create_account(conn, "owner@example.com", "Owner", now)
            account_pk = accounts.the_account_pk(conn)
            per_channel = -(-urls // channels)
            made = 0
            for c in range(channels):
                channel = accounts.create_channel(conn, account_pk, f"ch{c}", "WHATSAPP", now)
                batch = [
                    f"https://hook{c}-{i}.example.com/in"
                    for i in range(min(per_channel, urls - made))
                ]
                cw.replace_urls(conn, channel.pk, batch, now, 0)  # (new URLs: nothing kept)
                made += len(batch)
                if made >= urls:
                    break
            pause = round(urls * paused_share)
            conn.execute(
                "UPDATE channel_webhook_urls SET state = 'paused', paused_at = ?,"
                " next_probe_at = ?, failure_count = 6, first_failure_at = ?"
                " WHERE pk IN (SELECT pk FROM channel_webhook_urls ORDER BY pk LIMIT ?)",
                (now, now + 3600 * 10**6, now - 1060 * 10**6, pause),
            )

        store.write_sync(fill)
    finally:
        store.close()


async def measure(data_dir: Path, urls: int, idle_seconds: float, trace: bool) -> dict[str, float]:
    """One pass. With ``trace`` the Python heap is counted (tracemalloc, which itself inflates
    RSS and CPU); without, RSS and idle CPU are measured."""
    store = Store.open(data_dir)
    client = make_client(WebhooksConfig(), max_connections=None)
    hub = ChannelWebhookHub(store, client, ChannelWebhooksConfig(), SystemClock(), "http://x")
    try:
        async with client, trio.open_nursery() as nursery:
            gc.collect()
            rss0 = rss_bytes()
            if trace:
                tracemalloc.start()
            heap0 = tracemalloc.get_traced_memory()[0]
            started = time.perf_counter()
            await nursery.start(hub.run)
            # Every supervisor reads its row and its next message once, then waits.
            while True:
                await trio.sleep(0.2)
                stats = trio.lowlevel.current_statistics()
                if stats.tasks_runnable == 0 and store_idle(store):
                    await trio.sleep(0.5)
                    if trio.lowlevel.current_statistics().tasks_runnable == 0:
                        break
            settle = time.perf_counter() - started
            gc.collect()
            heap = tracemalloc.get_traced_memory()[0] - heap0
            tracemalloc.stop()
            rss = rss_bytes() - rss0
            assert hub.supervisors == urls, (hub.supervisors, urls)
            idle_cpu = 0.0
            if not trace:
                cpu0, wall0 = cpu_seconds(), time.perf_counter()
                await trio.sleep(idle_seconds)
                idle_cpu = (cpu_seconds() - cpu0) / (time.perf_counter() - wall0)
            nursery.cancel_scope.cancel()
    finally:
        store.close()
    return {
        "supervisors": float(urls),
        "settle_seconds": settle,
        "heap_bytes_per_supervisor": heap / urls,
        "rss_bytes_per_supervisor": rss / urls,
        "idle_cpu_share_of_one_core": idle_cpu,
    }


def store_idle(store: Store) -> bool:
    return store._read_limiter.borrowed_tokens == 0


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        t = time.perf_counter()
        build(data_dir, args.urls, args.channels, args.paused)
        built = time.perf_counter() - t
        figures = trio.run(measure, data_dir, args.urls, args.idle_seconds, False)
        traced = trio.run(measure, data_dir, args.urls, args.idle_seconds, True)
        figures["heap_bytes_per_supervisor"] = traced["heap_bytes_per_supervisor"]
    per_heap = figures["heap_bytes_per_supervisor"]
    per_rss = figures["rss_bytes_per_supervisor"]
    cpu = figures["idle_cpu_share_of_one_core"]
    rows = [
        ("URL supervisors", f"{args.urls:,}", f"{args.paused:.0%} paused, over {args.channels} channels"),
        ("start-up until all wait", f"{figures['settle_seconds']:.2f} s", f"store built in {built:.2f} s"),
        ("heap per supervisor", f"{per_heap / 1024:.2f} KB", f"target < {TARGET_BYTES // 1024} KB: ratio {per_heap / TARGET_BYTES:.2f}"),
        ("RSS per supervisor", f"{per_rss / 1024:.2f} KB", f"ratio to target {per_rss / TARGET_BYTES:.2f}"),
        ("idle CPU", f"{cpu:.3%}", f"of one core; target < {TARGET_CPU:.0%}: ratio {cpu / TARGET_CPU:.2f}"),
    ]  # fmt: skip
    report("supervisors", rows, {"args": vars(args), "figures": figures})
    ok = per_heap < TARGET_BYTES and cpu < TARGET_CPU
    print("  targets met" if ok else "  TARGET MISSED")
    return 0
