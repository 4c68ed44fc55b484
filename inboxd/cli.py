"""The ``inboxd`` command line (CONTRACT section 1).

Results are JSON on stdout; errors are one line on stderr with exit code 2 for usage and 1 for
everything else, never a traceback. ``--data`` may come from ``INBOXD_DATA``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sqlite3
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import trio

from inboxd import __version__, logs, wire
from inboxd.config import Config, ConfigError, parse_bind
from inboxd.errors import InboxError, StoreError
from inboxd.model import MAX_EMAIL, MAX_NAME, email_address
from inboxd.store import accounts
from inboxd.store.db import Store, db_path, store_exists
from inboxd.store.schema import MIGRATIONS
from inboxd.timeutil import now_us

log = logging.getLogger("inboxd.cli")


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")


def _emit(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _data_dir(args: argparse.Namespace) -> Path:
    value = args.data or os.environ.get("INBOXD_DATA")
    if not value:
        raise UsageError("--data DIR is required (or set INBOXD_DATA)")
    return Path(value).expanduser()


def _open(args: argparse.Namespace, *, allow_older: bool = False) -> Store:
    """The store as it is: only ``serve`` and ``init`` migrate it (README, Upgrading)."""
    return Store.open(_data_dir(args), readers=1, migrate_it=False, allow_older=allow_older)


def _init_store(data_dir: Path, owner_email: str, owner_name: str) -> dict[str, str] | int:
    """Create the store and its account; when one was already there, the number of migrations
    opening it applied instead."""
    store = Store.open(data_dir, create=True, readers=1)
    try:
        if store.read_sync(accounts.account_exists):
            return store.migrated
        new = store.write_sync(accounts.create_account, owner_email, owner_name, now_us())
        return {
            "accountId": new.account_id,
            "ownerUserId": new.owner_user_id,
            "apiKey": new.api_key,
        }
    finally:
        store.close()


SCHEMA = len(MIGRATIONS)  # the schema version this inboxd writes


def cmd_init(args: argparse.Namespace) -> int:
    data_dir = _data_dir(args)
    logs.setup("info")  # an existing store's migration steps are logged, as by serve
    created = _init_store(data_dir, args.owner_email, args.owner_name)
    if isinstance(created, int):
        done = "left as it is" if created == 0 else f"migrated to schema version {SCHEMA}"
        print(f"inboxd: a store already exists in {data_dir}; {done}", file=sys.stderr)
        return 0
    _emit(created)
    print(
        f"inboxd: store created in {data_dir}; the API key above is shown only once",
        file=sys.stderr,
    )
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from inboxd import daemon

    data_dir = _data_dir(args)
    config = Config.load(args.config)
    if args.bind:
        try:
            parse_bind(args.bind)
        except ConfigError as exc:  # the command line's: a usage error (exit 2)
            raise UsageError(f"inboxd serve: {exc.message}") from None
    else:
        try:
            parse_bind(config.server.bind)
        except ConfigError as exc:  # the config's: exit 1, as for any other bad config value
            raise ConfigError(f"server.bind: {exc.message}") from None
    logs.setup(config.log.level)
    created = not store_exists(data_dir)
    if created:
        # One command from nothing to a running daemon: the first serve creates the store and
        # prints the owner's key, like ``init``.
        made = _init_store(data_dir, "owner@localhost", "Owner")
        if isinstance(made, dict):
            _emit(made)
            log.info("store created; the owner's API key was printed on stdout, once")
    with daemon.hold_store(data_dir):  # before the migration: not under a daemon that serves
        if not created:
            # Migrate (and refuse a newer store) before the daemon starts, with a clear error.
            Store.open(data_dir, readers=1).close()
        return _serve(data_dir, config, args.bind)


def _serve(data_dir: Path, config: Config, bind: str | None) -> int:
    from inboxd import daemon, heap

    async def main() -> None:
        shutdown = trio.Event()
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:

                async def on_signals() -> None:
                    async for signum in signals:
                        log.info("stopping", extra={"signal": signal.Signals(signum).name})
                        shutdown.set()

                async def serve(
                    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
                ) -> None:
                    await daemon.run(
                        data_dir, config, shutdown, bind=bind, held=True, task_status=task_status
                    )
                    nursery.cancel_scope.cancel()

                nursery.start_soon(on_signals)
                await nursery.start(serve)
                # What start-up created lives as long as the process: keep the collector off it.
                heap.settle()

    trio.run(main)
    return 0


def _trimmed(what: str, max_len: int, printable: bool = False) -> Callable[[str], str]:
    """An argument type: the text without the white space around it, then 1 to ``max_len``
    characters (as the API checks names), and with ``printable`` no control characters."""

    def check(text: str) -> str:
        value = text.strip()
        if not 1 <= len(value) <= max_len or (printable and not value.isprintable()):
            kind = " printable" if printable else ""
            raise argparse.ArgumentTypeError(f"{what} must be 1 to {max_len}{kind} characters")
        return value

    return check


# A channel's or a member's name, as the API has it.
_name = _trimmed("a name", MAX_NAME)
# A channel's type (WHATSAPP, ...), served as every conversation's channelType.
_channel_type = _trimmed("a channel type", 32, printable=True)


def _email(text: str) -> str:
    """An operator's email, checked as the invite endpoint checks it."""
    email = email_address(text)
    if email is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an email address of at most {MAX_EMAIL} characters"
        )
    return email


def cmd_channel_add(args: argparse.Namespace) -> int:
    store = _open(args)
    try:

        def add(conn: Any) -> Any:
            return accounts.create_channel(
                conn, accounts.the_account_pk(conn), args.name, args.type, now_us()
            )

        channel = store.write_sync(add)
    finally:
        store.close()
    _emit(wire.channel(channel))
    return 0


def cmd_channel_list(args: argparse.Namespace) -> int:
    store = _open(args)
    try:
        rows = store.read_sync(
            lambda conn: conn.execute(
                "SELECT id, name, status, type FROM channels ORDER BY pk"
            ).fetchall()
        )
    finally:
        store.close()
    _emit([dict(r) for r in rows])
    return 0


def cmd_user_add(args: argparse.Namespace) -> int:
    channel_ids = [c.strip() for c in (args.channels or "").split(",") if c.strip()]
    store = _open(args)
    try:

        def add(conn: Any) -> Any:
            return accounts.create_operator(
                conn, accounts.the_account_pk(conn), args.email, args.name, channel_ids, now_us()
            )

        new = store.write_sync(add)
    finally:
        store.close()
    _emit({"userId": new.user_id, "memberId": new.member_id, "apiKey": new.api_key})
    return 0


def cmd_key_create(args: argparse.Namespace) -> int:
    store = _open(args)
    try:

        def create(conn: Any) -> Any:
            account_pk = accounts.the_account_pk(conn)
            user_pk = accounts.find_user_pk(conn, account_pk, args.user)
            return accounts.create_key(conn, account_pk, user_pk, now_us())

        key = store.write_sync(create)
    finally:
        store.close()
    _emit({"apiKey": key.api_key, "keyId": key.key_id, "prefix": key.prefix})
    return 0


def cmd_key_list(args: argparse.Namespace) -> int:
    store = _open(args)
    try:

        def list_(conn: Any) -> Any:
            account_pk = accounts.the_account_pk(conn)
            user_pk = (
                None if args.user is None else accounts.find_user_pk(conn, account_pk, args.user)
            )
            return accounts.list_keys(conn, account_pk, user_pk)

        keys = store.read_sync(list_)
    finally:
        store.close()
    _emit([wire.api_key(k) for k in keys])
    return 0


def cmd_key_revoke(args: argparse.Namespace) -> int:
    store = _open(args)
    try:

        def revoke(conn: Any) -> bool:
            return accounts.revoke_key(conn, accounts.the_account_pk(conn), args.key_id, now_us())

        changed = store.write_sync(revoke)
    finally:
        store.close()
    _emit({"keyId": args.key_id, "revoked": True, "alreadyRevoked": not changed})
    return 0


def cmd_backup(args: argparse.Namespace) -> int:
    out = Path(args.out_file).expanduser()
    if out.is_dir():
        raise UsageError(f"{out} is a directory; name the backup file")
    data_dir = _data_dir(args)
    live = db_path(data_dir).name
    if (
        out.name in {live, f"{live}-wal", f"{live}-shm"}
        and out.parent.is_dir()
        and data_dir.is_dir()
        and os.path.samefile(out.parent, data_dir)  # (also through a symlink or a bind mount)
    ):
        # Replacing the file a running daemon writes to would lose what it commits after.
        raise UsageError(f"{out} is the store itself; name a file outside it")
    store = _open(args, allow_older=True)  # the backup before an upgrade is of the old store
    tmp = out.with_name(out.name + ".partial")
    show = sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        if show:
            print(f"\rbackup: {done}/{total} pages", end="", file=sys.stderr, flush=True)

    try:
        tmp.unlink(missing_ok=True)
        store.backup_to(tmp, progress)
        os.replace(tmp, out)  # the named file is either the old one or a complete copy
    finally:
        store.close()
        tmp.unlink(missing_ok=True)
    if show:
        print(file=sys.stderr)
    _emit({"file": str(out), "bytes": out.stat().st_size})
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="inboxd", description="Self-hosted inbox management service.")
    parser.add_argument("--version", action="version", version=f"inboxd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def with_data(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--data", help="data directory (default: $INBOXD_DATA)")
        return p

    def handler(p: argparse.ArgumentParser, fn: Callable[[argparse.Namespace], int]) -> None:
        p.set_defaults(handler=fn)

    p = with_data(sub.add_parser("init", help="create the store and print the owner's API key"))
    p.add_argument("--owner-email", type=_email, default="owner@localhost")
    p.add_argument("--owner-name", type=_name, default="Owner")
    handler(p, cmd_init)

    p = with_data(sub.add_parser("serve", help="run the daemon in the foreground"))
    p.add_argument("--config", help="TOML config file (see config/inboxd.toml)")
    p.add_argument("--bind", help="HOST:PORT to listen on (default: server.bind, 127.0.0.1:8080)")
    handler(p, cmd_serve)

    channel = sub.add_parser("channel", help="manage channels").add_subparsers(
        dest="action", required=True, parser_class=_Parser
    )
    p = with_data(channel.add_parser("add", help="add a channel; prints it as JSON"))
    p.add_argument("--name", required=True, type=_name)
    p.add_argument(
        "--type", default="WHATSAPP", type=_channel_type, help="channel type (default WHATSAPP)"
    )
    handler(p, cmd_channel_add)
    handler(with_data(channel.add_parser("list", help="list channels")), cmd_channel_list)

    user = sub.add_parser("user", help="manage operators").add_subparsers(
        dest="action", required=True, parser_class=_Parser
    )
    p = with_data(user.add_parser("add", help="add an operator directly (no invite)"))
    p.add_argument("--email", required=True, type=_email)
    p.add_argument("--name", required=True, type=_name)
    p.add_argument("--channels", help="comma-separated channel ids the operator can open")
    handler(p, cmd_user_add)

    key = sub.add_parser("key", help="manage API keys").add_subparsers(
        dest="action", required=True, parser_class=_Parser
    )
    p = with_data(key.add_parser("create", help="create a key for a user; shown once"))
    p.add_argument("--user", required=True, help="user id or email")
    handler(p, cmd_key_create)
    p = with_data(key.add_parser("list", help="list keys (never the keys themselves)"))
    p.add_argument("--user", help="only this user's keys (id or email)")
    handler(p, cmd_key_list)
    p = with_data(key.add_parser("revoke", help="revoke a key by its id"))
    p.add_argument("key_id")
    handler(p, cmd_key_revoke)

    p = with_data(sub.add_parser("backup", help="consistent online copy of the store"))
    p.add_argument("out_file")
    handler(p, cmd_backup)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        result: int = args.handler(args)
        return result
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except (InboxError, StoreError, ConfigError) as exc:
        message = getattr(exc, "message", None) or str(exc)
        print(f"inboxd: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except (OSError, sqlite3.Error) as exc:
        print(f"inboxd: {_describe(exc)}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:  # from the daemon's nurseries, e.g. a port in use
        print(f"inboxd: {_describe(_first_leaf(group))}", file=sys.stderr)
        return 1
    except Exception as exc:
        # Never a traceback on the terminal (CONTRACT section 1); INBOXD_DEBUG=1 shows it.
        if os.environ.get("INBOXD_DEBUG"):
            raise
        print(
            f"inboxd: unexpected error: {_describe(exc)} (INBOXD_DEBUG=1 shows details)",
            file=sys.stderr,
        )
        return 1


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = exc.filename or ""
        return f"{exc.strerror}: {where}".rstrip(": ")
    if isinstance(exc, InboxError):
        return exc.message
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
