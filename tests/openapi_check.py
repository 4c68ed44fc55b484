"""Hold what the server really sends to its OpenAPI document (inboxd/api/openapi.py).

``check_response`` takes any response a test client got and fails (AssertionError) unless the
document describes it: the route and method are documented (a path no route serves must be the
404 the document promises for those; a documented path with another method the 405 with an
``Allow`` that lists exactly the documented methods), the status is documented for the operation,
its required headers are there, its content type is documented, and a JSON body validates against
the documented schema (JSON Schema 2020-12, formats asserted). When the server accepted a request
(2xx), the request must also have been one the document allows: its JSON body validates against
the request schema and the required query parameters were there.

``check_webhook_request`` and ``check_feed_frame`` do the same for what the server sends to
webhook receivers and websocket clients.

conftest.py hooks ``check_response`` into the shared HTTP clients, so every test doubles as a
check of the document.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Any, Final

import httpx
from jsonschema import Draft202012Validator

from inboxd.api.openapi import document

# Quart answers these for every route by itself; the document says so once instead of per path.
AUTOMATIC_METHODS = frozenset({"head", "options"})
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


class Mismatch(AssertionError):
    """The server did something its OpenAPI document does not describe."""


@functools.cache
def _templates() -> list[tuple[str, re.Pattern[str], int]]:
    """(template, regex, number of literal segments) for every documented path."""
    out = []
    for template in document()["paths"]:
        pattern = re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(template))
        literals = sum(1 for part in template.split("/") if part and not part.startswith("{"))
        out.append((template, re.compile(f"^{pattern}$"), literals))
    return out


def matching_templates(path: str) -> list[str]:
    """The documented path templates that match ``path``, literal segments first (as the
    router prefers ``/conversations/search`` to ``/conversations/{conversationId}``)."""
    found = [(literals, t) for t, rx, literals in _templates() if rx.match(path)]
    return [t for _, t in sorted(found, reverse=True)]


def find_operation(method: str, path: str) -> tuple[str, dict[str, Any]] | None:
    method = method.lower()
    for template in matching_templates(path):
        operation = document()["paths"][template].get(method)
        if operation is not None:
            return template, operation
    return None


def documented_methods(path: str) -> set[str]:
    return {
        m.upper() for t in matching_templates(path) for m in document()["paths"][t] if m in METHODS
    }


@functools.cache
def _validator(schema_json: str) -> Draft202012Validator:
    """A validator for one schema of the document; ``#/components/...`` refs resolve against the
    document's components."""
    schema = json.loads(schema_json)
    return Draft202012Validator(
        {**schema, "components": document()["components"]},
        format_checker=Draft202012Validator.FORMAT_CHECKER,
    )


def validate(instance: Any, schema: Mapping[str, Any], what: str) -> None:
    validator = _validator(json.dumps(schema, sort_keys=True))
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    if errors:
        details = "\n".join(
            f"  at {'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message[:300]}"
            for e in errors[:5]
        )
        raise Mismatch(f"{what} does not match the OpenAPI document:\n{details}")


def resolve(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """Follow a local ``$ref`` (a response, header or parameter) to what it names."""
    while "$ref" in node:
        target: Any = document()
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def _documented_response(operation: Mapping[str, Any], status: int) -> Mapping[str, Any] | None:
    responses = operation["responses"]
    for key in (str(status), f"{status // 100}XX", "default"):
        if key in responses:
            return resolve(responses[key])
    return None


def _is_error(response: httpx.Response, status: int, code: str) -> bool:
    if response.status_code != status:
        return False
    validate(response.json(), {"$ref": "#/components/schemas/Error"}, f"{status} body")
    return bool(response.json()["error"]["code"] == code)


def check_response(response: httpx.Response) -> None:
    """Fail unless the OpenAPI document describes this response to this request."""
    request = response.request
    method, path = request.method, request.url.path
    where = f"{method} {path} -> {response.status_code}"
    if not matching_templates(path):
        if not _is_error(response, 404, "not_found"):
            raise Mismatch(f"{where}: the document has no such path")
        return
    lookup = "GET" if method == "HEAD" else method
    found = find_operation(lookup, path)
    if found is None:
        documented = documented_methods(path)
        if method == "OPTIONS":
            if response.status_code == 200:
                allowed = {m.strip() for m in response.headers.get("allow", "").split(",")}
                if allowed - {"HEAD", "OPTIONS"} != documented:
                    raise Mismatch(f"{where}: Allow {sorted(allowed)} but documented {documented}")
            return
        if not _is_error(response, 405, "method_not_allowed"):
            raise Mismatch(f"{where}: the document has no {method} for this path")
        allowed = {m.strip() for m in response.headers["allow"].split(",")}
        if allowed - {"HEAD", "OPTIONS"} != documented:
            raise Mismatch(f"{where}: Allow {sorted(allowed)} but documented {documented}")
        return
    template, operation = found
    where = f"{method} {template} -> {response.status_code}"
    documented = _documented_response(operation, response.status_code)
    if documented is None:
        raise Mismatch(
            f"{where}: status not documented (documented: {sorted(operation['responses'])});"
            f" body {response.text[:300]}"
        )
    _check_headers(response, documented, where)
    if method != "HEAD":
        _check_body(response, documented, where)
    if 200 <= response.status_code < 300:
        _check_request(request, operation, where)


# Headers the server adds to some responses only; each must be documented where it appears.
MEANINGFUL_HEADERS = ("Idempotent-Replayed", "Retry-After", "WWW-Authenticate")


def _check_headers(response: httpx.Response, documented: Mapping[str, Any], where: str) -> None:
    headers = {name: resolve(header) for name, header in documented.get("headers", {}).items()}
    for name, header in headers.items():
        value = response.headers.get(name)
        if value is None:
            if header.get("required"):
                raise Mismatch(f"{where}: the documented header {name} is missing")
            continue
        validate(value, header["schema"], f"{where} header {name}")
    for name in MEANINGFUL_HEADERS:
        if name in response.headers and name not in headers:
            raise Mismatch(f"{where}: header {name} is not documented for this response")


def _check_body(response: httpx.Response, documented: Mapping[str, Any], where: str) -> None:
    content = documented.get("content")
    if not content:
        if response.content:
            raise Mismatch(f"{where}: a body where the document has none")
        return
    media_type = response.headers.get("content-type", "").split(";")[0].strip()
    if media_type not in content:
        raise Mismatch(f"{where}: content type {media_type!r}, documented {sorted(content)}")
    if media_type == "application/json":
        validate(response.json(), content[media_type]["schema"], f"{where} body")


# How a query string spells a boolean: the document's `true`/`false` and the `1`/`0` its
# descriptions allow, in any case (README, "Query parameters").
_BOOLEANS: Final = {"true": True, "false": False, "1": True, "0": False}


def _parameter_value(raw: str, schema: Mapping[str, Any], where: str) -> Any:
    """A query or header value as the schema's type, or the raw text when it is no such value
    (which then fails the schema)."""
    kind = schema.get("type")
    if kind == "integer":
        return int(raw) if re.fullmatch(r"-?[0-9]+", raw) else raw
    if kind == "boolean":
        return _BOOLEANS.get(raw.lower(), raw)
    if kind == "string":
        return raw
    raise Mismatch(f"{where}: the checker cannot read a parameter of schema {dict(schema)}")


def _check_request(request: httpx.Request, operation: Mapping[str, Any], where: str) -> None:
    """A request the server accepted must be one the document allows: its parameters (present
    when required, each value within its schema) and its body."""
    for parameter in map(resolve, operation.get("parameters", [])):
        name, place = parameter["name"], parameter["in"]
        if place == "query":
            values = request.url.params.get_list(name)
        elif place == "header":
            values = request.headers.get_list(name)
        else:
            continue
        if not parameter.get("required") and name != "limit":
            # An empty optional value is absent (README), but limit is 1..200 or a 400 (CONTRACT).
            values = [v for v in values if v != ""]
        if not values:
            if parameter.get("required"):
                raise Mismatch(f"{where}: accepted without the required {name}")
            continue
        # The server reads the first of repeated values (request.args.get); so does this.
        raw, schema = values[0], resolve(parameter["schema"])
        what = f"{where} {place} {name}={raw!r}"
        validate(_parameter_value(raw, schema, what), schema, what)
    body = request.content
    documented = operation.get("requestBody")
    if documented is None:
        if body:
            raise Mismatch(f"{where}: accepted a body the document does not describe")
        return
    if not body:
        if documented.get("required"):
            raise Mismatch(f"{where}: accepted without the required body")
        return
    # Media types are case-insensitive (RFC 9110, 8.3.1).
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type not in documented["content"]:
        raise Mismatch(f"{where}: accepted a {media_type} body, documented {documented['content']}")
    if media_type == "application/json":
        schema = documented["content"][media_type]["schema"]
        validate(json.loads(body), schema, f"{where} request body")


async def check_response_hook(response: httpx.Response) -> None:
    """httpx ``event_hooks`` form: the body must be read before it can be checked."""
    await response.aread()
    check_response(response)


def check_webhook_request(headers: Mapping[str, str], body: bytes) -> None:
    """Fail unless the document's ``webhooks`` describe this request a receiver got."""
    lowered = {k.lower(): v for k, v in headers.items()}
    event_type = lowered.get("x-svc-event", "")
    for name, webhook in document()["webhooks"].items():
        operation = webhook["post"]
        parameters = {p["name"]: p for p in operation["parameters"]}
        if event_type not in parameters["X-Svc-Event"]["schema"]["enum"]:
            continue
        for parameter in parameters.values():
            value = lowered.get(parameter["name"].lower())
            if value is None:
                raise Mismatch(f"webhook {name} {event_type}: no {parameter['name']} header")
            validate(value, parameter["schema"], f"webhook {name} header {parameter['name']}")
        envelope = json.loads(body)
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        validate(envelope, schema, f"webhook {name} {event_type} body")
        if envelope["type"] != event_type:
            raise Mismatch(f"webhook {name}: X-Svc-Event {event_type}, body {envelope['type']}")
        return
    raise Mismatch(f"no documented webhook sends the event type {event_type!r}")


def check_feed_frame(frame: Any) -> None:
    """Fail unless ``frame`` (a decoded websocket text frame) is a documented feed frame."""
    schema = {"oneOf": [{"$ref": f"#/components/schemas/{n}"} for n in ("FeedEvent", "FeedReset")]}
    validate(frame, schema, "feed frame")
