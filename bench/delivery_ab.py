"""Inbox webhook before and after: two versions draining the same backlog in turn, one receiver.

``bench delivery`` runs minutes apart on this machine differ by 20-30 % on their own, more than
most changes to the deliverer. This runs the baseline (a git revision, checked out into a
temporary worktree) and the working tree alternately, each on a fresh copy of one prepared store
(the webhook saved, ``--events`` events waiting), against one HTTPS receiver (bench/receiver.py), and
reads two figures for each pair:

- the daemon's main-thread CPU per delivery (``/proc``, over the middle of the backlog: past
  start-up, before the tail), which the machine's drift moves less than a rate;
- deliveries per second over the same stretch.

It prints each pair, the medians and the median of the paired ratios after / before.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench.common import ROOT, baseline_worktree, report, thread_cpu_seconds
from bench.delivery import daemon_env, make_certs, prepare
from bench.feed import free_port, start
from bench.receiver import Receiver


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--baseline", default="HEAD", help="the git revision to compare with (HEAD)")
    p.add_argument("--pairs", type=int, default=4, help="alternating runs per version (4)")
    p.add_argument("--events", type=int, default=5000, help="backlog per run (5000)")


def run(args: argparse.Namespace) -> int:
    skip = max(1, args.events // 10)  # start-up and the first deliveries
    tail = max(1, args.events // 25)  # the last ones, while the backlog runs out
    seen: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    with (
        tempfile.TemporaryDirectory() as tmp,
        baseline_worktree(args.baseline, Path(tmp) / "baseline") as baseline_src,
    ):
        ca_file, cert_file, key_file = make_certs(Path(tmp))
        rport = free_port()
        receiver_url = f"https://127.0.0.1:{rport}/hook"
        template = Path(tmp) / "template"
        _, _, _, secret = prepare(template, receiver_url, args.events)
        receiver = Receiver(secret, rport, cert_file, key_file)
        sources = {"before": baseline_src, "after": ROOT}

        async def one(who: str) -> None:
            data = Path(tmp) / "run"
            shutil.rmtree(data, ignore_errors=True)
            shutil.copytree(template, data)
            receiver.arrivals.clear()
            daemon = start(
                [
                    "-m",
                    "inboxd",
                    "serve",
                    "--data",
                    str(data),
                    "--bind",
                    f"127.0.0.1:{free_port()}",
                ],
                daemon_env(ca_file),
                cwd=sources[who],
            )
            try:
                with trio.fail_after(600):
                    await receiver.wait_for(skip)
                    cpu0, n0, t0 = (
                        thread_cpu_seconds(daemon.pid),
                        len(receiver.arrivals),
                        time.perf_counter(),
                    )
                    await receiver.wait_for(args.events - tail)
                    cpu1, n1, t1 = (
                        thread_cpu_seconds(daemon.pid),
                        len(receiver.arrivals),
                        time.perf_counter(),
                    )
            finally:
                daemon.terminate()
                await trio.to_thread.run_sync(daemon.wait, 15)
            count = n1 - n0
            seen[who].append(((cpu1 - cpu0) / count, count / (t1 - t0)))
            print(
                f"  {who:6s} {(cpu1 - cpu0) / count * 1e6:6.0f} us of main-thread CPU per"
                f" delivery, {count / (t1 - t0):5.0f}/s",
                flush=True,
            )

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                await nursery.start(receiver.run)
                for i in range(args.pairs):
                    for who in ("before", "after") if i % 2 == 0 else ("after", "before"):
                        await one(who)
                nursery.cancel_scope.cancel()

        trio.run(main)
        bad = receiver.bad_signatures

    def medians(k: int) -> dict[str, float]:
        return {who: statistics.median(x[k] for x in runs) for who, runs in seen.items()}

    def paired(k: int) -> float:
        return statistics.median(
            a[k] / b[k] for a, b in zip(seen["after"], seen["before"], strict=True)
        )

    cpu, rate = medians(0), medians(1)
    rows = [
        ("figure (median)", "before / after", "after / before (median of pairs)"),
        (
            "main-thread CPU per delivery",
            f"{cpu['before'] * 1e6:,.0f} / {cpu['after'] * 1e6:,.0f} us",
            f"x{paired(0):.3f}",
        ),
        ("deliveries/s", f"{rate['before']:,.0f} / {rate['after']:,.0f}", f"x{paired(1):.3f}"),
        ("bad signatures", str(bad), "must be 0"),
    ]
    figures: dict[str, Any] = {
        "cpu_per_delivery_s": cpu,
        "deliveries_per_s": rate,
        "cpu_ratio": paired(0),
        "rate_ratio": paired(1),
        "pairs": seen,
        "bad_signatures": bad,
    }
    report("delivery-ab", rows, {"args": vars(args), "figures": figures})
    return 0 if bad == 0 else 1
