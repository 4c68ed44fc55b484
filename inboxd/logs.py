"""Logging: one JSON object per line on stderr (CONTRACT section 1)."""

from __future__ import annotations

import collections
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import orjson
import trio

from inboxd.errors import StorageUnavailable

_STANDARD: Final = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}
# A line's encoder where orjson refuses a value (text with a lone surrogate, an integer past 64
# bits, a key that is not text): the standard library's, made once (``json.dumps`` with these
# arguments makes one a call), as compact. Non-ASCII text as it is; what JSON has no form for,
# as its str.
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, default=str, separators=(",", ":"))
# The last second a line was stamped in, and its "YYYY-MM-DDTHH:MM:SS" (one tuple, so that a
# thread logging meanwhile reads a matching pair).
_second: tuple[int, str] = (-1, "")
# While the daemon runs, the access log's lines are held and written together
# (``hold_access_lines``), about this long after the first of them (once the holder's sleep
# ends and it gets its turn): a write for each batch, not one for each request (``bench app``
# prints read one with its line held and with it written at once).
ACCESS_LINES_HOLD_SECONDS: Final = 0.05
# The held line that makes this many writes them all at once: memory stays bounded whatever the
# load.
ACCESS_LINES_HELD_AT_MOST: Final = 512


def _stamp(created: float, msecs: int) -> str:
    """``created`` (time.time()) as a line's "time": UTC to the millisecond, as
    ``2026-11-22T01:16:19.123Z``; the date and time of day made once a second."""
    global _second
    whole = int(created)
    second, text = _second
    if second != whole:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _second = (whole, text)
    return f"{text}.{msecs:03d}Z"


def _line(out: dict[str, Any]) -> bytes:
    """One log line's JSON, as UTF-8 (without its newline)."""
    try:
        return orjson.dumps(out, default=str)
    except orjson.JSONEncodeError:
        return _ENCODER.encode(out).encode("utf-8", "backslashreplace")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return self.line(record).decode()

    def line(self, record: logging.LogRecord) -> bytes:
        """The record's line (without its newline), as UTF-8."""
        return _line(self.fields(record))

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        """What the record's line holds, in its order."""
        out: dict[str, Any] = {
            "time": _stamp(record.created, int(record.msecs)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        # Structured fields passed as logging's ``extra=``.
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return out


class JsonLinesHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The daemon's one handler (``setup``): each record as a line of JSON in UTF-8, written
    to the stream's file descriptor in one ``write`` (after anything the stream itself holds);
    and ``write_line``, for a line made without a record (``log_request``), which a holder
    (``hold_access_lines``) may hold to write with others. A stream with no descriptor (a
    test's StringIO) gets the line as text.

    Every write starts with the lines held so far, so the handler's lines keep their order
    (what else writes to the stream's descriptor directly, a traceback Python prints, may come
    before held lines); ``flush`` (which ``logging.shutdown`` calls at exit) writes them too."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.setFormatter(JsonFormatter())
        # Lines write_line holds, and the holder: its thread (only lines from there are held)
        # and how to wake it when the first one comes. Other threads only take lines out.
        self._held: collections.deque[bytes] = collections.deque()
        self._holder: tuple[int, Callable[[], None]] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            formatter = self.formatter
            if type(formatter) is JsonFormatter:  # (a subclass may format otherwise)
                line = formatter.line(record)
            else:
                line = self.format(record).encode("utf-8", "backslashreplace")
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)
            return
        self._write(line, record)

    def write_line(self, line: bytes) -> None:
        """Write ``line`` (JSON, UTF-8, no newline) as ``emit`` writes a record's, under the
        lock ``handle`` takes for ``emit``; or, on a holder's thread, hold it for the holder."""
        holder = self._holder
        if holder is not None and holder[0] == threading.get_ident():
            held = self._held
            held.append(line)
            if len(held) == 1:
                holder[1]()  # the holder writes it (and what follows) a little later
            elif len(held) >= ACCESS_LINES_HELD_AT_MOST:
                self.write_held()
            return
        with self.lock:  # type: ignore[union-attr]  # (made by Handler.__init__)
            self._write(line, None)

    def write_held(self) -> None:
        """Write the lines held so far, in one ``write``."""
        with self.lock:  # type: ignore[union-attr]
            self._write(None, None)

    def flush(self) -> None:
        if self._held:
            self.write_held()
        super().flush()

    def _write(self, line: bytes | None, record: logging.LogRecord | None) -> None:
        """Write the lines held, then ``line`` (the caller holds the lock)."""
        held = self._held
        lines = []
        while held:  # (taken one by one: the holder's thread may add one meanwhile)
            lines.append(held.popleft())
        if line is not None:
            lines.append(line)
        if not lines:
            return
        end = self.terminator.encode()
        data = end.join(lines) + end
        try:
            stream = self.stream
            try:
                fd = stream.fileno()
            except (AttributeError, OSError, ValueError):
                stream.write(data.decode())
                super().flush()
                return
            stream.flush()  # (what another writer left in it goes first)
            done = os.write(fd, data)
            while done < len(data):  # (a signal, or a pipe taking part of it)
                done += os.write(fd, memoryview(data)[done:])
        except RecursionError:
            raise
        except Exception:  # (the lines that failed, whole, as logging reports a record's)
            text = data.decode(errors="replace")
            self.handleError(record or logging.makeLogRecord({"msg": text}))


def log_request(logger: logging.Logger, fields: dict[str, Any]) -> None:
    """Log "request" at info with ``fields`` as its ``extra``: the access log's line of each
    HTTP request. The caller has checked ``logger.isEnabledFor(logging.INFO)``; ``fields``'
    names are ones a record may take as ``extra`` (none of its own attributes, no leading
    underscore).

    Where the daemon's own handler is the only one the record would reach, and no filter could
    stop it, the line ``JsonFormatter`` would make of that record is made and written
    directly, without the record, the walk through the handlers and their lock. At the default
    level (info) logging's machinery cost each request more of the trio thread than anything
    else of inboxd's own (bench/HISTORY.md, thirty-seventh session). Otherwise (a test
    capturing records, another handler added) the record is logged as any other."""
    handler = _sole_handler(logger)
    if handler is not None:
        created = time.time()
        msecs = int((created - int(created)) * 1000)  # (as logging.LogRecord reckons it)
        try:
            line = _line(
                {
                    "time": _stamp(created, msecs),
                    "level": "info",
                    "logger": logger.name,
                    "msg": "request",
                    **fields,
                }
            )
        except Exception:  # (what even the standard library cannot encode: as a record)
            pass
        else:
            handler.write_line(line)
            return
    logger.info("request", extra=fields)


async def hold_access_lines(
    handler: JsonLinesHandler | None = None, seconds: float = ACCESS_LINES_HOLD_SECONDS
) -> None:
    """A task of the daemon's: while it runs, the lines ``log_request`` writes through
    ``handler`` (by default the root logger's ``JsonLinesHandler``, as ``setup`` leaves it) on
    this thread are held and written together, ``seconds`` after the first of them once this
    task gets its turn (sooner when another line is written: the held ones go first; or when
    ``ACCESS_LINES_HELD_AT_MOST`` wait). When it ends (cancelled with the daemon's other tasks
    as it stops) it writes what it holds, and lines go out one by one again. So the access log
    is about ``seconds`` behind, and a process killed outright (SIGKILL) loses about that much
    of it; nothing else is held."""
    if handler is None:
        roots = logging.getLogger().handlers
        handler = next((h for h in roots if type(h) is JsonLinesHandler), None)
    if handler is None or handler._holder is not None:  # (none of ours; or held already)
        return
    first = trio.Event()
    handler._holder = (threading.get_ident(), lambda: first.set())
    try:
        while True:
            await first.wait()
            await trio.sleep(seconds)
            first = trio.Event()
            handler.write_held()
    finally:
        handler._holder = None
        handler.write_held()


def _sole_handler(logger: logging.Logger) -> JsonLinesHandler | None:
    """The handler that alone gets ``logger``'s info records as they are: a ``JsonLinesHandler``
    with its own formatter and no filter, the only handler on the way up to the root (or to a
    logger that does not propagate). None where anything else is set up (a record factory or
    a logger class of its own too), or nothing is. (Of the loggers, only the record's own
    applies its filters.)"""
    if (
        logger.disabled
        or logger.filters
        or type(logger) is not logging.Logger  # (one that handles records its own way)
        or logging.getLogRecordFactory() is not logging.LogRecord  # (records with more in them)
    ):
        return None
    found: JsonLinesHandler | None = None
    node: logging.Logger | None = logger
    while node is not None:
        for handler in node.handlers:
            if (
                found is not None
                or type(handler) is not JsonLinesHandler
                or handler.filters
                or handler.level > logging.INFO
                or type(handler.formatter) is not JsonFormatter
            ):
                return None
            found = handler
        if not node.propagate:
            break
        node = node.parent
    return found


def setup(level: str = "info") -> None:
    handler = JsonLinesHandler(sys.stderr)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # hypercorn's own loggers would print plain text; our access log replaces its access log.
    for name in ("hypercorn.error", "hypercorn.access", "quart.app", "quart.serving"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    # The HTTP/2 libraries log every header they decode at debug (API keys, the unsubscribe
    # link's token in a path), and httpcore each step of every outgoing request: at most their
    # warnings, whatever the level. Secrets never reach the log (README, Configuration).
    for name in WIRE_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))


WIRE_LOGGERS: Final = ("hpack", "h2", "httpcore")


def log_failure(logger: logging.Logger, message: str, **extra: Any) -> None:
    """In an ``except`` of a task that retries: the failure with its traceback, unless the
    store's disk or files refused the write (``StorageUnavailable``), which the store has
    logged already, once a minute however many tasks retry: then a debug line."""
    error = sys.exc_info()[1]
    if isinstance(error, StorageUnavailable):
        logger.debug(message, extra={**extra, "code": error.code})
    else:
        logger.exception(message, extra=extra or None)
