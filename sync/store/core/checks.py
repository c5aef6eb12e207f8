"""Validation shared by the store backends (sync.store.embedded.workspace and
sync.store.postgres.workspace, their registries sync.store.embedded.registry and
sync.store.postgres.registry):
what a request must be before any backend touches it, so both refuse the same input with
the same message and status."""

from __future__ import annotations

import dataclasses
import hashlib
import operator
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sync.records import (
    DEFAULT_REF,
    KEY_BYTES,
    MODE_SERVER_SEARCH,
    MODES,
    FileUpdate,
    children_digest,
)
from sync.wire import LIMITS, BadRequest, Limits, PermissionDenied

WORKSPACE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")


def _key(value: object, where: str) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise BadRequest(f"{where} must be bytes, got {type(value).__name__}")
    raw = bytes(value)
    if len(raw) != KEY_BYTES:
        raise BadRequest(f"{where} must be {KEY_BYTES} bytes, got {len(raw)}")
    return raw


def ref_id(value: object, sealed: bool) -> bytes:
    """A checked ref id (16 bytes, sync.store.embedded.pool). A server-search workspace keeps
    one tree, the default ref's: another ref is a 409 that says so."""
    ref = _key(value, "ref")
    if ref != DEFAULT_REF and not sealed:
        raise BadRequest(
            "this workspace is server-search: it keeps one tree, so it takes no ref of"
            " its own (only sealed workspaces hold one tree per branch)", status=409)
    return ref


def _vector(value: object, dim: int, where: str) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except Exception as exc:  # ragged lists and other non-arrays
        raise BadRequest(f"{where} is not an array of numbers ({exc})") from None
    if arr.dtype.kind not in "fiu":
        raise BadRequest(f"{where} must hold numbers, got dtype {arr.dtype}")
    if arr.shape != (dim,):
        got = arr.shape[0] if arr.ndim == 1 else arr.shape
        raise BadRequest(f"{where} must have {dim} values (the workspace's dim), got {got}")
    with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf: refused
        out = arr.astype(np.float32)
    if not np.isfinite(out).all():
        raise BadRequest(f"{where} contains NaN or infinite values")
    norm = float(np.linalg.norm(out.astype(np.float64)))
    if norm > LIMITS.max_vector_norm:
        raise BadRequest(
            f"{where} has norm {norm:.3g}, over the limit of {LIMITS.max_vector_norm:.0e}"
            " (its squared distances would overflow float32)"
        )
    return out


def children_keys(keys: object, limits: Limits) -> list[bytes]:
    """The checked keys of a `children` request."""
    if not isinstance(keys, Sequence) or isinstance(keys, bytes | str):
        raise BadRequest("keys must be a list of keys")
    if len(keys) > limits.max_keys:
        raise BadRequest(f"too many keys: {len(keys)} > {limits.max_keys} per children call")
    return [_key(k, f"keys[{i}]") for i, k in enumerate(keys)]


def search_request(vector: object, k: int, dim: int, limits: Limits
                   ) -> tuple[np.ndarray, int]:
    """The checked vector (`dim` floats) and `k` of a `search` request."""
    query = _vector(vector, dim, "vector")
    try:
        if isinstance(k, bool):
            raise TypeError
        k = operator.index(k)
    except TypeError:
        raise BadRequest(f"k must be an integer, got {type(k).__name__}") from None
    if not 1 <= k <= limits.max_k:
        raise BadRequest(f"k must be between 1 and {limits.max_k}, got {k}")
    return query, k


def _meta(value: object, where: str, limit: int) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise BadRequest(f"{where} must be bytes, got {type(value).__name__}")
    if len(value) > limit:
        raise BadRequest(f"{where} is {len(value)} bytes, the limit is {limit}")
    return bytes(value)


_NO_ROWS = np.empty((0, 0), np.float32)


@dataclass(frozen=True, slots=True)
class Update:
    """A validated FileUpdate, its chunks as columns."""

    file_key: bytes
    ancestors: tuple[bytes, ...]
    value: bytes
    chunk_ids: list[bytes]
    vectors: np.ndarray  # (n, dim) float32
    metas: list[bytes]
    link: bool = False  # rows=the pool's blob (file key's fid, value)




def new_workspace_id(
    limits: Limits, dim: object, model_id: object, key_check: object,
    workspace_id: object, mode: object,
) -> str:
    """Check the fields of a workspace to create; returns its id (a random one if none
    was given)."""
    lim = limits
    if not isinstance(mode, str) or mode not in MODES:
        raise BadRequest(
            f"unknown workspace mode {str(mode)[:40]!r}: use one of {', '.join(MODES)}",
            status=400,
        )
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= lim.max_dim:
        raise BadRequest(f"dim must be an integer from 1 to {lim.max_dim}, got {dim!r}")
    if not isinstance(model_id, str) or not 1 <= len(model_id) <= lim.max_model_id:
        raise BadRequest(f"model_id must be a string of 1 to {lim.max_model_id} characters")
    if not model_id.isprintable():
        raise BadRequest("model_id must hold printable characters only")
    if not isinstance(key_check, bytes) or not 1 <= len(key_check) <= lim.max_key_check:
        raise BadRequest(f"key_check must be 1 to {lim.max_key_check} bytes")
    if workspace_id is None:
        return secrets.token_hex(16)
    if not isinstance(workspace_id, str) or not WORKSPACE_ID_RE.match(workspace_id):
        raise BadRequest(
            "workspace_id must be 1 to 64 characters of A-Z a-z 0-9 _ -,"
            " starting with a letter or digit"
        )
    return workspace_id


def token_hash(token: str) -> bytes:
    """What a store keeps of a bearer token: its SHA-256, never the token."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def quota_check(count: int, max_workspaces: int | None) -> None:
    """Refuse a new workspace (PermissionDenied) once the store holds `max_workspaces`."""
    if max_workspaces is not None and count >= max_workspaces:
        raise PermissionDenied(
            f"this server holds its limit of {max_workspaces} workspaces;"
            " ask its operator for room"
        )


def dir_value_checks(values: object, limits: Limits) -> dict[bytes, tuple[bytes, bytes]]:
    """key -> (value, children digest) of a `set_dir_values` request, checked."""
    if not isinstance(values, Sequence) or isinstance(values, bytes | str):
        raise BadRequest("values must be a list of (key, value, children) triples")
    if len(values) > limits.max_dir_values:
        raise BadRequest(f"too many directory values: {len(values)} > {limits.max_dir_values}")
    pending: dict[bytes, tuple[bytes, bytes]] = {}
    for i, item in enumerate(values):
        if not isinstance(item, Sequence) or isinstance(item, bytes | str) or len(item) != 3:
            raise BadRequest(f"values[{i}] must be a (key, value, children digest) triple")
        pending[_key(item[0], f"values[{i}][0]")] = (
            _key(item[1], f"values[{i}][1]"), _key(item[2], f"values[{i}][2]")
        )
    return pending


Children = dict[bytes, list[tuple[bytes, bytes | None]]]  # directory -> (child, value)


def decide_dir_values(
    pending: dict[bytes, tuple[bytes, bytes]],
    children_of: Callable[[list[bytes]], Children],
    write: Callable[[list[tuple[bytes, bytes]]], None],
) -> int:
    """The compare-and-set of `set_dir_values`, for either backend; returns how many
    values were refused.

    `pending`: existing directories' (value, children digest), `children_of(keys)`: their
    children as stored now, `write(items)`: set those (key, value) pairs. Bottom-up,
    whatever the order given: a value is decided once every value this call gives one
    of its children is, against the children as they are then: set if none is pending
    (NULL) and they digest as given, refused otherwise. Deciding a parent in the same
    round as its child could set it over the child's old value while the child changes.
    """
    pending = dict(pending)
    refused = 0
    while pending:
        kids = children_of(list(pending))
        decided = [k for k in pending if not any(c in pending for c, _ in kids.get(k, []))]
        if not decided:  # parent links in a cycle (a damaged table): set none of it
            return refused + len(pending)
        ready = []
        for key in decided:
            value, expected = pending.pop(key)
            mine = kids.get(key, [])
            if all(v is not None for _, v in mine) and children_digest(
                    (c, v) for c, v in mine if v is not None) == expected:
                ready.append((key, value))
            else:
                refused += 1
        if ready:
            write(ready)
    return refused


class ApplyTarget(Protocol):
    """What checking an apply needs to know of its workspace (either backend's)."""

    @property
    def limits(self) -> Limits: ...
    @property
    def sealed(self) -> bool: ...
    @property
    def dim(self) -> int: ...
    @property
    def workspace_id(self) -> str: ...


def validate_apply(
    ws: ApplyTarget, updates: Sequence[FileUpdate], deletes: Sequence[bytes]
) -> tuple[list[Update], list[bytes]]:
    """An `apply` request checked whole before anything is written (BadRequest naming
    the field otherwise): the updates as columns, the deletes without repeats."""
    lim = ws.limits
    for name, seq in (("updates", updates), ("deletes", deletes)):
        if not isinstance(seq, Sequence) or isinstance(seq, bytes | str):
            raise BadRequest(f"{name} must be a list")
    if len(updates) > lim.max_updates:
        raise BadRequest(f"too many updates: {len(updates)} > {lim.max_updates} per apply")
    if len(deletes) > lim.max_deletes:
        raise BadRequest(f"too many deletes: {len(deletes)} > {lim.max_deletes} per apply")
    dels = list(dict.fromkeys(_key(d, f"deletes[{i}]") for i, d in enumerate(deletes)))
    total = 0
    out: list[Update] = []
    vecs: list[np.ndarray] = []  # every chunk's vector, in order
    spans: list[tuple[int, int]] = []  # each update's rows in `vecs`
    shape: dict[bytes, tuple[bytes | None, bool]] = {}  # key -> (parent, is_dir)
    for i, u in enumerate(updates):
        where = f"updates[{i}]"
        if not isinstance(u, FileUpdate):
            raise BadRequest(f"{where} must be a FileUpdate, got {type(u).__name__}")
        file_key = _key(u.file_key, f"{where}.file_key")
        if file_key in shape and not shape[file_key][1]:
            raise BadRequest(f"{where}.file_key appears twice in this batch")
        value = _key(u.value, f"{where}.value")
        if not isinstance(u.ancestors, Sequence) or isinstance(u.ancestors, bytes | str):
            raise BadRequest(f"{where}.ancestors must be a list of keys")
        if not 1 <= len(u.ancestors) <= lim.max_depth:
            raise BadRequest(
                f"{where}.ancestors must hold 1 to {lim.max_depth} keys (the root"
                f" first), got {len(u.ancestors)}"
            )
        anc = tuple(_key(a, f"{where}.ancestors[{j}]") for j, a in enumerate(u.ancestors))
        if len(set(anc)) != len(anc) or file_key in anc:
            raise BadRequest(f"{where}: a key appears twice on the path from the root")
        if anc[0] != (out[0].ancestors[0] if out else anc[0]):
            raise BadRequest(f"{where}.ancestors[0] differs from updates[0]: one root only")
        if not isinstance(u.chunks, Sequence):
            raise BadRequest(f"{where}.chunks must be a list")
        if u.link is not False and u.link is not True:
            raise BadRequest(f"{where}.link must be true or false")
        if u.link and not ws.sealed:
            raise BadRequest(f"{where}.link: a server-search workspace has no blob pool"
                             " (only sealed workspaces share rows between refs)",
                             status=409)
        if u.link and u.chunks:
            raise BadRequest(f"{where}: a link names a stored blob and carries no chunks")
        total += len(u.chunks)
        if total > lim.max_chunks:
            raise BadRequest(f"too many chunks: more than {lim.max_chunks} per apply")
        for j, key in enumerate((*anc, file_key)):
            want = (anc[j - 1] if j else None, key != file_key)
            have = shape.setdefault(key, want)
            if have != want:
                what = "a file and a directory" if have[1] != want[1] else "two parents"
                raise BadRequest(f"{where}: key {key.hex()} has {what} in this batch")
        # Fast path first, per-field checks (which name the culprit) only when needed:
        # a full apply holds 20,000 chunks.
        ids, metas = [], []
        first = len(vecs)
        for j, c in enumerate(u.chunks):
            try:
                cid, vec, meta = c.chunk_id, c.vector, c.meta
            except AttributeError:
                raise BadRequest(
                    f"{where}.chunks[{j}] must be a ChunkRecord, got {type(c).__name__}"
                ) from None
            if type(cid) is not bytes or len(cid) != KEY_BYTES:
                cid = _key(cid, f"{where}.chunks[{j}].chunk_id")
            ids.append(cid)
            if type(meta) is not bytes or len(meta) > lim.max_meta_bytes:
                meta = _meta(meta, f"{where}.chunks[{j}].meta", lim.max_meta_bytes)
            metas.append(meta)
            if ws.sealed or vec is None:
                _check_no_vector(ws, vec, f"{where}.chunks[{j}]")
                continue
            if not (
                type(vec) is np.ndarray and vec.dtype == np.float32 and vec.shape == (ws.dim,)
            ):
                vec = _vector(vec, ws.dim, f"{where}.chunks[{j}].vector")
            vecs.append(vec)
        spans.append((first, len(vecs)))
        out.append(Update(file_key, anc, value, ids, _NO_ROWS, metas, bool(u.link)))
    # One stack and one finiteness check for the whole batch; each update gets a view.
    matrix = np.stack(vecs) if vecs else np.empty((0, ws.dim), np.float32)
    finite = np.isfinite(matrix).all(axis=1)
    if not finite.all():
        row = int(np.argmin(finite))
        i = next(i for i, (a, b) in enumerate(spans) if a <= row < b)
        raise BadRequest(
            f"updates[{i}].chunks[{row - spans[i][0]}].vector contains NaN or infinite values"
        )
    if len(matrix):
        norms = np.linalg.norm(matrix.astype(np.float64), axis=1)
        if norms.max() > lim.max_vector_norm:
            row = int(np.argmax(norms))
            i = next(i for i, (a, b) in enumerate(spans) if a <= row < b)
            raise BadRequest(
                f"updates[{i}].chunks[{row - spans[i][0]}].vector has norm"
                f" {norms[row]:.3g}, over the limit of {lim.max_vector_norm:.0e} (its"
                " squared distances would overflow float32)"
            )
    out = [
        dataclasses.replace(u, vectors=matrix[a:b])
        for u, (a, b) in zip(out, spans, strict=True)
    ]
    return out, dels


def _check_no_vector(ws: ApplyTarget, vector: object, where: str) -> None:
    """A chunk without a vector: what a sealed workspace wants, and a server-search
    one refuses. Both are 400s: the client sent rows of the other mode."""
    if ws.sealed and vector is not None:
        raise BadRequest(
            f"{where}: workspace {ws.workspace_id} is sealed: it stores no vectors",
            status=400,
        )
    if not ws.sealed:
        raise BadRequest(
            f"{where}.vector is missing: workspace {ws.workspace_id} is in"
            f" {MODE_SERVER_SEARCH} mode and ranks a vector of every chunk",
            status=400,
        )


def gc_settings(max_ref_age_days: float | None, grace_s: float | None,
                default_age_days: float | None, default_grace_s: float
                ) -> tuple[float | None, float]:
    """A `collect_garbage` call's (ref age in days, blob grace in seconds): the store's
    options where the call gives None; a 400 for a negative or non-number one. Both
    backends take their settings through it."""
    age = default_age_days if max_ref_age_days is None else max_ref_age_days
    grace = default_grace_s if grace_s is None else grace_s
    if (age is not None and not age >= 0) or not grace >= 0:
        raise BadRequest("max_ref_age_days and grace_s must be numbers >= 0")
    return age, grace


def pool_problems(where: str, loose: int, lacking: int, advice: str) -> list[str]:
    """What `check` says of a pool with `loose` rows of no listed blob and `lacking`
    committed leaves whose blob it does not hold (both backends' words)."""
    out = []
    if loose:
        out.append(f"{where} holds {loose} rows of no listed blob; {advice}")
    if lacking:
        out.append(f"{where} lacks the rows of {lacking} files its trees name; {advice}")
    return out
