"""The HTTP side of invitee tokens (sync.store.core.invitees), under a workspace, for its
owner's token only:

    POST /v1/workspaces/{id}/invitees          {expires_in: seconds | null} -> 201
                                               {token_id, token, expires_at}
    GET  /v1/workspaces/{id}/invitees          {invitees: [{token_id, created_at,
                                               expires_at}]}
    POST /v1/workspaces/{id}/invitees/revoke   {token_id} -> {revoked: token_id}; 404
                                               for an id the workspace does not have

An invitee's token gets 403 on all three: it cannot mint a token that outlives its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sync.store.core.backend import StoreBackend
from sync.store.core.invitees import MAX_EXPIRES_IN

Bearer = Callable[[str | None], str | None]
Answer = tuple[int, dict[str, Any]]

__all__ = ["InviteeBody", "RevokeBody", "invitee_handlers"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class InviteeBody(_Body):
    expires_in: float | None = Field(default=None, gt=0, le=MAX_EXPIRES_IN)


class RevokeBody(_Body):
    token_id: str = Field(max_length=64)


def invitee_handlers(bearer: Bearer) -> tuple[Callable[..., Answer], ...]:
    """The create, list and revoke handlers; `bearer` reads the token of an
    Authorization header."""

    def _owner(store: StoreBackend, ws: str, auth: str | None) -> None:
        store.authenticate(ws, bearer(auth), owner_only=True)

    def _create_invitee(store: StoreBackend, ws: str, auth: str | None,
                        body: bytes) -> Answer:
        _owner(store, ws, auth)
        req = InviteeBody.model_validate_json(body or b"{}")
        token_id, token, expires_at = store.create_invitee(ws, req.expires_in)
        return 201, {"token_id": token_id, "token": token, "expires_at": expires_at}

    def _list_invitees(store: StoreBackend, ws: str, auth: str | None,
                       _body: bytes) -> Answer:
        _owner(store, ws, auth)
        return 200, {"invitees": [i.to_json() for i in store.invitees(ws)]}

    def _revoke_invitee(store: StoreBackend, ws: str, auth: str | None,
                        body: bytes) -> Answer:
        _owner(store, ws, auth)
        req = RevokeBody.model_validate_json(body)
        store.revoke_invitee(ws, req.token_id)
        return 200, {"revoked": req.token_id}

    return _create_invitee, _list_invitees, _revoke_invitee
