"""The blob pool's parts that both backends share: a `blob_rows` request checked
(`blob_items`), its answer assembled (`blob_answer`), and the garbage collection's
defaults (what `StoreOptions` and `PgOptions` start from)."""

from __future__ import annotations

from collections.abc import Sequence

from sync.records import BlobRows
from sync.store.core.checks import _key
from sync.wire import BadRequest, Limits

# A sync's look-up of the pool and its link are seconds apart; an hour is ample.
DEFAULT_BLOB_GRACE = 3600.0
# A branch nobody synced for three months is gone from every clone, most likely.
DEFAULT_REF_MAX_AGE_DAYS = 90.0


def blob_items(items: object, limits: Limits) -> list[tuple[bytes, bytes]]:
    """The checked (file key, value) pairs of a `blob_rows` request, one per file key."""
    if not isinstance(items, Sequence) or isinstance(items, bytes | str):
        raise BadRequest("blobs must be a list of (file key, value) pairs")
    if len(items) > limits.max_row_files:
        raise BadRequest(f"too many blobs: {len(items)} > {limits.max_row_files} per call")
    out: dict[bytes, bytes] = {}
    for i, item in enumerate(items):
        if not isinstance(item, Sequence) or isinstance(item, bytes | str) or len(item) != 2:
            raise BadRequest(f"blobs[{i}] must be a (file key, value) pair")
        out[_key(item[0], f"blobs[{i}][0]")] = _key(item[1], f"blobs[{i}][1]")
    return list(out.items())


def blob_answer(wanted: list[tuple[bytes, bytes]],
                found: dict[bytes, list[tuple[int, bytes, bytes]]],
                max_bytes: int) -> BlobRows:
    """A `blob_rows` answer from the rows `found` of each wanted file key (rid, chunk
    id, meta), in row order: files in the order asked, as many as fit in `max_bytes`
    (the first always), and the keys whose blob the pool lacks. Both backends answer
    through it."""
    out: dict[bytes, list[tuple[bytes, bytes]]] = {}
    missing: list[bytes] = []
    size = 0
    for key, _ in wanted:
        if key not in found:
            missing.append(key)
            continue
        got = sorted(found[key], key=lambda r: r[0])
        cost = sum(len(c) + len(m) for _, c, m in got)
        if out and size + cost > max_bytes:
            break
        size += cost
        out[key] = [(c, m) for _, c, m in got]
    return BlobRows(out, missing)
