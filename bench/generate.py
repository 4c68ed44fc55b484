"""Build a big store for the benchmarks: conversations, messages, channels, operators.

Usage: ``python -m bench generate --data DIR [--conversations 1000000] [--messages 10000000]``.

Accounts, channels, operators and keys go through the store's own functions. Conversations,
contacts and messages go through a documented bulk import: plain INSERTs into the same tables in
large transactions, with the schema's triggers on (so the trigram indexes and the maintained
counters are built exactly as live traffic builds them) and ``synchronous=OFF`` while importing
(a crash mid-import means re-running it, as with any bulk load). History is not journaled: the
event journal holds changes, and an import is not one.

Text is realistic (chat phrases, real English words drawn Zipf-like, names, order numbers, phone
numbers); about a third of the conversations are "imported" with times rounded to the hour, so
many rows share one timestamp. The keys the benchmarks use are written to DIR/bench.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sqlite3
import sys
import time
from pathlib import Path

from bench.common import search_indexes_up_to_date
from bench.corpus import Text
from inboxd.store import accounts
from inboxd.store.db import Store, db_path, store_exists
from inboxd.timeutil import now_us

HOUR_US = 3600 * 1_000_000
YEAR_US = 365 * 24 * HOUR_US


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="directory for the new store")
    p.add_argument("--conversations", type=int, default=1_000_000)
    p.add_argument("--messages", type=int, default=10_000_000)
    p.add_argument("--channels", type=int, default=50)
    p.add_argument("--operators", type=int, default=200)
    p.add_argument("--seed", type=int, default=42)


def _progress(done: int, total: int, started: float, what: str) -> None:
    rate = done / max(time.perf_counter() - started, 1e-9)
    eta = (total - done) / rate if rate else 0
    print(
        f"\r  {what}: {done:,}/{total:,} ({done / total:.0%}), {rate:,.0f}/s, about {eta:,.0f} s left",
        end="",
        file=sys.stderr,
        flush=True,
    )


def build_people(
    store: Store, channels: int, operators: int, rng: random.Random
) -> dict[str, object]:
    def make(conn: sqlite3.Connection) -> dict[str, object]:
        now = now_us()
        owner = accounts.create_account(conn, "owner@example.com", "Olivia Owner", now)
        account_pk = accounts.the_account_pk(conn)
        made = [
            accounts.create_channel(conn, account_pk, f"Channel {i + 1}", "WHATSAPP", now)
            for i in range(channels)
        ]
        text = Text(rng)
        ops = []
        for i in range(operators):
            access = rng.sample(made, k=min(len(made), rng.randint(1, 5)))
            ops.append(
                accounts.create_operator(
                    conn,
                    account_pk,
                    f"operator{i}@example.com",
                    text.name(),
                    [c.id for c in access],
                    now,
                )
            )
        return {
            "accountPk": account_pk,
            "ownerKey": owner.api_key,
            "ownerUserId": owner.owner_user_id,
            "operatorKey": ops[0].api_key if ops else None,
            "operatorUserId": ops[0].user_id if ops else None,
            "channelIds": [c.id for c in made],
            "channelPks": [c.pk for c in made],
        }

    return store.write_sync(make)


def _id(prefix: str, pk: int, rng: random.Random) -> str:
    """An id in the usual shape whose order follows pk: the unique index grows at its end
    instead of taking random inserts, which is what makes a bulk import of millions fast."""
    return f"{prefix}_{pk:012x}{rng.getrandbits(32):08x}"


def import_history(
    path: Path, info: dict[str, object], conversations: int, messages: int, rng: random.Random
) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA cache_size = -1048576")  # 1 GiB while importing
    text = Text(rng)
    channel_pks: list[int] = info["channelPks"]  # type: ignore[assignment]
    account_pk = info["accountPk"]
    access = {}
    for user_pk, channel_pk in conn.execute("SELECT user_pk, channel_pk FROM channel_access"):
        access.setdefault(channel_pk, []).append(user_pk)
    owner_pk = conn.execute("SELECT pk FROM users WHERE role = 'OWNER'").fetchone()[0]
    # Channel sizes follow a long tail: the largest channel holds many conversations.
    cum_weights = list(itertools.accumulate(1 / (i + 1) ** 0.8 for i in range(len(channel_pks))))
    per_conversation = messages / conversations
    now = now_us()
    started = time.perf_counter()
    next_contact = next_conv = next_msg = 1
    made_messages = 0
    batch = 5000
    for first in range(0, conversations, batch):
        contacts, convs, msgs = [], [], []
        for _ in range(min(batch, conversations - first)):
            channel_pk = rng.choices(channel_pks, cum_weights=cum_weights)[0]
            imported = rng.random() < 0.33
            start = now - rng.randint(0, 2 * YEAR_US)
            if imported:
                start -= start % HOUR_US
            contact_pk, conv_pk = next_contact, next_conv
            next_contact += 1
            next_conv += 1
            phone = text.phone()
            contacts.append(
                (
                    contact_pk,
                    _id("ct", contact_pk, rng),
                    account_pk,
                    channel_pk,
                    phone,
                    text.name(),
                    "",
                    start,
                    start,
                )
            )
            remaining = conversations - first
            count = max(1, round(rng.expovariate(1 / per_conversation)))
            count = min(count, max(1, messages - made_messages - (remaining - 1)))
            at = start
            unread = 0
            last = None
            for _ in range(count):
                if not imported:
                    at += rng.randint(1, 6 * 3600) * 1_000_000
                direction = "INBOUND" if rng.random() < 0.55 else "OUTBOUND"
                unread = unread + 1 if direction == "INBOUND" else 0
                content = text.message()
                msgs.append(
                    (next_msg, _id("msg", next_msg, rng), account_pk, conv_pk, channel_pk, direction, "TEXT", 0,
                     content, "READ" if direction == "OUTBOUND" else "RECEIVED", at)
                )  # fmt: skip
                last = (next_msg, at, content[:200], direction)
                next_msg += 1
            made_messages += count
            status = "CLOSED" if rng.random() < 0.6 else "OPEN"
            candidates = access.get(channel_pk, [])
            assignee = None
            if rng.random() < 0.5:
                assignee = rng.choice(candidates) if candidates and rng.random() < 0.9 else owner_pk
            assert last is not None
            convs.append(
                (conv_pk, _id("conv", conv_pk, rng), account_pk, channel_pk, contact_pk, status, assignee,
                 unread if status == "OPEN" else 0, last[0], last[1], last[2], "TEXT", last[3],
                 "READ" if last[3] == "OUTBOUND" else "RECEIVED", last[1], last[1], start, last[1])
            )  # fmt: skip
        conn.execute("BEGIN")
        # In the contact search index's key order (schema v19, as for messages below).
        contacts.sort(key=lambda c: (c[3], -c[0]))
        conn.executemany("INSERT INTO contacts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", contacts)
        conn.executemany(
            "INSERT INTO conversations (pk, id, account_pk, channel_pk, contact_pk, status,"
            " assigned_to_pk, unread_count, last_message_pk, last_message_at,"
            " last_message_preview, last_message_type, last_message_direction,"
            " last_message_status, last_customer_message_at, sort_at, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            convs,
        )
        # In the message search index's key order (schema v18: channel, then message newest
        # first): FTS5 writes out what it holds each time that key goes down, so conversations
        # of random channels one after the other, or one channel's messages oldest first, would
        # write a segment for nearly every message.
        msgs.sort(key=lambda m: (m[4], -m[0]))
        conn.executemany(
            "INSERT INTO messages (pk, id, account_pk, conversation_pk, channel_pk, direction,"
            " type, is_system, content, status, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            msgs,
        )
        conn.execute("COMMIT")
        _progress(made_messages, messages, started, "messages")
    print(file=sys.stderr)
    conn.execute("PRAGMA optimize")
    conn.close()


def run(args: argparse.Namespace) -> int:
    data = Path(args.data)
    if store_exists(data):
        print(f"{data} already holds a store; pick a new directory", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    started = time.perf_counter()
    store = Store.open(data, create=True, readers=1)
    try:
        info = build_people(store, args.channels, args.operators, rng)
    finally:
        store.close()
    import_history(db_path(data), info, args.conversations, args.messages, rng)
    info.update(search_indexes_up_to_date(data))
    took = time.perf_counter() - started
    size = sum(p.stat().st_size for p in data.glob("inboxd.db*"))
    info.update(
        conversations=args.conversations,
        messages=args.messages,
        seconds=round(took, 1),
        bytes=size,
        bytesPerMillionMessages=round(size / max(args.messages, 1) * 1_000_000),
    )
    (data / "bench.json").write_text(json.dumps(info, indent=2))
    print(
        f"built {args.conversations:,} conversations and {args.messages:,} messages in {took:.0f} s;"
        f" {size / 2**30:.2f} GiB ({size / max(args.messages, 1) * 1e6 / 2**20:.0f} MiB per million"
        " messages)",
        file=sys.stderr,
    )
    return 0
