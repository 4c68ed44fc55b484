"""GET /api/v1/openapi.json (CONTRACT section 9): a valid OpenAPI 3.1 document of every route, and
a checker (tests/openapi_check.py) that is known to catch a server that strays from it.

The rest of the suite is the proof that the document matches the server: conftest.py runs every
response of the shared clients through the checker.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openapi_spec_validator import validate as validate_openapi

from inboxd import __version__
from inboxd.api.app import create_app
from inboxd.api.openapi import document
from inboxd.config import Config, LimitsConfig
from inboxd.store.db import Store
from tests.conftest import Seed, auth, ingest
from tests.openapi_check import (
    Mismatch,
    check_feed_frame,
    check_response,
    check_response_hook,
    check_webhook_request,
)

BASE = "http://inboxd.test"


async def test_the_served_document_is_valid_openapi_3_1(anon: httpx.AsyncClient) -> None:
    response = await anon.get("/api/v1/openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    served = response.json()
    assert served == document()
    assert served["openapi"] == "3.1.0"
    assert served["info"]["version"] == __version__
    validate_openapi(served)


@pytest.mark.parametrize("config", [Config(limits=LimitsConfig(requests_per_second=1, burst=1))])
async def test_the_document_needs_no_key_and_is_not_rate_limited(
    anon: httpx.AsyncClient, owner: httpx.AsyncClient
) -> None:
    for _ in range(5):
        assert (await anon.get("/api/v1/openapi.json")).status_code == 200
        # A key, even a bad one, is not looked at.
        bad_key = auth("ibx_not-a-key")
        assert (await anon.get("/api/v1/openapi.json", headers=bad_key)).status_code == 200
        assert (await owner.get("/api/v1/openapi.json")).status_code == 200
    # The same key on a keyed route is over its rate by now.
    statuses = [(await owner.get("/api/v1/inbox/channels")).status_code for _ in range(2)]
    assert 429 in statuses


def _rule_as_template(rule: str) -> str:
    """``/x/<conversation_id>`` -> ``/x/{conversationId}``."""

    def camel(match: re.Match[str]) -> str:
        head, *rest = match.group(1).split("_")
        return "{" + head + "".join(word.title() for word in rest) + "}"

    return re.sub(r"<(?:\w+:)?(\w+)>", camel, rule)


@pytest.fixture
def app_routes(tmp_path: Path) -> Iterator[set[tuple[str, str]]]:
    store = Store.open(tmp_path / "routes", create=True, readers=1)
    try:
        app = create_app(store, Config())
        yield {
            (_rule_as_template(rule.rule), method.lower())
            for rule in app.url_map.iter_rules()
            if rule.endpoint != "static"
            for method in rule.methods or ()
            if method not in ("HEAD", "OPTIONS")  # Quart answers these itself
        }
    finally:
        store.close()


def test_the_document_has_exactly_the_apps_routes(app_routes: set[tuple[str, str]]) -> None:
    documented = {
        (path, method) for path, operations in document()["paths"].items() for method in operations
    }
    assert documented - app_routes == set(), "documented but not served"
    assert app_routes - documented == set(), "served but not documented"


def test_public_routes_and_only_they_need_no_key() -> None:
    public = {
        f"{method.upper()} {path}"
        for path, operations in document()["paths"].items()
        for method, op in operations.items()
        if op.get("security") == []
    }
    assert public == {
        "GET /healthz",
        "GET /readyz",
        "GET /metrics",
        "GET /api/v1/openapi.json",
        "POST /api/v1/inbox/team/invites/accept",
        "GET /api/v1/channels/{channelId}/unsubscribe",
        "POST /api/v1/channels/{channelId}/unsubscribe",
    }
    assert document()["security"] == [{"bearerAuth": []}]


async def test_every_operation_the_document_says_needs_a_key_refuses_none(
    anon: httpx.AsyncClient,
) -> None:
    """The document's security against the server: each keyed operation, sent without a key,
    is 401 with WWW-Authenticate; each public one is answered without asking for one."""
    checked = 0
    for path, operations in document()["paths"].items():
        url = re.sub(r"\{[^}]+\}", "x_unknown", path)
        for method, op in operations.items():
            security = op.get("security")
            if security is not None and {} in security:
                continue  # the feed: a key on the upgrade or in the first frame
            body = {} if method in ("post", "put", "patch") else None
            response = await anon.request(method.upper(), url, json=body)
            if security == []:
                assert response.status_code != 401, f"{method.upper()} {path}"
            else:
                assert response.status_code == 401, f"{method.upper()} {path}"
                assert response.headers["www-authenticate"].startswith("Bearer")
            checked += 1
    assert checked > 40


async def test_the_shared_clients_check_every_response(
    owner: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    assert check_response_hook in owner.event_hooks["response"]
    assert check_response_hook in anon.event_hooks["response"]


# -- the checker bites ---------------------------------------------------------------------------


def fake(
    method: str, path: str, status: int, body: Any, request_body: Any = None, **headers: str
) -> httpx.Response:
    content = b"" if request_body is None else json.dumps(request_body).encode()
    request_headers = {"Content-Type": "application/json"} if content else {}
    request = httpx.Request(method, BASE + path, content=content, headers=request_headers)
    return httpx.Response(status, json=body, headers=headers, request=request)


@pytest.fixture
async def conversation(owner: httpx.AsyncClient, seeded: Seed) -> dict[str, Any]:
    message = await ingest(owner, seeded.sales_id, "15550001", content="hi")
    response = await owner.get(f"/api/v1/inbox/conversations/{message['conversationId']}")
    body: dict[str, Any] = response.json()
    return body


async def test_a_real_conversation_passes(conversation: dict[str, Any]) -> None:
    check_response(
        fake("GET", f"/api/v1/inbox/conversations/{conversation['id']}", 200, conversation)
    )


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda c: c.update(secretField="x"), id="extra field"),
        pytest.param(lambda c: c.pop("updatedAt"), id="missing field"),
        pytest.param(lambda c: c["contact"].update(nickname="x"), id="extra nested field"),
        pytest.param(lambda c: c.update(isBlocked=None), id="null where not nullable"),
        pytest.param(lambda c: c.update(unreadCount="1"), id="wrong type"),
        pytest.param(lambda c: c.update(status="ARCHIVED"), id="value outside the enum"),
        pytest.param(lambda c: c.update(createdAt="2026-11-22T01:16:19Z"), id="timestamp form"),
    ],
)
async def test_a_body_that_strays_from_its_schema_is_caught(
    conversation: dict[str, Any], change: Any
) -> None:
    strayed = copy.deepcopy(conversation)
    change(strayed)
    path = f"/api/v1/inbox/conversations/{conversation['id']}"
    with pytest.raises(Mismatch, match="does not match"):
        check_response(fake("GET", path, 200, strayed))


async def test_a_write_answering_a_read_shape_is_caught(conversation: dict[str, Any]) -> None:
    # Writes answer the Conversation without `contact`.
    path = f"/api/v1/inbox/conversations/{conversation['id']}/read"
    with pytest.raises(Mismatch, match="does not match"):
        check_response(fake("POST", path, 200, conversation))
    written = {k: v for k, v in conversation.items() if k != "contact"}
    check_response(fake("POST", path, 200, written))


def error(code: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": "Something went wrong."}}


def test_undocumented_statuses_codes_paths_and_headers_are_caught() -> None:
    conv = "/api/v1/inbox/conversations/conv_x"
    check_response(fake("GET", conv, 404, error("not_found")))
    with pytest.raises(Mismatch, match="status not documented"):
        check_response(fake("GET", conv, 409, error("status_unchanged")))
    with pytest.raises(Mismatch, match="does not match"):
        check_response(fake("GET", conv, 404, error("webhook_not_found")))
    with pytest.raises(Mismatch, match="does not match"):
        check_response(fake("GET", conv, 404, {"error": "not_found"}))
    with pytest.raises(Mismatch, match="no such path"):
        check_response(fake("GET", "/api/v1/inbox/secret-admin", 200, {}))
    with pytest.raises(Mismatch, match="no DELETE"):
        check_response(fake("DELETE", conv, 204, None))
    with pytest.raises(Mismatch, match="Allow"):
        check_response(fake("DELETE", conv, 405, error("method_not_allowed"), Allow="GET, POST"))
    check_response(fake("DELETE", conv, 405, error("method_not_allowed"), Allow="GET, HEAD"))
    with pytest.raises(Mismatch, match="Retry-After"):
        check_response(fake("GET", conv, 429, error("rate_limited")))
    check_response(fake("GET", conv, 429, error("rate_limited"), **{"Retry-After": "1"}))


async def test_an_accepted_request_must_be_documented(conversation: dict[str, Any]) -> None:
    written = f"/api/v1/inbox/conversations/{conversation['id']}/status"
    answer = {k: v for k, v in conversation.items() if k != "contact"}
    check_response(fake("PATCH", written, 200, answer, {"status": "CLOSED"}))
    check_response(fake("PATCH", written, 400, error("invalid_request"), {"status": "DONE"}))
    with pytest.raises(Mismatch, match="request body"):
        check_response(fake("PATCH", written, 200, answer, {"status": "DONE"}))
    found = {"contacts": [], "messages": []}
    search = "/api/v1/inbox/conversations/search"
    check_response(fake("GET", search + "?query=abc&channelId=ch_1", 200, found))
    with pytest.raises(Mismatch, match="without the required channelId"):
        check_response(fake("GET", search + "?query=abc", 200, found))


def test_the_text_routes_are_checked_by_content_type() -> None:
    with pytest.raises(Mismatch, match="content type"):
        check_response(fake("GET", "/metrics", 200, {"requests": 1}))


def test_webhook_requests_and_feed_frames_are_checked() -> None:
    data = {"conversationId": "c", "channelId": "ch", "actorUserId": "u"}
    envelope = {
        "id": "evt_1",
        "type": "inbox.conversation.blocked",
        "createdAt": "2026-11-22T01:16:19.123456Z",
        "data": data,
    }
    headers = {
        "X-Svc-Event": "inbox.conversation.blocked",
        "X-Svc-Delivery": "dlv_1",
        "X-Svc-Signature": "sha256=" + "0" * 64,
        "User-Agent": f"inboxd/{__version__}",
    }
    check_webhook_request(headers, json.dumps(envelope).encode())
    with pytest.raises(Mismatch, match="X-Svc-Signature"):
        check_webhook_request(headers | {"X-Svc-Signature": "md5=0"}, json.dumps(envelope).encode())
    with pytest.raises(Mismatch, match="does not match"):
        extra = {**envelope, "data": {**data, "reason": "spam"}}
        check_webhook_request(headers, json.dumps(extra).encode())
    with pytest.raises(Mismatch, match="no documented webhook"):
        check_webhook_request(headers | {"X-Svc-Event": "inbox.message.created"}, b"{}")
    check_feed_frame({"seq": 7, **envelope})
    check_feed_frame({"type": "feed.reset"})
    with pytest.raises(Mismatch, match="does not match"):
        check_feed_frame(envelope)  # no seq


async def test_the_webhook_secret_comes_exactly_when_created(owner: httpx.AsyncClient) -> None:
    configuration = (await owner.get("/api/v1/inbox/webhook")).json()
    secret = "whsec_" + "a" * 43
    path = "/api/v1/inbox/webhook"
    request = {"url": "https://hooks.example.com/inbox"}
    check_response(fake("PUT", path, 200, {**configuration, "created": False}, request))
    check_response(
        fake("PUT", path, 200, configuration | {"created": True, "secret": secret}, request)
    )
    with pytest.raises(Mismatch, match="does not match"):
        check_response(fake("PUT", path, 200, {**configuration, "created": True}, request))
    with pytest.raises(Mismatch, match="does not match"):
        check_response(
            fake("PUT", path, 200, configuration | {"created": False, "secret": secret}, request)
        )
