"""The field types of the server's request bodies: keys, bytes and vectors as they travel
(base64url without padding), each checked on the way in."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import PlainValidator, WithJsonSchema

from sync.records import KEY_BYTES
from sync.wire import b64decode, decode_vector


def _key(value: object) -> bytes:
    raw = b64decode(value)
    if len(raw) != KEY_BYTES:
        raise ValueError(f"must be {KEY_BYTES} bytes, got {len(raw)}")
    return raw


# Validators raise ValueError with a short reason; the handler adds the JSON path. The
# JSON schemas say what travels (for /openapi.json, client generators, fuzzers).
Key = Annotated[bytes, PlainValidator(_key), WithJsonSchema(
    {"type": "string", "pattern": "^[A-Za-z0-9_-]{22}$",
     "description": f"{KEY_BYTES} bytes, base64url without padding"})]
Bytes = Annotated[bytes, PlainValidator(b64decode), WithJsonSchema(
    {"type": "string", "pattern": "^[A-Za-z0-9_-]*$",
     "description": "bytes, base64url without padding"})]
Vector = Annotated[Any, PlainValidator(decode_vector), WithJsonSchema(  # np.ndarray, float32
    {"type": "string", "pattern": "^[A-Za-z0-9_-]*$",
     "description": "little-endian float32 values, base64url without padding"})]
