"""Page cursors that are date-times and still never skip or repeat a row.

The spec makes each cursor "an ISO date-time" (conversations: lastMessageAt; messages: createdAt),
and CONTRACT section 2 requires that walking pages returns every row exactly once even when
hundreds of rows share one timestamp. Both hold because ISO 8601 allows any number of fractional
digits: ``nextCursor`` is the last row's instant with its six microsecond digits followed by 13 more
that carry the row's position among rows of that same microsecond::

    2026-11-22T01:16:19.123456 0000000004711 Z   (written without the spaces)

ISO 8601 and RFC 3339 allow that, and Python's (3.11+), JavaScript's and Go's parsers read it as
the row's own instant (the extra digits are below a microsecond), so a client may treat it as the
date-time the spec promises; Java's java.time and .NET stop at nine and seven fractional digits,
and there a client keeps it a string (README). Passed back verbatim it continues exactly after
that row. A plain date-time a client writes itself means "rows older than this instant". (Nine
digits would leave three for the place among rows of one microsecond, and an import may give
thousands of rows the same instant.)
"""

from __future__ import annotations

from typing import Final

from inboxd.timeutil import MAX_US, MIN_US, format_us, parse_iso

_TIE_DIGITS: Final = 13
# A tie-breaker bound that lets every row of the cursor's microsecond through.
_ALL_OF_INSTANT: Final = 2**63 - 1


def encode(at_us: int, pk: int) -> str:
    """The cursor that continues after the row (at_us, pk) in newest-first order."""
    base = format_us(at_us)  # ...SS.ffffffZ
    return f"{base[:-1]}{pk:0{_TIE_DIGITS}d}Z"


def decode(text: str) -> tuple[int, int]:
    """A cursor as the exclusive bound (instant_us, pk): rows with (at, pk) < bound come next.

    Raises timeutil.BadTimestamp for text that is not a date-time with an offset. An instant
    before the epoch is older than every row (an empty page follows); one past the end of year
    9999 is newer than every row (the first page).
    """
    us, extra = parse_iso(text, bounded=False)
    if us < MIN_US:
        return MIN_US, 0
    if us > MAX_US:
        return MAX_US, _ALL_OF_INSTANT
    if len(extra) == _TIE_DIGITS:
        return us, int(extra)
    if extra.strip("0"):
        # A plain instant with sub-microsecond digits lies after every row of its microsecond.
        return us, _ALL_OF_INSTANT
    return us, 0
