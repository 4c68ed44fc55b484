"""Every operation of the OpenAPI document, fed odd input: never a 5xx, and every answer one the
document states (tests/openapi_check.py: its status, error code, body and headers).

hypothesis drives a plain httpx client in a worker thread while the daemon serves on the trio
loop. Path parameters are real ids of the seeded store or odd text; query parameters are the
documented names with odd values; bodies are any JSON, or the documented fields with values of
any JSON type. A request left unanswered for 10 s fails it as well: that is how it found
keep-alive connections hanging after an answer given before the body (tests/test_api_errors.py).
CI runs a fixed (derandomized) set of 500; ``INBOXD_FUZZ_EXAMPLES=N`` runs N new random ones.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote

import httpx
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inboxd.api.openapi import document
from tests.conftest import Seed, auth, ingest
from tests.openapi_check import check_response

DOCUMENT = document()
METHODS = ("get", "post", "put", "patch", "delete")
OPERATIONS = {
    (method.upper(), path): operation
    for path, item in DOCUMENT["paths"].items()
    for method, operation in item.items()
    if method in METHODS
}
# CI runs a fixed set; INBOXD_FUZZ_EXAMPLES=N runs N random ones (a new set each time).
EXAMPLES = int(os.environ.get("INBOXD_FUZZ_EXAMPLES", "0")) or 500
FIXED = "INBOXD_FUZZ_EXAMPLES" not in os.environ

ODD_TEXT = st.one_of(
    st.text(max_size=24),
    st.sampled_from(
        [
            "",
            " ",
            "0",
            "-1",
            "1e309",
            "NaN",
            "null",
            "true",
            "\x00",
            "%00",
            "../..",
            "ß",
            "😀",
            "2026-13-45T99:99:99Z",
            "a" * 3000,
        ]
    ),
)
# What a client can put in a header at all (httpx sends printable ASCII; the ends are trimmed).
HEADER_TEXT = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=300)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | ODD_TEXT,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def _resolve(node: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        section = "parameters" if "/parameters/" in node["$ref"] else "schemas"
        node = DOCUMENT["components"][section][name]
    return node


def _property_names(schema: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    schema = _resolve(schema)
    for variant in schema.get("oneOf", []) + schema.get("anyOf", []):
        yield from _property_names(variant)
    yield from schema.get("properties", {}).items()


def _body(operation: Mapping[str, Any]) -> st.SearchStrategy[Any]:
    """Any JSON, or an object of the documented fields (nested objects too) with any values."""
    content = operation.get("requestBody", {}).get("content", {}).get("application/json")
    if content is None:
        return st.none()

    def fields(schema: Mapping[str, Any], depth: int) -> st.SearchStrategy[Any]:
        properties = dict(_property_names(schema))
        if not properties or depth > 1:
            return JSON
        return st.fixed_dictionaries(
            {},
            optional={
                name: st.one_of(JSON, fields(sub, depth + 1)) for name, sub in properties.items()
            },
        )

    return st.one_of(JSON, fields(content["schema"], 0))


def _parameters(operation: Mapping[str, Any], where: str) -> list[str]:
    found = (_resolve(p) for p in operation.get("parameters", []))
    return [p["name"] for p in found if p["in"] == where]


async def test_no_input_makes_a_5xx_or_an_undocumented_answer(
    base_url: str, owner: httpx.AsyncClient, seeded: Seed
) -> None:
    message = await ingest(owner, seeded.sales_id, "15550001234", content="hello fuzz")
    ids = {
        "channelId": [seeded.sales_id, seeded.support_id],
        "conversationId": [message["conversationId"]],
        "messageId": [message["id"]],
        "memberId": [seeded.ann_id, seeded.bob_id],
    }
    keys = [seeded.owner_key, seeded.bob_key]
    await trio.to_thread.run_sync(_fuzz, base_url, keys, ids)


def _fuzz(base_url: str, keys: list[str], ids: dict[str, list[str]]) -> None:
    def checked(response: httpx.Response) -> None:
        response.read()
        check_response(response)

    with httpx.Client(
        base_url=base_url, timeout=10.0, event_hooks={"response": [checked]}
    ) as client:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=FIXED,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(data=st.data())
        def one_request(data: st.DataObject) -> None:
            method, path = data.draw(st.sampled_from(sorted(OPERATIONS)), "operation")
            operation = OPERATIONS[method, path]
            for name in _parameters(operation, "path"):
                real = ids.get(name)
                value = data.draw(st.sampled_from(real) | ODD_TEXT if real else ODD_TEXT, name)
                path = path.replace("{" + name + "}", quote(value, safe=""))
            params = data.draw(
                st.fixed_dictionaries(
                    {}, optional={n: ODD_TEXT for n in _parameters(operation, "query")}
                ),
                "query",
            )
            headers = auth(data.draw(st.sampled_from(keys), "key"))
            if "Idempotency-Key" in _parameters(operation, "header") and data.draw(
                st.booleans(), "with Idempotency-Key"
            ):
                headers["Idempotency-Key"] = data.draw(HEADER_TEXT, "Idempotency-Key")
            body = data.draw(_body(operation), "body")
            response = client.request(
                method,
                path,
                params=params,
                headers=headers,
                json=body if method in {"POST", "PUT", "PATCH"} else None,
            )
            assert response.status_code < 500, (response.status_code, response.text[:500])

        one_request()
