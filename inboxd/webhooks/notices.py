"""The two emails to a channel's owner about a failing webhook URL (spec "Channel webhook
notifications"): the warning after the second failure, and the notice that delivery stopped."""

from __future__ import annotations

from typing import Final
from urllib.parse import quote

import attrs

from inboxd.timeutil import format_us
from inboxd.webhooks.policy import Policy


@attrs.frozen
class Notice:
    subject: str
    body: str
    headers: dict[str, str]


def unsubscribe_url(base_url: str, channel_id: str, token: str) -> str:
    return f"{base_url.rstrip('/')}/api/v1/channels/{quote(channel_id)}/unsubscribe?token={token}"


def _headers(link: str) -> dict[str, str]:
    # RFC 2369 and RFC 8058: mail clients offer a one-click unsubscribe that POSTs to the link.
    return {"List-Unsubscribe": f"<{link}>", "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"}


_UNITS: Final = ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second"))


def spoken(seconds: float) -> str:
    """A duration as the emails say it: "10 minutes", "1 hour", "90 seconds"."""
    for size, unit in _UNITS:
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'' if n == 1 else 's'}"
    return f"{seconds:g} seconds"


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def warning(
    channel_name: str,
    channel_id: str,
    url: str,
    failures: int,
    error: str | None,
    link: str,
    policy: Policy,
) -> Notice:
    """The warning; what it says will happen next is the daemon's own policy
    (``channel_webhooks.pause_after`` and ``probe_schedule``)."""
    checks = [spoken(us / 1_000_000) for us in policy.probe_schedule_us]
    then = (
        f"is checked again after {_listed(checks)}"
        if checks
        else "stops until the URL is saved again"
    )
    body = (
        f"Deliveries of channel {channel_name} ({channel_id}) to\n\n  {url}\n\n"
        f"have failed {failures} times in a row (last error: {error or 'unknown'}).\n"
        "Messages are still being sent and retried. If the URL keeps failing for"
        f" {spoken(policy.pause_after_us / 1_000_000)},\ndelivery to it pauses and {then}.\n\n"
        f"Stop these emails: {link}\n"
    )
    return Notice(f"Webhook deliveries are failing: {url}", body, _headers(link))


def stopped(
    channel_name: str,
    channel_id: str,
    url: str,
    undelivered: int,
    disabled_at: int,
    error: str | None,
    link: str,
) -> Notice:
    body = (
        f"Delivery of channel {channel_name} ({channel_id}) to\n\n  {url}\n\n"
        f"has stopped at {format_us(disabled_at)}: the URL did not answer any of the checks\n"
        f"after it was paused (last error: {error or 'unknown'}).\n\n"
        f"{undelivered} message(s) are kept undelivered. To resume, save the URL again:\n"
        f"POST /api/v1/channels/{channel_id}/webhook with the full list of URLs to keep.\n\n"
        f"Stop these emails: {link}\n"
    )
    return Notice(f"Webhook delivery stopped: {url}", body, _headers(link))
