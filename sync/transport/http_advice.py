"""What a user can do about each refusal of a codeveil server, in one line.

`sync.transport.http_client` raises the same error classes as the in-process store (AuthError,
WorkspaceNotFound, ...) with the server's message; over HTTP it adds who answered and
this advice, so that a refused token, a workspace gone or a failing server each read as
what they are, and never as a server that cannot be reached.
"""

from __future__ import annotations

from sync.checkout.config import token_path
from sync.records import OWNER_ONLY

__all__ = ["advice"]


def advice(status: int, base_url: str, workspace_id: str | None, message: str = "") -> str:
    """The remedy for an answer of HTTP `status` (and the server's `message`) from the
    server at `base_url`, for a request about `workspace_id` (None: creating one, or
    asking its health)."""
    ws = f"workspace {workspace_id}" if workspace_id else "the workspace"
    if status == 403 and message.startswith(OWNER_ONLY[:40]):
        return "a teammate who joined with an invite cannot invite in turn"
    if status == 401 and "invitee token has expired" in message:
        return "ask the workspace's owner for a new invite, and run `codeveil join` with it"
    if status == 401 and workspace_id is None:
        return ("this server creates workspaces only for its admin token: set"
                " CODEVEIL_ADMIN_TOKEN to it (ask the server's operator)")
    if status == 403 and workspace_id is None:
        return "the server refuses to create more workspaces: ask its operator"
    if status in (401, 403):
        whose = ("is not one the server accepts" if status == 401
                 else "is another workspace's")
        where = f"{token_path(workspace_id)}" if workspace_id else "its token file"
        return (f"this machine's token for {ws} {whose}: put the workspace's token (from"
                f" whoever created it) in {where}, or set CODEVEIL_TOKEN"
                + (" (an invite's token that was revoked, or a workspace removed from the"
                   " server, is refused: ask its owner for a new invite and run `codeveil"
                   " join`)" if status == 401 else ""))
    if status == 404:
        return (f"{ws} is not on this server (removed, or the server's data was replaced):"
                " ask its operator to restore it, or remove .codeveil/ and run `codeveil"
                f" init --server {base_url}` to index into a new workspace")
    if status == 409 and workspace_id is None:
        return ("a workspace of that id exists already: join it with"
                f" `codeveil init --server {base_url} --workspace ID --token TOKEN`")
    if status == 409:
        return f"the request does not fit {ws} as the server holds it"
    if status >= 500:
        return ("the server failed on its side; retry later, and if it persists tell its"
                " operator (the server's log names the cause)")
    return "the request was refused as it stands"
