"""Operational routes without a key: liveness and readiness (CONTRACT section 9)."""

from __future__ import annotations

from quart import Blueprint, Response

from inboxd.api.app import state
from inboxd.api.http import json_response
from inboxd.store.db import schema_version
from inboxd.store.schema import MIGRATIONS

blueprint = Blueprint("ops", __name__)


@blueprint.get("/healthz")
async def healthz() -> Response:
    return json_response({"status": "ok"})


@blueprint.get("/readyz")
async def readyz() -> Response:
    st = state()
    try:
        version = await st.store.read(schema_version)
    except Exception as exc:  # the store is unusable: not ready, say why
        return json_response({"status": "unavailable", "error": str(exc)}, 503)
    if not st.ready or version != len(MIGRATIONS):
        return json_response({"status": "unavailable", "schemaVersion": version}, 503)
    return json_response({"status": "ready", "schemaVersion": version})
