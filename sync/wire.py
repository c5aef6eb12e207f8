"""What the store protocol looks like on the wire, shared by the server and `HttpClient`.

Encoding (one rule everywhere): every byte string (keys, values, chunk ids, key checks,
sealed metadata) is base64url without `=` padding; a vector is the base64url of its
little-endian float32 bytes. Everything else is plain JSON.

This module also holds the protocol's limits and its error vocabulary. Both are shared
on purpose: the in-process store enforces the same limits as the server, so a caller that
batches correctly for one works against the other, and `LocalClient` raises the same
exception classes that `HttpClient` rebuilds from a server's answer, so callers handle
both clients alike. It imports nothing heavy (no LanceDB, faiss or FastAPI).
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from sync.errors import SyncError
from sync.records import (
    MODE_SERVER_SEARCH,
    BlobRows,
    FileRows,
    FileUpdate,
    NodeInfo,
    RefInfo,
    SearchHit,
    WorkspaceInfo,
)

API_PREFIX = "/v1"


# -- limits -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """Bounds on one request. The server rejects anything larger with a 4xx; the
    in-process store enforces the same numbers. Advertised in `WorkspaceInfo.extra`."""

    max_body_bytes: int = 64 * 1024 * 1024
    max_updates: int = 4096  # files per apply
    max_chunks: int = 20_000  # chunks per apply, over all its files
    max_deletes: int = 10_000  # subtree roots per apply
    max_depth: int = 256  # ancestors of one file
    max_keys: int = 10_000  # directory keys per children call
    max_dir_values: int = 100_000  # (key, value) pairs per set_dir_values call
    max_k: int = 1000  # neighbours per search
    max_row_files: int = 2048  # file keys per file_rows call
    # Chunk ids and metadata bytes per file_rows answer: the files past it are left out of
    # the answer and asked for again (a file's rows always come whole, even past it).
    max_row_bytes: int = 16 * 1024 * 1024
    max_dim: int = 4096
    max_meta_bytes: int = 64 * 1024  # one sealed metadata blob
    max_model_id: int = 256  # characters
    max_key_check: int = 64  # bytes
    # L2 norm of a stored or query vector. Encrypted vectors are under 1e5 (sync.crypto.ciphers);
    # far larger finite ones make faiss's squared distances overflow float32 to inf,
    # which silently drops neighbours.
    max_vector_norm: int = 10**9

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


LIMITS = Limits()


# -- errors -----------------------------------------------------------------------------


class StoreError(SyncError):
    """The store refused an operation or could not carry it out.

    Raised alike by the in-process store and, rebuilt from the server's answer, by
    `HttpClient`. `http_status` is the status the server answers with.
    """

    http_status = 500


class BadRequest(StoreError):
    """The request is malformed or out of bounds; the message says what is wrong."""

    http_status = 422

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.http_status = status


class StoreCorrupt(StoreError):
    """A file of the store is damaged, truncated or missing; the message names it and
    what to do. 503: the store cannot serve this workspace until it is repaired."""

    http_status = 503


class StoreUnavailable(StoreError):
    """The store's database cannot be reached, or dropped the connection; the message
    names it (never its password). 503: the request may be retried later."""

    http_status = 503


class WorkspaceNotFound(StoreError):
    """No workspace with this id in this store."""

    http_status = 404


class RefNotFound(StoreError):
    """The workspace has no tree for this ref."""

    http_status = 404


class InviteeNotFound(StoreError):
    """The workspace has no invitee token of this id (sync.store.core.invitees)."""

    http_status = 404


class WorkspaceExists(StoreError):
    """A workspace with this id already exists."""

    http_status = 409


class AuthError(StoreError):
    """No bearer token, or one that belongs to no workspace."""

    http_status = 401


class PermissionDenied(AuthError):
    """A valid token, but of another workspace."""

    http_status = 403


class SealedWorkspaceError(StoreError):
    """The operation needs vectors on the server, and a sealed workspace keeps none
    (search runs on the client). 409: it conflicts with the workspace's mode."""

    http_status = 409


ERRORS_BY_STATUS: dict[int, type[StoreError]] = {
    401: AuthError,
    403: PermissionDenied,
    404: WorkspaceNotFound,
    409: WorkspaceExists,
}


# -- bytes and vectors --------------------------------------------------------------------

_B64URL = re.compile(r"[A-Za-z0-9_-]*\Z")
# base64url -> standard alphabet for binascii's strict decoder; "+", "/" and "=" are not
# base64url, so they map to "*", which the strict decoder refuses.
_URL_TO_STD = bytes.maketrans(b"-_+/=", b"+/***")
_STD_TO_URL = bytes.maketrans(b"+/", b"-_")


def b64encode(data: bytes) -> str:
    """base64url without padding."""
    return binascii.b2a_base64(data, newline=False).rstrip(b"=").translate(_STD_TO_URL).decode()


def b64decode(text: object) -> bytes:
    """Strict inverse of `b64encode`; ValueError with a readable reason otherwise."""
    if isinstance(text, str) and text.isascii() and len(text) % 4 != 1:
        raw = text.encode("ascii").translate(_URL_TO_STD) + b"=" * (-len(text) % 4)
        try:
            return binascii.a2b_base64(raw, strict_mode=True)
        except binascii.Error:
            pass  # find out what is wrong below; this is the uncommon path
    if not isinstance(text, str):
        raise ValueError(f"expected a base64url string, got {_json_type(text)}")
    if not _B64URL.match(text):
        bad = next(c for c in text if not (c.isascii() and (c.isalnum() or c in "-_")))
        raise ValueError(
            f"not base64url: character {bad!r} (use A-Z a-z 0-9 - _ and no '=' padding)"
        )
    if len(text) % 4 == 1:
        raise ValueError(f"not base64url: a length of {len(text)} characters is impossible")
    raise ValueError("not base64url")  # pragma: no cover - every case is caught above


def encode_vector(vector: np.ndarray) -> str:
    # Values beyond float32's range become inf here, and the server refuses them by name.
    with np.errstate(over="ignore"):
        return b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes())


def decode_vector(text: object) -> np.ndarray:
    """A float32 vector from base64url; its length and finiteness are checked by the store,
    which knows the workspace's dim."""
    raw = b64decode(text)
    if len(raw) % 4:
        raise ValueError(f"a vector is float32: {len(raw)} bytes is not a multiple of 4")
    return np.frombuffer(raw, dtype="<f4")


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


# -- records <-> JSON ---------------------------------------------------------------------
# Requests are parsed by the server's pydantic models (sync.server.app); these functions build
# requests on the client side and convert the server's answers both ways.


def node_to_json(node: NodeInfo) -> dict[str, Any]:
    return {
        "key": b64encode(node.key),
        "value": None if node.value is None else b64encode(node.value),
        "is_dir": node.is_dir,
    }


def node_from_json(obj: dict[str, Any]) -> NodeInfo:
    value = obj["value"]
    return NodeInfo(
        key=b64decode(obj["key"]),
        value=None if value is None else b64decode(value),
        is_dir=bool(obj["is_dir"]),
    )


def info_to_json(info: WorkspaceInfo) -> dict[str, Any]:
    return {
        "workspace_id": info.workspace_id,
        "dim": info.dim,
        "model_id": info.model_id,
        "key_check": b64encode(info.key_check),
        "chunks": info.chunks,
        "nodes": info.nodes,
        "extra": info.extra,
        "mode": info.mode,
    }


def info_from_json(obj: dict[str, Any]) -> WorkspaceInfo:
    return WorkspaceInfo(
        workspace_id=str(obj["workspace_id"]),
        dim=int(obj["dim"]),
        model_id=str(obj["model_id"]),
        key_check=b64decode(obj["key_check"]),
        chunks=int(obj.get("chunks", 0)),
        nodes=int(obj.get("nodes", 0)),
        extra=dict(obj.get("extra") or {}),
        # A server from before workspace modes knew server-search only.
        mode=str(obj.get("mode") or MODE_SERVER_SEARCH),
    )


def update_to_json(update: FileUpdate) -> dict[str, Any]:
    return {
        "file_key": b64encode(update.file_key),
        "ancestors": [b64encode(a) for a in update.ancestors],
        "value": b64encode(update.value),
        "chunks": [_chunk_to_json(c.chunk_id, c.vector, c.meta) for c in update.chunks],
        # Only when set: an upload's request is what it was before the pool.
        **({"link": True} if update.link else {}),
    }


def _chunk_to_json(chunk_id: bytes, vector: np.ndarray | None, meta: bytes) -> dict[str, Any]:
    # A sealed workspace's rows have no vector: the field is left out, not sent as null.
    out = {"chunk_id": b64encode(chunk_id), "meta": b64encode(meta)}
    if vector is not None:
        out["vector"] = encode_vector(vector)
    return out


def rows_to_json(rows: FileRows) -> dict[str, Any]:
    """A file_rows answer: {"files": {key: [[chunk_id, meta], ...]}}."""
    return {
        "files": {
            b64encode(key): [[b64encode(cid), b64encode(meta)] for cid, meta in found]
            for key, found in rows.items()
        }
    }


def gather_rows(
    file_keys: list[bytes], per_call: int, fetch: Callable[[list[bytes]], FileRows]
) -> FileRows:
    """Every file's rows, in calls of at most `per_call` keys. A store answers a call
    with the rows of a prefix of its keys when they would pass its byte bound; the rest
    are asked for again. Each call answers at least one key, so this ends."""
    wanted = list(dict.fromkeys(file_keys))
    out: FileRows = {}
    at = 0
    while at < len(wanted):
        part = wanted[at : at + per_call]
        answer = fetch(part)
        answered = 0
        for key in part:  # the answer covers a prefix of `part`
            if key not in answer:
                break
            out[key] = answer[key]
            answered += 1
        if not answered:
            raise StoreError("the store answered a file_rows call without any of its files")
        at += answered
    return out


def rows_from_json(obj: dict[str, Any]) -> FileRows:
    return {
        b64decode(key): [(b64decode(cid), b64decode(meta)) for cid, meta in found]
        for key, found in obj["files"].items()
    }


def hit_to_json(hit: SearchHit) -> dict[str, Any]:
    return {
        "chunk_id": b64encode(hit.chunk_id),
        "distance": hit.distance,
        "meta": b64encode(hit.meta),
    }


def hit_from_json(obj: dict[str, Any]) -> SearchHit:
    return SearchHit(
        chunk_id=b64decode(obj["chunk_id"]),
        distance=float(obj["distance"]),
        meta=b64decode(obj["meta"]),
    )


def blob_rows_to_json(answer: BlobRows) -> dict[str, Any]:
    """A blob_rows answer: file_rows' shape, and the keys of blobs the pool lacks."""
    return {**rows_to_json(answer.rows), "missing": [b64encode(k) for k in answer.missing]}


def blob_rows_from_json(obj: dict[str, Any]) -> BlobRows:
    return BlobRows(rows_from_json(obj), [b64decode(k) for k in obj["missing"]])


def gather_blob_rows(items: list[tuple[bytes, bytes]], per_call: int,
                     fetch: Callable[[list[tuple[bytes, bytes]]], BlobRows]) -> BlobRows:
    """`gather_rows` for blobs: every item answered, as rows or as missing."""
    wanted = list(dict(items).items())
    out = BlobRows({}, [])
    at = 0
    while at < len(wanted):
        part = wanted[at : at + per_call]
        answer = fetch(part)
        answered = 0
        for key, _ in part:  # the answer covers a prefix of `part`
            if key in answer.rows:
                out.rows[key] = answer.rows[key]
            elif key in answer.missing:
                out.missing.append(key)
            else:
                break
            answered += 1
        if not answered:
            raise StoreError("the store answered a blob_rows call without any of its blobs")
        at += answered
    return out


def refs_to_json(refs: list[RefInfo]) -> dict[str, Any]:
    return {"refs": [{"ref": b64encode(r.ref), "synced_at": r.synced_at, "files": r.files,
                      "rows": r.rows} for r in refs]}


def refs_from_json(obj: dict[str, Any]) -> list[RefInfo]:
    return [RefInfo(b64decode(r["ref"]), float(r["synced_at"]), int(r["files"]),
                    int(r["rows"])) for r in obj["refs"]]
