"""The command line of CONTRACT section 1, run the way users run it: as a subprocess."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from hypercorn.trio import serve as hypercorn_serve

from bench.common import child_pid
from inboxd import daemon, resident
from inboxd.errors import StoreError
from tests.conftest import Seed, test_config

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def inboxd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inboxd", *args],
        capture_output=True,
        text=True,
        env=env or ENV,
        timeout=60,
    )


def ok(*args: str) -> Any:
    result = inboxd(*args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_init_prints_the_owner_key_once_and_is_idempotent(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    first = ok("init", "--data", data, "--owner-email", "me@example.com", "--owner-name", "Me")
    assert set(first) == {"accountId", "ownerUserId", "apiKey"}
    again = inboxd("init", "--data", data)
    assert again.returncode == 0
    assert again.stdout == ""
    assert "already exists" in again.stderr
    # Keys are stored only as hashes.
    raw = (tmp_path / "d" / "inboxd.db").read_bytes()
    assert first["apiKey"].encode() not in raw
    # A new data directory is its owner's alone (it holds the webhooks' signing secrets); it
    # was made with the process's umask, readable by all (a review found it).
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o700


def test_data_dir_from_environment(tmp_path: Path) -> None:
    result = inboxd("init", env={**ENV, "INBOXD_DATA": str(tmp_path / "e")})
    assert result.returncode == 0
    assert (tmp_path / "e" / "inboxd.db").is_file()


def test_usage_errors_exit_2_with_one_line(tmp_path: Path) -> None:
    bad_values = [  # checked as the API checks them (a name once trimmed, an email address)
        ["channel", "add", "--data", str(tmp_path), "--name", "  "],
        ["user", "add", "--data", str(tmp_path), "--email", "", "--name", "A"],
        ["user", "add", "--data", str(tmp_path), "--email", "not-an-email", "--name", "A"],
        ["user", "add", "--data", str(tmp_path), "--email", "a@example.com", "--name", ""],
        ["init", "--data", str(tmp_path), "--owner-email", "  not an email  "],
        ["init", "--data", str(tmp_path), "--owner-email", "a@example.com", "--owner-name", " "],
        # A channel's type is served as channelType: never empty, never a page long.
        ["channel", "add", "--data", str(tmp_path), "--name", "S", "--type", " "],
        ["channel", "add", "--data", str(tmp_path), "--name", "S", "--type", "T" * 33],
        # A port the OS cannot bind is the command line's error, named before anything starts.
        ["serve", "--data", str(tmp_path), "--bind", "127.0.0.1:99999"],
        ["serve", "--data", str(tmp_path), "--bind", "127.0.0.1:0"],
        # A backup onto the store it copies would replace the file a running daemon writes to.
        ["backup", "--data", str(tmp_path), str(tmp_path / "inboxd.db")],
        ["backup", "--data", str(tmp_path), str(tmp_path / "inboxd.db-wal")],
    ]
    for args in (
        ["frobnicate"],
        ["channel", "add", "--data", str(tmp_path)],
        ["init"],
        *bad_values,
    ):
        result = inboxd(*args, env={k: v for k, v in ENV.items() if k != "INBOXD_DATA"})
        assert result.returncode == 2, args
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "Traceback" not in result.stderr


def test_other_errors_exit_1_with_one_line(tmp_path: Path) -> None:
    missing = inboxd("channel", "add", "--data", str(tmp_path / "none"), "--name", "x")
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        f"inboxd: no inboxd store in {tmp_path / 'none'} (run 'inboxd init --data DIR')"
    ]
    data = str(tmp_path / "d")
    ok("init", "--data", data)
    for args in (
        [
            "user",
            "add",
            "--data",
            data,
            "--email",
            "a@example.com",
            "--name",
            "A",
            "--channels",
            "ch_nope",
        ],
        ["key", "create", "--data", data, "--user", "nobody@example.com"],
        ["key", "revoke", "--data", data, "key_nope"],
    ):
        result = inboxd(*args)
        assert result.returncode == 1, args
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    # A bad bind address in the config (not on the command line) is a config error, exit 1.
    bad_bind = inboxd("serve", "--data", data, env={**ENV, "INBOXD_SERVER_BIND": "nonsense"})
    assert bad_bind.returncode == 1
    assert (
        bad_bind.stderr.strip() == "inboxd: server.bind: bind address 'nonsense' is not HOST:PORT"
    )
    # The store's own file under another name for its directory is refused too.
    alias = tmp_path / "alias"
    alias.symlink_to(data, target_is_directory=True)
    onto_itself = inboxd("backup", "--data", data, str(alias / "inboxd.db"))
    assert onto_itself.returncode == 2 and "is the store itself" in onto_itself.stderr
    bad_port = inboxd("serve", "--data", data, env={**ENV, "INBOXD_SERVER_BIND": "127.0.0.1:70000"})
    assert bad_port.returncode == 1
    assert bad_port.stderr.strip() == (
        "inboxd: server.bind: bind address '127.0.0.1:70000': the port must be 1 to 65535"
    )


def test_newer_store_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "d"
    ok("init", "--data", str(data))
    with sqlite3.connect(data / "inboxd.db") as conn:
        conn.execute("PRAGMA user_version = 999")
    result = inboxd("channel", "list", "--data", str(data))
    assert result.returncode == 1
    assert "newer" in result.stderr


def test_only_serve_and_init_migrate_and_a_backup_copies_the_store_as_it_is(
    tmp_path: Path,
) -> None:
    """A store one schema version behind (as the previous release left it): 'key list' refuses
    it, naming the commands that migrate; 'backup' copies it unmigrated (the backup to take
    before an upgrade); 'init' migrates it and says so."""
    from inboxd.store import accounts
    from inboxd.store.schema import MIGRATIONS

    data = tmp_path / "d"
    data.mkdir()
    older = len(MIGRATIONS) - 1
    conn = sqlite3.connect(data / "inboxd.db", isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode = WAL")
    for number, script in enumerate(MIGRATIONS[:older], start=1):
        conn.executescript(f"BEGIN; {script}\nPRAGMA user_version = {number}; COMMIT;")
    conn.execute("BEGIN")
    accounts.create_account(conn, "me@example.com", "Me", 1)
    conn.execute("COMMIT")
    conn.close()

    def version(path: Path) -> int:
        with sqlite3.connect(path) as c:
            return int(c.execute("PRAGMA user_version").fetchone()[0])

    listed = inboxd("key", "list", "--data", str(data))
    assert listed.returncode == 1
    assert f"schema version {older}, older than" in listed.stderr
    assert "'inboxd serve' or 'inboxd init' migrates it" in listed.stderr
    assert version(data / "inboxd.db") == older
    copied = ok("backup", "--data", str(data), str(tmp_path / "before.db"))
    assert version(Path(copied["file"])) == older
    assert version(data / "inboxd.db") == older
    init = inboxd("init", "--data", str(data))
    assert init.returncode == 0 and init.stdout == ""
    assert f"migrated to schema version {len(MIGRATIONS)}" in init.stderr
    assert "migrating the store" in init.stderr  # its log line, as serve's
    assert version(data / "inboxd.db") == len(MIGRATIONS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError("daemon did not become ready")


def serve(data: str, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "inboxd", "serve", "--data", data, "--bind", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**ENV, "INBOXD_LIMITS_REQUESTS_PER_SECOND": "0"},
    )


def frozen_objects(url: str) -> float:
    """``inboxd_gc_frozen_objects`` from /metrics, once start-up has set it."""
    deadline = time.monotonic() + 10
    while True:
        text = httpx.get(f"{url}/metrics").text
        (line,) = [x for x in text.splitlines() if x.startswith("inboxd_gc_frozen_objects ")]
        frozen = float(line.split()[1])
        if frozen or time.monotonic() > deadline:
            return frozen
        time.sleep(0.05)


def stop(proc: subprocess.Popen[str]) -> tuple[int, float, str, str]:
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=15)
    return proc.returncode, time.monotonic() - started, err, out


def test_full_cli_flow_serve_restart_and_backup(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    owner = ok("init", "--data", data)
    channel = ok("channel", "add", "--data", data, "--name", "Sales", "--type", "WHATSAPP")
    assert set(channel) >= {"id", "name", "status"} and channel["status"] == "ACTIVE"
    op = ok(
        "user",
        "add",
        "--data",
        data,
        "--email",
        "op@example.com",
        "--name",
        "Op",
        "--channels",
        channel["id"],
    )
    assert set(op) == {"userId", "memberId", "apiKey"}
    extra = ok("key", "create", "--data", data, "--user", "op@example.com")
    assert set(extra) == {"apiKey", "keyId", "prefix"} and extra["apiKey"].startswith(
        extra["prefix"]
    )
    keys = ok("key", "list", "--data", data, "--user", op["userId"])
    assert [k["keyId"] for k in keys][-1] == extra["keyId"]
    assert all("apiKey" not in k for k in keys)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve(data, port)
    try:
        wait_ready(url, proc)
        owner_h = {"Authorization": f"Bearer {owner['apiKey']}"}
        body = {
            "channelId": channel["id"],
            "direction": "INBOUND",
            "contact": {"phoneNumber": "15550001", "name": "Ada"},
            "type": "TEXT",
            "content": "kept across restarts",
        }
        created = httpx.post(f"{url}/api/v1/messaging/messages", json=body, headers=owner_h)
        assert created.status_code == 201
        op_h = {"Authorization": f"Bearer {extra['apiKey']}"}
        assert httpx.get(f"{url}/api/v1/inbox/channels", headers=op_h).status_code == 200
        # A key revoked by the CLI while the daemon runs stops working on the next request.
        revoked = ok("key", "revoke", "--data", data, extra["keyId"])
        assert revoked["revoked"] is True
        assert httpx.get(f"{url}/api/v1/inbox/channels", headers=op_h).status_code == 401
        # Once started, serve moves start-up's objects out of the collector's way (heap.py).
        assert frozen_objects(url) > 10_000
        # An online backup while serving.
        backup = tmp_path / "backup.db"
        result = ok("backup", "--data", data, str(backup))
        assert result["file"] == str(backup) and result["bytes"] > 0
        with sqlite3.connect(backup) as conn:
            assert conn.execute("SELECT content FROM messages").fetchall() == [
                ("kept across restarts",)
            ]
    finally:
        code, took, err, _ = stop(proc)
    assert code == 0, err
    assert took < 10
    lines = [json.loads(line) for line in err.strip().splitlines()]
    assert any(line["msg"] == "request" and line["status"] == 201 for line in lines)
    assert lines[-1]["msg"] == "stopped"

    proc = serve(data, port)
    try:
        wait_ready(url, proc)
        listed = httpx.get(f"{url}/api/v1/inbox/conversations", headers=owner_h).json()
        assert [c["lastMessagePreview"] for c in listed["data"]] == ["kept across restarts"]
        assert listed["data"][0]["contact"]["name"] == "Ada"
    finally:
        code, _, err, _ = stop(proc)
    assert code == 0, err


def test_first_serve_on_an_empty_dir_creates_the_store_and_prints_the_key(tmp_path: Path) -> None:
    data = str(tmp_path / "fresh")
    port = free_port()
    proc = serve(data, port)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
    finally:
        code, _, _, out = stop(proc)
    assert code == 0
    key = json.loads(out.splitlines()[0])["apiKey"]
    assert key.startswith("ibx_")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signals_stop_the_daemon_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    data = str(tmp_path / "d")
    ok("init", "--data", data)
    port = free_port()
    proc = serve(data, port)
    wait_ready(f"http://127.0.0.1:{port}", proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def _locked_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        (line,) = [x for x in f if x.startswith("VmLck:")]
    return int(line.split()[1])


def _code_files(pid: int) -> set[str]:
    """The files whose private mappings resident.py locks, as process ``pid`` maps them."""
    maps = Path(f"/proc/{pid}/maps").read_text(errors="surrogateescape")
    return {m.path for m in resident.private_file_mappings(maps)}


def test_the_daemon_locks_its_code_in_memory_and_says_so(tmp_path: Path) -> None:
    """resident.py: once started, the daemon's own code is locked in memory (or the log says
    what was not, and why, where this machine does not allow it). The writer child's code is
    locked with it: the child runs no file that the daemon has not mapped, and a file's pages
    are the same pages in every process that maps it (locked in one, kept for all)."""
    data = str(tmp_path / "d")
    owner = ok("init", "--data", data)
    port = free_port()
    proc = serve(data, port)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    # A write, so that the writer child has loaded what its writes use.
    made = httpx.post(
        f"{url}/api/v1/inbox/keys", headers={"Authorization": f"Bearer {owner['apiKey']}"}
    )
    assert made.status_code == 201, made.text
    writer = child_pid(proc.pid, b"inboxd.store.writer")
    assert writer is not None
    writer_files = _code_files(writer)
    assert any("python" in f for f in writer_files)  # (the interpreter, at least)
    # The first look locks one mapping after another, in a worker thread: wait until the count
    # stands still (or, where nothing may be locked, 10 s).
    deadline, locked = time.monotonic() + 10, -1
    while time.monotonic() < deadline:
        now = _locked_kib(proc.pid) * 1024
        if now and now == locked:
            break
        locked = now
        time.sleep(0.3)
    daemon_files = _code_files(proc.pid)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=15)
    assert writer_files <= daemon_files, writer_files - daemon_files
    lines = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    (said,) = [x for x in lines if x["msg"].startswith("locked the daemon's code in memory")]
    assert said["logger"] == "inboxd.daemon" and said["level"] == "info"
    # The kernel's count of the process's locked memory is what the line says was locked.
    assert locked == said["locked_bytes"]
    if "not_locked" in said:  # (a memory-lock limit, no CAP_IPC_LOCK: what fits)
        assert said["not_locked_bytes"] > 0
    else:
        assert said["not_locked_bytes"] == 0
        assert said["locked_bytes"] > 4 << 20  # (about 20 MB: the interpreter, SQLite, ...)


@pytest.mark.parametrize("drain_delay", [0.0, 0.5])
async def test_a_stop_while_the_daemon_starts_is_a_clean_stop(
    seeded: Seed, monkeypatch: pytest.MonkeyPatch, drain_delay: float
) -> None:
    """A signal that comes while the daemon is still starting (the API already answers
    /readyz, the mailer or the webhook hub not yet started) stops it like any other: ``run``
    returns, and its caller's ``nursery.start`` with it. It raised "child exited without
    calling task_status.started()" (the service then exited with status 1).

    However long hypercorn takes to begin its drain, the caller is told no URL serves: it was
    told the URL when the rest of the start-up outran the drain (a CI run under load did)."""

    async def slow_to_drain(app: Any, hc: Any, *, shutdown_trigger: Any, task_status: Any) -> None:
        async def trigger() -> None:
            await shutdown_trigger()
            await trio.sleep(drain_delay)

        await hypercorn_serve(app, hc, shutdown_trigger=trigger, task_status=task_status)

    monkeypatch.setattr("inboxd.daemon.serve", slow_to_drain)
    shutdown = trio.Event()
    shutdown.set()  # before anything started
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            urls = await nursery.start(
                partial(daemon.run, seeded.data_dir, test_config(), shutdown, bind="127.0.0.1:0")
            )
    assert urls == []


async def test_a_second_daemon_on_the_same_store_is_refused(seeded: Seed, base_url: str) -> None:
    """Two daemons on one store would deliver every webhook event twice, and each one's feed
    would miss the other's writes (found by an audit: both started)."""
    with pytest.raises(StoreError) as refused:
        await daemon.run(seeded.data_dir, test_config(), trio.Event(), bind="127.0.0.1:0")
    assert str(refused.value) == (
        f"another inboxd daemon is serving the store in {seeded.data_dir} (pid {os.getpid()});"
        " stop it first"
    )
    async with httpx.AsyncClient(base_url=base_url) as client:  # the first one serves on
        assert (await client.get("/readyz")).status_code == 200


def test_serve_refuses_a_store_another_daemon_serves(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    ok("init", "--data", data)
    port = free_port()
    first = serve(data, port)
    try:
        wait_ready(f"http://127.0.0.1:{port}", first)
        second = inboxd("serve", "--data", data, "--bind", f"127.0.0.1:{free_port()}")
        assert second.returncode == 1
        assert second.stderr.strip().splitlines()[-1] == (
            f"inboxd: another inboxd daemon is serving the store in {data} (pid {first.pid});"
            " stop it first"
        )
        assert "Traceback" not in second.stderr
    finally:
        code, _, err, _ = stop(first)
    assert code == 0, err
