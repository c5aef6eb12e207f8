"""Invitee tokens (sync.store.core.invitees): made by a workspace's own token, each opens the
workspace until it expires or is revoked, alone; an invitee cannot make, list or revoke
them. The same contract on the embedded store and PostgreSQL, and through the server's
routes with the HTTP client."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sync.records import MODE_SEALED
from sync.store.core.backend import StoreBackend
from sync.transport.http_client import HttpClient
from sync.wire import AuthError, BadRequest, InviteeNotFound, PermissionDenied

KEY_CHECK = bytes(16)


@pytest.fixture(params=["embedded", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreBackend]:
    if request.param == "postgres":
        yield request.getfixturevalue("pg_store")
        return
    from sync.store import Store

    with Store(tmp_path / "data") as embedded:
        yield embedded


def _workspace(store: StoreBackend) -> tuple[str, str]:
    return store.create_workspace(8, "test-model", KEY_CHECK, mode=MODE_SEALED)


def test_an_invitee_token_opens_its_workspace_until_revoked(store: StoreBackend) -> None:
    ws, owner = _workspace(store)
    other_ws, _ = _workspace(store)
    token_id, token, expires_at = store.create_invitee(ws)
    assert expires_at is None and token != owner
    store.authenticate(ws, token)
    with pytest.raises(PermissionDenied):
        store.authenticate(other_ws, token)
    with pytest.raises(PermissionDenied, match="only the token the workspace was created"):
        store.authenticate(ws, token, owner_only=True)
    store.authenticate(ws, owner, owner_only=True)

    second_id, second, _ = store.create_invitee(ws)
    assert [i.token_id for i in store.invitees(ws)] == [token_id, second_id]
    assert store.invitees(other_ws) == []
    store.revoke_invitee(ws, token_id)
    with pytest.raises(AuthError, match="invalid bearer token"):
        store.authenticate(ws, token)
    store.authenticate(ws, second)  # the others' tokens stay
    store.authenticate(ws, owner)
    assert [i.token_id for i in store.invitees(ws)] == [second_id]
    with pytest.raises(InviteeNotFound):
        store.revoke_invitee(ws, token_id)
    with pytest.raises(InviteeNotFound):
        store.revoke_invitee(other_ws, second_id)  # another workspace's token is not its own
    with pytest.raises(InviteeNotFound):
        store.revoke_invitee(ws, "not-an-id")


def test_an_invitee_token_expires(store: StoreBackend) -> None:
    ws, _owner = _workspace(store)
    _id, token, expires_at = store.create_invitee(ws, 0.3)
    assert expires_at is not None and expires_at > time.time()
    store.authenticate(ws, token)
    time.sleep(0.4)
    with pytest.raises(AuthError, match="expired"):
        store.authenticate(ws, token)
    for bad in (0, -1, float("inf"), 10**9):
        with pytest.raises(BadRequest):
            store.create_invitee(ws, bad)


def test_the_server_lets_only_the_owner_manage_invitees(server_url: str) -> None:
    ws = "invitees-" + secrets.token_hex(4)
    owner = HttpClient.create_workspace(server_url, ws, dim=8, model_id="test-model",
                                        key_check=KEY_CHECK, mode=MODE_SEALED)
    with HttpClient(server_url, ws, owner) as admin:
        token_id, token, expires_at = admin.create_invitee(3600)
        assert expires_at is not None and 3590 < expires_at - time.time() <= 3600
        assert [i.token_id for i in admin.invitees()] == [token_id]
        with HttpClient(server_url, ws, token) as invitee:
            assert invitee.info().workspace_id == ws
            for call in (invitee.invitees, lambda: invitee.create_invitee(None),
                         lambda: invitee.revoke_invitee(token_id)):
                with pytest.raises(PermissionDenied, match="only the token"):
                    call()
            admin.revoke_invitee(token_id)
            with pytest.raises(AuthError):
                invitee.info()
        with pytest.raises(InviteeNotFound):
            admin.revoke_invitee(token_id)
        with pytest.raises(BadRequest):
            admin.create_invitee(-5)
        assert admin.invitees() == []
