"""The conversation JSON that SQLite builds for list pages and search (conversations.load_json)
is exactly what wire.conversation builds from the model, for any stored values."""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inboxd import wire
from inboxd.store import accounts, conversations, messages
from inboxd.store.db import Store
from inboxd.timeutil import MAX_US
from tests.conftest import Seed, seed_store

# Any text the store can hold: every code point but surrogates (CONTRACT section 3 rejects them).
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
maybe_text = st.none() | text
instant = st.integers(min_value=0, max_value=MAX_US)


def _open() -> tuple[Store, Seed, str]:
    """One store for every example (seeding a store per example is slow); each example
    overwrites the same conversation."""
    tmp = tempfile.mkdtemp(prefix="inboxd-wire-")
    seed = seed_store(Path(tmp) / "data")
    store = Store.open(seed.data_dir, readers=1)
    who = store.read_sync(accounts.authenticate, seed.owner_key)
    assert who is not None
    new = messages.NewMessage(
        channel_id=seed.sales_id,
        direction="INBOUND",
        phone_number="4915100000",
        contact_name="x",
        contact_avatar=None,
        type="TEXT",
        content="hello",
    )
    conv_id = store.write_sync(messages.ingest, who, new, 1).message.conversation_id
    store.write_sync(messages.ingest, who, new, 2)  # a second message, to quote the first
    return store, seed, conv_id


@pytest.fixture(scope="module", autouse=True)
def _store() -> Iterator[None]:
    global _STORE
    _STORE = _open()
    yield
    _STORE[0].close()
    shutil.rmtree(_STORE[0].data_dir.parent, ignore_errors=True)


_STORE: tuple[Store, Seed, str]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    contact_name=text,
    contact_avatar=text,
    phone=st.text("0123456789+", min_size=1, max_size=16),
    title=maybe_text,
    tags=st.lists(text, max_size=3),
    preview=maybe_text,
    kinds=st.tuples(maybe_text, maybe_text, maybe_text),
    unread=st.integers(min_value=0, max_value=2**40),
    blocked=st.booleans(),
    assignee=st.none() | st.tuples(text, maybe_text),
    times=st.tuples(st.none() | instant, st.none() | instant, instant, instant, instant),
)
def test_sql_json_matches_the_wire_module(
    contact_name: str,
    contact_avatar: str,
    phone: str,
    title: str | None,
    tags: list[str],
    preview: str | None,
    kinds: tuple[str | None, str | None, str | None],
    unread: int,
    blocked: bool,
    assignee: tuple[str, str | None] | None,
    times: tuple[int | None, int | None, int, int, int],
) -> None:
    store, seed, conv_id = _STORE
    last_at, customer_at, sort_at, created_at, updated_at = times

    def arrange(conn: sqlite3.Connection) -> int:
        pk, contact_pk = conn.execute(
            "SELECT pk, contact_pk FROM conversations WHERE id = ?", (conv_id,)
        ).fetchone()
        conn.execute(
            "UPDATE contacts SET name = ?, avatar = ?, phone_number = ? WHERE pk = ?",
            (contact_name, contact_avatar, phone, contact_pk),
        )
        user_pk = None
        if assignee is not None:
            user_pk = conn.execute("SELECT pk FROM users WHERE id = ?", (seed.ann_id,)).fetchone()[
                0
            ]
            conn.execute(
                "UPDATE users SET name = ?, avatar = ? WHERE pk = ?",
                (*assignee, user_pk),
            )
        conn.execute(
            "UPDATE conversations SET title = ?, tags = ?, last_message_preview = ?,"
            " last_message_type = ?, last_message_direction = ?,"
            " last_message_status = ?, unread_count = ?, is_blocked = ?,"
            " assigned_to_pk = ?, last_message_at = ?, last_customer_message_at = ?,"
            " sort_at = ?, created_at = ?, updated_at = ? WHERE pk = ?",
            (
                title,
                json.dumps(tags),
                preview,
                *kinds,
                unread,
                int(blocked),
                user_pk,
                last_at,
                customer_at,
                sort_at,
                created_at,
                updated_at,
                pk,
            ),
        )
        return int(pk)

    pk = store.write_sync(arrange)
    from_sql = store.read_sync(lambda c: conversations.load_json(c, [pk]))
    from_model = store.read_sync(conversations.load, [pk])
    built = [wire.conversation(c, with_contact=True) for c in from_model]
    assert json.loads(from_sql) == built
    who = store.read_sync(accounts.authenticate, seed.owner_key)
    # What list pages serve: the same text, from conversation_wire.
    page = store.read_sync(conversations.list_page_json, who, conversations.ListQuery(limit=200))
    assert [c for c in json.loads(page.rows.json) if c["id"] == conv_id] == built
    one = store.read_sync(conversations.get_json, who, conv_id)
    assert json.loads(one) == wire.conversation(from_model[0], with_contact=True)


finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(maybe_text, min_size=12, max_size=12),
    file_size=st.none() | st.integers(min_value=0, max_value=2**53),
    floats=st.tuples(st.none() | finite, st.none() | finite, st.none() | finite),
    times=st.tuples(st.none() | instant, st.none() | instant, st.none() | instant, instant),
    # The store writes only names, ids and nulls here (actions._ref); integers past 64 bits,
    # which SQLite's JSON turns into doubles, never reach this column.
    assignment=st.none()
    | st.dictionaries(
        text, st.none() | text | st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=3
    ),
    author=st.booleans(),
    quoted=st.booleans(),
)
def test_message_sql_json_matches_the_wire_module(
    texts: list[str | None],
    file_size: int | None,
    floats: tuple[float | None, float | None, float | None],
    times: tuple[int | None, int | None, int | None, int],
    assignment: dict[str, object] | None,
    author: bool,
    quoted: bool,
) -> None:
    store, seed, conv_id = _STORE

    def arrange(conn: sqlite3.Connection) -> int:
        pk, quoted_pk = (
            r[0]
            for r in conn.execute(
                "SELECT m.pk FROM messages m JOIN conversations c ON c.pk = m.conversation_pk"
                " WHERE c.id = ? ORDER BY m.pk LIMIT 2",
                (conv_id,),
            )
        )
        author_pk = conn.execute("SELECT pk FROM users WHERE id = ?", (seed.ann_id,)).fetchone()[0]
        conn.execute(
            "UPDATE messages SET content = ?, media_url = ?, media_type = ?, file_name = ?,"
            " thumbnail_url = ?, template_name = ?, template_language = ?, status = ?,"
            " external_id = ?, system_event_source = ?, system_event_operator_name = ?,"
            " system_event_operator_email = ?, file_size = ?, media_duration = ?, latitude = ?,"
            " longitude = ?, sent_at = ?, delivered_at = ?, read_at = ?, created_at = ?,"
            " assignment_event = ?, author_user_pk = ?, quoted_message_pk = ? WHERE pk = ?",
            (
                *texts,
                file_size,
                *floats,
                *times,
                None if assignment is None else json.dumps(assignment),
                author_pk if author else None,
                quoted_pk if quoted else None,
                pk,
            ),
        )
        return int(pk)

    pk = store.write_sync(arrange)
    who = store.read_sync(accounts.authenticate, seed.owner_key)
    page = store.read_sync(messages.history_json, who, conv_id, "all", 200, None)
    from_model = store.read_sync(lambda c: messages.load_one(c, pk))
    from_sql = [m for m in json.loads(page.json) if m["id"] == from_model.id]
    assert from_sql == [wire.message(from_model)]
