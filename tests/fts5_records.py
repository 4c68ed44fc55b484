"""Reading FTS5's own records in the tests (https://sqlite.org/fts5.html has no API for them;
the layout is in SQLite's fts5_index.c): their integers are SQLite varints."""

from __future__ import annotations


def varint(blob: bytes, i: int) -> tuple[int, int]:
    """The SQLite varint at ``blob[i]`` and the offset past it: 7 bits a byte, high bit set on
    every byte but the last, a ninth byte giving all 8 of its bits."""
    value = 0
    for k in range(9):
        byte = blob[i]
        i += 1
        if k == 8:
            return (value << 8) | byte, i
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, i
    raise AssertionError("unreachable")
