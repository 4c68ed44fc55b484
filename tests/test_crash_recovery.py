"""SIGKILL between a change and its delivery: after a restart the event arrives (CONTRACT s. 6)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import trio

from tests.conftest import OPENAPI_HOOKS, Seed, auth, ingest
from tests.receiver import Certs, make_certs, running_receiver


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_daemon(data: Path, port: int, ca_file: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "INBOXD_LIMITS_REQUESTS_PER_SECOND": "0",
        "INBOXD_WEBHOOKS_CA_FILE": str(ca_file),
        "INBOXD_WEBHOOKS_ALLOW_PRIVATE_HOSTS": "true",
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "inboxd",
            "serve",
            "--data",
            str(data),
            "--bind",
            f"127.0.0.1:{port}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def wait_ready(client: httpx.AsyncClient) -> None:
    with trio.fail_after(30):
        while True:
            try:
                if (await client.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await trio.sleep(0.05)


@asynccontextmanager
async def api_client(port: int, seeded: Seed) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}",
        headers=auth(seeded.owner_key),
        timeout=10,
        event_hooks=OPENAPI_HOOKS,
    ) as api:
        yield api


async def hook_and_block(api: httpx.AsyncClient, seeded: Seed, url: str) -> None:
    """Save the inbox webhook's URL, then make one event for it: a new conversation blocked."""
    assert (await api.put("/api/v1/inbox/webhook", json={"url": url})).status_code == 200
    conv = (await ingest(api, seeded.sales_id, "15550001", content="hi"))["conversationId"]
    assert (await api.post(f"/api/v1/inbox/conversations/{conv}/block")).status_code == 200


@asynccontextmanager
async def daemon_process(
    seeded: Seed, port: int, certs: Certs, api: httpx.AsyncClient, stop_with: signal.Signals
) -> AsyncIterator[None]:
    """``inboxd serve`` in a process of its own, ready; ended with ``stop_with``."""
    proc = start_daemon(seeded.data_dir, port, certs.ca_file)
    try:
        await wait_ready(api)
        yield
    finally:
        proc.send_signal(stop_with)
        proc.wait(timeout=15)


async def test_sigkill_before_delivery_then_restart_delivers(seeded: Seed, tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "tls")
    port = free_port()
    async with running_receiver(certs) as receiver, api_client(port, seeded) as api:
        receiver.statuses += [503] * 5  # the receiver is down while the first daemon runs
        async with daemon_process(seeded, port, certs, api, signal.SIGKILL):
            await hook_and_block(api, seeded, receiver.url)
            (failed,) = await receiver.wait_for(1, within=30)
        receiver.statuses.clear()  # the receiver is back
        async with daemon_process(seeded, port, certs, api, signal.SIGTERM):
            got = await receiver.wait_for(2, within=30)
    delivered = json.loads(got[1].body)
    assert delivered["type"] == "inbox.conversation.blocked"
    assert delivered["id"] == json.loads(failed.body)["id"]
    assert got[1].body == failed.body  # the bytes serialised at commit, unchanged


async def test_sigkill_during_an_attempt_keeps_the_delivery_id(
    seeded: Seed, tmp_path: Path
) -> None:
    """An attempt is recorded after its answer: one in flight when the daemon was killed left
    no record, and the event went out again after the restart under a new X-Svc-Delivery
    (CONTRACT section 6: the same on retries of one event; found by a review)."""
    certs = make_certs(tmp_path / "tls")
    port = free_port()
    async with running_receiver(certs) as receiver, api_client(port, seeded) as api:
        receiver.hang = True  # the first attempt is in flight when the daemon dies
        async with daemon_process(seeded, port, certs, api, signal.SIGKILL):
            await hook_and_block(api, seeded, receiver.url)
            (first,) = await receiver.wait_for(1, within=30)
        receiver.hang = False
        async with daemon_process(seeded, port, certs, api, signal.SIGTERM):
            again = (await receiver.wait_for(2, within=30))[1]
    assert json.loads(again.body)["id"] == json.loads(first.body)["id"]  # the same event
    assert again.headers["x-svc-delivery"] == first.headers["x-svc-delivery"]
