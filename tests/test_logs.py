"""The daemon's log: no key, secret or token at any level (README, Configuration, log.level)."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest
import trio

from inboxd import logs
from inboxd.errors import StorageUnavailable
from inboxd.logs import log_failure
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
    lines = debug_log.getvalue().splitlines()
    assert any('"logger": "inboxd.access"' in line for line in lines)  # the log is captured
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
