"""Errors of the sync layer (keys, crypto, store, server, network).

    CodeveilError (indexer.errors)
    └── SyncError
        ├── WorkspaceKeyError       (sync.keys)   the workspace key cannot be used
        │   ├── KeyMissingError         no key file and no CODEVEIL_KEY
        │   ├── KeyExistsError          a different key is already stored
        │   ├── KeyFormatError          not a key: bad text, length or version
        │   │   └── KeyChecksumError    an exported key with a typo in it
        │   ├── KeyPermissionError      the key file is open to other users
        │   └── KeyMismatchError        not the key this workspace was created with
        ├── CryptoError             (sync.crypto) a sealed record failed to open
        │   ├── MetadataAuthError       wrong key, or altered, truncated or moved blob
        │   └── MetadataFormatError     unknown envelope version or malformed plaintext
        ├── StoreError              (sync.wire)   the store refused a request or is unusable
        │   ├── BadRequest              malformed or over-limit input (HTTP 400/413/422)
        │   ├── WorkspaceNotFound       no such workspace (404)
        │   ├── WorkspaceExists         the id is taken (409)
        │   └── AuthError               no or wrong token (401)
        │       └── PermissionDenied    a token of another workspace (403)
        ├── DaemonError             (sync.daemon) the daemon cannot start or be reached
        │   └── AlreadyRunningError     another daemon holds the repo's lock
        └── ClientError             (sync.http_client) the server could not answer
            ├── ServerUnavailable       unreachable or overloaded: retry later
            └── ServerError             a 5xx or an unreadable answer

Key and crypto errors are defined here and raised by sync.keys and sync.crypto; the
others live next to the code that raises them and are re-exported here.
"""

from __future__ import annotations

from indexer.errors import CodeveilError


class SyncError(CodeveilError):
    """Base of errors raised by the sync layer."""


class WorkspaceKeyError(SyncError):
    """The workspace key is missing, malformed, exposed or wrong."""


class KeyMissingError(WorkspaceKeyError):
    """No key file for the workspace and no CODEVEIL_KEY in the environment."""


class KeyExistsError(WorkspaceKeyError):
    """A key is already stored for the workspace; replacing it would lose the old one."""


class KeyFormatError(WorkspaceKeyError):
    """Text, a key file or CODEVEIL_KEY does not hold a codeveil key of a known version."""


class KeyChecksumError(KeyFormatError):
    """An exported key's checksum does not match: it was mistyped or cut short."""


class KeyPermissionError(WorkspaceKeyError):
    """The key file can be read or written by other users; it is refused until fixed."""


class KeyMismatchError(WorkspaceKeyError):
    """The key's check value differs from the one the workspace was created with."""


class CryptoError(SyncError):
    """A sealed record from the store could not be opened."""


class MetadataAuthError(CryptoError):
    """A metadata envelope failed authentication (wrong key, altered, or moved)."""


class MetadataFormatError(CryptoError):
    """A metadata envelope has an unknown version or a malformed plaintext."""
