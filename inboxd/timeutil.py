"""Time on the wire and in the store.

The store keeps every instant as integer microseconds since the Unix epoch (UTC): compact, exact and
cheap to compare in indexes. The wire carries ISO 8601 UTC with a ``Z`` suffix and six fractional
digits (CONTRACT section 2); inputs accept any ISO 8601 date-time that carries an offset.
"""

from __future__ import annotations

import calendar
import datetime as dt
import functools
import re
import time
from typing import Final

_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US: Final = dt.timedelta(microseconds=1)

# Any ISO 8601 date-time with an explicit offset (CONTRACT section 2), extended or basic
# (2026-11-22T01:16:19Z, 20261122T011619Z): a calendar, week (2026-W47-7, 2026W477) or ordinal
# (2026-326, 2026326) date; "T" or a space; hours, hours and minutes, or all three; a decimal
# fraction of the last of them after "." or ","; and "Z", +hh, +hhmm or +hh:mm. Python's
# fromisoformat truncates fractions past six digits, so the fraction is split off here and read
# digit by digit (see cursors.py for why).
ISO_DATE_TIME: Final = (
    r"^(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2}|[0-9]{8}"
    r"|[0-9]{4}-W[0-9]{2}-[0-9]|[0-9]{4}W[0-9]{3}"
    r"|[0-9]{4}-[0-9]{3}|[0-9]{7})[Tt ]"
    r"(?P<hms>[0-9]{2}(?::[0-9]{2}(?::[0-9]{2})?|[0-9]{2}(?:[0-9]{2})?)?)"
    r"(?:[.,](?P<frac>[0-9]{1,30}))?(?P<tz>[Zz]|[+-][0-9]{2}(?::?[0-9]{2})?)$"
)
_ISO_RE: Final = re.compile(ISO_DATE_TIME)
# The same without group names, as JSON Schema (ECMA-262) writes a pattern: what the OpenAPI
# document states for the date-times a client sends.
ISO_DATE_TIME_SCHEMA: Final = re.sub(r"\?P<\w+>", "", ISO_DATE_TIME)
# Instants the store and the wire can hold: from the epoch to the end of year 9999.
MIN_US: Final = 0
MAX_US: Final = 253_402_300_799_999_999


def now_us() -> int:
    """The current wall-clock time in microseconds since the epoch."""
    return time.time_ns() // 1000


@functools.lru_cache(maxsize=4096)
def _day_prefix(days: int) -> str:
    return (_EPOCH + dt.timedelta(days=days)).strftime("%Y-%m-%dT")


def format_us(us: int) -> str:
    """Microseconds since the epoch as ``2026-11-22T01:16:19.123456Z``.

    On the hot path of every response (four per conversation row): the date part is cached per
    day and the rest is integer arithmetic, about four times faster than datetime.strftime.
    """
    secs, micro = divmod(us, 1_000_000)
    days, rem = divmod(secs, 86_400)
    hours, rem = divmod(rem, 3600)
    minutes, seconds = divmod(rem, 60)
    return f"{_day_prefix(days)}{hours:02d}:{minutes:02d}:{seconds:02d}.{micro:06d}Z"


def format_opt(us: int | None) -> str | None:
    return None if us is None else format_us(us)


class BadTimestamp(ValueError):
    """Raised for a string that is not an ISO 8601 date-time with an offset."""


class OutOfRange(BadTimestamp):
    """Raised for a date-time before 1970-01-01 or after 9999-12-31 UTC: the store keeps
    instants as microseconds from the epoch, and the wire writes years with four digits."""


class _PastTheEnd(Exception):
    """A valid ISO date after 9999-12-31 (week 52 or 53 of 9999 ending in 10000)."""


def _date(text: str) -> dt.date:
    """The date part of ``ISO_DATE_TIME``: calendar, week or ordinal, extended or basic.
    ValueError for a date that does not exist; _PastTheEnd for one after 9999-12-31."""
    year = int(text[:4])
    rest = text[4:].lstrip("-")
    if rest.startswith("W"):  # week date: Www-D or WwwD
        week, weekday = int(rest[1:].replace("-", "")[:2]), int(rest[-1])
        weeks = 53 if dt.date(year, 12, 28).isocalendar().week == 53 else 52
        if not (1 <= week <= weeks and 1 <= weekday <= 7):
            raise ValueError(f"{year} has no day {weekday} of week {week}")
        if year == dt.MAXYEAR and (week, weekday) > dt.date(year, 12, 31).isocalendar()[1:]:
            raise _PastTheEnd(text)
        return dt.date.fromisocalendar(year, week, weekday)
    if len(rest) == 3:  # ordinal date: the day of the year
        day_of_year = int(rest)
        if not 1 <= day_of_year <= (366 if calendar.isleap(year) else 365):
            raise ValueError(f"{year} has no day {day_of_year}")
        return dt.date(year, 1, 1) + dt.timedelta(days=day_of_year - 1)
    digits = rest.replace("-", "")
    return dt.date(year, int(digits[:2]), int(digits[2:]))


# Microseconds in the unit that a fraction on hours, minutes or seconds is a fraction of.
_FRACTION_OF: Final = {2: 3_600_000_000, 4: 60_000_000, 6: 1_000_000}


def parse_iso(text: str, *, bounded: bool = True) -> tuple[int, str]:
    """Parse an ISO 8601 date-time with an offset.

    Returns the instant in whole microseconds (truncated) and what the fraction holds below the
    microsecond: for a fraction of seconds, its digits past the sixth, which only cursors use;
    for a fraction of hours or minutes, "1" when it does not come out in whole microseconds.
    Raises BadTimestamp for anything else, naive times included, and, when ``bounded``, for
    instants outside what the store and the wire hold (1970-01-01 to 9999-12-31 UTC).
    """
    m = _ISO_RE.fullmatch(text)
    if m is None:
        raise BadTimestamp(f"{text!r} is not an ISO 8601 date-time with a time zone offset")
    frac = m["frac"] or ""
    tz = m["tz"]
    if tz in ("Z", "z"):
        tz = "+00:00"
    elif len(tz) == 3:
        tz += ":00"
    elif ":" not in tz:
        tz = tz[:3] + ":" + tz[3:]
    clock = m["hms"].replace(":", "")
    try:
        day = _date(m["date"])
        base = dt.datetime.fromisoformat(
            f"{day.isoformat()}T{clock[:2]}:{clock[2:4] or '00'}:{clock[4:] or '00'}{tz}"
        )
    except _PastTheEnd:
        if bounded:
            raise OutOfRange(f"{text!r} is outside 1970-01-01 to 9999-12-31 UTC") from None
        return MAX_US + 1, ""
    except (ValueError, OverflowError) as exc:
        raise BadTimestamp(f"{text!r} is not a valid date-time") from exc
    extra = ""
    if len(clock) == 6:  # a fraction of seconds: the first six digits are microseconds
        micros = int((frac + "000000")[:6])
        extra = frac[6:]
    elif frac:  # of hours or minutes: exact in integers, truncated to the microsecond
        micros, below = divmod(int(frac) * _FRACTION_OF[len(clock)], 10 ** len(frac))
        extra = "1" if below else ""
    else:
        micros = 0
    delta = base - _EPOCH
    us = (delta.days * 86_400 + delta.seconds) * 1_000_000 + micros
    if bounded and not MIN_US <= us <= MAX_US:
        raise OutOfRange(f"{text!r} is outside 1970-01-01 to 9999-12-31 UTC")
    return us, extra


def parse_instant(text: str) -> int:
    """An ISO 8601 date-time with an offset, as microseconds since the epoch."""
    return parse_iso(text)[0]
