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
many rows share one timestamp. Messages are numbered in the order of their times across all
conversations, as live traffic numbers them (``import_history``). The keys the benchmarks use
are written to DIR/bench.json.
"""

from __future__ import annotations

import argparse
import array
import itertools
import json
import random
import sqlite3
import sys
import time
from pathlib import Path
from typing import Final

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


# A message's status as imported, by its direction.
_STATUS_OF: Final = {"INBOUND": "RECEIVED", "OUTBOUND": "READ"}


def import_history(
    path: Path, info: dict[str, object], conversations: int, messages: int, rng: random.Random
) -> None:
    """Contacts, conversations and their messages, in three passes.

    Messages are numbered (their ``pk``, which orders the table and their ids) in the order of
    their times across all conversations, as live traffic numbers them, and not conversation
    by conversation (as until the forty-first session): a conversation's messages then lie
    among other conversations' in the table, as in a store filled over time (ten million
    messages over two years put about two thousand others between two of one conversation's
    that are hours apart, by reckoning). The history page's figures did not move with it
    (bench/HISTORY.md, forty-first session, item 5).

    1. Each conversation's channel, contact, size, message times and directions (contacts
       inserted as they come); then every message's place in time (the total exactly as
       asked, where there are at least as many messages as conversations).
    2. The messages in that order, a batch at a time.
    3. The conversations, with their last messages."""
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
    batch = 5000

    # 1. Per conversation (index c, pk c + 1): its channel, start, status, assignee; per
    # message (in the order made, a conversation's together): its time, conversation and
    # direction. Compact arrays: ten million messages.
    conv_channel = array.array("i")
    conv_start = array.array("q")
    conv_open = array.array("b")
    conv_assignee: list[int | None] = []
    conv_unread = array.array("i")  # (its trailing inbound messages, open or not)
    conv_imported = array.array("b")
    conv_last_at = array.array("q")
    msg_at = array.array("q")
    msg_conv = array.array("i")
    msg_inbound = array.array("b")
    started = time.perf_counter()
    for first in range(0, conversations, batch):
        contacts = []
        for c in range(first, min(first + batch, conversations)):
            channel_pk = rng.choices(channel_pks, cum_weights=cum_weights)[0]
            imported = rng.random() < 0.33
            start = now - rng.randint(0, 2 * YEAR_US)
            if imported:
                start -= start % HOUR_US
            contacts.append(
                (c + 1, _id("ct", c + 1, rng), account_pk, channel_pk, text.phone(), text.name(),
                 "", start, start)
            )  # fmt: skip
            left = conversations - c - 1  # (each of them gets one message at least)
            count = max(1, round(rng.expovariate(1 / per_conversation)))
            count = min(count, max(1, messages - len(msg_at) - left))
            at = start
            unread = 0
            for _ in range(count):
                if not imported:
                    at += rng.randint(1, 6 * 3600) * 1_000_000
                inbound = rng.random() < 0.55
                unread = unread + 1 if inbound else 0
                msg_at.append(at)
                msg_conv.append(c)
                msg_inbound.append(inbound)
            is_open = rng.random() >= 0.6
            candidates = access.get(channel_pk, [])
            assignee = None
            if rng.random() < 0.5:
                assignee = rng.choice(candidates) if candidates and rng.random() < 0.9 else owner_pk
            conv_channel.append(channel_pk)
            conv_start.append(start)
            conv_open.append(is_open)
            conv_assignee.append(assignee)
            conv_unread.append(unread)
            conv_imported.append(imported)
            conv_last_at.append(at)
        conn.execute("BEGIN")
        # In the contact search index's key order (schema v19, as for messages below).
        contacts.sort(key=lambda c: (c[3], -c[0]))
        conn.executemany("INSERT INTO contacts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", contacts)
        conn.execute("COMMIT")
        _progress(len(conv_start), conversations, started, "contacts, and when each message comes")
    print(file=sys.stderr)
    # Sizes drawn that fell short of the total asked: one message more for as many
    # conversations drawn at random, each its newest.
    for _ in range(messages - len(msg_at)):
        c = rng.randrange(conversations)
        at = conv_last_at[c] + (0 if conv_imported[c] else rng.randint(1, 6 * 3600) * 1_000_000)
        inbound = rng.random() < 0.55
        conv_last_at[c] = at
        conv_unread[c] = conv_unread[c] + 1 if inbound else 0
        msg_at.append(at)
        msg_conv.append(c)
        msg_inbound.append(inbound)
    # A message's pk is its rank in time (ties in the order made: a conversation's messages
    # that share a time keep theirs, an extra one above comes after them). The sort's list
    # peaks at about 0.75 GB for ten million messages; kept as an array, 40 MB.
    order = array.array("i", sorted(range(len(msg_at)), key=msg_at.__getitem__))

    # 2. The messages, in pk order, a batch at a time.
    total = len(order)
    last: list[tuple[int, int, str, str] | None] = [None] * conversations
    started = time.perf_counter()
    for first in range(0, total, batch * 10):
        msgs = []
        for pk in range(first + 1, min(first + batch * 10, total) + 1):
            m = order[pk - 1]
            c = msg_conv[m]
            direction = "INBOUND" if msg_inbound[m] else "OUTBOUND"
            content = text.message()
            at = msg_at[m]
            msgs.append(
                (pk, _id("msg", pk, rng), account_pk, c + 1, conv_channel[c], direction, "TEXT", 0,
                 content, _STATUS_OF[direction], at)
            )  # fmt: skip
            last[c] = (pk, at, content[:200], direction)  # (the last one made stays)
        # In the message search index's key order (schema v18: channel, then message newest
        # first): FTS5 writes out what it holds each time that key goes down, so messages of
        # random channels one after the other, or one channel's messages oldest first, would
        # write a segment for nearly every message.
        msgs.sort(key=lambda m: (m[4], -m[0]))
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO messages (pk, id, account_pk, conversation_pk, channel_pk, direction,"
            " type, is_system, content, status, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            msgs,
        )
        conn.execute("COMMIT")
        _progress(first + len(msgs), total, started, "messages")
    print(file=sys.stderr)
    del order, msg_at, msg_conv, msg_inbound

    # 3. The conversations.
    started = time.perf_counter()
    for first in range(0, conversations, batch):
        convs = []
        for c in range(first, min(first + batch, conversations)):
            last_pk, last_at, preview, direction = last[c]  # type: ignore[misc]  # (one each)
            convs.append(
                (c + 1, _id("conv", c + 1, rng), account_pk, conv_channel[c], c + 1,
                 "OPEN" if conv_open[c] else "CLOSED", conv_assignee[c],
                 conv_unread[c] if conv_open[c] else 0, last_pk, last_at, preview, "TEXT",
                 direction, _STATUS_OF[direction], last_at, last_at, conv_start[c], last_at)
            )  # fmt: skip
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO conversations (pk, id, account_pk, channel_pk, contact_pk, status,"
            " assigned_to_pk, unread_count, last_message_pk, last_message_at,"
            " last_message_preview, last_message_type, last_message_direction,"
            " last_message_status, last_customer_message_at, sort_at, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            convs,
        )
        conn.execute("COMMIT")
        _progress(first + len(convs), conversations, started, "conversations")
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
