"""The app's own cost per request, in-process: inboxd's quart-trio app called as ASGI, no sockets.

``bench http`` measures whole requests, where hypercorn, h11, trio's sockets and the kernel
take most of the trio thread's time and the machine's noise hides a few microseconds. This
calls the app the daemon serves (``create_app`` on the given store) with an ASGI scope, one
request at a time, and times the thread's CPU per request; each figure is the minimum over
``--rounds`` rounds of ``--requests`` requests (the least disturbed round). Beside the API's
reads it adds to the same app a bare 1 KB JSON route (at the app, in a blueprint, and in a
blueprint behind the API's key check), so the table shows what each layer adds (the API's reads:
read one, counts, the first list page plain and with ``bench http``'s two filters, and a history
page); and times the
bare quart-trio app of ``bench http``'s ceiling (``bench/bare.py``) called the same way, the
store's read of one conversation and the key cache's hit alone, the first list page read at the
store as the route reads it and as it read it before the twentieth session (two statements),
and its rows' stored JSON read and encoded as bytes (since the twelfth session) and as text
(before it); and read one as it was served before the thirty-sixth session (its key found in
the key cache by SHA-256, the URL map bound by Quart's own path), beside read one as it is;
and read one with its access-log line written to a file, as the daemon does at the default log
level (``bench http`` runs it at warning, without): held and written with the others of the
next 50 ms (``logs.hold_access_lines``, since the thirty-ninth session), written at once as
before, and made through a LogRecord and the standard library's JSON as before the
thirty-seventh session.

The store is only read (GET requests; the key's lastUsedAt stays in memory), unless
``--writes``: then four more rows call with 32 requests in flight at once, as ``bench http``'s
connections are, so that writes go in batches as they do served: the bare app's GET and its
PATCH with a small JSON body, read one, and a title write through the daemon's writer process
(the change, its SYSTEM message and its event, committed). The title writes rename the store's
200 most recent conversations of its largest channel (``bench http``'s write rows do the same)
and add a SYSTEM message and an event for each.
"""

from __future__ import annotations

import argparse
import json
import logging
import sqlite3
import tempfile
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
from inboxd.api import app as app_module
from inboxd.api.app import AppState, authenticate, create_app
from inboxd.config import Config
from inboxd.ids import hash_api_key
from inboxd.logs import JsonFormatter, JsonLinesHandler, hold_access_lines, log_request
from inboxd.model import Principal
from inboxd.store import conversations
from inboxd.store.db import Store
from inboxd.store.writer import WriterProcess

BARE = "1 KB JSON, the bare quart-trio app (bench/bare.py)"
BASE_ROUTE = "1 KB JSON, a route of inboxd's app"
AT_ONCE = 32  # requests in flight in the --writes rows, as bench http's connections
BARE_GET_AT_ONCE = f"{AT_ONCE} at once: the bare app's GET (1 KB JSON)"
BY_SHA256 = "read one, the key cache found by SHA-256 (before the thirty-sixth session)"
BOUND_BY_QUART = "read one, the URL map bound by Quart's path (before the thirty-sixth session)"
LOGGED = "read one, its access-log line held and written to a file (log level info, the default)"
LOGGED_AT_ONCE = "read one, that line written at once (before the thirty-ninth session)"
LOGGED_BY_RECORD = (
    "read one, that line made through a LogRecord (before the thirty-seventh session)"
)
_KB_OF_JSON = {"items": [{"id": f"item_{i:04d}", "name": "x" * 20} for i in range(19)]}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data", required=True, help="a store from 'bench generate' (only read, but --writes)"
    )
    p.add_argument("--requests", type=int, default=400, help="requests per round (400)")
    p.add_argument("--rounds", type=int, default=12, help="rounds; the minimum is kept (12)")
    p.add_argument(
        "--writes",
        action="store_true",
        help=f"also {AT_ONCE} requests at once, title writes among them (renames conversations)",
    )


def _scope(
    path: str, headers: list[tuple[bytes, bytes]], query: bytes = b"", method: str = "GET"
) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
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
    with tempfile.TemporaryFile("w") as log_file:  # the daemon's stderr, for the access log
        return await _measure_logging_to(args, log_file)


async def _measure_logging_to(args: argparse.Namespace, log_file: Any) -> dict[str, float]:
    data = Path(args.data)
    ids = pick(data)
    config = Config.load(None, {"INBOXD_LIMITS_REQUESTS_PER_SECOND": "0"})
    store = Store.open(data)
    if args.writes:  # as the daemon writes: in its writer process
        store.writer_process = WriterProcess(store.path)
        await store.writer_process.start()
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

        async def call(
            scope: dict[str, Any], to: Any = app, body: bytes = b""
        ) -> list[dict[str, Any]]:
            sent: list[dict[str, Any]] = []
            messages = [{"type": "http.request", "body": body, "more_body": False}]
            answered = trio.Event()

            async def receive() -> dict[str, Any]:
                # The body, then, as hypercorn does once the answer is out (its stream closes),
                # a disconnect: quart-trio's receiving task ends on it. Until the twenty-seventh
                # session this waited forever instead, and each request paid for cancelling it
                # (about 100 us), which no served request does.
                if messages:
                    return messages.pop()
                await answered.wait()
                return {"type": "http.disconnect"}

            async def send(message: dict[str, Any]) -> None:
                sent.append(message)
                if message["type"] == "http.response.body" and not message.get("more_body"):
                    answered.set()

            await to(scope, receive, send)
            return sent

        routes = {
            BASE_ROUTE: _scope("/bench/kb", []),
            "1 KB JSON, in a blueprint": _scope("/api/v1/bench-plain/kb", key),
            "1 KB JSON, in a blueprint with the key check": _scope("/api/v1/bench-keyed/kb", key),
            "read one": _scope(f"/api/v1/inbox/conversations/{conversation}", key),
            "counts": _scope("/api/v1/inbox/conversations/counts", key),
            "list page (50)": _scope("/api/v1/inbox/conversations", key),
            # bench http's filtered list rows, the same queries
            "list page (50), channel + OPEN": _scope(
                "/api/v1/inbox/conversations",
                key,
                f"limit=50&channelId={ids['channel']}&status=OPEN".encode(),
            ),
            "list page (50), tab=unassigned": _scope(
                "/api/v1/inbox/conversations", key, b"limit=50&tab=unassigned"
            ),
            "history page (50)": _scope(
                f"/api/v1/inbox/conversations/{ids['history_conversations'][0]}/messages", key
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
            if state.keys.cached(state.keys.digest(ids["key"])) is None:
                raise RuntimeError("bench app: the key is not in the key cache")

        timed: dict[str, Callable[[], Awaitable[Any]]] = {BARE: lambda: call(bare_scope, bare)}
        timed.update({name: (lambda scope=scope: call(scope)) for name, scope in routes.items()})

        # Read one as it was served before the thirty-sixth session, in the same rounds: the
        # key cache found by the key's SHA-256, and the URL map bound by Quart's own path each
        # time (an attribute of the instance over the method, for the call; about 0.2 us).
        def before(owner: object, attribute: str, old: object) -> Callable[[], Awaitable[Any]]:
            async def read_one_as_before() -> None:
                setattr(owner, attribute, old)
                try:
                    await call(routes["read one"])
                finally:
                    delattr(owner, attribute)

            return read_one_as_before

        timed[BY_SHA256] = before(state.keys, "digest", hash_api_key)
        timed[BOUND_BY_QUART] = before(app, "create_url_adapter", app._quart_url_adapter)

        # Read one with its access-log line, as the daemon at the default log level writes it
        # (a JsonLinesHandler on its stderr, here a file), and as it was written before the
        # thirty-seventh session (a LogRecord through logging's StreamHandler, formatted by the
        # standard library's json): for the call, the app module's access logger is another,
        # at info, with that handler alone.
        def access_logger(name: str, handler: logging.Handler) -> logging.Logger:
            logger = logging.getLogger(name)
            logger.setLevel(logging.INFO)
            logger.propagate = False
            logger.handlers[:] = [handler]
            return logger

        before_handler = logging.StreamHandler(log_file)
        before_handler.setFormatter(_JsonFormatterBefore())
        held = JsonLinesHandler(log_file)  # (held while the rounds run, as the daemon holds)
        loggers = {
            LOGGED: (access_logger("bench.app.access", held), log_request),
            LOGGED_AT_ONCE: (
                access_logger("bench.app.access_at_once", JsonLinesHandler(log_file)),
                log_request,
            ),
            LOGGED_BY_RECORD: (
                access_logger("bench.app.access_before", before_handler),
                _by_record,
            ),
        }
        quiet = app_module.access_log

        def logged(name: str) -> Callable[[], Awaitable[Any]]:
            async def read_one_logged() -> None:
                app_module.access_log, app_module.log_request = loggers[name]
                try:
                    await call(routes["read one"])
                finally:
                    app_module.access_log, app_module.log_request = quiet, log_request

            return read_one_logged

        timed[LOGGED] = logged(LOGGED)
        timed[LOGGED_AT_ONCE] = logged(LOGGED_AT_ONCE)
        timed[LOGGED_BY_RECORD] = logged(LOGGED_BY_RECORD)
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
        at_once = _at_once(ids, key, call, app) if args.writes else {}
        for check in at_once.values():  # each answers 200 (a write that fails is not timed)
            await check()
        best = dict.fromkeys([*timed, *at_once], float("inf"))
        each = max(1, args.requests // AT_ONCE)
        async with trio.open_nursery() as holding:
            holding.start_soon(hold_access_lines, held)
            # (the row's lines still held at its end are written within its own time)
            await _rounds(args, timed, at_once, best, each, {LOGGED: held.write_held})
            holding.cancel_scope.cancel()
        return {name: seconds * 1e6 for name, seconds in best.items()}
    finally:
        if store.writer_process is not None:
            await store.writer_process.aclose()
        store.close()


async def _rounds(
    args: argparse.Namespace,
    timed: dict[str, Callable[[], Awaitable[Any]]],
    at_once: dict[str, Callable[[], Awaitable[Any]]],
    best: dict[str, float],
    each: int,
    ending: dict[str, Callable[[], None]],
) -> None:
    """Time each row once a round, keeping each row's least CPU a call in ``best``; a row's
    ``ending``, if any, is timed with it, after its calls."""
    for _ in range(args.rounds):
        for name, fn in timed.items():
            started = time.thread_time()
            for _ in range(args.requests):
                await fn()
            if name in ending:
                ending[name]()
            best[name] = min(best[name], (time.thread_time() - started) / args.requests)
        for name, fn in at_once.items():
            started = time.thread_time()
            async with trio.open_nursery() as nursery:
                for _ in range(AT_ONCE):
                    nursery.start_soon(_repeat, fn, each)
            spent = time.thread_time() - started
            best[name] = min(best[name], spent / (each * AT_ONCE))


async def _repeat(fn: Callable[[], Awaitable[Any]], times: int) -> None:
    for _ in range(times):
        await fn()


def _at_once(
    ids: dict[str, Any],
    key: list[tuple[bytes, bytes]],
    call: Callable[..., Awaitable[list[dict[str, Any]]]],
    app: Any,
) -> dict[str, Callable[[], Awaitable[None]]]:
    """The --writes rows: each call checks its answer was 200, so that a failing write (a
    refused body, a writer that stopped) is an error, not a cheap request."""
    conversations_ = ids["conversations"][:200]
    count = iter(range(1 << 62))

    async def ok(scope: dict[str, Any], to: Any = app, body: bytes = b"") -> None:
        sent = await call(scope, to, body)
        if sent[0]["status"] != 200:
            raise RuntimeError(f"bench app: {scope['method']} {scope['path']}: {sent[0]['status']}")

    def patch(path: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
        typed = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        return _scope(path, [*headers, *typed], method="PATCH")

    async def bare_get() -> None:
        await ok(_scope("/ceiling", []), bare)

    async def bare_patch() -> None:
        body = b'{"title": "t%d"}' % next(count)
        await ok(patch("/ceiling", body, []), bare, body)

    async def read_one() -> None:
        conversation = conversations_[next(count) % len(conversations_)]
        await ok(_scope(f"/api/v1/inbox/conversations/{conversation}", key))

    async def title() -> None:
        n = next(count)
        conversation, body = conversations_[n % len(conversations_)], b'{"title": "t%d"}' % n
        await ok(patch(f"/api/v1/inbox/conversations/{conversation}/title", body, key), app, body)

    return {
        BARE_GET_AT_ONCE: bare_get,
        f"{AT_ONCE} at once: the bare app's PATCH (a small JSON body read and parsed)": bare_patch,
        f"{AT_ONCE} at once: read one": read_one,
        f"{AT_ONCE} at once: title write (change + SYSTEM row + event, the writer process)": title,
    }


def _by_record(logger: logging.Logger, fields: dict[str, Any]) -> None:
    logger.info("request", extra=fields)


class _JsonFormatterBefore(JsonFormatter):
    """inboxd.logs.JsonFormatter as it wrote before the thirty-seventh session: the standard
    library's json (a new encoder a call), the date and time made for every line."""

    def format(self, record: logging.LogRecord) -> str:
        out = self.fields(record)
        out["time"] = (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z"
        )
        return json.dumps(out, default=str, ensure_ascii=False)


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
    base = us[BASE_ROUTE]
    rows = [("figure", "us", "thread CPU per call, minimum of the rounds; beside the 1 KB route")]
    for name, value in us.items():
        plain = name.endswith("alone") or name in (BARE, BASE_ROUTE, BARE_GET_AT_ONCE)
        note = "" if plain else f"{value - base:+.1f} us"
        if not plain and name.startswith(f"{AT_ONCE} at once"):
            note = f"{value - us[BARE_GET_AT_ONCE]:+.1f} us beside the bare GET, {AT_ONCE} at once"
        if name in (BY_SHA256, BOUND_BY_QUART, LOGGED, LOGGED_AT_ONCE, LOGGED_BY_RECORD):
            note = f"{value - us['read one']:+.1f} us beside read one"
        rows.append((name, f"{value:.1f}", note))
    report("app", rows, {"args": vars(args), "us": us})
    return 0
