"""Cursors are ISO date-times that carry a tie-breaker below the microsecond."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inboxd import cursors
from inboxd.timeutil import ISO_DATE_TIME_SCHEMA, BadTimestamp, format_us, parse_instant


@given(st.integers(0, 4_102_444_800_000_000), st.integers(1, 10**13 - 1))
def test_round_trip_and_still_a_date_time(at: int, pk: int) -> None:
    text = cursors.encode(at, pk)
    assert cursors.decode(text) == (at, pk)
    # Any ISO parser reads it as the row's own instant.
    parsed = dt.datetime.fromisoformat(text)
    assert format_us(int(parsed.timestamp()) * 1_000_000 + parsed.microsecond) == format_us(at)


def test_plain_instants() -> None:
    assert cursors.decode("2026-01-01T00:00:00Z") == (1_767_225_600_000_000, 0)
    assert cursors.decode("2026-01-01T01:00:00+01:00") == (1_767_225_600_000_000, 0)
    assert cursors.decode("2026-01-01T00:00:00.000000000Z") == (1_767_225_600_000_000, 0)
    assert cursors.decode("2026-01-01T00:00:00.0000001Z")[1] == 2**63 - 1


@pytest.mark.parametrize(
    "text",
    [
        "",
        "2026-01-01",
        "2026-01-01T00:00:00",
        "soon",
        "2026-13-01T00:00:00Z",
        " 2026-01-01T00:00:00Z",
        "2026-01-01T00:00:00Z\n",
        "\u0662026-01-01T00:00:00Z",
    ],
)
def test_rejects_what_is_not_a_date_time_with_offset(text: str) -> None:
    with pytest.raises(BadTimestamp):
        cursors.decode(text)


@pytest.mark.parametrize(
    "text",
    [
        "2026-01-01T00:00Z",
        "2026-01-01 00:00:00+01",
        "2026-01-01t00:00:00,5+0100",
        "2026-01-01T00:00:00.1234567890123456789-05:30",
        "20260101T000000Z",
        "20260101T0000+0100",
        "2026-W01-4T00:00:00Z",
        "2026W014T00Z",
        "2026-001T00:00Z",
        "2026001T00Z",
        "2026-01-01T00,5Z",
    ],
)
def test_the_iso_forms_the_document_states_are_the_forms_accepted(text: str) -> None:
    """The OpenAPI document's pattern for the date-times clients send (cursor, sentAt) is the
    parser's own, without its group names."""
    assert re.search(ISO_DATE_TIME_SCHEMA, text)
    assert cursors.decode(text)[0] > 0


def test_the_basic_format_reads_as_the_extended_one() -> None:
    assert parse_instant("20261122T011619.5+0100") == parse_instant("2026-11-22T01:16:19.5+01:00")
    assert parse_instant("20261122T0116Z") == parse_instant("2026-11-22T01:16:00Z")


def test_week_and_ordinal_dates_and_fractions_of_hours_and_minutes() -> None:
    day = parse_instant("2026-01-06T00:00:00Z")
    for text in ("2026-W02-2T00:00:00Z", "2026W022T00Z", "2026-006T00:00Z", "2026006T00Z"):
        assert parse_instant(text) == day, text
    assert parse_instant("2020-366T12:00:00Z") == parse_instant("2020-12-31T12:00:00Z")
    # A fraction is of the last unit given (ISO 8601), not always of seconds.
    assert parse_instant("2026-01-06T01,25Z") == parse_instant("2026-01-06T01:15:00Z")
    assert parse_instant("2026-01-06T01:00.5Z") == parse_instant("2026-01-06T01:00:30Z")
    assert parse_instant("2026-01-06T0100.5+01") == parse_instant("2026-01-06T00:00:30Z")
    # Past the microsecond, a fraction of minutes places the instant after its microsecond's rows.
    assert cursors.decode("2026-01-06T00:00.00000001Z") == (day, 2**63 - 1)
    for bad in (
        "2025-366T00:00:00Z",
        "2026-000T00:00:00Z",
        "2026-W54-1T00:00:00Z",
        "2026-W02-8T00:00:00Z",
        "2026-W022T00:00:00Z",
        "2026-01-06T1Z",
    ):
        with pytest.raises(BadTimestamp):
            parse_instant(bad)


def test_cursors_beyond_what_the_store_holds_are_bounds_not_errors() -> None:
    """Before the epoch: older than every row; past 9999: newer than every row. ``sentAt``
    (``parse_instant``) still refuses them."""
    assert cursors.decode("1969-12-31T23:59:59.999999Z") == (0, 0)
    assert cursors.decode("0001-01-01T00:00:00Z") == (0, 0)
    assert cursors.decode("9999-12-31T23:59:59-01:00") == (253_402_300_799_999_999, 2**63 - 1)
    # A week date in week 52 of 9999 can fall in 10000: past the end, not an error.
    assert cursors.decode("9999-W52-6T00Z") == (253_402_300_799_999_999, 2**63 - 1)
    for text in ("1969-12-31T23:59:59Z", "9999-12-31T23:59:59-01:00", "9999-W52-6T00Z"):
        with pytest.raises(BadTimestamp, match="outside 1970-01-01"):
            parse_instant(text)
    # Days that do not exist are not dates (day 366 of 9999 crashed the parser: a 500).
    for text in (
        "9999-366T00:00Z",
        "9999366T00Z",
        "2023-366T00Z",
        "2021-W53-1T00Z",
        "0000-001T00Z",
    ):
        with pytest.raises(BadTimestamp, match="not a valid date-time"):
            cursors.decode(text)


def test_parse_instant_accepts_offsets() -> None:
    assert parse_instant("2026-11-22T01:16:19.123456Z") == parse_instant(
        "2026-11-22T02:16:19.123456+01:00"
    )
