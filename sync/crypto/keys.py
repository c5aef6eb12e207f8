"""Workspace keys: one 32-byte random secret per workspace, its sub-keys, and its storage.

Terminology
    workspace key   32 random bytes; whoever holds it can read the index. The server never
                    sees it, only `key_check`.
    sub-key         32 bytes, HKDF-SHA256(ikm = workspace key, salt = b"codeveil/v1",
                    info = b"codeveil/v1 <label>"), one per use:
                      path    node keys of the Merkle tree         (sync.crypto.ciphers.node_key)
                      tree    node values of the Merkle tree       (sync.crypto.ciphers.node_value)
                      chunk   chunk ids                            (sync.crypto.ciphers.chunk_id)
                      meta    AES-256-GCM key of chunk metadata    (sync.crypto.ciphers.seal_meta)
                      row     AES-256-GCM key of sealed chunk rows (sync.crypto.sealed_rows)
                      vector  rotation, scale and noise of vectors (ciphers.VectorCipher)
                      ref     ref ids, one per branch a client syncs (sync.checkout.refs)
                      check   the key check, and nothing else
                    The salt is a fixed string, not the workspace id: the workspace key is
                    already uniformly random (RFC 5869 section 3.1), and binding to the
                    workspace is done where it matters, in the metadata's associated data.
    key check       HMAC-SHA256(k_check, b"codeveil/v1 key check")[:16]. Stored by the
                    server with the workspace, so a client can tell a wrong key at once;
                    it reveals nothing about the other sub-keys.

Exported form (what `codeveil key export` prints and `codeveil key import` reads; also the
content of a key file, plus a newline)::

    codeveil-key-v1:<base64url, no padding, of: key (32 bytes) || checksum (4 bytes)>
    checksum = SHA-256(b"codeveil-key-v1:" || key)[:4]

48 characters after the prefix, no slack bits, so any mistyped character is caught (with
probability 1 - 2^-32). Whitespace inside is ignored so a wrapped paste still reads.

Where a key comes from, first match wins:
    1. CODEVEIL_KEY: 64 hex digits, base64url (or base64) of 32 bytes, or the exported
       form. It stands for every workspace, so set it for one command or one CI job.
    2. <config dir>/keys/<workspace id>.key, config dir = CODEVEIL_CONFIG_DIR or
       platformdirs.user_config_dir("codeveil") (see indexer.paths.config_dir).

Files: the keys folder is made 0700 and each key file is written 0600 atomically (a temp
file in the same folder, opened O_EXCL with mode 0600, fsynced, then renamed, or hard
linked when an existing file must not be replaced). A key file that other users can read
or write is refused with KeyPermissionError, not silently fixed: as with ssh, the key may
already have leaked, and the user should know before anything is encrypted under it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import hashlib
import hmac
import os
import re
import secrets
import stat
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from indexer.paths import config_dir
from indexer.private_files import fsync_dir, private_dir
from sync.errors import (
    KeyChecksumError,
    KeyExistsError,
    KeyFormatError,
    KeyMismatchError,
    KeyMissingError,
    KeyPermissionError,
)

__all__ = [
    "CHECK_SIZE",
    "ENV_KEY",
    "EXPORT_PREFIX",
    "KEY_SIZE",
    "WorkspaceKey",
    "create_key",
    "ensure_key_matches",
    "export_key",
    "import_key",
    "key_path",
    "load_key",
    "parse_key",
    "write_secret_file",
]

KEY_SIZE = 32
CHECK_SIZE = 16
ENV_KEY = "CODEVEIL_KEY"
EXPORT_PREFIX = "codeveil-key-v1:"

_HKDF_SALT = b"codeveil/v1"
_LABEL = "codeveil/v1 {}"
_CHECK_MESSAGE = b"codeveil/v1 key check"
_CHECKSUM_SIZE = 4
_MAX_KEY_FILE = 4096  # a key file is ~65 bytes; refuse to slurp anything large
# A workspace id becomes a file name: no separators, no leading dot, bounded length.
_WORKSPACE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_HEX_KEY = re.compile(r"[0-9a-fA-F]{64}")


def _subkey(secret: bytes, label: str) -> bytes:
    hkdf = HKDF(
        algorithm=hashes.SHA256(),
        length=KEY_SIZE,
        salt=_HKDF_SALT,
        info=_LABEL.format(label).encode(),
    )
    return hkdf.derive(secret)


class WorkspaceKey:
    """A workspace key and its sub-keys, derived once at construction.

    Equality is constant-time on the secret; the hash is the public key check, so keys
    can be dict keys without the secret ever feeding a hash. `repr` never shows the secret.
    """

    __slots__ = (
        "__weakref__",
        "_hash",
        "_secret",
        "check_key",
        "chunk_key",
        "key_check",
        "meta_key",
        "path_key",
        "ref_key",
        "row_key",
        "tree_key",
        "vector_key",
    )

    path_key: bytes
    tree_key: bytes
    chunk_key: bytes
    meta_key: bytes
    row_key: bytes
    vector_key: bytes
    ref_key: bytes
    check_key: bytes
    key_check: bytes

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, bytes) or len(secret) != KEY_SIZE:
            raise KeyFormatError(f"a workspace key is {KEY_SIZE} bytes")
        self._secret = secret
        self.path_key = _subkey(secret, "path")
        self.tree_key = _subkey(secret, "tree")
        self.chunk_key = _subkey(secret, "chunk")
        self.meta_key = _subkey(secret, "meta")
        self.row_key = _subkey(secret, "row")
        self.vector_key = _subkey(secret, "vector")
        self.ref_key = _subkey(secret, "ref")
        self.check_key = _subkey(secret, "check")
        self.key_check = hmac.digest(self.check_key, _CHECK_MESSAGE, "sha256")[:CHECK_SIZE]
        self._hash = int.from_bytes(self.key_check[:8], "big")

    @classmethod
    def generate(cls) -> WorkspaceKey:
        """A fresh key from the operating system's CSPRNG."""
        return cls(secrets.token_bytes(KEY_SIZE))

    @property
    def secret(self) -> bytes:
        """The 32 raw bytes. Only export and storage need them."""
        return self._secret

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkspaceKey):
            return NotImplemented
        return hmac.compare_digest(self._secret, other._secret)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"WorkspaceKey(check={self.key_check.hex()})"


# -- exported form ---------------------------------------------------------------------


def _checksum(secret: bytes) -> bytes:
    return hashlib.sha256(EXPORT_PREFIX.encode() + secret).digest()[:_CHECKSUM_SIZE]


def export_key(key: WorkspaceKey) -> str:
    """The key as one copy-pasteable line: `codeveil-key-v1:` + 48 base64url characters."""
    body = base64.urlsafe_b64encode(key.secret + _checksum(key.secret)).rstrip(b"=")
    return EXPORT_PREFIX + body.decode("ascii")


def _b64decode(text: str) -> bytes:
    """Strict base64url (or standard base64) with optional padding; binascii.Error if not."""
    text = text.replace("+", "-").replace("/", "_").rstrip("=")
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def parse_key(text: str) -> WorkspaceKey:
    """Read the exported form. Never puts the text in an error message: it is a secret."""
    text = "".join(text.split())
    if not text.startswith(EXPORT_PREFIX):
        version = re.match(r"codeveil-key-(v[^:]*):", text)
        if version:
            raise KeyFormatError(
                f"this is a codeveil key of format {version.group(1)}; this codeveil reads "
                "v1 only: upgrade codeveil to use it"
            )
        raise KeyFormatError(
            f"not a codeveil key: an exported key starts with {EXPORT_PREFIX!r}; "
            "copy the whole line that `codeveil key export` printed"
        )
    try:
        raw = _b64decode(text[len(EXPORT_PREFIX) :])
    except (binascii.Error, ValueError):
        raise KeyFormatError(
            "the exported key has characters that are not base64url (A-Z a-z 0-9 - _); "
            "copy it again"
        ) from None
    if len(raw) != KEY_SIZE + _CHECKSUM_SIZE:
        raise KeyFormatError(
            f"the exported key is {len(raw)} bytes long, not {KEY_SIZE + _CHECKSUM_SIZE}: "
            "it was cut short or has extra characters; copy the whole line again"
        )
    secret, checksum = raw[:KEY_SIZE], raw[KEY_SIZE:]
    if not hmac.compare_digest(checksum, _checksum(secret)):
        raise KeyChecksumError(
            "the exported key's checksum does not match: a character was mistyped or "
            "changed; copy the key again"
        )
    return _derived(secret)


@functools.lru_cache(maxsize=8)
def _derived(secret: bytes) -> WorkspaceKey:
    """The key of `secret`, its sub-keys derived once per process: a search reads the
    key file each time (it may have been replaced), and eight HKDF derivations cost
    about a millisecond of a query's few."""
    return WorkspaceKey(secret)


def _parse_env(text: str) -> WorkspaceKey:
    text = text.strip()
    if text.startswith("codeveil-key-"):
        return parse_key(text)
    if _HEX_KEY.fullmatch(text):
        return WorkspaceKey(bytes.fromhex(text))
    try:
        raw = _b64decode(text)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != KEY_SIZE:
        raise KeyFormatError(
            f"{ENV_KEY} is set but does not hold a key: expected 64 hex digits, base64url "
            f"of {KEY_SIZE} bytes, or an exported {EXPORT_PREFIX}... line; fix or unset it "
            "to use the key file"
        )
    return WorkspaceKey(raw)


# -- files -----------------------------------------------------------------------------


def key_path(workspace_id: str) -> Path:
    """Where the key of `workspace_id` is stored: <config dir>/keys/<workspace id>.key."""
    if not _WORKSPACE_ID.fullmatch(workspace_id):
        raise ValueError(
            f"workspace id {workspace_id!r} is not usable as a file name "
            "(letters, digits, '.', '_' and '-', at most 128, not starting with '.')"
        )
    return config_dir() / "keys" / f"{workspace_id}.key"


def _link_no_clobber(src: str, dst: Path) -> None:
    """Make `dst` name `src`'s file, failing with FileExistsError if `dst` exists."""
    try:
        os.link(src, dst)  # atomic, and refuses to replace: no window for a lost key
    except FileExistsError:
        raise
    except OSError:
        # Filesystems without hard links: check, then rename (a narrow race, no loss of
        # an existing file unless another process writes the same name in that instant).
        if dst.exists():
            raise FileExistsError(dst) from None
        os.replace(src, dst)


def write_secret_file(path: Path, data: bytes, *, replace: bool = True) -> None:
    """Write `data` to `path` atomically, readable by its owner only (file 0600, folder 0700).

    With `replace=False`, raise FileExistsError rather than overwrite an existing file.
    No reader ever sees a partial file, and a crash leaves at most a `.tmp` file behind.
    """
    folder = path.parent
    private_dir(folder)
    tmp = str(folder / f".{path.name}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(tmp, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            if os.name == "posix":
                os.fchmod(f.fileno(), 0o600)  # the umask may have removed bits we want
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            _link_no_clobber(tmp, path)
        fsync_dir(folder)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _read_key_file(path: Path, workspace_id: str) -> WorkspaceKey:
    # O_NONBLOCK: a FIFO planted at the key's name must not hang us; files ignore it.
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise KeyMissingError(
            f"no key for workspace {workspace_id}: {path} does not exist and {ENV_KEY} is "
            "not set. If a teammate created this workspace, ask them for "
            "`codeveil key export` and run `codeveil key import`; if the key is lost, nothing "
            "indexed under it can be read again: start a new workspace here (delete "
            ".codeveil/, then `codeveil init --server URL` for one on a server, or just "
            "`codeveil index` for the embedded store)"
        ) from None
    try:
        # fstat on the open file, not stat on the name: the name could change in between.
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyFormatError(f"{path} is not a regular file; it should hold a key")
        if os.name == "posix" and st.st_mode & 0o077:
            raise KeyPermissionError(
                f"{path} is open to other users (mode {stat.S_IMODE(st.st_mode):04o}); a "
                f"workspace key must be private: run `chmod 600 {path}`, and if someone "
                "else could have read it, index into a new workspace"
            )
        data = os.read(fd, _MAX_KEY_FILE + 1)
    finally:
        os.close(fd)
    try:
        if len(data) > _MAX_KEY_FILE:
            raise KeyFormatError(f"over {_MAX_KEY_FILE} bytes; a key file holds one line")
        return parse_key(data.decode("ascii"))
    except (KeyFormatError, UnicodeDecodeError) as exc:
        reason = "not ASCII text" if isinstance(exc, UnicodeDecodeError) else str(exc)
        raise KeyFormatError(
            f"{path} does not hold a valid workspace key ({reason}); restore it with "
            "`codeveil key import`, or delete it and index into a new workspace"
        ) from None


def create_key(workspace_id: str) -> WorkspaceKey:
    """Generate and store a new key for `workspace_id`; KeyExistsError if one is stored."""
    path = key_path(workspace_id)
    key = WorkspaceKey.generate()
    try:
        write_secret_file(path, (export_key(key) + "\n").encode("ascii"), replace=False)
    except FileExistsError:
        raise KeyExistsError(
            f"workspace {workspace_id} already has a key at {path}; load it instead"
        ) from None
    return key


def load_key(workspace_id: str) -> WorkspaceKey:
    """The key of `workspace_id`: from CODEVEIL_KEY if set (and not empty), else its file."""
    env = os.environ.get(ENV_KEY, "")
    if env.strip():
        return _parse_env(env)
    path = key_path(workspace_id)
    return _read_key_file(path, workspace_id)


def import_key(workspace_id: str, text: str, *, replace: bool = False) -> WorkspaceKey:
    """Validate an exported key and store it for `workspace_id`.

    Storing the same key again is a no-op. A different stored key is only replaced with
    `replace=True`, since whatever was encrypted under it becomes unreadable.
    """
    key = parse_key(text)
    path = key_path(workspace_id)
    data = (export_key(key) + "\n").encode("ascii")
    if not replace:
        try:
            write_secret_file(path, data, replace=False)
            return key
        except FileExistsError:
            try:
                existing = _read_key_file(path, workspace_id)
            except (KeyFormatError, KeyPermissionError) as exc:
                raise KeyExistsError(
                    f"workspace {workspace_id} already has a key file that cannot be used "
                    f"({exc}); import with --force to replace it"
                ) from None
            if existing == key:
                return key
            raise KeyExistsError(
                f"workspace {workspace_id} already has a different key at {path}; "
                "replacing it makes what was indexed under it unreadable. Export it first "
                "if it may still be needed, then import with --force"
            ) from None
    write_secret_file(path, data, replace=True)
    return key


def ensure_key_matches(key: WorkspaceKey, workspace_id: str, expected_check: bytes) -> None:
    """Raise KeyMismatchError unless `key` is the key `workspace_id` was created with."""
    if not hmac.compare_digest(key.key_check, expected_check):
        from_env = bool(os.environ.get(ENV_KEY, "").strip())
        source = f"{ENV_KEY} (set in the environment)" if from_env else key_path(workspace_id)
        raise KeyMismatchError(
            f"the key from {source} is not the key workspace {workspace_id} was created "
            f"with (key check {key.key_check.hex()} != {expected_check.hex()}); import the "
            "right key with `codeveil key import`"
        )
