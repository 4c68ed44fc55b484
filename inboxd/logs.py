"""Logging: one JSON object per line on stderr (CONTRACT section 1)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Final

from inboxd.errors import StorageUnavailable

_STANDARD: Final = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
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
        return json.dumps(out, default=str, ensure_ascii=False)


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
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
