"""Errors of the indexing layer. The whole hierarchy (sync and retrieval add theirs)::

    CodeveilError                      every error codeveil raises on purpose
    ├── IndexerError                   files -> chunks -> vectors
    │   └── EmbedderError              the model could not be loaded or run
    ├── sync errors (sync/errors.py)   keys, crypto, store, server, network
    └── retrieval errors               no index here, bad query options

The CLI turns any CodeveilError into one line on stderr and a non-zero exit.
"""

from __future__ import annotations


class CodeveilError(Exception):
    """Base of every error codeveil raises on purpose; its message is meant for a user."""


class IndexerError(CodeveilError):
    """Walking, chunking or embedding failed."""


class EmbedderError(IndexerError):
    """The embedding model could not be loaded or run."""
