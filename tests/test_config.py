"""Config: the contract's keys and defaults, TOML, INBOXD_<SECTION>_<KEY> overrides, errors."""

from __future__ import annotations

import tomllib
from pathlib import Path

import attrs
import pytest

from inboxd.config import Config, ConfigError, parse_duration

EXAMPLE = Path(__file__).parent.parent / "config" / "inboxd.toml"


def test_defaults_are_the_spec_values() -> None:
    c = Config()
    assert c.server.bind == "127.0.0.1:8080"
    assert c.server.max_body_bytes == 1_048_576
    assert c.webhooks.request_timeout == 10
    assert c.webhooks.ca_file == "" and c.webhooks.allow_private_hosts is False
    assert c.channel_webhooks.pause_after == 600
    assert c.channel_webhooks.probe_schedule == (900, 3600, 21600)
    assert c.channel_webhooks.backlog_retention == 86400
    assert c.inbox_webhook.retry_schedule == (10, 60, 300, 1800, 7200, 21600, 43200, 86400)
    assert c.mail.smtp_host == "" and c.mail.smtp_port == 25 and c.mail.from_ == "inboxd@localhost"
    assert c.feed.retention == 7 * 86400
    assert c.limits.requests_per_second == 50 and c.limits.burst == 100


def test_documented_example_has_every_key_with_the_defaults() -> None:
    assert Config.load(EXAMPLE, env={}) == Config()
    with open(EXAMPLE, "rb") as fh:
        data = tomllib.load(fh)
    for section in (
        "server",
        "webhooks",
        "channel_webhooks",
        "inbox_webhook",
        "mail",
        "feed",
        "limits",
    ):
        assert section in data
    # Every key is in the example, and in README's table.
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    for section in attrs.fields(Config):
        for field in attrs.fields(type(getattr(Config(), section.name))):
            key = field.metadata.get("key", field.name)
            assert key in data[section.name], f"{section.name}.{key} is not in the example"
            assert f"`{section.name}.{key}`" in readme, f"{section.name}.{key} is not in README"


def test_toml_then_environment(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[server]\nbind = "0.0.0.0:9000"\n[channel_webhooks]\nprobe_schedule = ["1m", "2m"]\n'
        '[mail]\nfrom = "ops@example.com"\n'
    )
    c = Config.load(
        path,
        env={
            "INBOXD_SERVER_MAX_BODY_BYTES": "2048",
            "INBOXD_WEBHOOKS_ALLOW_PRIVATE_HOSTS": "true",
            "INBOXD_CHANNEL_WEBHOOKS_PAUSE_AFTER": "30s",
            "INBOXD_INBOX_WEBHOOK_RETRY_SCHEDULE": "1s,2s",
        },
    )
    assert c.server.bind == "0.0.0.0:9000"
    assert c.server.max_body_bytes == 2048
    assert c.webhooks.allow_private_hosts is True
    assert c.channel_webhooks.pause_after == 30
    assert c.channel_webhooks.probe_schedule == (60, 120)
    assert c.inbox_webhook.retry_schedule == (1, 2)
    assert c.mail.from_ == "ops@example.com"


@pytest.mark.parametrize(
    ("toml", "env", "needle"),
    [
        ("[server]\nbnid = 'x'\n", {}, "server.bnid"),
        ("[sever]\n", {}, "[sever]"),
        ("[server]\nmax_body_bytes = 'big'\n", {}, "server.max_body_bytes"),
        ("[feed]\nretention = '7 days'\n", {}, "feed.retention"),
        ("", {"INBOXD_LIMITS_BURST": "lots"}, "INBOXD_LIMITS_BURST"),
        ("[server\n", {}, "not valid TOML"),
        # Values that would break the daemon at their first use are refused, naming the key.
        ("[server]\nmax_body_bytes = -1\n", {}, "max_body_bytes must be at least 1"),
        ("[feed]\nqueue_bound = 0\n", {}, "queue_bound must be at least 1"),
        # Longer, and the stop would outlast CONTRACT section 1's 10 s.
        ("[server]\nshutdown_timeout = '8s'\n", {}, "shutdown_timeout must be at most 7s"),
        ("", {"INBOXD_MAIL_SMTP_PORT": "70000"}, "smtp_port must be a port from 1 to 65535"),
        ("[webhooks]\nrequest_timeout = '0s'\n", {}, "request_timeout must be more than 0"),
        ("[webhooks]\nca_file = '/no/such/ca.pem'\n", {}, "ca_file: /no/such/ca.pem does not"),
        ("[limits]\nburst = -1\n", {}, "burst must be at least 0"),
        ("[channel_webhooks]\nprobe_schedule = ['15m', '0s']\n", {}, "probe_schedule must be"),
        # NaN passes a range check by failing its comparison: a nan rate turned the limit off.
        ("[limits]\nrequests_per_second = nan\n", {}, "requests_per_second must be a finite"),
        ("", {"INBOXD_LIMITS_REQUESTS_PER_SECOND": "nan"}, "requests_per_second must be a finite"),
        ("", {"INBOXD_LIMITS_REQUESTS_PER_SECOND": "inf"}, "requests_per_second must be a finite"),
        # A whole number past what a float holds (it escaped as an OverflowError, no key named).
        ("", {"INBOXD_FEED_QUEUE_BOUND": "1" + "0" * 400}, "queue_bound must be at most"),
        (f"[limits]\nburst = {2**60}\n", {}, "burst must be at most"),
    ],
)
def test_bad_config_names_the_culprit(
    tmp_path: Path, toml: str, env: dict[str, str], needle: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=None) as info:
        Config.load(path, env=env)
    assert needle in info.value.message


@pytest.mark.parametrize(
    ("text", "seconds"), [("500ms", 0.5), ("10s", 10), ("15m", 900), ("6h", 21600), ("7d", 604800)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
