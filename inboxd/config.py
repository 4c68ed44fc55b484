"""The daemon's configuration: one frozen ``Config`` read from TOML, then from the environment.

Every key of CONTRACT section 1 exists here with the spec's default. A key can be overridden by an
environment variable ``INBOXD_<SECTION>_<KEY>`` (upper case). Durations are written ``"500ms"``,
``"10s"``, ``"15m"``, ``"6h"`` or ``"7d"`` and held as float seconds. Unknown sections or keys are an
error, so a typo in a config file is reported instead of silently ignored.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from inboxd.errors import InboxError


class ConfigError(InboxError):
    """A config file or environment variable that cannot be used."""


SECOND: Final = 1.0
MINUTE: Final = 60 * SECOND
HOUR: Final = 60 * MINUTE
DAY: Final = 24 * HOUR
# The longest server.shutdown_timeout: what follows it in a stop takes up to 3 s more (but for a
# writer child that hangs: see ServerConfig.shutdown_timeout).
SHUTDOWN_TIMEOUT_MAX: Final = 7 * SECOND

_UNITS: Final = {"ms": 0.001, "s": SECOND, "m": MINUTE, "h": HOUR, "d": DAY}
_DURATION_RE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")


def parse_duration(text: str) -> float:
    """``"15m"`` -> 900.0 seconds."""
    m = _DURATION_RE.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a duration like '10s', '15m', '6h' or '7d'")
    return float(m[1]) * _UNITS[m[2]]


def _kind(kind: str) -> dict[str, str]:
    return {"kind": kind}


# Range checks: a value that would break the daemon at its first use (every request 413, every
# feed upgrade failing) is refused when the config is read, naming the key.
Check = Any  # an attrs validator: (instance, attribute, value) -> None


_LARGEST_WHOLE: Final = 2**53  # the largest whole numbers a float holds exactly


def _finite(attribute: attrs.Attribute[Any], value: float) -> None:
    """TOML and the environment's numbers (float()) read nan and inf; NaN passes every range
    check by failing its comparison (a nan rate turned the rate limit off)."""
    if isinstance(value, int):
        # No setting needs more, and past it the float arithmetic that uses them (the rate
        # limiter's, the timers') fails or rounds: refused here, naming the key.
        if abs(value) > _LARGEST_WHOLE:
            raise ValueError(f"{_key(attribute)} must be at most {_LARGEST_WHOLE}, not {value}")
        return
    if not math.isfinite(value):
        raise ValueError(f"{_key(attribute)} must be a finite number, not {value!r}")


def _at_least(low: float) -> Check:
    def check(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
        _finite(attribute, value)
        if value < low:
            raise ValueError(f"{_key(attribute)} must be at least {low:g}, not {value!r}")

    return check


def _between(low: float, high: float, why: str) -> Check:
    def check(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
        _at_least(low)(_, attribute, value)
        if value > high:
            raise ValueError(f"{_key(attribute)} must be at most {high:g}s ({why}), not {value:g}s")

    return check


def _more_than(low: float) -> Check:
    def check(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
        _finite(attribute, value)
        if value <= low:
            raise ValueError(f"{_key(attribute)} must be more than {low:g}, not {value!r}")

    return check


def _each(inner: Check) -> Check:
    def check(instance: object, attribute: attrs.Attribute[Any], values: tuple[Any, ...]) -> None:
        for value in values:
            inner(instance, attribute, value)

    return check


def _port(_: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if not 1 <= value <= 65535:
        raise ValueError(f"{_key(attribute)} must be a port from 1 to 65535, not {value!r}")


def _readable_file(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value and not os.access(value, os.R_OK):
        raise ValueError(f"{_key(attribute)}: {value} does not exist or cannot be read")


@attrs.frozen
class ServerConfig:
    bind: str = attrs.field(default="127.0.0.1:8080", metadata=_kind("str"))
    max_body_bytes: int = attrs.field(
        default=1_048_576, metadata=_kind("int"), validator=_at_least(1)
    )
    # How long in-flight requests may take to finish after SIGTERM (systemd's TimeoutStopSec is
    # set above it). Bounded so that the stop keeps CONTRACT section 1's 10 s: after it come the
    # cut of stuck connections (0.5 s), the cache keeper's stop (at most 2 s) and the writer
    # child's last commit (milliseconds; one that hangs is given 5 s before it is killed).
    shutdown_timeout: float = attrs.field(
        default=5.0,
        metadata=_kind("duration"),
        validator=_between(0, SHUTDOWN_TIMEOUT_MAX, "the daemon exits within 10 s of SIGTERM"),
    )
    # The address users reach the daemon at, for links in emails; empty: the bound address.
    public_url: str = attrs.field(default="", metadata=_kind("str"))
    # At start, have the OS read the store into its page cache in the background when it takes
    # at most half of the memory available (store/warm.py); false: leave the cache alone.
    warm_cache: bool = attrs.field(default=True, metadata=_kind("bool"))
    # And lock it there (mlock), as far as RLIMIT_MEMLOCK (or CAP_IPC_LOCK) allows, so that the
    # kernel cannot page it out; false: keep it mapped only, and check every second that it is.
    lock_cache: bool = attrs.field(default=True, metadata=_kind("bool"))
    # Lock the daemon's own code (the interpreter's and its libraries', about 20 MB) in memory,
    # as far as RLIMIT_MEMLOCK (or CAP_IPC_LOCK) allows, so that a request never waits for the
    # disk to bring a part of it back (resident.py); false: leave it to the kernel.
    lock_code: bool = attrs.field(default=True, metadata=_kind("bool"))


@attrs.frozen
class WebhooksConfig:
    request_timeout: float = attrs.field(
        default=10.0, metadata=_kind("duration"), validator=_more_than(0)
    )
    ca_file: str = attrs.field(default="", metadata=_kind("str"), validator=_readable_file)
    allow_private_hosts: bool = attrs.field(default=False, metadata=_kind("bool"))


@attrs.frozen
class ChannelWebhooksConfig:
    pause_after: float = attrs.field(
        default=10 * MINUTE, metadata=_kind("duration"), validator=_at_least(0)
    )
    probe_schedule: tuple[float, ...] = attrs.field(
        default=(15 * MINUTE, HOUR, 6 * HOUR),
        metadata=_kind("durations"),
        validator=_each(_more_than(0)),
    )
    backlog_retention: float = attrs.field(
        default=DAY, metadata=_kind("duration"), validator=_at_least(0)
    )


@attrs.frozen
class InboxWebhookConfig:
    retry_schedule: tuple[float, ...] = attrs.field(
        default=(10.0, MINUTE, 5 * MINUTE, 30 * MINUTE, 2 * HOUR, 6 * HOUR, 12 * HOUR, DAY),
        metadata=_kind("durations"),
        validator=_each(_at_least(0)),
    )


@attrs.frozen
class MailConfig:
    smtp_host: str = attrs.field(default="", metadata=_kind("str"))
    smtp_port: int = attrs.field(default=25, metadata=_kind("int"), validator=_port)
    from_: str = attrs.field(default="inboxd@localhost", metadata={"kind": "str", "key": "from"})
    starttls: bool = attrs.field(default=False, metadata=_kind("bool"))
    username: str = attrs.field(default="", metadata=_kind("str"))
    password: str = attrs.field(default="", metadata=_kind("str"), repr=False)


@attrs.frozen
class FeedConfig:
    retention: float = attrs.field(
        default=7 * DAY, metadata=_kind("duration"), validator=_more_than(0)
    )
    # Events that may wait for one websocket client; past that it is closed with 1013.
    queue_bound: int = attrs.field(default=1000, metadata=_kind("int"), validator=_at_least(1))


@attrs.frozen
class LimitsConfig:
    requests_per_second: float = attrs.field(
        default=50.0, metadata=_kind("float"), validator=_at_least(0)
    )
    burst: int = attrs.field(default=100, metadata=_kind("int"), validator=_at_least(0))


LOG_LEVELS: Final = ("debug", "info", "warning", "error")


def _log_level(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if value.lower() not in LOG_LEVELS:
        raise ValueError(f"log level {value!r} is not one of {', '.join(LOG_LEVELS)}")


@attrs.frozen
class LogConfig:
    level: str = attrs.field(default="info", metadata=_kind("str"), validator=_log_level)


@attrs.frozen
class Config:
    server: ServerConfig = ServerConfig()
    webhooks: WebhooksConfig = WebhooksConfig()
    channel_webhooks: ChannelWebhooksConfig = ChannelWebhooksConfig()
    inbox_webhook: InboxWebhookConfig = InboxWebhookConfig()
    mail: MailConfig = MailConfig()
    feed: FeedConfig = FeedConfig()
    limits: LimitsConfig = LimitsConfig()
    log: LogConfig = LogConfig()

    @classmethod
    def load(cls, path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
        """Defaults, then the TOML file at ``path`` (if any), then ``INBOXD_<SECTION>_<KEY>``."""
        data: dict[str, Any] = {}
        if path is not None:
            try:
                with open(path, "rb") as fh:
                    data = tomllib.load(fh)
            except FileNotFoundError:
                raise ConfigError(f"config file {path} does not exist") from None
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        return cls.from_mapping(data, os.environ if env is None else env)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], env: Mapping[str, str]) -> Config:
        sections: dict[str, Any] = {}
        known = {f.name for f in attrs.fields(cls)}
        for name in data:
            if name not in known:
                raise ConfigError(f"unknown config section [{name}]")
        for section in attrs.fields(cls):
            section_cls = type(section.default)
            raw = data.get(section.name, {})
            if not isinstance(raw, dict):
                raise ConfigError(f"[{section.name}] must be a table")
            sections[section.name] = _load_section(section.name, section_cls, raw, env)
        return cls(**sections)


def _key(field: attrs.Attribute[Any]) -> str:
    return str(field.metadata.get("key", field.name))


def _load_section(name: str, section_cls: type, raw: dict[str, Any], env: Mapping[str, str]) -> Any:
    fields = {_key(f): f for f in attrs.fields(section_cls)}
    for key in raw:
        if key not in fields:
            raise ConfigError(f"unknown config key {name}.{key}")
    values: dict[str, Any] = {}
    for key, field in fields.items():
        kind = field.metadata["kind"]
        env_name = f"INBOXD_{name}_{key}".upper()
        try:
            if env_name in env:
                values[field.name] = _from_env(kind, env[env_name])
            elif key in raw:
                values[field.name] = _from_toml(kind, raw[key])
        except (ValueError, TypeError) as exc:
            where = env_name if env_name in env else f"{name}.{key}"
            raise ConfigError(f"{where}: {exc}") from None
    try:
        return section_cls(**values)
    except ValueError as exc:
        raise ConfigError(f"[{name}]: {exc}") from None


def _from_toml(kind: str, value: Any) -> Any:
    if kind == "str":
        if not isinstance(value, str):
            raise TypeError("must be a string")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError("must be a whole number")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError("must be a number")
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise TypeError("must be true or false")
        return value
    if kind == "duration":
        if not isinstance(value, str):
            raise TypeError("must be a duration string like '10s'")
        return parse_duration(value)
    if kind == "durations":
        if not isinstance(value, list) or not value:
            raise TypeError("must be a non-empty list of durations like ['15m', '1h']")
        return tuple(_from_toml("duration", v) for v in value)
    raise AssertionError(kind)


def _from_env(kind: str, text: str) -> Any:
    if kind == "str":
        return text
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "bool":
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"{text!r} is not true or false")
    if kind == "duration":
        return parse_duration(text)
    if kind == "durations":
        items = [p.strip().strip("\"'") for p in text.strip().strip("[]").split(",")]
        if not any(items):
            raise ValueError("must list at least one duration")
        return tuple(parse_duration(p) for p in items if p)
    raise AssertionError(kind)


def parse_bind(bind: str) -> tuple[str, int]:
    """``"127.0.0.1:8080"`` or ``"[::1]:8080"`` -> (host, port)."""
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not host:
        raise ConfigError(f"bind address {bind!r} is not HOST:PORT")
    if not 1 <= int(port) <= 65535:
        raise ConfigError(f"bind address {bind!r}: the port must be 1 to 65535")
    return host.strip("[]"), int(port)
