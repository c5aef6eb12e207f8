"""The HTTP side of refs and the blob pool (sync.store.embedded.pool): the request bodies and
handlers of `GET /refs`, `DELETE /refs/{ref}`, `POST /blobs` and `POST /gc` under a
workspace, and the check of a ref in a path. The tree routes under `/refs/{ref}` are
sync.server.app's own handlers, given the ref."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sync.records import KEY_BYTES
from sync.server.body_fields import Key
from sync.store.core.backend import StoreBackend, WorkspaceBackend
from sync.wire import (
    LIMITS,
    BadRequest,
    b64decode,
    blob_rows_to_json,
    refs_to_json,
)

Authorize = Callable[[StoreBackend, str, str | None], WorkspaceBackend]
Answer = tuple[int, dict[str, Any]]

REF_PARAMETER = {
    "name": "ref", "in": "path", "required": True,
    "description": f"a ref id: {KEY_BYTES} bytes (a keyed hash the client makes of its"
                   " branch's name), base64url without padding",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{22}$"},
}


def ref_from_path(text: str) -> bytes:
    """The ref of a path; BadRequest (400) for one that is not 16 bytes of base64url."""
    try:
        raw = b64decode(text)
    except ValueError:
        raw = b""
    if len(raw) != KEY_BYTES:
        raise BadRequest(f"malformed ref id {text[:40]!r}: expected {KEY_BYTES} bytes,"
                         " base64url without padding", status=400)
    return raw




class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class BlobsBody(_Body):
    # (file key, leaf value) of each file version wanted
    blobs: list[tuple[Key, Key]] = Field(max_length=LIMITS.max_row_files)
    rows: bool = True  # false: only which blobs the pool holds


class GcBody(_Body):
    max_ref_age_days: float | None = Field(default=None, ge=0)
    grace_s: float | None = Field(default=None, ge=0)


def refs_handler(authorized: Authorize) -> Callable[..., Answer]:
    def _refs(store: StoreBackend, ws: str, auth: str | None, _body: bytes) -> Answer:
        return 200, refs_to_json(authorized(store, ws, auth).refs())
    return _refs


def drop_ref_handler(authorized: Authorize) -> Callable[..., Answer]:
    def _drop_ref(store: StoreBackend, ws: str, auth: str | None, _body: bytes,
                  ref: bytes) -> Answer:
        authorized(store, ws, auth).drop_ref(ref)
        return 200, {"dropped": True}
    return _drop_ref


def blobs_handler(authorized: Authorize) -> Callable[..., Answer]:
    def _blobs(store: StoreBackend, ws: str, auth: str | None, body: bytes) -> Answer:
        workspace = authorized(store, ws, auth)
        req = BlobsBody.model_validate_json(body)
        return 200, blob_rows_to_json(workspace.blob_rows(req.blobs, rows=req.rows))
    return _blobs


def gc_handler(authorized: Authorize) -> Callable[..., Answer]:
    def _gc(store: StoreBackend, ws: str, auth: str | None, body: bytes) -> Answer:
        workspace = authorized(store, ws, auth)
        req = GcBody.model_validate_json(body or b"{}")
        return 200, workspace.collect_garbage(max_ref_age_days=req.max_ref_age_days,
                                              grace_s=req.grace_s)
    return _gc
