"""Joining a teammate's workspace from an invite (sync.workspace.invite): check everything that can
be checked, then write.

The order is the point: the string is decoded and checked (sync.workspace.invite), then the server
is asked, with the invite's token, for the workspace, whose key check must match the
invite's key and whose model this machine must be able to run. Only then is anything
written: the key (beside the other keys), the token, and `.codeveil/` in the checkout.
A string that is cut, altered, expired, or whose token the server no longer accepts
leaves no trace. The first index afterwards pulls the teammate's vectors
(sync.syncer.syncer) instead of embedding them.
"""

from __future__ import annotations

import os
from pathlib import Path

from indexer.embedder import Embedder
from indexer.errors import CodeveilError
from sync.checkout.config import RepoConfig, codeveil_dir, load_config, save_token
from sync.crypto.keys import export_key, import_key
from sync.records import WorkspaceInfo
from sync.wire import AuthError, WorkspaceNotFound
from sync.workspace.invite import Invite, InviteError

__all__ = ["join_workspace"]


def join_workspace(path: Path, invite: Invite) -> RepoConfig:
    """Point the checkout at `path` at the invite's workspace, with the key and token
    stored; raises (writing nothing) when the checkout is indexed into another
    workspace, the server refuses the token, or the key or model do not fit the
    workspace. A checkout already pointed at the workspace only gets the new token."""
    root = path.resolve()
    if not root.is_dir():
        raise CodeveilError(f"no such folder: {path}")
    rejoin = (codeveil_dir(root) / "config.json").exists()
    if rejoin:
        # The same workspace again (a new invite after the last one's token was revoked
        # or expired): only the token changes. Another one is refused.
        config = load_config(root)
        if (config.workspace_id, config.server) != (invite.workspace_id, invite.server):
            raise CodeveilError(f"{root} is indexed into another workspace; remove"
                                f" {codeveil_dir(root)} first to join this one there")
    info = _ask_server(invite)
    if info.key_check != invite.key.key_check:
        raise InviteError(f"the invite's key is not the key of workspace {invite.workspace_id}"
                          " on its server; ask for a new invite")
    embedder = _embedder_for(info.model_id)
    # From here on, writes: the key first (refused without a write if another key is
    # stored for this workspace), then the token and the checkout's config.
    import_key(invite.workspace_id, export_key(invite.key))
    from sync.workspace.workspace import Workspace

    # A token stored here for this workspace that the server still takes (the owner's,
    # or an earlier invite's, joining a second clone) is kept: the tokens are the
    # user's, not the clone's, and replacing the owner's would lose the right to invite.
    token = None if _stored_token_works(invite) else invite.token
    if rejoin:
        if token is not None:
            save_token(invite.workspace_id, token)
        return load_config(root)
    ws = Workspace(root, embedder=embedder)
    try:
        return ws.init(server=invite.server, workspace_id=invite.workspace_id, token=token)
    finally:
        ws.close()


def _stored_token_works(invite: Invite) -> bool:
    from sync.checkout.config import token_path
    from sync.transport.http_client import HttpClient
    from sync.wire import StoreError

    try:
        stored = token_path(invite.workspace_id).read_text().strip()
    except OSError:
        return False
    if not stored or stored == invite.token:
        return False
    try:
        with HttpClient(invite.server, invite.workspace_id, stored) as client:
            client.info()
    except StoreError:
        return False
    return True


def _ask_server(invite: Invite) -> WorkspaceInfo:
    from sync.transport.http_client import HttpClient

    try:
        with HttpClient(invite.server, invite.workspace_id, invite.token) as client:
            return client.info()
    except WorkspaceNotFound:
        raise InviteError(f"workspace {invite.workspace_id} no longer exists on"
                          f" {invite.server}; ask for a new invite") from None
    except AuthError:
        raise InviteError(f"{invite.server} refuses the invite's token (it was revoked, or"
                          " the workspace's token changed); ask for a new invite") from None


def _embedder_for(model_id: str) -> Embedder:
    """The embedder of the workspace's model: CODEVEIL_EMBEDDER's if set (and the same
    model), else the one that makes `model_id`'s vectors."""
    from indexer.embedder_registry import default_embedder, embedder_for_model_id

    if os.environ.get("CODEVEIL_EMBEDDER"):
        chosen = default_embedder()
        if chosen.model_id != model_id:
            raise CodeveilError(f"the workspace holds vectors of {model_id}, but"
                                f" CODEVEIL_EMBEDDER makes {chosen.model_id}; unset it")
        return chosen
    found = embedder_for_model_id(model_id)
    if found is None:
        raise CodeveilError(f"the workspace holds vectors of {model_id}, which this codeveil"
                            " cannot make; upgrade codeveil")
    return found
