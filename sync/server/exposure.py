"""Whether `codeveil serve` may start open to workspace creation on the host it binds.

A server reachable only from this machine is as private as the machine; one that listens
on another interface lets anyone who reaches it create workspaces (and fill its disk)
unless an admin token guards that, so such a start needs the token or an explicit --open.
"""

from __future__ import annotations

import ipaddress

from sync.errors import SyncError

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class ServeRefused(SyncError):
    """A server asked to listen beyond loopback with nothing guarding workspace creation."""


def is_loopback(host: str) -> bool:
    """True when `host` (a name or an address, IPv6 optionally in brackets) binds only
    this machine's loopback interface."""
    name = host.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # another name: it may resolve to any interface


def open_server_refusal(host: str, admin_token: str | None, allow_open: bool) -> str | None:
    """The one-line reason a server on `host` must not start, or None when it may.

    `admin_token` is the value of CODEVEIL_ADMIN_TOKEN (blank counts as unset, as the
    server itself reads it); `allow_open` is the operator's explicit --open."""
    if allow_open or is_loopback(host) or (admin_token or "").strip():
        return None
    return (f"refusing to serve on {host}: beyond loopback anyone who reaches the server"
            " could create workspaces; set CODEVEIL_ADMIN_TOKEN, or pass --open to allow it")
