"""Rebuild a damaged `.codeveil/config.json` from what the embedded store and the key
file hold, so that `codeveil doctor --repair` does not start a new workspace (under a
new key) over an index that is still whole.

Everything the config names is also held elsewhere: the workspace id, model, dimension
and mode in the embedded store's registry, and the key that proves which workspace is
this repo's in the key file of that id. A config is rebuilt only when exactly one
workspace of the registry has a key file whose key check matches the registry's, and
when whatever of the damaged file is still readable agrees with it; otherwise the error
says what disagrees. A workspace on a server is rebuilt from this machine's record of the
checkout (`sync.checkout.checkouts`, in the user config dir beside the key and token): same
server, same workspace, provided its key is here and what is still readable of the
damaged file agrees; without a record the error says how to join it again.
"""

from __future__ import annotations

import hmac
import json
from pathlib import Path

from indexer.errors import CodeveilError
from sync.checkout.checkouts import CheckoutRecord, load_checkout, record_path
from sync.checkout.config import (
    CONFIG_VERSION,
    ConfigError,
    RepoConfig,
    codeveil_dir,
    save_config,
    store_path,
)
from sync.crypto.keys import load_key
from sync.store.embedded.registry import Store


def recover_config(root: Path) -> RepoConfig:
    """The config of the repo at `root`, rebuilt from its embedded store and key file,
    and saved. Raises ConfigError, saying why, when they cannot settle it."""
    recorded = load_checkout(root)
    if recorded is not None:
        return _from_record(root, recorded)
    registry = store_path(root) / "registry.sqlite"
    if not registry.is_file():
        raise ConfigError(
            f"cannot rebuild {codeveil_dir(root) / 'config.json'}: there is no embedded"
            " store to rebuild it from (an index on a server: run `codeveil init --server"
            " URL --workspace ID` again with the id `codeveil status` shows on a teammate's"
            " clone)")
    with Store(store_path(root)) as store:
        records = [store.record(w) for w in store.workspace_ids()]
    keyed, mismatched = [], []
    for record in records:
        try:
            key = load_key(record.workspace_id)
        except CodeveilError:
            continue  # no usable key for this workspace on this machine
        if hmac.compare_digest(key.key_check, record.key_check):
            keyed.append(record)
        else:
            mismatched.append(record.workspace_id)
    remnant = _readable_part(root)
    if remnant.get("server") is not None:
        raise ConfigError(
            "cannot rebuild the config: it names a server, whose workspace the embedded"
            " store cannot confirm; fix the file by hand or run `codeveil init --server URL"
            " --workspace ID` again")
    named = remnant.get("workspace_id")
    if named is not None and named not in {r.workspace_id for r in keyed}:
        raise ConfigError(
            f"cannot rebuild the config: it still names workspace {named!r}, which the"
            " store and the key files do not confirm; fix the file by hand or delete"
            " .codeveil/ and index again")
    if len(keyed) != 1:
        found = (f"{len(keyed)} workspaces of the store have a matching key"
                 if keyed else "no workspace of the store has a matching key on this machine")
        extra = f" (key check differs for {', '.join(mismatched)})" if mismatched else ""
        raise ConfigError(
            f"cannot rebuild the config: {found}{extra}; import the workspace's key"
            " (`codeveil key import`) or delete .codeveil/ and index again")
    record = keyed[0]
    config = RepoConfig(workspace_id=record.workspace_id, model_id=record.model_id,
                        dim=record.dim, server=None, version=CONFIG_VERSION,
                        mode=record.mode)
    save_config(root, config)
    return config


def _from_record(root: Path, record: CheckoutRecord) -> RepoConfig:
    """The config of a checkout on a server, from this machine's record of it."""
    remnant = _readable_part(root)
    for name in ("workspace_id", "server"):
        if remnant.get(name) is not None and remnant[name] != getattr(record, name):
            raise ConfigError(
                f"cannot rebuild the config: it still names {name} {remnant[name]!r} but"
                f" {record_path(root)} records {getattr(record, name)!r}; fix the file by"
                " hand, or delete both and join again with `codeveil init --server URL"
                " --workspace ID`")
    load_key(record.workspace_id)  # a config whose key is not here would not open
    config = RepoConfig(workspace_id=record.workspace_id, model_id=record.model_id,
                        dim=record.dim, server=record.server, version=CONFIG_VERSION,
                        mode=record.mode)
    save_config(root, config)
    return config


def _readable_part(root: Path) -> dict[str, object]:
    """What of a damaged config still parses (nothing if it is not a JSON object)."""
    try:
        raw = json.loads((codeveil_dir(root) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


__all__ = ["recover_config"]
