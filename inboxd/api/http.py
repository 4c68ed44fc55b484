"""Request parsing and JSON responses shared by every route.

Each helper raises ``InvalidRequest`` (400), ``UnsupportedMediaType`` (415) or lets Quart raise 413,
with a message that names the offending parameter, so clients learn what to fix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final, TypeVar, cast

import orjson
from quart import Response, g, request

from inboxd import cursors
from inboxd.errors import InvalidRequest, UnsupportedMediaType
from inboxd.timeutil import BadTimestamp, OutOfRange, parse_instant

_JSON: Final = "application/json"
_SMALL_NUMBER: Final = re.compile(r"[0-9]{1,4}")
DEFAULT_LIMIT: Final = 50
MAX_LIMIT: Final = 200

T = TypeVar("T")


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def json_response(
    obj: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return encoded_json(dumps(obj), status, headers)


def encoded_json(
    body: bytes | str, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """A response whose JSON is already encoded (stored, built in SQL, by the writer process,
    or kept for an Idempotency-Key)."""
    return Response(body, status=status, headers=dict(headers or {}), content_type=_JSON)


# -- query parameters ----------------------------------------------------------------------------


def _arg(name: str) -> str | None:
    """The query parameter's (first) value, None when it is not given. Not ``args.get``:
    werkzeug's ``get`` raises and catches a ``BadRequestKeyError`` for a name not given, about
    2 us each (by hand), and a list page asks for six that are usually absent."""
    args = request.args
    return args[name] if name in args else None  # noqa: SIM401 (the point of this helper)


def arg_limit() -> int:
    raw = _arg("limit")
    if raw is None:  # (given empty it is a bad limit: CONTRACT section 2, "anything else")
        return DEFAULT_LIMIT
    if not _SMALL_NUMBER.fullmatch(raw) or not 1 <= int(raw) <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be a whole number from 1 to {MAX_LIMIT}")
    value = int(raw)
    return value


def arg_cursor() -> tuple[int, int] | None:
    raw = _arg("cursor")
    if raw is None or raw == "":
        return None
    try:
        return cursors.decode(raw)
    except BadTimestamp:
        raise InvalidRequest(
            "cursor must be the nextCursor of the previous page (an ISO 8601 date-time)"
        ) from None


def arg_str(name: str, *, required: bool = False, empty_allowed: bool = True) -> str | None:
    """A query parameter's text; an empty one is None, or, when required, "" if
    ``empty_allowed`` (an empty search query finds nothing) and missing if not."""
    raw = _arg(name)
    if raw is None or (raw == "" and not (required and empty_allowed)):
        if required:
            raise InvalidRequest(f"query parameter {name} is required")
        return None
    return raw


def arg_choice(name: str, choices: tuple[str, ...], default: str | None = None) -> str | None:
    raw = _arg(name)
    if raw is None or raw == "":
        return default
    if raw not in choices:
        raise InvalidRequest(f"{name} must be one of {', '.join(choices)}")
    return raw


def arg_bool(name: str) -> bool:
    raw = _arg(name)
    if raw is None or raw == "":
        return False
    lowered = raw.lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise InvalidRequest(f"{name} must be true or false")


# -- bodies --------------------------------------------------------------------------------------


async def read_body() -> bytes:
    """The request's whole body (Quart's body timeout and size limit apply), noted as read:
    the app's finish_request hook then has nothing left to wait for."""
    data = await request.get_data(as_text=False)
    assert isinstance(data, bytes)
    cast(Any, g)._get_current_object().body_read = True
    return data


async def json_body(*, required: bool = True) -> dict[str, Any]:
    """The request body as a JSON object. An empty body is ``{}`` where no body is required."""
    data = await read_body()
    if not data:
        if required:
            raise InvalidRequest("the request body must be a JSON object")
        return {}
    req = cast(Any, request)._get_current_object()
    # The usual header as it is, else werkzeug's parse (case, parameters such as charset).
    if req.headers.get("Content-Type") != _JSON and req.mimetype != _JSON:
        raise UnsupportedMediaType("the request body must be application/json")
    try:
        # orjson reads RFC 8259 JSON only: UTF-8 without a byte order mark, no NaN or Infinity,
        # no lone surrogate escape ("\\ud800", which no stored text may hold), nesting at most
        # 1,024 deep. Integers past 64 bits come back as floats (a field wanting a whole number
        # then says so).
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise InvalidRequest("the request body is not valid JSON (UTF-8 text, no NaN)") from None
    if not isinstance(value, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return value


_MISSING: Final = object()


def field(
    body: Mapping[str, Any],
    name: str,
    kind: type[T] | tuple[type, ...],
    *,
    required: bool = False,
    nullable: bool = False,
    max_len: int | None = None,
) -> Any:
    """One body field, checked for presence and type. Booleans never pass as numbers."""
    value = body.get(name, _MISSING)
    if value is _MISSING:
        if required:
            raise InvalidRequest(f"{name} is required")
        return None
    if value is None:
        if nullable or not required:
            return None
        raise InvalidRequest(f"{name} must not be null")
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise InvalidRequest(f"{name} must be {_kind_name(kinds)}")
    if not isinstance(value, kinds):
        raise InvalidRequest(f"{name} must be {_kind_name(kinds)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidRequest(f"{name} must be a finite number")
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        raise InvalidRequest(f"{name} is out of range")
    if max_len is not None and isinstance(value, str) and len(value) > max_len:
        raise InvalidRequest(f"{name} must be at most {max_len} characters")
    return value


def trimmed_field(body: Mapping[str, Any], name: str, max_len: int) -> str:
    """A required string field without the white space around it, 1 to ``max_len`` characters
    long once trimmed (the spaces around it do not count against the length)."""
    value: str = field(body, name, str, required=True).strip()
    if not value:
        raise InvalidRequest(f"{name} must not be empty")
    if len(value) > max_len:
        raise InvalidRequest(f"{name} must be at most {max_len} characters")
    return value


def _kind_name(kinds: tuple[type, ...]) -> str:
    names = {
        str: "a string",
        int: "a whole number",
        float: "a number",
        bool: "a boolean",
        dict: "an object",
        list: "a list",
    }
    if int in kinds and float in kinds:
        return "a number"
    named = sorted({names.get(k, k.__name__) for k in kinds})
    return " or ".join(named)


def field_instant(body: Mapping[str, Any], name: str) -> int | None:
    value = field(body, name, str)
    if value is None:
        return None
    try:
        return parse_instant(value)
    except OutOfRange:
        raise InvalidRequest(f"{name} must lie between 1970-01-01 and 9999-12-31 UTC") from None
    except BadTimestamp:
        raise InvalidRequest(
            f"{name} must be an ISO 8601 date-time with a time zone offset"
        ) from None
