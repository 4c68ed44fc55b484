"""Inbox webhook delivery: signed events per second to a local HTTPS receiver, and the time from
a change to its receipt when idle, beside what a bare client reaches against the same receiver.

- Throughput: the store gets a backlog of ``--events`` deliverable events (title changes, each one
  ``inbox.conversation.title_changed``) while the daemon is stopped, with the webhook already
  saved; then the daemon starts and the figure is how fast the receiver sees the backlog arrive,
  first to last (each one signed, sent over HTTPS, and recorded as delivered in the store).
- Idle latency: one title change at a time through the API, timed from sending the request (and
  from its response, which comes after the commit) until the receiver has the event.
- Ceiling: a bare httpx sender in its own process posting the same signed bodies one at a time
  to the same receiver (no store), through the transport as inboxd does: what one sequential
  HTTPS sender can do here.

The receiver (bench/receiver.py) runs in a process of its own on uvicorn with a trustme
certificate, checks every signature, and is lean so that the figures are the sender's: with one
event at a time, its time is part of every round trip. Its CPU per request is printed beside.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio
import trustme

from bench.common import report, thread_cpu_seconds
from bench.feed import ROOT, build_store, free_port, pct, start, wait_http
from bench.receiver import Receiver


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=3000, help="backlog delivered (3000)")
    p.add_argument("--rounds", type=int, default=200, help="idle changes timed (200)")


def make_certs(directory: Path) -> tuple[Path, Path, Path]:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    ca_file, cert_file, key_file = (
        directory / "ca.pem",
        directory / "cert.pem",
        directory / "key.pem",
    )
    ca.cert_pem.write_to_path(str(ca_file))
    server.cert_chain_pems[0].write_to_path(str(cert_file))
    server.private_key_pem.write_to_path(str(key_file))
    return ca_file, cert_file, key_file


def daemon_env(ca_file: Path) -> dict[str, str]:
    """The daemon's settings for delivering to the local receiver, trusting its CA."""
    return {
        "INBOXD_LIMITS_REQUESTS_PER_SECOND": "0",
        "INBOXD_LOG_LEVEL": "warning",
        "INBOXD_WEBHOOKS_CA_FILE": str(ca_file),
        "INBOXD_WEBHOOKS_ALLOW_PRIVATE_HOSTS": "true",
    }


def prepare(data: Path, receiver_url: str, events: int) -> tuple[str, str, str, str]:
    """A store with the webhook saved and ``events`` deliverable events waiting."""
    from inboxd.store import accounts, actions, webhooks
    from inboxd.store.db import Store
    from inboxd.timeutil import now_us

    key, conv, channel_id = build_store(data)
    store = Store.open(data, readers=1)
    try:
        who = store.read_sync(accounts.authenticate, key)
        assert who is not None
        saved = store.write_sync(webhooks.put, who.account_pk, receiver_url, now_us())
        assert saved.secret is not None

        def backlog(conn: Any) -> None:
            for i in range(events):
                actions.rename(conn, who, conv, f"backlog {i}", now_us())

        store.write_sync(backlog)
    finally:
        store.close()
    return key, conv, channel_id, saved.secret


def ceiling_client(url: str, ca_file: str, secret: str, count: int) -> None:
    """``python -m bench.delivery URL CA SECRET COUNT``: sequential signed POSTs, print the rate."""
    body = json.dumps(
        {
            "id": "evt_ceiling",
            "type": "inbox.conversation.title_changed",
            "createdAt": "2026-11-22T00:00:00.000000Z",
            "data": {"conversationId": "conv_x", "channelId": "ch_x", "title": "x" * 20},
        }
    ).encode()

    async def main() -> float:
        # httpx's leanest sequential POST: the transport itself, as inboxd's post_event uses it
        # (AsyncClient.send's machinery costs a fifth of each POST's CPU).
        timeout = httpx.Timeout(30).as_dict()
        async with httpx.AsyncHTTPTransport(verify=ca_file) as transport:
            started = time.perf_counter()
            for i in range(count):
                signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
                request = httpx.Request(
                    "POST",
                    url,
                    content=body,
                    headers={
                        "Content-Type": "application/json",
                        "X-Svc-Event": "inbox.conversation.title_changed",
                        "X-Svc-Delivery": f"dlv_{i}",
                        "X-Svc-Signature": signature,
                    },
                    extensions={"timeout": timeout},
                )
                response = await transport.handle_async_request(request)
                await response.aread()
                await response.aclose()
                assert response.status_code == 200
            return count / (time.perf_counter() - started)

    print(trio.run(main))


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        ca_file, cert_file, key_file = make_certs(Path(tmp))
        rport = free_port()
        receiver_url = f"https://127.0.0.1:{rport}/hook"
        data = Path(tmp) / "data"
        key, conv, _, secret = prepare(data, receiver_url, args.events)
        receiver = Receiver(secret, rport, cert_file, key_file)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        figures: dict[str, Any] = {}

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                await nursery.start(receiver.run)
                # The backlog: from the first receipt to the last.
                cpu_before = thread_cpu_seconds(receiver.pid)
                daemon = start(
                    ["-m", "inboxd", "serve", "--data", str(data), "--bind", f"127.0.0.1:{port}"],
                    daemon_env(ca_file),
                )
                try:
                    with trio.fail_after(600):
                        await receiver.wait_for(args.events)
                    figures["receiver_cpu_s"] = (
                        thread_cpu_seconds(receiver.pid) - cpu_before
                    ) / args.events
                    times = sorted(receiver.arrivals.values())
                    figures["backlog_per_s"] = (len(times) - 1) / (times[-1] - times[0])
                    await trio.to_thread.run_sync(wait_http, f"{base}/readyz")
                    figures.update(await idle_latency(base, key, conv, receiver, args.rounds))
                finally:
                    daemon.terminate()
                    await trio.to_thread.run_sync(daemon.wait, 15)
                # The ceiling: a bare sequential client in its own process, same receiver.
                cpu_before = thread_cpu_seconds(receiver.pid)
                out = await trio.run_process(
                    [
                        sys.executable,
                        "-m",
                        "bench.delivery",
                        receiver_url,
                        str(ca_file),
                        secret,
                        str(args.events),
                    ],
                    cwd=ROOT,
                    capture_stdout=True,
                )
                figures["receiver_cpu_ceiling_s"] = (
                    thread_cpu_seconds(receiver.pid) - cpu_before
                ) / args.events
                figures["ceiling_per_s"] = float(out.stdout.decode().strip())
                nursery.cancel_scope.cancel()

        trio.run(main)
        figures["bad_signatures"] = receiver.bad_signatures

    def ms(v: float) -> str:
        return f"{v * 1000:.1f} ms"

    rate, ceiling = figures["backlog_per_s"], figures["ceiling_per_s"]
    req, resp = figures["from_request"], figures["from_response"]
    rows = [
        ("figure", "inboxd", "beside it"),
        (
            f"deliveries/s (backlog of {args.events:,})",
            f"{rate:,.0f}",
            f"bare sequential client {ceiling:,.0f}/s: {rate / ceiling:.0%}; target >= 500/s",
        ),
        (
            "request -> receipt p50, idle",
            ms(pct(req, 0.5)),
            f"{args.rounds} changes, one at a time",
        ),
        ("request -> receipt p99, idle", ms(pct(req, 0.99)), "target < 50 ms"),
        ("response -> receipt p50 / p99", f"{ms(pct(resp, 0.5))} / {ms(pct(resp, 0.99))}", ""),
        (
            "receiver CPU per request",
            f"{figures['receiver_cpu_s'] * 1e6:,.0f} us",
            f"{figures['receiver_cpu_ceiling_s'] * 1e6:,.0f} us for the bare client's",
        ),
        ("bad signatures", str(figures["bad_signatures"]), "must be 0"),
    ]
    report(
        "delivery",
        rows,
        {
            "args": vars(args),
            "figures": {
                "backlog_per_s": rate,
                "ceiling_per_s": ceiling,
                "request_to_receipt": {"p50": pct(req, 0.5), "p99": pct(req, 0.99)},
                "response_to_receipt": {"p50": pct(resp, 0.5), "p99": pct(resp, 0.99)},
                "receiver_cpu_per_request_s": figures["receiver_cpu_s"],
                "receiver_cpu_per_ceiling_request_s": figures["receiver_cpu_ceiling_s"],
                "bad_signatures": figures["bad_signatures"],
            },
        },
    )
    return 0 if figures["bad_signatures"] == 0 else 1


async def idle_latency(
    base: str, key: str, conv: str, receiver: Receiver, rounds: int
) -> dict[str, list[float]]:
    from_request: list[float] = []
    from_response: list[float] = []
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as api:
        for i in range(rounds):
            title = f"idle {i} {time.time_ns()}"
            t0 = time.monotonic()  # (the receiver's clock)
            response = await api.patch(
                f"/api/v1/inbox/conversations/{conv}/title", json={"title": title}
            )
            t1 = time.monotonic()
            assert response.status_code == 200, response.text
            with trio.fail_after(30):
                while title not in receiver.titles:
                    await receiver.changed.wait()
            at = receiver.titles[title]
            from_request.append(at - t0)
            from_response.append(at - t1)
            await trio.sleep(0.02)
    return {"from_request": from_request, "from_response": from_response}


if __name__ == "__main__":
    ceiling_client(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
