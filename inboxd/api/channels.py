"""Routes for channel webhooks (CONTRACT section 7), owner key only, and the owner's one-click
unsubscribe link from the notice emails (no key: the token in the link is the secret)."""

from __future__ import annotations

from typing import Any, Final

import trio
from quart import Blueprint, Response, request

from inboxd.api.app import authenticate, now_us, owner_only, principal, state, write_as_owner
from inboxd.api.http import field, json_body, json_response
from inboxd.errors import InvalidRequest, NotFound
from inboxd.store import accounts
from inboxd.store import channel_webhooks as cw
from inboxd.timeutil import format_opt
from inboxd.webhooks.client import validate_url

blueprint = Blueprint("channels", __name__, url_prefix="/api/v1/channels")
blueprint.before_request(authenticate)
public = Blueprint("channels_public", __name__, url_prefix="/api/v1/channels")

MAX_URLS: Final = 10


blueprint.before_request(owner_only("manage channel webhooks"))


async def _channel_pk(channel_id: str) -> int:
    channel = await state().store.read(accounts.visible_channel, principal(), channel_id)
    return channel.pk


def _min_created_at() -> int:
    return now_us() - round(state().config.channel_webhooks.backlog_retention * 1_000_000)


def settings_json(s: cw.Settings) -> dict[str, Any]:
    return {
        "channelId": s.channel_id,
        "notifications": {"email": s.notify_email},
        "secretPrefix": s.secret_prefix,
        "webhooks": [
            {
                "url": u.url,
                "state": u.state.state,
                "failureCount": u.state.failure_count,
                "firstFailureAt": format_opt(u.state.first_failure_at),
                "lastFailureAt": format_opt(u.state.last_failure_at),
                "lastStatus": u.state.last_status,
                "lastError": u.state.last_error,
                "lastSuccessAt": format_opt(u.state.last_success_at),
                "pausedAt": format_opt(u.state.paused_at),
                "nextProbeAt": format_opt(u.state.next_probe_at),
                "probesDone": u.state.probes_done,
                "disabledAt": format_opt(u.state.disabled_at),
                "backlog": u.backlog,
            }
            for u in s.urls
        ],
    }


async def _settings(channel_pk: int, channel_id: str) -> dict[str, Any]:
    s = await state().store.read(cw.settings, channel_pk, channel_id, _min_created_at())
    return settings_json(s)


async def _reconcile() -> None:
    hub = state().channel_hub
    if hub is not None:
        await hub.reconcile()


@blueprint.get("/<channel_id>/webhook")
async def get_urls(channel_id: str) -> Response:
    pk = await _channel_pk(channel_id)
    return json_response({"urls": await state().store.read(cw.list_urls, pk)})


@blueprint.post("/<channel_id>/webhook")
async def replace_urls(channel_id: str) -> Response:
    pk = await _channel_pk(channel_id)
    urls = field(await json_body(), "urls", list, required=True)
    if len(urls) > MAX_URLS:
        raise InvalidRequest(f"urls may list at most {MAX_URLS} URLs")
    if not all(isinstance(u, str) for u in urls):
        raise InvalidRequest("urls must be a list of strings")
    allow_private = state().config.webhooks.allow_private_hosts
    for url in urls:
        validate_url(url, allow_private=allow_private)
    # Once the list is taken for a batch it commits, and its supervisors must follow even if
    # the client has gone meanwhile (the request is then cancelled at its next checkpoint, which
    # may be the wait for another write's batch; nothing else would start them): the write
    # and the reconcile after it are not cancelled.
    with trio.CancelScope(shield=True):
        secret = await write_as_owner(cw.replace_urls, pk, urls, now_us(), _min_created_at())
        await _reconcile()
    body = await _settings(pk, channel_id)
    if secret is not None:
        body["secret"] = secret
    return json_response(body)


@blueprint.post("/<channel_id>/webhook/secret")
async def rotate_secret(channel_id: str) -> Response:
    pk = await _channel_pk(channel_id)
    await json_body(required=False)
    secret = await write_as_owner(cw.rotate_secret, pk, now_us())
    body = await _settings(pk, channel_id)
    body["secret"] = secret
    return json_response(body)


@blueprint.get("/<channel_id>/settings")
async def get_settings(channel_id: str) -> Response:
    pk = await _channel_pk(channel_id)
    return json_response(await _settings(pk, channel_id))


@blueprint.patch("/<channel_id>/settings")
async def patch_settings(channel_id: str) -> Response:
    pk = await _channel_pk(channel_id)
    notifications = field(await json_body(), "notifications", dict, required=True)
    email = field(notifications, "email", bool, required=True)
    await write_as_owner(cw.set_notify_email, pk, email, now_us())
    return json_response(await _settings(pk, channel_id))


_PAGE: Final = """<!doctype html><meta charset="utf-8"><title>inboxd</title>
<body style="font-family: sans-serif; max-width: 32em; margin: 3em auto">{}</body>"""


def _html(inner: str, status: int = 200) -> Response:
    return Response(_PAGE.format(inner), status=status, content_type="text/html; charset=utf-8")


@public.get("/<channel_id>/unsubscribe")
async def unsubscribe_page(channel_id: str) -> Response:
    # A GET changes nothing (mail scanners follow links); the button POSTs.
    token = request.args.get("token", "")
    return _html(
        "<p>Stop emails about failing webhook URLs of this channel?</p>"
        '<form method="post"><input type="hidden" name="token" value="'
        + token.replace('"', "&quot;").replace("<", "&lt;")
        + '"><button>Unsubscribe</button></form>'
    )


@public.post("/<channel_id>/unsubscribe")
async def unsubscribe(channel_id: str) -> Response:
    form = await request.form
    token = request.args.get("token") or form.get("token") or ""
    done = await state().store.write(cw.unsubscribe, channel_id, token, now_us())
    if not done:
        raise NotFound("unknown channel or unsubscribe token")
    return _html("<p>Unsubscribed. You will get no more of these emails.</p>")
