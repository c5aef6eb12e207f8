"""Invite strings: everything a teammate needs to join a workspace, in one line.

Format, version 1::

    cvinv1_<base64url, no padding, of: payload || checksum>
    payload  = compact JSON {"v": 1, "s": server URL, "w": workspace id, "t": bearer
               token, "k": base64url of the 32-byte workspace key, "e": expiry (unix
               seconds) or null}
    checksum = SHA-256(b"cvinv1_" || payload)[:8]

The checksum is not a signature: it catches a string that was cut short, wrapped badly
or had a character changed (with probability 1 - 2^-64), so that `join` refuses it
before anything is written. Whoever holds the string holds the key and the token: it is
a secret like a password.

The token is an invitee token (sync.store.core.invitees) made for this one invite by the
workspace's owner: the server refuses it once it expires or is revoked
(`codeveil invite --revoke ID`), whatever else the other teammates hold. The expiry is
in the string too, so that `join` refuses a string past it before asking the server.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sync.crypto.keys import KEY_SIZE, WorkspaceKey
from sync.errors import SyncError

if TYPE_CHECKING:
    from sync.checkout.config import RepoConfig
    from sync.records import Invitee
    from sync.transport.http_client import HttpClient

__all__ = [
    "PREFIX",
    "Invite",
    "InviteError",
    "decode_invite",
    "list_invitees",
    "make_invite",
    "parse_duration",
    "revoke_invitee",
]

PREFIX = "cvinv1_"
VERSION = 1
_CHECKSUM_SIZE = 8
_MAX_LENGTH = 8192  # a real invite is ~250 characters; refuse to decode anything huge
_WORKSPACE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")  # as sync.checkout.config reads
_DURATION = re.compile(r"(\d+)\s*([smhdw])\Z")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}


class InviteError(SyncError):
    """An invite string that cannot be used: cut, altered, expired, or of another version."""


@dataclass(frozen=True)
class Invite:
    """What an invite carries. `repr` never shows the token or the key."""

    server: str
    workspace_id: str
    token: str
    key: WorkspaceKey
    expires_at: float | None = None

    def __repr__(self) -> str:
        return f"Invite(server={self.server!r}, workspace_id={self.workspace_id!r})"

    def encode(self) -> str:
        """The invite as one copy-pasteable line (`cvinv1_...`)."""
        payload = json.dumps(
            {"v": VERSION, "s": self.server, "w": self.workspace_id, "t": self.token,
             "k": _b64(self.key.secret), "e": self.expires_at},
            separators=(",", ":"),
        ).encode()
        return PREFIX + _b64(payload + _checksum(payload))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _checksum(payload: bytes) -> bytes:
    return hashlib.sha256(PREFIX.encode() + payload).digest()[:_CHECKSUM_SIZE]


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def decode_invite(text: str, *, now: float | None = None) -> Invite:
    """Read and check an invite string: version, checksum, every field, the key's length,
    the expiry. Raises InviteError naming what is wrong, never quoting the string (it is
    a secret)."""
    text = "".join(text.split())  # a string wrapped by a chat or a terminal still reads
    if not text.startswith(PREFIX):
        other = re.match(r"cvinv(\d+)_", text)
        if other:
            raise InviteError(f"this invite is of format v{other.group(1)}; this codeveil"
                              f" reads v{VERSION} only: upgrade codeveil to use it")
        raise InviteError(f"not a codeveil invite: one starts with {PREFIX!r}; copy the"
                          " whole line `codeveil invite` printed")
    if len(text) > _MAX_LENGTH:
        raise InviteError("the invite is far too long to be one; copy it again")
    try:
        raw = _unb64(text[len(PREFIX):])
    except (binascii.Error, ValueError):
        raise InviteError("the invite has characters that are not base64url (A-Z a-z 0-9"
                          " - _): it was altered or cut; copy it again") from None
    payload, checksum = raw[:-_CHECKSUM_SIZE], raw[-_CHECKSUM_SIZE:]
    if len(raw) <= _CHECKSUM_SIZE or not hmac.compare_digest(checksum, _checksum(payload)):
        raise InviteError("the invite's checksum does not match: it was cut short or a"
                          " character changed; copy the whole line again")
    invite = _fields(payload)
    if invite.expires_at is not None and invite.expires_at <= (now or time.time()):
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(invite.expires_at))
        raise InviteError(f"this invite expired at {when}; ask for a new one"
                          " (`codeveil invite`)")
    return invite


def _fields(payload: bytes) -> Invite:
    """The fields of a payload whose checksum matched: checked all the same, since a
    string can be made by hand, or by a codeveil with a bug."""
    try:
        raw = json.loads(payload)
    except ValueError:
        raw = None
    if not isinstance(raw, dict):
        raise InviteError("the invite's content is not readable; ask for a new one")
    if raw.get("v") != VERSION:
        raise InviteError(f"the invite says format {raw.get('v')!r}; this codeveil reads"
                          f" {VERSION}")
    server, ws, token, key, expires = (raw.get(f) for f in "swtke")
    if not isinstance(server, str) or not server.startswith(("http://", "https://")):
        raise InviteError("the invite's server is not an http(s) URL; ask for a new one")
    if not isinstance(ws, str) or not _WORKSPACE_ID.match(ws):
        raise InviteError("the invite's workspace id is not one; ask for a new one")
    if not isinstance(token, str) or not token or not token.isprintable() or " " in token:
        raise InviteError("the invite's token is empty or malformed; ask for a new one")
    try:
        secret = _unb64(key) if isinstance(key, str) else b""
    except (binascii.Error, ValueError):
        secret = b""
    if len(secret) != KEY_SIZE:
        raise InviteError(f"the invite's key is not {KEY_SIZE} bytes; ask for a new one")
    if expires is not None and (isinstance(expires, bool)
                                or not isinstance(expires, int | float)):
        raise InviteError("the invite's expiry is not a time; ask for a new one")
    return Invite(server=server.rstrip("/"), workspace_id=ws, token=token,
                  key=WorkspaceKey(secret),
                  expires_at=None if expires is None else float(expires))


def parse_duration(text: str) -> float:
    """Seconds in `30m`, `12h`, `7d`, `2w` (or `90s`); InviteError if not a duration."""
    from sync.records import MAX_EXPIRES_IN

    match = _DURATION.match(text.strip().lower())
    if not match:
        raise InviteError(f"{text!r} is not a duration: write a number and a unit, s, m,"
                          " h, d or w (e.g. 12h, 7d)")
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds == 0:
        raise InviteError(f"an invite that expires in {text.strip()} would be expired when"
                          " made: give a duration (e.g. 12h, 7d), or leave --expires out"
                          " for one that works until revoked")
    if seconds > MAX_EXPIRES_IN:  # checked here: the server's refusal is its raw schema
        raise InviteError(f"{text.strip()} is longer than an invite may last,"
                          f" {MAX_EXPIRES_IN // 86_400} days; leave --expires out for one"
                          " that works until revoked")
    return seconds


def _owner_client(repo: Path) -> tuple[RepoConfig, HttpClient]:
    """The config of the checkout at or above `repo` and a client of its server with the
    token stored here. Refused for an embedded store: a teammate cannot reach a store
    inside this folder."""
    from sync.checkout.config import codeveil_dir, find_root, load_config, load_token
    from sync.transport.http_client import HttpClient

    root = find_root(repo)
    config = load_config(root)
    if config.server is None:
        raise InviteError(f"the workspace of {root} is embedded in {codeveil_dir(root)}, not"
                          " on a server, so no teammate can reach it: index into a server"
                          " (`codeveil init --server URL` in a fresh clone) to share it")
    return config, HttpClient(config.server, config.workspace_id,
                              load_token(config.workspace_id))


def make_invite(repo: Path, *, expires_in: float | None = None) -> tuple[Invite, str]:
    """An invite to the workspace of the checkout at or above `repo`, carrying a new
    invitee token (valid `expires_in` seconds, or until revoked), and that token's id."""
    from sync.crypto.keys import load_key

    config, client = _owner_client(repo)
    key = load_key(config.workspace_id)
    assert config.server is not None
    with client:
        token_id, token, expires_at = client.create_invitee(expires_in)
    made = Invite(server=config.server, workspace_id=config.workspace_id, token=token,
                  key=key, expires_at=expires_at)
    return made, token_id


def list_invitees(repo: Path) -> list[Invitee]:
    """The invitee tokens of the workspace of the checkout at or above `repo`."""
    _config, client = _owner_client(repo)
    with client:
        return client.invitees()


def revoke_invitee(repo: Path, token_id: str) -> None:
    """Revoke one invitee token of the workspace of the checkout at or above `repo`."""
    _config, client = _owner_client(repo)
    with client:
        client.revoke_invitee(token_id)
