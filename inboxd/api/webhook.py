"""Routes for the inbox webhook: spec endpoints 13-16, the delivery log and redelivery."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response

from inboxd import cursors
from inboxd.api.app import (
    authenticate,
    now_us,
    principal,
    require_owner,
    state,
    write_as_owner,
)
from inboxd.api.http import arg_cursor, arg_limit, field, json_body, json_response
from inboxd.store import webhooks
from inboxd.timeutil import format_opt, format_us
from inboxd.webhooks import catalog
from inboxd.webhooks.client import validate_url

blueprint = Blueprint("webhook", __name__, url_prefix="/api/v1/inbox/webhook")
blueprint.before_request(authenticate)


def configuration(hook: webhooks.InboxWebhook | None) -> dict[str, Any]:
    return {
        "url": None if hook is None else hook.url,
        "secretPrefix": None if hook is None else hook.secret_prefix,
        "createdAt": None if hook is None else format_us(hook.created_at),
        "updatedAt": None if hook is None else format_us(hook.updated_at),
        "lastDeliveryAt": None if hook is None else format_opt(hook.last_delivery_at),
        "lastDeliveryStatus": None if hook is None else hook.last_delivery_status,
        "lastDeliveryError": None if hook is None else hook.last_delivery_error,
        "events": catalog.describe(),
        "envelope": catalog.ENVELOPE,
    }


def _saved(saved: webhooks.Saved) -> Response:
    body = configuration(saved.webhook)
    body["created"] = saved.created
    if saved.secret is not None:
        body["secret"] = saved.secret
    return json_response(body)


@blueprint.get("")
async def get_webhook() -> Response:
    hook = await state().store.read(webhooks.get, principal().account_pk)
    return json_response(configuration(hook))


@blueprint.put("")
async def put_webhook() -> Response:
    require_owner("change the inbox webhook")
    body = await json_body()
    url = field(body, "url", str, required=True)
    validate_url(url, allow_private=state().config.webhooks.allow_private_hosts)
    saved = await write_as_owner(webhooks.put, principal().account_pk, url, now_us())
    return _saved(saved)


@blueprint.delete("")
async def delete_webhook() -> Response:
    require_owner("change the inbox webhook")
    removed = await write_as_owner(webhooks.delete, principal().account_pk)
    return json_response({"removed": removed})


@blueprint.post("/secret")
async def rotate_secret() -> Response:
    require_owner("change the inbox webhook")
    await json_body(required=False)
    saved = await write_as_owner(webhooks.rotate, principal().account_pk, now_us())
    return _saved(saved)


@blueprint.get("/deliveries")
async def list_deliveries() -> Response:
    require_owner("see the inbox webhook's deliveries")
    rows, has_more = await state().store.read(
        webhooks.list_deliveries, principal().account_pk, arg_limit(), arg_cursor()
    )
    last = rows[-1] if rows else None
    return json_response(
        {
            "deliveries": [
                {
                    "eventId": r.event_id,
                    "type": r.event_type,
                    "deliveryId": r.delivery_id,
                    "attempt": r.attempt,
                    "outcome": r.outcome,
                    "status": r.status,
                    "error": r.error,
                    "durationMs": r.duration_ms,
                    "at": format_us(r.at),
                }
                for r in rows
            ],
            "nextCursor": cursors.encode(last.at, last.pk) if has_more and last else None,
            "hasMore": has_more,
        }
    )


@blueprint.post("/deliveries/<event_id>/redeliver")
async def redeliver(event_id: str) -> Response:
    require_owner("redeliver inbox webhook events")
    await json_body(required=False)
    await write_as_owner(webhooks.queue_redelivery, principal().account_pk, event_id, now_us())
    return json_response({"eventId": event_id, "queued": True}, 202)
