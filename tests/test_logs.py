"""The daemon's log: no key, secret or token at any level (README, Configuration, log.level)."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from inboxd import logs
from inboxd.errors import StorageUnavailable
from inboxd.logs import JsonFormatter, log_failure
from tests.conftest import Seed

# HTTP/2 with prior knowledge (h2c), which hypercorn serves on the API's own port; from another
# process, so that only the daemon's logging lands in the captured stderr.
CLIENT = """
import sys, httpx
with httpx.Client(http1=False, http2=True, timeout=10) as c:
    r = c.get(sys.argv[1] + "/api/v1/inbox/channels", headers={"Authorization": "Bearer " + sys.argv[2]})
    print(r.http_version, r.status_code)
"""


@pytest.fixture
def debug_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """The daemon's stderr, with logging set up as `inboxd serve` does at log level debug."""
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    levels = {name: logging.getLogger(name).level for name in ("hpack", "h2", "httpcore")}
    logs.setup("debug")
    yield stream
    root.handlers[:], root.level = saved
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


async def test_an_http2_request_does_not_log_its_api_key_at_debug(
    base_url: str, seeded: Seed, debug_log: io.StringIO
) -> None:
    """hpack logged every header it decoded at debug, the Authorization header among them (a
    review found it): anyone reading the log had every key that came over HTTP/2."""
    done = await trio.run_process(
        [sys.executable, "-c", CLIENT, base_url, seeded.owner_key], capture_stdout=True
    )
    assert done.stdout.decode().split() == ["HTTP/2", "200"]
    for handler in logging.getLogger().handlers:
        handler.flush()  # (the access line, were it held: logs.hold_access_lines)
    lines = debug_log.getvalue().splitlines()
    assert any(json.loads(line)["logger"] == "inboxd.access" for line in lines)  # it is captured
    assert [line for line in lines if seeded.owner_key in line] == []


def test_a_retrying_task_s_failure_is_logged_with_its_traceback_unless_the_disk_refused_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store logs a disk that refuses writes once a minute (StorageAlarm); the tasks that
    retry (10,000 URL supervisors, say) must not each add a traceback every few seconds."""
    caplog.set_level(logging.DEBUG, logger="inboxd.test")
    logger = logging.getLogger("inboxd.test")
    try:
        raise StorageUnavailable("full", code="storage_full", retry_after=60)
    except StorageUnavailable:
        log_failure(logger, "could not record it", url=7)
    try:
        raise ValueError("a bug")
    except ValueError:
        log_failure(logger, "could not record it", url=8)
    quiet, loud = caplog.records
    assert (quiet.levelname, quiet.exc_info, quiet.__dict__["code"]) == (
        "DEBUG",
        None,
        "storage_full",
    )
    assert quiet.__dict__["url"] == 7
    assert loud.levelname == "ERROR" and loud.exc_info is not None and loud.__dict__["url"] == 8


# -- the access log's direct line (logs.log_request) ---------------------------------------------

FIELDS = {"method": "PATCH", "path": "/api/v1/inbox/conversations/conv_x/title", "status": 200}


@pytest.fixture
def sole(tmp_path: Path) -> Iterator[tuple[logs.JsonLinesHandler, Path]]:
    """The daemon's handler on a file, on the root logger as `logs.setup` leaves it (a test
    calls ``alone`` first: pytest adds its capture handler once the call starts)."""
    path = tmp_path / "stderr"
    with path.open("w") as stream:
        handler = logs.JsonLinesHandler(stream)
        root = logging.getLogger()
        saved = root.handlers[:]

        root.handlers[:] = [handler]
        try:
            yield handler, path
        finally:
            root.handlers[:] = saved


def alone(handler: logs.JsonLinesHandler) -> None:
    """Leave ``handler`` the root's only one (pytest's capture, added as the call started,
    taken away until the fixture's teardown puts back what was there before)."""
    logging.getLogger().handlers[:] = [handler]


def test_the_access_line_written_directly_is_the_line_of_its_record(
    sole: tuple[logs.JsonLinesHandler, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """log_request skips the LogRecord where the daemon's handler alone would get it: the line
    must be the one JsonFormatter makes of that record, byte for byte."""
    handler, path = sole
    alone(handler)
    # 2025-11-29T07:06:40.250Z (Python 3.13's LogRecord reads time_ns, earlier ones time)
    monkeypatch.setattr(time, "time", lambda: 1_764_400_000.25)
    monkeypatch.setattr(time, "time_ns", lambda: 1_764_400_000_250_000_000)
    access = logging.getLogger("inboxd.access")
    assert logs._sole_handler(access) is handler

    def no_record(*args: object, **kwargs: object) -> logging.LogRecord:
        raise AssertionError("the access log made a LogRecord")

    monkeypatch.setattr(access, "makeRecord", no_record)
    logs.log_request(access, {**FIELDS, "ms": 0.42, "text": "é ✓ 日本"})
    monkeypatch.undo()
    record = access.makeRecord(
        access.name, logging.INFO, "x.py", 1, "request", None, None,
        extra={**FIELDS, "ms": 0.42, "text": "é ✓ 日本"},
    )  # fmt: skip
    record.created, record.msecs = 1_764_400_000.25, 250.0  # (the clock given back)
    written = path.read_bytes()
    assert written == JsonFormatter().format(record).encode() + b"\n"
    assert json.loads(written) == {
        "time": "2025-11-29T07:06:40.250Z",
        "level": "info",
        "logger": "inboxd.access",
        "msg": "request",
        **FIELDS,
        "ms": 0.42,
        "text": "é ✓ 日本",
    }


def test_with_another_handler_the_access_log_makes_its_record(
    sole: tuple[logs.JsonLinesHandler, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """A handler besides the daemon's (here pytest's capture), a filter, or none of ours: the
    record is logged as any other, and each handler gets it."""
    handler, path = sole
    alone(handler)
    caplog.set_level(logging.INFO, logger="inboxd.access")
    access = logging.getLogger("inboxd.access")
    logging.getLogger().addHandler(caplog.handler)
    assert logs._sole_handler(access) is None
    logs.log_request(access, dict(FIELDS))
    (record,) = [r for r in caplog.records if r.name == "inboxd.access"]
    assert (record.getMessage(), record.__dict__["status"]) == ("request", 200)
    assert json.loads(path.read_bytes())["path"] == FIELDS["path"]
    logging.getLogger().removeHandler(caplog.handler)
    assert logs._sole_handler(access) is handler
    access.addFilter(lambda record: False)
    try:
        assert logs._sole_handler(access) is None
        logs.log_request(access, dict(FIELDS))  # filtered out: nothing written
    finally:
        access.filters.clear()
    assert len(path.read_bytes().splitlines()) == 1
    handler.setLevel(logging.WARNING)
    try:
        assert logs._sole_handler(access) is None
    finally:
        handler.setLevel(logging.NOTSET)
    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(lambda *args, **kwargs: factory(*args, **kwargs))
    try:
        assert logs._sole_handler(access) is None  # records made otherwise: as records
    finally:
        logging.setLogRecordFactory(factory)

    class Own(logging.Logger):  # a logger class of one's own (it may handle records its way)
        pass

    own = Own("inboxd.test.own")
    own.handlers[:] = [handler]
    assert logs._sole_handler(own) is None
    own.__class__ = logging.Logger
    assert logs._sole_handler(own) is handler
    quiet = logging.getLogger("inboxd.test.quiet.child")
    logging.getLogger("inboxd.test.quiet").propagate = False
    try:
        assert logs._sole_handler(quiet) is None  # no handler reached at all
    finally:
        logging.getLogger("inboxd.test.quiet").propagate = True
    assert logs._sole_handler(access) is handler


def test_a_line_goes_after_what_the_stream_held_and_in_one_piece(
    sole: tuple[logs.JsonLinesHandler, Path],
) -> None:
    """Lines are written to the descriptor, past the stream's buffer: what another writer
    left in it (text without its newline yet) is flushed first, so the order holds."""
    handler, path = sole
    alone(handler)
    handler.stream.write("a traceback's first part ")
    handler.write_line(b'{"msg":"x"}')
    logging.getLogger("inboxd.test").warning("after", extra={"n": 1})
    lines = path.read_text().splitlines()
    assert lines[0] == 'a traceback\'s first part {"msg":"x"}'
    assert json.loads(lines[1])["msg"] == "after" and json.loads(lines[1])["n"] == 1


def test_what_orjson_refuses_is_written_by_the_standard_encoder(
    sole: tuple[logs.JsonLinesHandler, Path],
) -> None:
    """A lone surrogate (a path's undecodable byte, say) or an integer past 64 bits: the line
    is still one valid JSON object, in UTF-8."""
    handler, path = sole
    alone(handler)
    access = logging.getLogger("inboxd.access")
    assert logs._sole_handler(access) is handler
    logs.log_request(access, {"path": "/a\udc80b", "n": 2**70})
    logging.getLogger("inboxd.test").warning("odd", extra={"text": "\ud800", "key": {1: 2}})
    lines = path.read_bytes().splitlines()
    assert all(b'", "' not in line and b'": ' not in line for line in lines)  # compact all the same
    first, second = (json.loads(line) for line in lines)
    assert (first["path"], first["n"]) == ("/a\udc80b", 2**70)
    assert (second["text"], second["key"]) == ("\ud800", {"1": 2})


def test_a_stream_without_a_descriptor_gets_the_line_as_text() -> None:
    stream = io.StringIO()
    handler = logs.JsonLinesHandler(stream)
    handler.write_line(b'{"msg":"\xc3\xa9"}')
    handler.emit(
        logging.makeLogRecord(
            {"name": "inboxd.test", "msg": "b", "levelno": 30, "levelname": "WARNING"}
        )
    )
    first, second = stream.getvalue().splitlines()
    assert first == '{"msg":"é"}'
    assert (json.loads(second)["msg"], json.loads(second)["level"]) == ("b", "warning")


def test_a_line_that_cannot_be_encoded_does_not_fail_its_request(
    sole: tuple[logs.JsonLinesHandler, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A field neither encoder takes (a list that holds itself): log_request hands the record to
    logging, whose handler reports the error its way; the request goes on, and the next line is
    written as usual."""
    handler, path = sole
    alone(handler)
    monkeypatch.setattr(logging, "raiseExceptions", False)  # (logging's report to stderr)
    access = logging.getLogger("inboxd.access")
    access.setLevel(logging.INFO)
    try:
        circular: list[Any] = []
        circular.append(circular)
        logs.log_request(access, {"path": "/x", "odd": circular})
        logs.log_request(access, dict(FIELDS))
    finally:
        access.setLevel(logging.NOTSET)
    (line,) = path.read_bytes().splitlines()
    assert json.loads(line)["path"] == FIELDS["path"]


# -- the access log's lines held while the daemon runs (logs.hold_access_lines) -------------------


def access_line(n: int) -> None:
    logs.log_request(logging.getLogger("inboxd.access"), {**FIELDS, "n": n})


def in_thread(fn: Any, *args: object) -> None:
    """``fn(*args)`` in another thread, waited for without yielding to trio."""
    thread = threading.Thread(target=fn, args=args)
    thread.start()
    thread.join()


def written(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


@pytest.fixture
def counted_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the handler's ``write`` calls (logs.py's ``os.write``)."""
    sizes: list[int] = []

    def write(fd: int, data: bytes) -> int:
        sizes.append(len(data))
        return os.write(fd, data)

    monkeypatch.setattr(logs, "os", SimpleNamespace(write=write))
    return sizes


async def test_access_lines_are_held_and_written_together_within_the_hold(
    sole: tuple[logs.JsonLinesHandler, Path], autojump_clock: trio.testing.MockClock,
    counted_writes: list[int],
) -> None:  # fmt: skip
    """A write for each request cost it about 10 us of the trio thread: while the daemon runs,
    its lines wait at most ACCESS_LINES_HOLD_SECONDS and go out in one write, in order."""
    handler, path = sole
    alone(handler)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(logs.hold_access_lines)
        await trio.sleep(1)  # (the holder has started and waits)
        for n in range(3):
            access_line(n)
        assert path.read_bytes() == b""
        await trio.sleep(logs.ACCESS_LINES_HOLD_SECONDS - 0.001)
        assert path.read_bytes() == b""
        await trio.sleep(0.002)
        assert [line["n"] for line in written(path)] == [0, 1, 2]
        assert len(counted_writes) == 1
        # The next lines start another hold of their own.
        await trio.sleep(10)
        access_line(3)
        await trio.sleep(logs.ACCESS_LINES_HOLD_SECONDS + 0.001)
        assert [line["n"] for line in written(path)] == [0, 1, 2, 3]
        assert len(counted_writes) == 2
        nursery.cancel_scope.cancel()


async def test_a_line_of_another_kind_is_written_at_once_after_the_held_ones(
    sole: tuple[logs.JsonLinesHandler, Path], autojump_clock: trio.testing.MockClock,
    counted_writes: list[int],
) -> None:  # fmt: skip
    """Only the access log waits, and it never changes the order: a warning (here from another
    thread too) is written at once, after the lines held so far, in the same write."""
    handler, path = sole
    alone(handler)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(logs.hold_access_lines)
        await trio.sleep(1)
        access_line(0)
        access_line(1)
        logging.getLogger("inboxd.test").warning("now")
        assert [line.get("n", line["msg"]) for line in written(path)] == [0, 1, "now"]
        assert len(counted_writes) == 1
        # Another thread, run to its end while the holder cannot run (no checkpoint here):
        # its access line is not held, and it writes the held one first.
        access_line(2)
        in_thread(access_line, 3)
        assert [line.get("n", line["msg"]) for line in written(path)] == [0, 1, "now", 2, 3]
        assert len(counted_writes) == 2
        access_line(4)
        in_thread(logging.getLogger("inboxd.test").warning, "there")
        assert [line.get("n", line["msg"]) for line in written(path)][-2:] == [4, "there"]
        assert len(counted_writes) == 3
        nursery.cancel_scope.cancel()


async def test_the_holder_s_end_writes_what_it_holds_and_lines_go_out_at_once_again(
    sole: tuple[logs.JsonLinesHandler, Path], autojump_clock: trio.testing.MockClock,
) -> None:  # fmt: skip
    """The daemon stopping cancels the holder: nothing held is lost, and a line logged after
    it (the last requests' lines come before "stopped") is written as it comes."""
    handler, path = sole
    alone(handler)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(logs.hold_access_lines)
            await trio.sleep(1)
            access_line(0)
            scope.cancel()
    assert [line["n"] for line in written(path)] == [0]
    access_line(1)
    assert [line["n"] for line in written(path)] == [0, 1]


async def test_held_lines_are_bounded_and_flushed_at_exit(
    sole: tuple[logs.JsonLinesHandler, Path], autojump_clock: trio.testing.MockClock,
    counted_writes: list[int],
) -> None:  # fmt: skip
    """However many requests come within a hold, at most ACCESS_LINES_HELD_AT_MOST lines wait;
    and ``flush`` (logging.shutdown at exit) writes them, should a process end without the
    holder's own end."""
    handler, path = sole
    alone(handler)
    most = logs.ACCESS_LINES_HELD_AT_MOST
    async with trio.open_nursery() as nursery:
        nursery.start_soon(logs.hold_access_lines)
        await trio.sleep(1)
        for n in range(most - 1):
            access_line(n)
        assert path.read_bytes() == b""
        access_line(most - 1)
        assert [line["n"] for line in written(path)] == list(range(most))
        access_line(most)
        handler.flush()
        assert [line["n"] for line in written(path)] == list(range(most + 1))
        assert len(counted_writes) == 2
        await trio.sleep(1)
        assert len(counted_writes) == 2  # (the holder woke to nothing left to write)
        nursery.cancel_scope.cancel()


async def test_without_the_daemon_s_handler_nothing_is_held(
    sole: tuple[logs.JsonLinesHandler, Path], autojump_clock: trio.testing.MockClock,
) -> None:  # fmt: skip
    """A root logger without a JsonLinesHandler (a test's capture): the holder has nothing to
    do and ends; a second holder of the same handler ends too, leaving the first one's."""
    handler, path = sole
    logging.getLogger().handlers[:] = []
    with trio.fail_after(1):  # (a holder that waited instead would fail here, not hang)
        await logs.hold_access_lines()  # returns at once
    alone(handler)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(logs.hold_access_lines)
        await trio.sleep(1)
        with trio.fail_after(1):
            await logs.hold_access_lines()  # returns at once
        access_line(0)
        assert path.read_bytes() == b""
        await trio.sleep(1)
        assert [line["n"] for line in written(path)] == [0]
        nursery.cancel_scope.cancel()


def test_a_write_that_fails_midway_is_reported_and_the_next_lines_go_out(
    sole: tuple[logs.JsonLinesHandler, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipe that takes part of a batch, cut inside a character, then refuses the rest (its
    reader gone): logging reports the lines, whole, as it reports a record's; nothing is raised
    into the request or the holder, and the next line is written."""
    handler, path = sole
    alone(handler)
    reported: list[logging.LogRecord] = []
    monkeypatch.setattr(handler, "handleError", reported.append)
    payload = '{"p":"é"}\n{"n":2}\n'.encode()
    calls: list[bytes] = []

    def write(fd: int, data: bytes) -> int:
        calls.append(bytes(data))
        if len(calls) == 1:
            return payload.index("é".encode()) + 1  # (the first byte of its two)
        if len(calls) == 2:
            raise BrokenPipeError(32, "Broken pipe")
        return os.write(fd, data)

    monkeypatch.setattr(logs, "os", SimpleNamespace(write=write))
    handler._held.extend(['{"p":"é"}'.encode(), b'{"n":2}'])
    handler.write_held()
    assert calls == [payload, payload[7:]]
    (record,) = reported
    assert record.getMessage() == payload.decode()
    handler.write_line(b'{"n":3}')
    assert path.read_bytes() == b'{"n":3}\n'
