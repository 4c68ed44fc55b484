"""Write functions for tests/test_writer.py. The writer process imports them by name, so they
live here, apart from pytest and the fixtures (the child imports only what it needs)."""

from __future__ import annotations

import os
import sqlite3
import time

from inboxd.errors import Conflict
from inboxd.store import db, events


def record_pid(conn: sqlite3.Connection, n: int) -> int:
    """Journal a test event holding the process that ran this write; return its pid."""
    events.append(conn, 1, None, "test.pid", {"n": n, "pid": os.getpid()}, 1)
    db.wake(conn, "test.signal")
    return os.getpid()


def refuse_after_writing(conn: sqlite3.Connection, n: int) -> None:
    """Write, then refuse: the write must be undone alone."""
    events.append(conn, 1, None, "test.pid", {"n": n, "pid": os.getpid()}, 1)
    raise Conflict(f"write {n} refuses", code="test_refused")


class Unpicklable(Exception):
    def __init__(self, a: str, b: str) -> None:  # pickling calls Unpicklable(msg): TypeError
        super().__init__(f"{a} {b}")


def raise_unpicklable(conn: sqlite3.Connection) -> None:
    raise Unpicklable("no", "pickle")


def sleep_then_record(conn: sqlite3.Connection, seconds: float) -> None:
    events.append(conn, 1, None, "test.pid", {"n": -1, "pid": os.getpid()}, 1)
    time.sleep(seconds)


def print_then_record(conn: sqlite3.Connection, n: int) -> int:
    """A write that prints (to stdout, as a stray debug line or a library might)."""
    print(f"debug: hello from write {n}")
    return record_pid(conn, n)


def return_unpicklable(conn: sqlite3.Connection, n: int) -> object:
    """Write, then return something that does not pickle: the write must be undone alone."""
    events.append(conn, 1, None, "test.pid", {"n": n, "pid": os.getpid()}, 1)
    return lambda: n


def echo_large(conn: sqlite3.Connection, blob: bytes) -> bytes:
    """Journal a test event and return ``blob`` doubled: a batch and an answer larger than a
    pipe holds at once."""
    events.append(conn, 1, None, "test.pid", {"n": len(blob), "pid": os.getpid()}, 1)
    return blob + blob


def die_after_the_next_commit(conn: sqlite3.Connection) -> None:
    """In the writer child: the next batch commits, then the child dies before it answers
    (what a SIGKILL or the OOM killer does in that window)."""
    run_batch = db.run_batch

    def commit_then_die(c: sqlite3.Connection, batch: list[db.WriteRequest]) -> None:
        run_batch(c, batch)  # BEGIN, the writes, COMMIT (with its fsync): durable now
        os._exit(9)

    db.run_batch = commit_then_die  # type: ignore[assignment]


def fill_the_disk(conn: sqlite3.Connection) -> None:
    """The store may not grow past the pages it has (SQLite's max_page_count, on the writer's
    connection): a write that needs a new page fails with SQLITE_FULL, as on a full disk."""
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")


def free_the_disk(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA max_page_count = 4294967294")


def record_big(conn: sqlite3.Connection, n: int) -> None:
    """Journal a test event large enough to need new pages."""
    events.append(conn, 1, None, "test.pid", {"n": n, "pad": "x" * 200_000}, 1)


def bad_sql(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO no_such_table VALUES (1)")


def lock_a_table(conn: sqlite3.Connection) -> None:
    """SQLITE_LOCKED, a conflict within one connection (a table dropped under its own open
    cursor): a bug of the write, not the disk's doing."""
    conn.execute("CREATE TEMP TABLE held (x)")
    conn.execute("INSERT INTO held VALUES (1), (2)")
    cursor = conn.execute("SELECT x FROM held")
    cursor.fetchone()
    conn.execute("DROP TABLE held")
