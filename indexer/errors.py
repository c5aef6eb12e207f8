"""The base of every error codeveil raises on purpose, and the whole tree, drawn once.

Each class lives next to the code that raises it (module in brackets); this drawing is
the one map of them, and tests/test_errors.py fails when a class is missing from it or
hangs under another parent than drawn::

    CodeveilError                         every error codeveil raises on purpose
    ├── IndexerError                      files -> chunks -> vectors
    │   ├── EmbedderError                 the model could not be loaded or run
    │   └── NotebookError   (indexer.notebook)  a .ipynb that is not a notebook's JSON
    ├── FormatError         (indexer.formats) a file of a format this version does not read
    ├── CorruptFileError    (indexer.sqlite_files)  a damaged SQLite file: which, what to do
    ├── NoIndexError        (sync.checkout.config)  no `.codeveil/` here or above
    ├── IndexNotBuilt       (sync.checkout.index_state)  set up, but its first index never finished
    ├── SyncError           (sync.errors)     keys, crypto, store, server, network
    │   ├── WorkspaceKeyError   (sync.errors)     the workspace key cannot be used
    │   │   ├── KeyMissingError                   no key file and no CODEVEIL_KEY
    │   │   ├── KeyExistsError                    a different key is already stored
    │   │   ├── KeyFormatError                    not a key: bad text, length or version
    │   │   │   └── KeyChecksumError              an exported key with a typo in it
    │   │   ├── KeyPermissionError                the key file is open to other users
    │   │   └── KeyMismatchError                  not the key the workspace was made with
    │   ├── CryptoError         (sync.errors)     a sealed record failed to open
    │   │   ├── MetadataAuthError                 wrong key, or altered, cut or moved blob
    │   │   └── MetadataFormatError               unknown envelope version or bad plaintext
    │   ├── ConfigError         (sync.checkout.config)  `.codeveil/config.json` is unusable
    │   ├── StoreError          (sync.wire)       the store refused a request or is unusable
    │   │   ├── BadRequest                        malformed or over-limit input (400/413/422)
    │   │   ├── StoreCorrupt                      a damaged store file: which, what to do (503)
    │   │   ├── StoreUnavailable                  the store's database cannot be reached (503)
    │   │   ├── WorkspaceNotFound                 no such workspace (404)
    │   │   ├── RefNotFound                       no tree of that ref in the workspace (404)
    │   │   ├── InviteeNotFound                   no invitee token of that id (404)
    │   │   ├── WorkspaceExists                   the id is taken (409)
    │   │   ├── SealedWorkspaceError              search asked of a sealed workspace (409)
    │   │   └── AuthError                         no or wrong token (401)
    │   │       └── PermissionDenied              a token of another workspace (403)
    │   ├── SnapshotError       (sync.store.embedded.vector_index)  an unusable search snapshot
    │   ├── ServeRefused        (sync.server.exposure)  a server beyond loopback with no admin token
    │   ├── InviteError         (sync.workspace.invite)  an invite string cut, altered or expired
    │   ├── OneTree             (sync.workspace.ref_list)  refs asked of a one-tree workspace
    │   ├── DaemonError         (sync.daemon)     the daemon cannot start or be reached
    │   │   └── AlreadyRunningError               another daemon holds the repo's lock
    │   └── ClientError         (sync.transport.http_client)  the server could not answer
    │       ├── ServerUnavailable                 unreachable or overloaded: retry later
    │       └── ServerError                       a 5xx or an unreadable answer
    ├── SearchError         (retrieval.faces.api)   bad search options (k, group, ...)
    ├── ServerSearchOffline (retrieval.faces.api)   a server-search workspace's server is down
    ├── AgentSetupError     (retrieval.faces.agent_setup)  an agent's config file left unedited
    ├── JsoncError          (retrieval.faces.agent_setup)  not JSON, even with comments
    ├── ToolInputError      (retrieval.agent.symbols)  a name, file or pattern a lookup cannot use
    └── ModelMismatchError  (sync.workspace.workspace)  the workspace holds another model's vectors

`retrieval.WrongKeyError` is another name of KeyMismatchError. The CLI turns any
CodeveilError into one line on stderr and a non-zero exit.
"""

from __future__ import annotations


class CodeveilError(Exception):
    """Base of every error codeveil raises on purpose; its message is meant for a user."""


class IndexerError(CodeveilError):
    """Walking, chunking or embedding failed."""


class EmbedderError(IndexerError):
    """The embedding model could not be loaded or run."""
