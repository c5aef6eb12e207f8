"""Invitee tokens: bearer tokens a workspace's owner makes for one teammate each, with an
optional expiry, that can be revoked one by one (`codeveil invite`, `--revoke`).

Both stores keep one row per invitee token: (sha256(token), token id, workspace id,
created_at, expires_at or NULL); like the workspace's own token, the token itself is
shown once and never stored. The token id (16 hex digits, random) names the token for
listing and revoking and says nothing about the token.

An invitee token opens the workspace as its own token does, until it expires or is
revoked (checked on every request: neither is cached). Only the workspace's own token,
the one it was created with, makes, lists and revokes invitee tokens: an invitee cannot
mint a token that outlives its own. Expiry is the server's clock (time.time()).
"""

from __future__ import annotations

import math
import re
import secrets
import time

from sync.records import MAX_EXPIRES_IN, OWNER_ONLY, Invitee
from sync.wire import AuthError, BadRequest, InviteeNotFound

__all__ = [
    "MAX_EXPIRES_IN",
    "OWNER_ONLY",
    "Invitee",
    "check_token_id",
    "expired",
    "expired_error",
    "new_invitee",
]

_TOKEN_ID = re.compile(r"[0-9a-f]{16}\Z")


def new_invitee(expires_in: float | None) -> tuple[str, str, float, float | None]:
    """(token id, token, created_at, expires_at) of a new invitee token; BadRequest for an
    expiry that is not a positive number of seconds up to MAX_EXPIRES_IN."""
    if expires_in is not None and (isinstance(expires_in, bool)
                                   or not isinstance(expires_in, int | float)
                                   or not math.isfinite(expires_in)
                                   or not 0 < expires_in <= MAX_EXPIRES_IN):
        raise BadRequest(f"expires_in must be a number of seconds from 0 to {MAX_EXPIRES_IN}")
    now = time.time()
    return (secrets.token_hex(8), secrets.token_urlsafe(32), now,
            None if expires_in is None else now + expires_in)


def check_token_id(token_id: object) -> str:
    """A well-formed token id; InviteeNotFound (404) for anything else."""
    if not isinstance(token_id, str) or not _TOKEN_ID.match(token_id):
        raise InviteeNotFound(f"no invitee token {str(token_id)[:40]!r}")
    return token_id


def expired(expires_at: float | None) -> bool:
    return expires_at is not None and expires_at <= time.time()


def expired_error() -> AuthError:
    return AuthError("this invitee token has expired; ask the workspace's owner for a new"
                     " invite")

