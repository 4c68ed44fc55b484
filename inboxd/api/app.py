"""The quart-trio application: wiring, authentication, error mapping and the access log.

Routes live in the sibling modules; this module owns what every request goes through:

- ``Authorization: Bearer <key>`` on every ``/api/v1`` route (401 with ``WWW-Authenticate``);
- the per-key rate limit (429 with ``Retry-After``);
- one error mapping for the whole app: ``InboxError`` and Werkzeug's HTTP errors become the JSON
  error body of CONTRACT section 3; anything else is logged and answered with a JSON 500, never a
  traceback or HTML.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar, cast

import attrs
import orjson
import trio
from quart import (
    Request,
    Response,
    current_app,
    g,
    has_request_context,
    has_websocket_context,
    request,
    websocket,
)
from quart.sessions import NullSession, SessionInterface
from quart_trio import QuartTrio
from quart_trio.wrappers import TrioRequest
from werkzeug.exceptions import BadHost, BadRequest, HTTPException
from werkzeug.routing import MapAdapter, WebsocketMismatch
from werkzeug.sansio.utils import get_content_length
from werkzeug.utils import cached_property

from inboxd.api.http import encoded_json, json_response, read_body
from inboxd.api.ratelimit import RateLimiter, retry_after_seconds
from inboxd.clock import Clock, SystemClock
from inboxd.config import Config
from inboxd.errors import Forbidden, InboxError, InvalidRequest, RateLimited, Unauthorized
from inboxd.feed import FeedHub
from inboxd.logs import log_failure, log_request
from inboxd.metrics import Metrics
from inboxd.model import Principal
from inboxd.store import accounts, idempotency
from inboxd.store.db import IDEMPOTENT_WRITE, Store
from inboxd.webhooks.channel import ChannelWebhookHub

log = logging.getLogger("inboxd.api")
access_log = logging.getLogger("inboxd.access")

T = TypeVar("T")

_HTTP_CODES: Final = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
}
_HTTP_MESSAGES: Final = {
    404: "there is no such resource",
    405: "this path does not accept that method",
    413: "the request body is larger than the server accepts",
}


@attrs.define
class AppState:
    """What routes need from the daemon."""

    store: Store
    config: Config
    limiter: RateLimiter
    clock: Clock
    # Set by the daemon once the channel webhook hub runs; routes ask it to reconcile.
    channel_hub: ChannelWebhookHub | None = None
    feed_hub: FeedHub | None = None
    metrics: Metrics = attrs.Factory(Metrics)
    # key pk -> last time it was used; flushed to the store by the daemon now and then, so that a
    # request does not pay for a write just to record lastUsedAt.
    key_usage: dict[int, int] = attrs.Factory(dict)
    keys: KeyCache = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.keys = KeyCache(self.store)

    ready: bool = True

    def oldest_kept_us(self) -> int:
        """The journal keeps events from this time on (feed.retention ago): older ones are pruned,
        and a client resuming before it is told to refetch."""
        return self.clock.now_us() - round(self.config.feed.retention * 1_000_000)


class KeyCache:
    """API key -> Principal, so that most requests make one trip to the store instead of two.

    Entries are trusted while nothing that principals are made of has changed: on each lookup
    the store's ``commit_stamp`` (from shared memory, no query) says whether any connection has
    committed since the last look (our own writer, or the CLI revoking a key from another
    process); only then is the ``auth_epoch`` counter read, which triggers move whenever a key,
    a user's role or membership, or channel access changes. So revocation takes effect on the
    next request, and the thousands of other commits (messages, actions) keep the cache warm.

    Entries are found by the key's ``digest``: BLAKE2b keyed with a secret of this cache's own,
    not the SHA-256 the store keeps (``ids.hash_api_key``, computed only when the store is
    asked). No key is kept in the clear; and SHA-256 goes through OpenSSL 3's provider
    machinery on every call: 0.4 us in a loop either way, but a few microseconds more than
    BLAKE2b in a request, whose other work leaves OpenSSL's code and tables out of the CPU's
    caches (``bench app`` prints read one both ways).
    """

    MAX_ENTRIES: Final = 10_000

    def __init__(self, store: Store) -> None:
        self._store = store
        self._stamp: object = None
        self._epoch = -1
        self._entries: dict[bytes, Principal] = {}
        self._secret = secrets.token_bytes(32)

    def digest(self, token: str) -> bytes:
        """The key's name in this cache (see the class)."""
        return hashlib.blake2b(token.encode(), key=self._secret, digest_size=32).digest()

    def known_epoch(self) -> int | None:
        """``current_epoch`` when nothing committed since the last look (no coroutine, no
        store access); else None."""
        return self._epoch if self._store.commit_stamp() == self._stamp else None

    async def current_epoch(self) -> int:
        """The store's ``auth_epoch``, read again only when something committed since the last
        look (the feed checks it before each live event: a key revoked by the CLI, in another
        process, must get nothing more)."""
        stamp = self._store.commit_stamp()
        if stamp != self._stamp:
            epoch = await self._store.read(accounts.auth_epoch)
            if epoch != self._epoch:
                self._entries.clear()
                self._epoch = epoch
            self._stamp = stamp
        return self._epoch

    def cached(self, digest: bytes) -> Principal | None:
        """The principal of the key with this digest (``digest``) if the cache holds it and
        nothing was committed since the cache was last checked (no store access, no
        coroutine); else None: ask ``lookup``."""
        if self._store.commit_stamp() != self._stamp:
            return None
        return self._entries.get(digest)

    async def lookup(self, token: str, digest: bytes | None = None) -> Principal | None:
        """``digest``: the token's ``digest``, if the caller has it already."""
        epoch = await self.current_epoch()
        digest = digest or self.digest(token)
        who = self._entries.get(digest)
        if who is not None:
            return who
        who = await self._store.read(accounts.authenticate, token)
        # Keep it only if nothing it depends on changed while we were reading.
        if who is not None and await self.current_epoch() == epoch:
            if len(self._entries) >= self.MAX_ENTRIES:
                self._entries.clear()
            self._entries[digest] = who
        return who


def state() -> AppState:
    # The app itself, not an attribute looked up through the proxy (a request asks 4-6 times).
    app: QuartTrio = cast(Any, current_app)._get_current_object()  # werkzeug's LocalProxy
    return cast(AppState, app.extensions["inboxd"])


def now_us() -> int:
    """The daemon's wall clock (see clock.py), for timestamps written by requests."""
    return state().clock.now_us()


def principal() -> Principal:
    return cast(Principal, g.principal)


def owner_only(doing: str) -> Callable[[], Awaitable[None]]:
    """A ``before_request`` hook (after ``authenticate``) that lets only the account owner's key
    in: 403 ``forbidden``, "only the account owner's key may {doing}". OPTIONS passes, as in
    ``authenticate``."""

    async def hook() -> None:
        if request.method != "OPTIONS":
            require_owner(doing)

    return hook


async def write_as_owner(fn: Callable[..., T], *args: object) -> T:
    """``store.write(fn, *args)`` for an owner-only write whose function takes the account or a
    channel, not the principal: run through ``accounts.as_owner``, so that the request's key
    is read again in the write (a key revoked meanwhile gets 401 and changes nothing)."""
    return await state().store.write(accounts.as_owner, principal(), fn, *args)


def require_owner(doing: str) -> None:
    """403 ``forbidden`` unless the request's key is the account owner's."""
    if not principal().is_owner:
        raise Forbidden(f"only the account owner's key may {doing}")


async def authenticate() -> Response | None:
    """``before_request`` of the API blueprints: resolve the key, apply the rate limit, and
    answer a repeated Idempotency-Key with the first response.

    Every API request runs this, so the request, the app's state and ``g`` are each looked up
    once through Quart's context proxies, and a key the cache holds is found without a
    coroutine (``KeyCache.cached``)."""
    req = cast(Request, cast(Any, request)._get_current_object())
    method = req.method
    if method == "OPTIONS":
        return None  # OPTIONS carries no key: Quart answers it (200 with Allow)
    scheme, _, token = req.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("send the API key as 'Authorization: Bearer <key>'")
    st = state()
    digest = st.keys.digest(token)
    who = st.keys.cached(digest) or await st.keys.lookup(token, digest)
    if who is None:
        raise Unauthorized("the API key is unknown or revoked")
    take_rate(who, st)
    cast(Any, g)._get_current_object().principal = who
    if method not in IDEMPOTENT_METHODS:  # reads skip the header lookup
        return None
    return await _idempotency_claim(req, who, st)


def take_rate(who: Principal, st: AppState | None = None) -> None:
    """Count one request against the key's token bucket (RateLimited when it is empty) and
    note the key's use. HTTP requests and websocket upgrades of the feed both go through it."""
    st = st or state()
    wait = st.limiter.take(who.key_pk)
    if wait > 0:
        raise RateLimited(
            "too many requests for this API key; slow down", retry_after=retry_after_seconds(wait)
        )
    st.key_usage[who.key_pk] = st.clock.now_us()


IDEMPOTENT_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
IDEMPOTENCY_KEY: Final = re.compile(r"^[\x21-\x7e]{1,255}$")


async def _idempotency_claim(req: Request, who: Principal, st: AppState) -> Response | None:
    key = req.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not IDEMPOTENCY_KEY.match(key):
        raise InvalidRequest("Idempotency-Key must be 1 to 255 visible ASCII characters")
    body = await read_body()
    fingerprint = hashlib.sha256(
        b"\0".join([req.method.encode(), req.full_path.encode(), body])
    ).digest()
    stored = await st.store.write(
        idempotency.claim, who.user_pk, key, fingerprint, st.clock.now_us()
    )
    if stored is not None:
        return encoded_json(stored.body, stored.status, {"Idempotent-Replayed": "true"})
    g.idempotency_key = key
    IDEMPOTENT_WRITE.set((who.user_pk, key))
    return None


async def _idempotency_complete(key: str, response: Response) -> None:
    IDEMPOTENT_WRITE.set(None)
    store, user_pk = state().store, principal().user_pk
    try:
        # Not kept: a failure of ours, or a 401 (the key revoked while its request ran), which
        # changed nothing and would refuse the user's other keys the same request for 24 h.
        if response.status_code >= 500 or response.status_code == 401:
            await store.write(idempotency.release, user_pk, key)
        else:
            body = _without_secrets(await response.get_data(as_text=False))
            await store.write(idempotency.complete, user_pk, key, response.status_code, body)
    except Exception:
        # (A claim left running frees itself after a minute: idempotency.claim. A full disk
        # that refused this too is logged by the store, once a minute: log_failure.)
        log_failure(log, "could not record the Idempotency-Key response")


# Fields of a response that carry a new API key or signing secret (new keys, accepted invites,
# saved or rotated webhooks).
SECRET_FIELDS: Final = ("apiKey", "secret")


def _without_secrets(body: bytes) -> bytes:
    """A response as an Idempotency-Key keeps it, to answer repeats: a new API key or signing
    secret in it becomes null. Keys are shown once and stored only as a hash, and a webhook's
    secret is never returned after the response that made it; a client that lost that
    response revokes the key or rotates the secret."""
    if not any(b'"%s"' % name.encode() in body for name in SECRET_FIELDS):
        return body
    data = orjson.loads(body)
    if isinstance(data, dict):
        for name in SECRET_FIELDS:
            if data.get(name) is not None:
                data[name] = None
    return orjson.dumps(data)


def _error_response(exc: InboxError) -> Response:
    return json_response(exc.body(), exc.status, exc.headers())


class NoSessions(SessionInterface):
    """The API has no cookies or sessions: skip Quart's per-request session work (it looked
    for a signing key and built an empty session object on every request)."""

    _NONE: Final = NullSession()

    async def open_session(self, app: Any, request: Any) -> NullSession:
        return self._NONE

    async def save_session(self, app: Any, session: Any, response: Any) -> None:
        return None


class InboxRequest(TrioRequest):
    """quart-trio's request, with its chain of blueprint names kept per route, and its
    Content-Length found without werkzeug's lookups when there is none (``content_length``).

    Quart asks for ``blueprints`` two or three times in every request (for the
    ``before_request`` and ``after_request`` hooks, and for error handlers), each time through
    ``endpoint`` and ``blueprint`` and an import (about 2 us; 0.2 us from the dict); the chain
    depends only on the matched route."""

    # The status of the response decided before the rest of an unread body was waited for
    # (``finish_request``): the request is recorded with it should that wait be cancelled.
    decided_status: int | None = None

    @cached_property
    def content_length(self) -> int | None:
        """werkzeug's, which Quart asks for as it makes every request. Without a Content-Length
        (every GET) both of werkzeug's case-blind lookups (Content-Length, Transfer-Encoding)
        raise and catch a ``KeyError`` inside it, about 5 us together (by hand), to answer
        None; a scan of the ASGI scope's lower-case names tells the same in 0.4 us."""
        for name, _ in self.scope["headers"]:
            if name == b"content-length":
                return get_content_length(
                    http_content_length=self.headers.get("Content-Length"),
                    http_transfer_encoding=self.headers.get("Transfer-Encoding"),
                )
        return None

    @property
    def blueprints(self) -> list[str]:
        rule = self.url_rule
        endpoint = None if rule is None else rule.endpoint
        chain = _BLUEPRINT_CHAINS.get(endpoint)
        if chain is None:
            chain = _BLUEPRINT_CHAINS[endpoint] = tuple(super().blueprints)
        return list(chain)


_BLUEPRINT_CHAINS: dict[str | None, tuple[str, ...]] = {}


# The Host headers whose bound name InboxApp remembers: at most this many (then it starts
# afresh), each at most this long (a DNS name is at most 253 characters, and a port): a client
# chooses the header, and werkzeug takes a name of any length made of valid labels.
MAX_BOUND_HOSTS: Final = 256
MAX_BOUND_HOST_LENGTH: Final = 260
# Not remembered yet (None in InboxApp._bound_hosts is a host refused).
_UNBOUND: Final[Any] = object()


class InboxApp(QuartTrio):
    """The daemon's quart-trio app: Quart's, with each HTTP request timed, counted in the
    metrics and written to the access log around Quart's whole handling of it.

    Around ``handle_request`` rather than in ``before_request`` / ``after_request`` hooks: the
    request object is at hand (no lookups through the context proxies), and a hook costs every
    request a few microseconds of Quart's machinery (``bench app``). The time covers what
    Quart does for the request: routing, the hooks, the route, its error handler and waiting
    for the rest of an unread body (the response is not sent before that is done)."""

    request_class = InboxRequest

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # (scheme, Host) -> the host name werkzeug binds the URL map to (None: refused).
        self._bound_hosts: dict[tuple[str, str], str | None] = {}

    async def asgi_app(self, scope: Any, receive: Any, send: Any) -> None:
        """A query string that is not UTF-8 is refused here: Quart decodes it while it sets the
        request up, before any error handler, and answered a bare 500. HTTP/1.1 (h11) refuses
        such bytes itself; HTTP/2 without TLS, which hypercorn serves on the same port, passes
        them on."""
        query = scope.get("query_string", b"")
        if not query.isascii() and scope["type"] in ("http", "websocket"):
            try:
                query.decode()
            except UnicodeDecodeError:
                await _refuse_undecodable(scope, send)
                return
        await super().asgi_app(scope, receive, send)

    def create_url_adapter(self, request: Any) -> MapAdapter | None:
        """Quart's, with the host name it binds remembered per Host, and bad hosts refused.

        Binding the URL map IDNA-encodes the request's host with Python's ``idna`` codec, pure
        Python, and Quart normalises the host twice first: a few microseconds of every
        request, saved by remembering the name (a Host header is the same from request to
        request; ``bench app`` prints read one both ways). The adapter is the one werkzeug's
        ``Map.bind`` makes (the test compares them
        field by field); where this app's routing is set up otherwise (a ``SERVER_NAME``, host
        or subdomain matching) Quart's own path is taken.

        A Host header that werkzeug cannot IDNA-encode (an empty label, a label over 63
        characters: ``Host: a..b``) made binding the URL map raise ``BadHost`` while Quart set
        up the request, before any error handler: hypercorn answered a bare 500. Such a request
        now matches no route, with a 400 that the error handlers turn into the JSON answer."""
        if (
            request is None
            or self.config["SERVER_NAME"] is not None
            or self.subdomain_matching
            or self.url_map.host_matching
            or self.url_map.default_subdomain
        ):
            return self._quart_url_adapter(request)
        scheme = request.scheme
        host = (scheme, request.host)
        name = self._bound_hosts.get(host, _UNBOUND)
        if name is _UNBOUND:
            adapter = self._quart_url_adapter(request)
            if len(host[1]) <= MAX_BOUND_HOST_LENGTH:  # (not a long made-up one)
                if len(self._bound_hosts) >= MAX_BOUND_HOSTS:  # (clients choose the header)
                    self._bound_hosts.clear()
                self._bound_hosts[host] = (
                    adapter.server_name if isinstance(adapter, MapAdapter) else None
                )
            return adapter
        if name is None:
            return cast(MapAdapter, _RefusedHost())
        root = request.root_path
        return MapAdapter(
            self.url_map,
            name,
            "/" if root is None else root,
            "",  # (Quart's subdomain where the host is the server name: none)
            scheme,
            request.path,
            request.method,
            request.query_string.decode(),
        )

    def _quart_url_adapter(self, request: Any) -> MapAdapter | None:
        try:
            return super().create_url_adapter(request)
        except BadHost:
            return cast(MapAdapter, _RefusedHost())

    async def handle_request(self, request: Request) -> Any:
        started = time.perf_counter()
        try:
            response = await super().handle_request(request)
        except BaseException:
            # Cancelled (the client went away) while waiting for the rest of an unread body:
            # the answer was decided; record it like any other.
            status = getattr(request, "decided_status", None)
            if status is not None:
                self._record(request, status, started)
            raise
        self._record(request, response.status_code, started)
        return response

    def _record(self, request: Request, status: int, started: float) -> None:
        """Count the request in the metrics and write its access-log line."""
        took = time.perf_counter() - started
        rule = request.url_rule
        route = "unmatched" if rule is None else rule.rule
        # A method no route serves is labelled OTHER: a client must not add series at will.
        method = request.method if request.method in _KNOWN_METHODS else "OTHER"
        cast(AppState, self.extensions["inboxd"]).metrics.observe_request(
            route, method, status, took
        )
        if access_log.isEnabledFor(logging.INFO):
            log_request(
                access_log,
                {
                    "method": request.method,
                    "path": request.path,
                    "status": status,
                    "ms": round(took * 1000, 2),
                },
            )


class _RefusedHost:
    """The URL adapter of a request whose Host is not a host name: it matches nothing."""

    def match(self, *args: Any, **kwargs: Any) -> Any:
        raise BadRequest("the request's Host header is not a valid host name")


# The methods the metrics label by name (RFC 9110's); any other is counted as OTHER.
_KNOWN_METHODS: Final = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"}
)

_UNDECODABLE_QUERY: Final = orjson.dumps(
    {"error": {"code": "invalid_request", "message": "the query string is not UTF-8"}}
)


async def _refuse_undecodable(scope: Any, send: Any) -> None:
    """400 ``invalid_request`` (CONTRACT section 3), sent as ASGI messages: Quart cannot make a
    request of it. A websocket upgrade gets the same answer (the ASGI extension hypercorn
    offers for answering one with HTTP), or, without it, is closed before it is accepted."""
    body = _UNDECODABLE_QUERY
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if scope["type"] == "websocket":
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        start, part = "websocket.http.response.start", "websocket.http.response.body"
    else:
        start, part = "http.response.start", "http.response.body"
        if scope["method"] == "HEAD":
            body = b""
    await send({"type": start, "status": 400, "headers": headers})
    await send({"type": part, "body": body})


# How long a response waits for the rest of a request body it did not need (see
# finish_request in create_app).
BODY_WAIT_SECONDS: Final = 10.0


def _has_body() -> bool:
    """Whether the request says a body follows (a Content-Length other than 0, or chunked).
    Scans the ASGI scope's header list (lower-case byte names) instead of two case-blind
    lookups in werkzeug's ``Headers``, which every GET would otherwise pay for."""
    for name, value in request.scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip(b" 0")):
            return True
    return False


def create_app(store: Store, config: Config, clock: Clock | None = None) -> QuartTrio:
    from inboxd.api import channels, feed, inbox, messaging, ops, team, webhook

    app = InboxApp("inboxd")
    app.session_interface = NoSessions()  # type: ignore[assignment]  # Quart types it narrowly
    app.config["MAX_CONTENT_LENGTH"] = config.server.max_body_bytes
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = True
    # An empty path segment (".../conversations//messages") is a path the API does not have:
    # 404 not_found, not werkzeug's 308 redirect to the path with the slashes merged.
    app.url_map.merge_slashes = False
    app.extensions["inboxd"] = AppState(
        store=store,
        config=config,
        limiter=RateLimiter(
            config.limits.requests_per_second, config.limits.burst, clock=time.monotonic
        ),
        clock=clock or SystemClock(),
    )
    app.register_blueprint(ops.blueprint)
    app.register_blueprint(inbox.blueprint)
    app.register_blueprint(messaging.blueprint)
    app.register_blueprint(webhook.blueprint)
    app.register_blueprint(team.public)
    app.register_blueprint(team.blueprint)
    app.register_blueprint(channels.public)
    app.register_blueprint(channels.blueprint)
    app.register_blueprint(feed.blueprint)

    @app.after_request
    async def finish_request(response: Response) -> Response:
        """Record an Idempotency-Key's response, and read what is left of the request's body
        before the response ends.

        The body: an answer given before the body was read (a 401, 403 or 404 decided from the
        headers) would otherwise end while the body is still arriving, and hypercorn then
        closes the connection: a keep-alive client's next request on it fails. Worse, when the
        body and the client's next request arrive while that close is under way, quart-trio's
        disconnect handling cancels the close half-done and the next request waits unanswered
        until the client gives up (found by tests/test_fuzz.py; tests/test_api_errors.py has
        the sequence). Bodies are small (``server.max_body_bytes``); one that does not come
        within BODY_WAIT_SECONDS, or is too large, is answered with ``Connection: close``
        instead (the client is to open a new connection; hypercorn drops one that keeps
        sending at its read timeout).

        A body the route read (``read_body``) leaves nothing to do, so the hook costs writes
        nothing. One hook for both, with ``g`` looked up once: each hook and each lookup
        through Quart's context proxies is a few microseconds of every request."""
        flags = cast(Any, g)._get_current_object()
        if "idempotency_key" in flags:
            await _idempotency_complete(flags.pop("idempotency_key"), response)
        if response.status_code in (408, 413):  # the body is not coming, or too large
            response.headers["Connection"] = "close"
            return response
        if "body_read" in flags or not _has_body():
            return response
        cast(Any, request).decided_status = response.status_code
        with trio.move_on_after(BODY_WAIT_SECONDS) as waited:
            try:
                await request.get_data(cache=False)
            except HTTPException:  # over max_body_bytes, or past Quart's body timeout
                response.headers["Connection"] = "close"
        if waited.cancelled_caught:
            response.headers["Connection"] = "close"
        return response

    @app.errorhandler(InboxError)
    async def on_inbox_error(exc: InboxError) -> Response:
        return _error_response(exc)

    @app.errorhandler(HTTPException)
    async def on_http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        code = _HTTP_CODES.get(status, "http_error")
        message = _HTTP_MESSAGES.get(status) or (exc.description or exc.name)
        headers: dict[str, Any] = {}
        if isinstance(exc, WebsocketMismatch):
            if has_websocket_context():  # a websocket upgrade to a plain HTTP path
                message = "this path is not a websocket: the feed is at /api/v1/inbox/feed"
            else:  # plain HTTP to the feed
                message = "this path is a websocket: open it with a websocket upgrade"
                headers["Upgrade"] = "websocket"
        if status == 413:
            # The rest of the body is not read: the connection cannot be reused.
            headers["Connection"] = "close"
        if status == 405 and getattr(exc, "valid_methods", None):
            headers["Allow"] = ", ".join(exc.valid_methods or [])  # type: ignore[attr-defined]
        return json_response({"error": {"code": code, "message": message}}, status, headers)

    @app.errorhandler(Exception)
    async def on_unexpected(exc: Exception) -> Response:
        # (The feed's websocket handler comes here too: it has no request context.)
        path = request.path if has_request_context() else websocket.path
        log.exception("unhandled error", extra={"path": path})
        return json_response(
            {"error": {"code": "internal_error", "message": "the server failed; it is logged"}},
            500,
        )

    return app
