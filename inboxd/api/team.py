"""Routes for the team (invites, members) and API keys (CONTRACT sections 4 and 6)."""

from __future__ import annotations

from typing import Any, Final

from quart import Blueprint, Response

from inboxd import wire
from inboxd.api.app import authenticate, now_us, principal, require_owner, state
from inboxd.api.http import field, json_body, json_response, trimmed_field
from inboxd.errors import InvalidRequest
from inboxd.model import MAX_EMAIL, MAX_NAME, email_address
from inboxd.store import accounts, team
from inboxd.timeutil import format_us

blueprint = Blueprint("team", __name__, url_prefix="/api/v1/inbox")
blueprint.before_request(authenticate)

# Accepting an invite needs no key: the token in the body is the secret.
public = Blueprint("team_public", __name__, url_prefix="/api/v1/inbox/team/invites")

MAX_TOKEN: Final = 200
MANAGE_THE_TEAM: Final = "manage the team"  # (the store's own check says the same)


def _email(body: dict[str, Any]) -> str:
    email = email_address(field(body, "email", str, required=True))
    if email is None:
        raise InvalidRequest(f"email must be an email address of at most {MAX_EMAIL} characters")
    return email


def _channel_ids(body: dict[str, Any]) -> list[str]:
    value = field(body, "channelIds", list, required=True)
    if not all(isinstance(c, str) for c in value):
        raise InvalidRequest("channelIds must be a list of channel ids")
    return list(value)


def invite_json(i: team.Invite) -> dict[str, Any]:
    return {
        "inviteId": i.id,
        "email": i.email,
        "channelIds": i.channel_ids,
        "status": i.status,
        "createdAt": format_us(i.created_at),
        "expiresAt": format_us(i.expires_at),
    }


def member_json(m: team.Member) -> dict[str, Any]:
    return {
        "memberId": m.member_id,
        "userId": m.user_id,
        "email": m.email,
        "name": m.name,
        "avatar": m.avatar,
        "role": m.role,
        "channelIds": m.channel_ids,
        "createdAt": format_us(m.created_at),
    }


@blueprint.post("/team/invites")
async def create_invite() -> Response:
    require_owner(MANAGE_THE_TEAM)  # before the body: an operator's key is 403 whatever it sends
    body = await json_body()
    email, channel_ids = _email(body), _channel_ids(body)
    new = await state().store.write(team.invite, principal(), email, channel_ids, now_us())
    return json_response(invite_json(new.invite), 201)


@blueprint.get("/team/invites")
async def list_invites() -> Response:
    rows = await state().store.read(team.list_invites, principal(), now_us())
    return json_response([invite_json(i) for i in rows])


@blueprint.delete("/team/invites/<invite_id>")
async def revoke_invite(invite_id: str) -> Response:
    revoked = await state().store.write(team.revoke_invite, principal(), invite_id, now_us())
    return json_response(invite_json(revoked))


@public.post("/accept")
async def accept_invite() -> Response:
    body = await json_body()
    token = field(body, "token", str, required=True, max_len=MAX_TOKEN)
    name = trimmed_field(body, "name", MAX_NAME)
    new = await state().store.write(team.accept_invite, token, name, now_us())
    return json_response(
        {"memberId": new.member_id, "userId": new.user_id, "apiKey": new.api_key}, 201
    )


@blueprint.get("/team/members")
async def list_members() -> Response:
    rows = await state().store.read(team.list_members, principal())
    return json_response([member_json(m) for m in rows])


@blueprint.put("/team/members/<member_id>/channels")
async def set_member_channels(member_id: str) -> Response:
    require_owner(MANAGE_THE_TEAM)
    channel_ids = _channel_ids(await json_body())
    member = await state().store.write(
        team.set_member_channels, principal(), member_id, channel_ids, now_us()
    )
    return json_response(member_json(member))


@blueprint.delete("/team/members/<member_id>")
async def remove_member(member_id: str) -> Response:
    await state().store.write(team.remove_member, principal(), member_id, now_us())
    return json_response({"memberId": member_id, "removed": True})


# -- keys ----------------------------------------------------------------------------------------


@blueprint.get("/keys")
async def list_keys() -> Response:
    who = principal()
    rows = await state().store.read(accounts.list_keys, who.account_pk, who.user_pk)
    return json_response([wire.api_key(k) for k in rows])


@blueprint.post("/keys")
async def create_key() -> Response:
    body = await json_body(required=False)
    user_id = field(body, "userId", str)  # (unknown at any length: the same answer)
    key = await state().store.write(team.create_key_for, principal(), user_id, now_us())
    return json_response({"apiKey": key.api_key, "keyId": key.key_id, "prefix": key.prefix}, 201)


@blueprint.delete("/keys/<key_id>")
async def revoke_key(key_id: str) -> Response:
    key_pk = await state().store.write(team.revoke_key_as, principal(), key_id, now_us())
    hub = state().feed_hub
    if hub is not None:
        hub.close_key(key_pk)  # revocation also ends the key's open feed sockets
    return json_response({"keyId": key_id, "revoked": True})
