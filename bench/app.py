"""The app's own cost per request, in-process: inboxd's quart-trio app called as ASGI, no sockets.

``bench http`` measures whole requests, where hypercorn, h11, trio's sockets and the kernel
take most of the trio thread's time and the machine's noise hides a few microseconds. This
calls the app the daemon serves (``create_app`` on the given store) with an ASGI scope, one
request at a time, and times the thread's CPU per request; each figure is the minimum over
``--rounds`` rounds of ``--requests`` requests (the least disturbed round). Beside the API's
reads it adds to the same app a bare 1 KB JSON route (at the app, in a blueprint, and in a
blueprint behind the API's key check), so the table shows what each layer adds (the API's reads:
read one, counts, the first list page and a history page); and times the
bare quart-trio app of ``bench http``'s ceiling (``bench/bare.py``) called the same way, the
store's read of one conversation and the key cache's hit alone, the first list page read at the
store as the route reads it and as it read it before the twentieth session (two statements),
and its rows' stored JSON read and encoded as bytes (since the twelfth session) and as text
(before it).

The store is only read (GET requests; the key's lastUsedAt stays in memory).
"""

from __future__ import annotations

import argparse
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import orjson
import trio
from quart import Blueprint

from bench.bare import app as bare
from bench.common import report
from bench.http import pick
from inboxd.api.app import AppState, authenticate, create_app
from inboxd.config import Config
from inboxd.ids import hash_api_key
from inboxd.model import Principal
from inboxd.store import conversations
from inboxd.store.db import Store

BARE = "1 KB JSON, the bare quart-trio app (bench/bare.py)"
_KB_OF_JSON = {"items": [{"id": f"item_{i:04d}", "name": "x" * 20} for i in range(19)]}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="a store from 'bench generate' (only read)")
    p.add_argument("--requests", type=int, default=400, help="requests per round (400)")
    p.add_argument("--rounds", type=int, default=12, help="rounds; the minimum is kept (12)")


def _scope(path: str, headers: list[tuple[bytes, bytes]], query: bytes = b"") -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": [(b"host", b"bench"), *headers],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 80),
        "extensions": {},
        "state": {},
    }


async def _measure(args: argparse.Namespace) -> dict[str, float]:
    data = Path(args.data)
    ids = pick(data)
    config = Config.load(None, {"INBOXD_LIMITS_REQUESTS_PER_SECOND": "0"})
    store = Store.open(data)
    try:
        app = create_app(store, config)

        @app.get("/bench/kb")
        async def kb() -> dict[str, object]:
            return _KB_OF_JSON

        plain = Blueprint("bench_plain", __name__, url_prefix="/api/v1/bench-plain")
        keyed = Blueprint("bench_keyed", __name__, url_prefix="/api/v1/bench-keyed")
        keyed.before_request(authenticate)
        for blueprint in (plain, keyed):
            blueprint.get("/kb")(kb)
            app.register_blueprint(blueprint)
        await app.startup()
        key = [(b"authorization", f"Bearer {ids['key']}".encode())]
        conversation = ids["conversations"][0]

        await bare.startup()

        async def call(scope: dict[str, Any], to: Any = app) -> list[dict[str, Any]]:
            sent: list[dict[str, Any]] = []
            messages = [{"type": "http.request", "body": b"", "more_body": False}]

            async def receive() -> dict[str, Any]:
                if messages:
                    return messages.pop()
                await trio.sleep_forever()
                raise AssertionError("unreachable")

            async def send(message: dict[str, Any]) -> None:
                sent.append(message)

            await to(scope, receive, send)
            return sent

        routes = {
            "1 KB JSON, a route of inboxd's app": _scope("/bench/kb", []),
            "1 KB JSON, in a blueprint": _scope("/api/v1/bench-plain/kb", key),
            "1 KB JSON, in a blueprint with the key check": _scope("/api/v1/bench-keyed/kb", key),
            "read one": _scope(f"/api/v1/inbox/conversations/{conversation}", key),
            "counts": _scope("/api/v1/inbox/conversations/counts", key),
            "list page (50)": _scope("/api/v1/inbox/conversations", key),
            "history page (50)": _scope(
                f"/api/v1/inbox/conversations/{conversation}/messages", key
            ),
        }
        bare_scope = _scope("/ceiling", [])
        if (await call(bare_scope, bare))[0]["status"] != 200:
            raise RuntimeError("bench app: the bare app's /ceiling did not answer 200")
        for name, scope in routes.items():
            status = (await call(scope))[0]["status"]
            if status != 200:
                raise RuntimeError(f"bench app: {name} answered {status}")
        state: AppState = app.extensions["inboxd"]
        who = await state.keys.lookup(ids["key"])

        async def read_one() -> None:
            await store.read(conversations.get_json, who, conversation)

        async def lookup() -> None:  # what authenticate asks first: hash the key, then the cache
            if state.keys.cached(hash_api_key(ids["key"])) is None:
                raise RuntimeError("bench app: the key is not in the key cache")

        timed: dict[str, Callable[[], Awaitable[Any]]] = {BARE: lambda: call(bare_scope, bare)}
        timed.update({name: (lambda scope=scope: call(scope)) for name, scope in routes.items()})
        timed["the store's read of one conversation, alone"] = read_one
        timed["the key's hash and the key cache's hit (KeyCache.cached), alone"] = lookup
        # The first list page at the store, as the route reads it (one statement, since the
        # twentieth session) and as it was read before (the keys, then their JSON); then its
        # rows' stored JSON read and encoded into the answer as UTF-8 bytes (as the route does
        # since the twelfth session) and as text (decoded into a str, joined, encoded again):
        # the same for ASCII, dearer for text beyond it.
        first_page = conversations.ListQuery(limit=50)
        timed["the first list page read at the store (list_page_json), alone"] = lambda: store.read(
            conversations.list_page_json, who, first_page
        )
        timed["the same in two statements (before the twentieth session), alone"] = lambda: (
            store.read(_page_in_two_statements, who, first_page)
        )
        page_pks = store.read_sync(_page_pks, who, first_page)
        as_text = store.read_sync(_page_rows, page_pks, "json")
        beyond = "" if as_text.isascii() else ", text beyond ASCII"
        as_bytes = f"the first list page's rows read and encoded as bytes{beyond}, alone"
        timed[as_bytes] = lambda: _encode_page(
            store.read_sync(_page_rows, page_pks, "CAST(json AS BLOB)")
        )
        timed[f"the same as text (before the twelfth session){beyond}, alone"] = lambda: (
            _encode_page(store.read_sync(_page_rows, page_pks, "json"))
        )
        best = dict.fromkeys(timed, float("inf"))
        for _ in range(args.rounds):
            for name, fn in timed.items():
                started = time.thread_time()
                for _ in range(args.requests):
                    await fn()
                best[name] = min(best[name], (time.thread_time() - started) / args.requests)
        return {name: seconds * 1e6 for name, seconds in best.items()}
    finally:
        store.close()


def _page_pks(conn: sqlite3.Connection, who: Principal, q: conversations.ListQuery) -> list[int]:
    """The page's pks, from the keys' query the route runs (it asks one more than the page)."""
    query = conversations._page_keys_sql(conn, who, q)
    return [] if query is None else [r[1] for r in conn.execute(*query).fetchall()[: q.limit]]


def _page_in_two_statements(
    conn: sqlite3.Connection, who: Principal, q: conversations.ListQuery
) -> bytes:
    """The page's JSON as the route read it from the eleventh session to the twentieth: its
    keys, then their stored JSON in a second statement."""
    return cast(bytes, _page_rows(conn, _page_pks(conn, who, q), "CAST(json AS BLOB)"))


def _page_rows(conn: sqlite3.Connection, pks: list[int], column: str) -> Any:
    """The rows' stored JSON as one array, read as the list page read it from the eleventh
    session to the twentieth (one IN (...) lookup, mapped back to the keys' order): as
    ``CAST(json AS BLOB)`` (bytes) or as ``json`` (text, before the twelfth session)."""
    cursor = conn.cursor()
    cursor.row_factory = None
    marks = ",".join("?" * len(pks))
    found = dict(
        cursor.execute(f"SELECT pk, {column} FROM conversation_wire WHERE pk IN ({marks})", pks)
    )
    parts = [found[pk] for pk in pks if pk in found]
    return (b"[" + b",".join(parts) + b"]") if column != "json" else "[" + ",".join(parts) + "]"


async def _encode_page(rows: bytes | str) -> bytes:
    return orjson.dumps({"data": orjson.Fragment(rows), "pagination": {"hasMore": True}})


def run(args: argparse.Namespace) -> int:
    us = trio.run(_measure, args)
    base = us["1 KB JSON, a route of inboxd's app"]
    rows = [("figure", "us", "thread CPU per call, minimum of the rounds; beside the 1 KB route")]
    for name, value in us.items():
        plain = name.endswith("alone") or name in (BARE, "1 KB JSON, a route of inboxd's app")
        note = "" if plain else f"{value - base:+.1f} us"
        rows.append((name, f"{value:.1f}", note))
    report("app", rows, {"args": vars(args), "us": us})
    return 0
