"""A repo's link to its workspace: `.codeveil/config.json`, found the way git finds `.git/`.

Layout of `.codeveil/` inside an indexed folder::

    .codeveil/
      .gitignore        "*": the folder never enters git
      config.json       format version, workspace id, server URL (or none), model id, dim,
                        mode ("sealed", or "server-search": see docs/threat-model.md)
      init.lock         empty; flock'ed while the folder is being set up
      state.sqlite      client state: stat cache, local chunks (holds code; never sent)
      store/            the embedded store (only without a server): ciphertext only

The workspace key and the server token live in the user config dir, never in the repo.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from indexer.errors import CodeveilError
from indexer.paths import config_dir
from indexer.private_files import private_dir, write_atomic
from sync.errors import SyncError
from sync.records import MODE_SEALED, MODE_SERVER_SEARCH, MODES

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no concurrent initialisers
    fcntl = None  # type: ignore[assignment]

CONFIG_VERSION = 1
DIR_NAME = ".codeveil"
_WORKSPACE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")  # as sync.store.core.checks accepts
_CONFIG_ADVICE = (
    "`codeveil doctor --repair` rebuilds it from the embedded store and the key file, or"
    " restore the value (`codeveil status` on a teammate's clone shows it)"
)


class NoIndexError(CodeveilError):
    """No `.codeveil/` in this folder or any folder above it."""


class ConfigError(SyncError):
    """`.codeveil/config.json` is missing fields, corrupt, or of a version we do not know."""


@dataclass
class RepoConfig:
    workspace_id: str
    model_id: str
    dim: int
    server: str | None = None
    version: int = CONFIG_VERSION
    # Written by every codeveil that knows modes; a config without one is older than
    # sealed mode, so its workspace ranks on the server.
    mode: str = MODE_SERVER_SEARCH

    @property
    def sealed(self) -> bool:
        """True when the server stores only sealed rows and search runs here."""
        return self.mode == MODE_SEALED


def find_root(start: Path) -> Path:
    """The nearest folder at or above `start` holding `.codeveil/config.json`."""
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / DIR_NAME / "config.json").is_file():
            return folder
    recorded = missing_config_message(start)
    if recorded:
        raise NoIndexError(recorded)
    for folder in (start, *start.parents):
        if (folder / DIR_NAME / "store" / "registry.sqlite").is_file():
            # An embedded store without its config: an index started anew here would be
            # a new workspace beside it; the repair rebuilds the config from the store.
            raise NoIndexError(
                f"{folder / DIR_NAME / 'config.json'} is missing, but {folder / DIR_NAME}"
                f" holds an index: run `codeveil doctor --repair -C {folder}` to restore it")
    raise NoIndexError(
        f"no codeveil index in {start} or any parent folder; run `codeveil index` there first"
    )


def missing_config_message(start: Path) -> str | None:
    """What to say when no config.json is found at or above `start` but this machine
    recorded a checkout there on a server (`sync.checkout.checkouts`); None when it did not."""
    from sync.checkout.checkouts import find_recorded, record_path
    from sync.crypto.keys import ENV_KEY, key_path

    record = find_recorded(start)
    if record is None:
        return None
    said = (f"{Path(record.root) / DIR_NAME / 'config.json'} is missing, but"
            f" {record.root} belongs to workspace {record.workspace_id} on"
            f" {record.server} (recorded in {record_path(Path(record.root))})")
    if not os.environ.get(ENV_KEY, "").strip() and not key_path(record.workspace_id).exists():
        # The repair would need the key: without it, it cannot lead out.
        return (f"{said}, and its key is not on this machine: import it (`codeveil key"
                f" import`) and run `codeveil doctor --repair -C {record.root}`; if the key"
                f" is lost, start a new workspace: `codeveil init {record.root} --server"
                f" {record.server}`")
    return f"{said}: run `codeveil doctor --repair -C {record.root}` to restore it"


def server_url_problem(server: str) -> str | None:
    """Why `server` (as given to `--server`) is not a server URL; None when it is one."""
    from urllib.parse import urlsplit

    try:
        parsed = urlsplit(server)
        host = parsed.hostname
        parsed.port  # noqa: B018 (raises ValueError for a port out of range)
    except ValueError as exc:
        return f"{server!r} is not a URL ({exc})"
    if parsed.scheme in ("http", "https") and host:
        return None
    if "://" not in server:
        return (f"{server!r} has no scheme; a codeveil server is reached over http(s):"
                f" --server https://{server} (or http:// on a trusted network)")
    return f"{server!r} is not an http(s) URL; a codeveil server is reached over http(s)"


def codeveil_dir(root: Path) -> Path:
    return root / DIR_NAME


def state_path(root: Path) -> Path:
    return codeveil_dir(root) / "state.sqlite"


def store_path(root: Path) -> Path:
    return codeveil_dir(root) / "store"


def load_config(root: Path) -> RepoConfig:
    path = codeveil_dir(root) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise NoIndexError(missing_config_message(root)
                           or f"no codeveil index at {root}; run `codeveil index` first"
                           ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is unreadable or not JSON ({exc}); {_CONFIG_ADVICE}") from exc
    if not isinstance(raw, dict) or raw.get("version") != CONFIG_VERSION:
        raise ConfigError(
            f"{path} has format version {raw.get('version') if isinstance(raw, dict) else '?'},"
            f" this codeveil reads version {CONFIG_VERSION}"
        )
    missing = [k for k in ("workspace_id", "model_id", "dim") if k not in raw]
    if missing:
        raise ConfigError(f"{path} lacks the field {missing[0]!r}; {_CONFIG_ADVICE}")
    ws, model, dim, server = raw["workspace_id"], raw["model_id"], raw["dim"], raw.get("server")
    mode = raw.get("mode", MODE_SERVER_SEARCH)
    # Checked here, so a hand-edited value is reported as the setting it is, not as
    # whatever error it would cause further on.
    if not isinstance(ws, str) or not _WORKSPACE_ID.match(ws):
        raise ConfigError(
            f"{path}: workspace_id {ws!r} is not a workspace id (1 to 64 of A-Z a-z 0-9 _ -);"
            f" {_CONFIG_ADVICE}"
        )
    if not isinstance(model, str) or not model or not model.isprintable():
        raise ConfigError(f"{path}: model_id {model!r} is not a model id; {_CONFIG_ADVICE}")
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= 65536:
        raise ConfigError(f"{path}: dim {dim!r} is not a positive integer; {_CONFIG_ADVICE}")
    if server is not None and not (
        isinstance(server, str) and server.startswith(("http://", "https://"))
    ):
        raise ConfigError(
            f"{path}: server {server!r} is not an http(s) URL; fix it, or run"
            " `codeveil init --server URL` again"
        )
    if mode not in MODES:
        raise ConfigError(f"{path}: mode {mode!r} is not one of {', '.join(MODES)};"
                          f" {_CONFIG_ADVICE}")
    return RepoConfig(workspace_id=ws, model_id=model, dim=dim, server=server, mode=mode)


def _make_dir(root: Path) -> Path:
    """`.codeveil/`, with the `.gitignore` that keeps it out of git from the start."""
    folder = codeveil_dir(root)
    private_dir(folder)
    ignore = folder / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# codeveil's local index: never commit it\n*\n")
    return folder


def save_config(root: Path, config: RepoConfig) -> None:
    folder = _make_dir(root)
    write_atomic(folder / "config.json", json.dumps(asdict(config), indent=2) + "\n")
    remember_checkout(root, config)


def remember_checkout(root: Path, config: RepoConfig) -> None:
    """Record which server and workspace the checkout at `root` belongs to, in the user
    config dir (`sync.checkout.checkouts`): a lost config.json can then be rebuilt. A checkout
    on an embedded store is forgotten there (its store holds what rebuilds it)."""
    from sync.checkout.checkouts import CheckoutRecord, forget_checkout, record_checkout

    if config.server is None:
        forget_checkout(root)
        return
    record_checkout(CheckoutRecord(
        root=str(root.resolve()), workspace_id=config.workspace_id, server=config.server,
        model_id=config.model_id, dim=config.dim, mode=config.mode))


@contextlib.contextmanager
def init_lock(root: Path) -> Iterator[None]:
    """Held while `.codeveil/` is being set up, so that two processes initialising one
    folder at once (a daemon and an index, two agents) end with one workspace and one
    key: the second waits, then finds the first one's config. Not reentrant."""
    folder = _make_dir(root)
    with open(folder / "init.lock", "a+b") as f:
        if fcntl is not None:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        yield  # closing the file releases the lock, also when the process dies


def new_workspace_id() -> str:
    return secrets.token_hex(16)


def token_path(workspace_id: str) -> Path:
    return config_dir() / "tokens" / f"{workspace_id}.token"


def save_token(workspace_id: str, token: str) -> None:
    """Keep a server's bearer token beside the keys, readable by the user only."""
    from sync.crypto.keys import write_secret_file

    write_secret_file(token_path(workspace_id), token.encode())


def load_token(workspace_id: str) -> str:
    env = os.environ.get("CODEVEIL_TOKEN")
    if env:
        return env.strip()
    path = token_path(workspace_id)
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise ConfigError(
            f"no server token for workspace {workspace_id} (looked in {path});"
            " set CODEVEIL_TOKEN or run `codeveil init --server URL` again"
        ) from None
