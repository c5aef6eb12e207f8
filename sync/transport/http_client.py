"""`HttpClient`: the `StoreClient` that talks to `codeveil serve` (sync.server.app) over HTTP.

One keep-alive `httpx.Client` per instance. Errors:

- the server refused the request: the same `StoreError` subclasses the in-process store
  raises (sync.wire), carrying the server's message: AuthError (401), PermissionDenied
  (403), WorkspaceNotFound (404), WorkspaceExists (409), BadRequest (any other 4xx);
- `ServerUnavailable`: the server could not be reached, the connection broke, it did not
  answer in time, or it answered 502/503/504. Every store operation is idempotent
  (an apply replaces whole files), so a caller may retry these; this client never does;
- `ServerError`: a 5xx or an answer outside the protocol (a bug on the server side).
"""

from __future__ import annotations

import functools
import json
import operator
import os
import re
import ssl
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import numpy as np

from sync.client import TransferStats
from sync.errors import SyncError
from sync.records import (
    DEFAULT_REF,
    MODE_SERVER_SEARCH,
    BlobRows,
    DirValue,
    FileRows,
    FileUpdate,
    Invitee,
    NodeInfo,
    RefInfo,
    SearchHit,
    WorkspaceInfo,
)
from sync.transport.http_advice import advice
from sync.wire import (
    API_PREFIX,
    ERRORS_BY_STATUS,
    LIMITS,
    AuthError,
    BadRequest,
    InviteeNotFound,
    RefNotFound,
    SealedWorkspaceError,
    StoreError,
    WorkspaceNotFound,
    b64decode,
    b64encode,
    blob_rows_from_json,
    encode_vector,
    gather_blob_rows,
    gather_rows,
    hit_from_json,
    info_from_json,
    node_from_json,
    refs_from_json,
    rows_from_json,
    update_to_json,
)

T = TypeVar("T")

DEFAULT_TIMEOUT = 120.0  # seconds; a full apply batch is written and fsynced before the answer
CONNECT_TIMEOUT = 10.0  # seconds to open a connection (reads pass less: sync.workspace.workspace)


class ClientError(SyncError):
    """The server could not be reached, or answered outside the protocol."""


class ServerUnavailable(ClientError):
    """No answer from the server (refused, reset, timed out, 502/503/504): retry later."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        #: The HTTP status it answered (502/503/504), None when nothing answered.
        self.status = status


class ServerError(ClientError):
    """The server failed (5xx) or sent an answer this client cannot read."""


class HttpClient:
    """Operations on one workspace of a codeveil server.

    `stats` counts requests sent and body bytes each way (headers are not counted).
    """

    def __init__(
        self,
        base_url: str,
        workspace_id: str,
        token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_body_bytes: int = LIMITS.max_body_bytes,
        transport: httpx.BaseTransport | None = None,
        ref: bytes = DEFAULT_REF,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        if not isinstance(token, str) or not token.isascii() or not token.isprintable() or (
            not token or any(c.isspace() for c in token)
        ):
            raise AuthError("the bearer token is empty or holds spaces or control characters")
        self.base_url = base_url.rstrip("/")
        self.workspace_id = workspace_id
        self.max_body_bytes = max_body_bytes
        self.stats = TransferStats()
        self._path = f"{API_PREFIX}/workspaces/{quote(workspace_id, safe='')}"
        self.ref = ref
        self._http = _session(self.base_url, timeout, transport, token,
                              connect_timeout=connect_timeout)

    @property
    def ref(self) -> bytes:
        """The ref whose tree the tree requests read and write."""
        return self._ref

    @ref.setter
    def ref(self, ref: bytes) -> None:
        self._ref = ref
        # The default ref's tree at the routes of before refs (a server of one tree
        # answers them alike); another ref's under /refs/{ref}.
        self._tree = (self._path if ref == DEFAULT_REF
                      else f"{self._path}/refs/{_encode(b64encode, ref, 'ref')}")

    # -- workspaces -------------------------------------------------------------------

    @classmethod
    def create_workspace(
        cls,
        base_url: str,
        workspace_id: str,
        *,
        dim: int,
        model_id: str,
        key_check: bytes,
        mode: str = MODE_SERVER_SEARCH,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> str:
        """Create `workspace_id` of `mode` on the server at `base_url`; returns its
        bearer token.

        The server keeps only a hash of the token: this is the one time it is seen.
        """
        payload = {
            "dim": dim,
            "model_id": model_id,
            "key_check": _encode(b64encode, key_check, "key_check"),
            "workspace_id": workspace_id,
            "mode": mode,
        }
        # A server started with an admin token wants it for this (and only this) call.
        admin = os.environ.get("CODEVEIL_ADMIN_TOKEN", "").strip() or None
        with _session(base_url.rstrip("/"), timeout, transport, admin) as http:
            answer = _call(http, base_url, "POST", f"{API_PREFIX}/workspaces", payload)
        return _field(answer, lambda a: str(a["token"]))

    @classmethod
    def health(
        cls, base_url: str, *, timeout: float = 5.0, transport: httpx.BaseTransport | None = None
    ) -> dict[str, Any]:
        """The server's health answer; ServerUnavailable if it cannot be reached."""
        with _session(base_url.rstrip("/"), timeout, transport, None) as http:
            return _call(http, base_url, "GET", f"{API_PREFIX}/health", None)

    # -- StoreClient ------------------------------------------------------------------

    def info(self) -> WorkspaceInfo:
        return _field(self._request("GET", ""), info_from_json)

    def root(self) -> NodeInfo | None:
        answer = self._tree_request("GET", "/tree/root")
        return _field(answer, lambda a: None if a["node"] is None else node_from_json(a["node"]))

    def children(self, keys: list[bytes]) -> dict[bytes, list[NodeInfo]]:
        payload = {"keys": [_encode(b64encode, k, "keys") for k in keys]}
        answer = self._tree_request("POST", "/tree/children", payload)
        return _field(
            answer,
            lambda a: {
                b64decode(k): [node_from_json(n) for n in nodes]
                for k, nodes in a["children"].items()
            },
        )

    def apply(self, updates: list[FileUpdate], deletes: list[bytes]) -> list[bytes]:
        payload = {
            "updates": [_encode(update_to_json, u, "updates") for u in updates],
            "deletes": [_encode(b64encode, d, "deletes") for d in deletes],
        }
        answer = self._tree_request("POST", "/apply", payload)
        return _field(answer, lambda a: [b64decode(k) for k in a.get("missing", [])])

    def set_dir_values(self, values: list[DirValue]) -> NodeInfo | None:
        payload = {"values": [[_encode(b64encode, part, "values") for part in v] for v in values]}
        answer = self._tree_request("POST", "/tree/dirs", payload)
        return _field(answer, lambda a: None if a.get("root") is None
                      else node_from_json(a["root"]))

    def search(self, vector: np.ndarray, k: int) -> list[SearchHit]:
        try:
            k_json: Any = operator.index(k) if not isinstance(k, bool) else k
        except TypeError:
            k_json = k  # let the server say what is wrong with it
        payload = {"vector": _encode(encode_vector, vector, "vector"), "k": k_json}
        # 409 here is the workspace's mode, not a taken id.
        answer = self._request("POST", "/search", payload, conflict=SealedWorkspaceError)
        return _field(answer, lambda a: [hit_from_json(h) for h in a["hits"]])

    def file_rows(self, file_keys: list[bytes]) -> FileRows:
        def fetch(part: list[bytes]) -> FileRows:
            payload = {"files": [_encode(b64encode, k, "files") for k in part]}
            return _field(self._tree_request("POST", "/rows", payload), rows_from_json)

        return gather_rows(file_keys, LIMITS.max_row_files, fetch)

    def blob_rows(self, blobs: list[tuple[bytes, bytes]], *, rows: bool = True) -> BlobRows:
        def fetch(part: list[tuple[bytes, bytes]]) -> BlobRows:
            payload: dict[str, Any] = {
                "blobs": [[_encode(b64encode, k, "blobs"), _encode(b64encode, v, "blobs")]
                          for k, v in part], "rows": rows}
            return _field(self._request("POST", "/blobs", payload), blob_rows_from_json)

        return gather_blob_rows(blobs, LIMITS.max_row_files, fetch)

    def refs(self) -> list[RefInfo]:
        return _field(self._request("GET", "/refs"), refs_from_json)

    def drop_ref(self, ref: bytes) -> None:
        try:
            self._request("DELETE", f"/refs/{_encode(b64encode, ref, 'ref')}")
        except WorkspaceNotFound as exc:  # a 404 of this route: the ref, not the workspace
            if "has no ref" not in str(exc):
                raise
            raise RefNotFound(str(exc).split(" (HTTP 404", 1)[0]) from None

    # -- invitee tokens (sync.store.core.invitees); the workspace's own token only ------------

    def create_invitee(self, expires_in: float | None = None
                       ) -> tuple[str, str, float | None]:
        """A new invitee token: (token id, token, expires_at or None)."""
        def read(a: dict[str, Any]) -> tuple[str, str, float | None]:
            expires = a["expires_at"]
            return str(a["token_id"]), str(a["token"]), None if expires is None else float(
                expires)

        return _field(self._request("POST", "/invitees", {"expires_in": expires_in}), read)

    def invitees(self) -> list[Invitee]:
        """The workspace's invitee tokens not revoked, oldest first."""
        return _field(self._request("GET", "/invitees"), lambda a: [
            Invitee(str(i["token_id"]), float(i["created_at"]),
                    None if i["expires_at"] is None else float(i["expires_at"]))
            for i in a["invitees"]])

    def revoke_invitee(self, token_id: str) -> None:
        try:
            self._request("POST", "/invitees/revoke", {"token_id": token_id})
        except WorkspaceNotFound as exc:  # a 404 of this route: the token id
            if "no invitee token" not in str(exc):
                raise
            raise InviteeNotFound(
                f"workspace {self.workspace_id} has no invite token {token_id[:40]!r} on"
                f" {self.base_url} (revoked already, or never made: `codeveil invite"
                " --list` shows them)") from None

    def collect_garbage(self, *, max_ref_age_days: float | None = None,
                        grace_s: float | None = None) -> dict[str, int]:
        payload = {"max_ref_age_days": max_ref_age_days, "grace_s": grace_s}
        return _field(self._request("POST", "/gc", payload),
                      lambda a: {k: int(a[k]) for k in ("refs", "blobs", "rows")})

    def verify(self) -> None:
        """Nothing to ask: a server with damaged files answers 503 to every request."""

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------

    def _tree_request(self, method: str, path: str, payload: dict[str, Any] | None = None
                      ) -> dict[str, Any]:
        return _call(self._http, self.base_url, method, self._tree + path, payload,
                     stats=self.stats, max_body_bytes=self.max_body_bytes,
                     workspace_id=self.workspace_id)

    def _request(
        self, method: str, path: str, payload: dict[str, Any] | None = None,
        *, conflict: type[StoreError] | None = None,
    ) -> dict[str, Any]:
        return _call(
            self._http, self.base_url, method, self._path + path, payload,
            stats=self.stats, max_body_bytes=self.max_body_bytes, conflict=conflict,
            workspace_id=self.workspace_id,
        )


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Building one (loading the CA bundle) costs tens of ms; httpx would do it for every
    # client, even one that only ever talks plain HTTP to loopback.
    return httpx.create_ssl_context()


def _session(
    base_url: str, timeout: float, transport: httpx.BaseTransport | None, token: str | None,
    *, connect_timeout: float = CONNECT_TIMEOUT,
) -> httpx.Client:
    headers = {"User-Agent": "codeveil"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.Client(
        base_url=base_url,
        headers=headers,
        timeout=httpx.Timeout(timeout, connect=min(timeout, connect_timeout)),
        transport=transport,
        verify=_ssl_context(),
    )


def _call(
    http: httpx.Client,
    base_url: str,
    method: str,
    path: str,
    payload: dict[str, Any] | None,
    *,
    stats: TransferStats | None = None,
    max_body_bytes: int = LIMITS.max_body_bytes,
    conflict: type[StoreError] | None = None,
    workspace_id: str | None = None,
) -> dict[str, Any]:
    """One request; `conflict` is the error a 409 stands for on this route;
    `workspace_id` the workspace it is about (named in the advice of a refusal)."""
    content = None
    if payload is not None:
        content = json.dumps(payload, separators=(",", ":")).encode()
        if len(content) > max_body_bytes:
            # The server would refuse it unread; say so without sending it.
            raise BadRequest(
                f"request body of {len(content)} bytes exceeds the server's limit of"
                f" {max_body_bytes} bytes; send smaller batches",
                status=413,
            )
    headers = {"Content-Type": "application/json"} if content is not None else None
    if stats is not None:
        stats.requests += 1
        stats.bytes_sent += len(content or b"")
    try:
        response = http.request(method, path, content=content, headers=headers)
    except httpx.ConnectError as exc:
        raise ServerUnavailable(f"cannot reach server at {base_url}: {exc}") from exc
    except httpx.LocalProtocolError as exc:  # a request httpx will not send: retrying won't help
        raise BadRequest(f"cannot send the request: {exc}", status=400) from exc
    except httpx.TimeoutException as exc:
        raise ServerUnavailable(
            f"no answer from the server at {base_url} in time ({type(exc).__name__})"
        ) from exc
    except httpx.TransportError as exc:
        raise ServerUnavailable(
            f"the connection to the server at {base_url} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if stats is not None:
        stats.bytes_received += len(response.content)
    status = response.status_code
    if status >= 400:
        message = _error_message(response)
        if status not in (502, 503, 504) and not _json_body(response):
            # Every refusal of a codeveil server is JSON (its own, or its framework's for
            # a route it lacks); an HTML or text page is another server's. Its page and a
            # 404's "workspace no longer exists" would both mislead. 502-504: a proxy
            # before a codeveil server that is down, said below as an outage.
            raise ServerError(_not_codeveil(base_url, response))
        known = conflict if status == 409 and conflict else ERRORS_BY_STATUS.get(status)
        if known is not None:
            raise known(f"{message} (HTTP {status} from {base_url}); "
                        + advice(status, base_url, workspace_id, message))
        if status in (502, 503, 504):
            # Answered, but unable to serve now (its store, or the server behind a proxy):
            # retried like an outage, said as what it is.
            raise ServerUnavailable(f"server at {base_url} unavailable ({status}): {message};"
                                    " retry later, and if it persists tell its operator",
                                    status=status)
        if status < 500:
            raise BadRequest(message, status=status)
        raise ServerError(f"server at {base_url} failed ({status}): {message}; "
                          + advice(status, base_url, workspace_id))
    try:
        answer = response.json()
    except ValueError:
        raise ServerError(_not_codeveil(base_url, response)) from None
    if not isinstance(answer, dict):
        raise ServerError(f"the server at {base_url} sent an unexpected answer")
    return answer


def _json_body(response: httpx.Response) -> bool:
    try:
        return isinstance(response.json(), dict)
    except ValueError:
        return False


def _not_codeveil(base_url: str, response: httpx.Response) -> str:
    """What to say of an answer that no codeveil server gives: what did answer, and the
    one next step."""
    kind = response.headers.get("content-type", "no content type").split(";")[0]
    title = re.search(r"<title>\s*([^<]{1,80}?)\s*</title>", response.text, re.IGNORECASE)
    what = f": {title.group(1)!r}" if title else ""
    return (f"{base_url} is not a codeveil server: it answered HTTP {response.status_code}"
            f" with {kind}{what}; check the URL (`codeveil serve` prints the one to use)")


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return body["error"]
    text = response.text.strip()
    return text[:300] if text else response.reason_phrase or f"HTTP {response.status_code}"


def _encode(fn: Callable[[Any], T], value: object, what: str) -> T:
    """Client-side encoding; a value that cannot be encoded is a BadRequest, as it is
    in-process."""
    try:
        return fn(value)
    except (TypeError, ValueError, AttributeError) as exc:
        raise BadRequest(f"{what}: cannot encode {type(value).__name__}: {exc}") from None


def _field(answer: dict[str, Any], read: Callable[[dict[str, Any]], T]) -> T:
    try:
        return read(answer)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ServerError(f"unexpected answer from the server: {exc!r}") from None


__all__ = ["ClientError", "HttpClient", "ServerError", "ServerUnavailable"]
