"""Key and crypto errors of the sync layer, raised by sync.crypto.keys and sync.crypto.ciphers.

The whole error tree, with the classes that live beside the code raising them, is drawn
once in indexer/errors.py.
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
