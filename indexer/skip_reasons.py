"""Why a file that is not ignored is still left out of the index: one list for the walk,
the content checks and the asset rules, shown to users by `codeveil index --json`."""

from __future__ import annotations

from enum import StrEnum


class SkipReason(StrEnum):
    """Why a file that is not ignored is still left out of the index."""

    TOO_LARGE = "too large"
    LOCK_FILE = "lock file"
    MINIFIED = "minified"
    GENERATED = "generated"
    BINARY = "binary"
    NOT_UTF8 = "not UTF-8"
    UNREADABLE = "unreadable"
    SYMLINK_OUTSIDE = "symlink outside repo"
    SYMLINK_DIR = "symlinked directory"  # never followed
    NOT_REGULAR = "not a regular file"  # FIFO, socket, device
    BAD_NAME = "name not UTF-8"  # cannot be stored, encrypted or shown faithfully
    TOO_DEEP = "nested too deep"  # more directories above it than the store accepts
    # Text that nobody searches (indexer.assets); a .codeveilignore negation brings it back.
    SVG = "SVG image"
    DATA = "data file"
    TRANSLATIONS = "translations"  # a catalog of one language's messages (.po)
    VENDORED = "vendored"  # a folder of someone else's code, skipped whole
    BUNDLE = "bundle"  # built JavaScript or CSS
    BAD_NOTEBOOK = "not a valid notebook"  # .ipynb whose JSON does not parse as one
