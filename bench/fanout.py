"""A model of the feed's fan-out on one trio thread: the scheduler's passes and what a request waits.

No sockets: N ``FeedClient`` tasks wait on their queues; one event is offered to all of them
(``FeedClient.offer``, as the hub does after a commit), and each, as the feed's route does, takes
its turn (``FeedClient.take_turn``) and then "writes" its frame: ``--write-steps`` steps of
``--step-us`` of CPU each, with a checkpoint between them (a frame's write through Quart,
hypercorn and the socket is a few steps of about 100 us in all). Beside them a "request" of
``--request-steps`` checkpoints starts at the same moment: how long it takes is what an API
request on the same thread waits for the fan-out. A trio Instrument times each pass of the
scheduler (one I/O check per pass). Run with the feed's turns (``SEND_TURNS``) and without (as
many turns as clients); each figure is the median over ``--rounds``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, cast

import trio

from bench.common import report
from inboxd.feed import SEND_TURNS, FeedClient, FeedEvent


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clients", type=int, default=1000, help="feed clients (1000)")
    p.add_argument("--rounds", type=int, default=5, help="fan-outs per setting (5)")
    p.add_argument("--write-steps", type=int, default=4, help="steps of a frame's write (4)")
    p.add_argument("--step-us", type=float, default=25.0, help="CPU per step, us (25)")
    p.add_argument("--request-steps", type=int, default=10, help="steps of a request (10)")


class Passes(trio.abc.Instrument):
    def __init__(self) -> None:
        self.at: list[float] = []

    def after_io_wait(self, timeout: float) -> None:
        self.at.append(time.perf_counter())


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def fan_out(args: argparse.Namespace, turns: int) -> dict[str, float]:
    """One event to every client; the scheduler's passes and the request's wait, in ms."""
    semaphore = trio.Semaphore(turns)
    clients = [FeedClient(cast(Any, None), 10, semaphore) for _ in range(args.clients)]
    written = 0
    all_written = trio.Event()

    async def client_task(client: FeedClient) -> None:
        nonlocal written
        async for _ in client.events:
            await client.take_turn()
            for _ in range(args.write_steps):
                busy(args.step_us / 1e6)
                await trio.lowlevel.checkpoint()
            written += 1
            if written == len(clients):
                all_written.set()

    async def request(out: list[float], done: trio.Event) -> None:
        started = time.perf_counter()
        for _ in range(args.request_steps):
            await trio.lowlevel.checkpoint()
        out.append(time.perf_counter() - started)
        done.set()

    event = FeedEvent(1, 1, None, "inbox.message.created", 0, "{}")
    waited: list[float] = []
    answered = trio.Event()
    async with trio.open_nursery() as nursery:
        for client in clients:
            nursery.start_soon(client_task, client)
        await trio.sleep(0.05)  # every client waits on its queue
        passes = Passes()
        trio.lowlevel.add_instrument(passes)
        started = time.perf_counter()
        for client in clients:
            client.offer(event)
        nursery.start_soon(request, waited, answered)
        await all_written.wait()
        took = time.perf_counter() - started
        await answered.wait()
        trio.lowlevel.remove_instrument(passes)
        nursery.cancel_scope.cancel()
    gaps = [b - a for a, b in zip(passes.at, passes.at[1:], strict=False)] or [0.0]
    return {
        "fan_out_ms": took * 1000,
        "passes": float(len(passes.at)),
        "first_pass_ms": gaps[0] * 1000,
        "median_pass_ms": statistics.median(gaps) * 1000,
        "longest_pass_ms": max(gaps) * 1000,
        "request_ms": waited[0] * 1000,
    }


def run(args: argparse.Namespace) -> int:
    figures: dict[str, dict[str, float]] = {}
    for name, turns in (("turns", SEND_TURNS), ("no turns", args.clients)):
        rounds = [trio.run(fan_out, args, turns) for _ in range(args.rounds)]
        figures[name] = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}

    def row(label: str, key: str, unit: str = "ms") -> tuple[str, str, str]:
        mine, theirs = figures["turns"][key], figures["no turns"][key]
        fmt = "{:.0f}" if unit == "" else "{:.2f} ms"
        return (label, fmt.format(mine), f"without turns {fmt.format(theirs)}")

    rows = [
        ("clients", f"{args.clients:,}", f"{SEND_TURNS} turns; medians of {args.rounds} fan-outs"),
        row("a request's wait", "request_ms"),
        row("the whole fan-out", "fan_out_ms"),
        row("passes of the scheduler", "passes", ""),
        row("the first pass", "first_pass_ms"),
        row("a pass (median)", "median_pass_ms"),
        row("the longest pass", "longest_pass_ms"),
    ]
    report("fanout", rows, {"args": vars(args), "figures": figures})
    return 0
