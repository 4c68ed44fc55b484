"""Operational routes without a key: liveness, readiness, metrics and the OpenAPI document
(CONTRACT section 9).

None of them goes through ``authenticate``: they need no key and are not rate-limited per key. The
OpenAPI document holds no secrets; API docs are public (README, "where the spec and contract are
silent").
"""

from __future__ import annotations

from quart import Blueprint, Response

from inboxd.api.app import state
from inboxd.api.http import encoded_json, json_response
from inboxd.api.openapi import OPENAPI_PATH, document_json
from inboxd.metrics import CONTENT_TYPE
from inboxd.store import channel_webhooks, shards
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


@blueprint.get("/metrics")
async def metrics() -> Response:
    """Prometheus text format; URL states and channels' own search indexes are counted in the
    store when scraped."""
    st = state()
    body = st.metrics.exposition(
        url_states=await st.store.read(channel_webhooks.count_by_state),
        own_indexes=await st.store.read(shards.count_by_state),
        feed_clients=0 if st.feed_hub is None else len(st.feed_hub.clients),
        supervisors=0 if st.channel_hub is None else st.channel_hub.supervisors,
        loop_disk_waits=st.store.loop_disk_waits,
        writer_starts=0 if st.store.writer_process is None else st.store.writer_process.started,
        in_memory=st.store.in_memory is True,
        commit_times=st.store.all_commit_times(),
        restart_times=st.store.restart_times,
        reads=(st.store.inline_reads, st.store.offloaded_reads),
    )
    return Response(body, content_type=CONTENT_TYPE)


@blueprint.get(OPENAPI_PATH)
async def openapi() -> Response:
    return encoded_json(document_json())
