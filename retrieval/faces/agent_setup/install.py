"""`codeveil agent install` and `uninstall`: codeveil's MCP entry in each agent client's
own config file (retrieval.faces.agent_setup.clients), and an optional instruction section in
AGENTS.md / CLAUDE.md.

Edits are surgical: only the `codeveil` entry of the client's server map is set or
removed; other entries, keys and their order stay. A JSON file keeps its indent; a
TOML file (Codex) is edited as text, one table appended or cut, and re-read with
tomllib to prove that nothing else changed. JSON with comments and trailing commas
(JSONC: VS Code, Cursor) is edited as text too (retrieval.faces.agent_setup.jsonc), so its comments
stay, and re-read the same way. A file that cannot be read as its format, or whose
edit would not read back as meant, is left alone with an error. Before the first
change to an existing file a copy is kept beside it (`<file>.bak`, once); a file that
did not exist is not backed up, and uninstall removes it again when nothing else was
put in it. Installing twice leaves one entry.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indexer.private_files import write_atomic
from retrieval.faces.agent_setup import jsonc
from retrieval.faces.agent_setup.clients import CLIENTS, SERVER_NAME, AgentSetupError, Client

__all__ = [
    "INSTRUCTIONS",
    "INSTRUCTION_FILES",
    "Change",
    "detect_clients",
    "install",
    "install_instructions",
    "instruction_files",
    "uninstall",
    "uninstall_instructions",
    "writes_portable",
]


@dataclass(frozen=True)
class Change:
    """What install or uninstall did (or, with `write=False`, would do) to one file."""

    client: str
    path: Path
    action: str  # "added", "updated", "unchanged", "removed", "absent"
    snippet: str  # codeveil's entry as the file holds it ("" when removed)
    backup: Path | None = None


def detect_clients(repo: Path, home: Path) -> list[Client]:
    """The clients this machine (or this repo) shows signs of."""
    return [c for c in CLIENTS if c.in_use(repo, home)]


def install(clients: list[Client], command: list[str], *, scope: str, repo: Path,
            home: Path, env: dict[str, str] | None = None, portable: bool = True,
            write: bool = True) -> list[Change]:
    """Set codeveil's entry, running `command` (with `env`), in each client's file for
    `scope`; with `portable`, a project file gets the client's portable command instead
    (and no `env`: the paths are this machine's)."""
    changes = []
    for client in clients:
        chosen = client.scope_for(scope)
        path = client.path(chosen, repo, home)
        entry = (client.entry(client.portable_command())
                 if portable and chosen == "project" else client.entry(command, env))
        edit = _toml_install if client.format == "toml" else _json_install
        changes.append(edit(client, path, entry, write))
    return changes


def writes_portable(clients: list[Client], scope: str) -> bool:
    """Whether any of `clients` gets a project file for `scope`."""
    return any(c.scope_for(scope) == "project" for c in clients)


def uninstall(clients: list[Client], *, scopes: tuple[str, ...], repo: Path, home: Path,
              write: bool = True) -> list[Change]:
    """Remove codeveil's entry from each client's file for each of `scopes`."""
    changes = []
    for client in clients:
        paths = dict.fromkeys(client.path(client.scope_for(s), repo, home) for s in scopes)
        edit = _toml_uninstall if client.format == "toml" else _json_uninstall
        changes += [edit(client, path, write) for path in paths]
    return changes


# -- files ----------------------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise AgentSetupError(f"cannot read {path} ({exc}); it is left as it is") from None


def _backup(path: Path) -> Path:
    return path.with_name(path.name + ".bak")


def _write(path: Path, text: str, *, keep_backup: bool = True) -> Path | None:
    """Replace `path` with `text`, keeping its mode; the first time an existing file is
    changed, copy it to `<file>.bak` first. Returns the backup, if there is one."""
    backup = _backup(path)
    mode = None
    if path.exists():
        mode = path.stat().st_mode & 0o777
        if keep_backup and not backup.exists():
            shutil.copy2(path, backup)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    os.chmod(path, 0o644 if mode is None else mode)  # write_atomic's temp file is 0600
    return backup if backup.exists() else None


def _created_by_us(path: Path) -> bool:
    """A file with no backup was made by install (an existing one is backed up first)."""
    return not _backup(path).exists()


# -- JSON -----------------------------------------------------------------------------


def _json_load(path: Path, key: str) -> tuple[dict[str, Any], str | None]:
    """The file's object and its text; JSON with comments and trailing commas (JSONC,
    which VS Code and Cursor read) is read too."""
    text = _read(path)
    if text is None or not text.strip():
        return {}, text
    try:
        data = jsonc.loads(text)
    except jsonc.JsoncError as exc:
        raise AgentSetupError(
            f"{path} is not JSON, even with comments allowed ({exc}); it is left as it is:"
            " add codeveil's entry by hand (docs/mcp.md)") from None
    if not isinstance(data, dict) or not isinstance(data.get(key, {}), dict):
        raise AgentSetupError(f"{path}: expected an object with {key!r} an object; it is"
                              " left as it is")
    return data, text


def _is_plain(text: str | None) -> bool:
    try:
        json.loads(text or "")
    except ValueError:
        return False
    return True


def _indent(text: str | None) -> int | str:
    """The indent the file uses (its first indented line's), 2 for a new file."""
    match = re.search(r"\n([ \t]+)\S", text or "")
    if not match:
        return 2
    lead = match.group(1)
    return "\t" if "\t" in lead else len(lead)


def _dump(path: Path, data: dict[str, Any], text: str | None,
          edit: Callable[[str, str], str]) -> str:
    """The file's new text, holding `data`. Plain JSON is written again whole (in its
    own indent); a file with comments gets `edit` (text, indent unit) on its text, so
    that they stay, and is re-read to prove it holds `data` and nothing else."""
    if text is None or not text.strip() or _is_plain(text):
        return json.dumps(data, indent=_indent(text), ensure_ascii=False) + "\n"
    unit = _indent(text)
    try:
        new = edit(text, unit if isinstance(unit, str) else " " * unit)
        same = jsonc.loads(new) == data
    except jsonc.JsoncError:
        same = False
    if not same:
        raise AgentSetupError(f"{path} has comments and a layout this command cannot edit"
                              " safely; it is left as it is: change codeveil's entry by"
                              " hand (docs/mcp.md)")
    return new


def _json_snippet(client: Client, entry: dict[str, object]) -> str:
    return json.dumps({client.key: {SERVER_NAME: entry}}, indent=2)


def _json_install(client: Client, path: Path, entry: dict[str, object],
                  write: bool) -> Change:
    data, text = _json_load(path, client.key)
    had_map = client.key in data
    servers = data.setdefault(client.key, {})
    snippet = _json_snippet(client, entry)
    if servers.get(SERVER_NAME) == entry:
        return Change(client.name, path, "unchanged", snippet, _existing_backup(path))
    action = "updated" if SERVER_NAME in servers else "added"
    servers[SERVER_NAME] = entry

    def edit(old: str, unit: str) -> str:
        if had_map:
            return jsonc.set_member(old, (client.key,), SERVER_NAME, entry, unit)
        return jsonc.set_member(old, (), client.key, {SERVER_NAME: entry}, unit)

    new = _dump(path, data, text, edit)  # refused here, before any file is written
    backup = _write(path, new) if write else None
    return Change(client.name, path, action, snippet, backup)


def _json_uninstall(client: Client, path: Path, write: bool) -> Change:
    data, text = _json_load(path, client.key)
    servers = data.get(client.key, {})
    if SERVER_NAME not in servers:
        return Change(client.name, path, "absent", "")
    del servers[SERVER_NAME]
    drop_map = not servers and not _had_key(path, client.key)
    if drop_map:
        del data[client.key]

    def edit(old: str, unit: str) -> str:
        new = jsonc.remove_member(old, (client.key,), SERVER_NAME)
        return jsonc.remove_member(new, (), client.key) if drop_map else new

    new = "" if not data and _created_by_us(path) else _dump(path, data, text, edit)
    if write:
        if not new:
            path.unlink()
        else:
            _write(path, new)
    return Change(client.name, path, "removed", "", _existing_backup(path))


def _had_key(path: Path, key: str) -> bool:
    """Whether the file, before install first changed it, had `key` (so an emptied map
    stays, as the user had it)."""
    if _created_by_us(path):
        return False
    with contextlib.suppress(AgentSetupError):
        return key in _json_load(_backup(path), key)[0]
    return True


def _existing_backup(path: Path) -> Path | None:
    backup = _backup(path)
    return backup if backup.exists() else None


# -- TOML (Codex) -----------------------------------------------------------------------

# A header of codeveil's table or one of its subtables: [mcp_servers.codeveil],
# [mcp_servers."codeveil".env].
_OUR_HEADER = re.compile(r"\s*\[\s*mcp_servers\s*\.\s*(codeveil|\"codeveil\"|'codeveil')\s*[.\]]")


def _toml_str(value: str) -> str:
    """A TOML basic string."""
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_block(client: Client, entry: dict[str, object]) -> str:
    args, env = entry["args"], entry.get("env", {})
    assert isinstance(args, list) and isinstance(env, dict)
    block = (f"[{client.key}.{SERVER_NAME}]\n"
             f"command = {_toml_str(str(entry['command']))}\n"
             f"args = [{', '.join(_toml_str(str(a)) for a in args)}]\n")
    if env:
        pairs = ", ".join(f"{name} = {_toml_str(str(value))}" for name, value in env.items())
        block += f"env = {{ {pairs} }}\n"
    return block


def _toml_load(path: Path, text: str | None) -> dict[str, Any]:
    try:
        return tomllib.loads(text or "")
    except tomllib.TOMLDecodeError as exc:
        raise AgentSetupError(f"{path} is not valid TOML ({exc}); it is left as it is")\
            from None


def _toml_cut(path: Path, client: Client, text: str) -> str:
    """`text` without codeveil's table (and its subtables), proved by re-reading it: the
    rest must parse to exactly what it did."""
    kept, ours = [], False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("["):
            ours = bool(_OUR_HEADER.match(line))
        if not ours:
            kept.append(line)
    cut = "".join(kept)
    before = _toml_load(path, text)
    before.get(client.key, {}).pop(SERVER_NAME, None)
    after = _toml_load(path, cut)
    if not after.get(client.key) and not before.get(client.key):
        before.pop(client.key, None)
        after.pop(client.key, None)
    if after != before:
        raise AgentSetupError(
            f"{path} defines [{client.key}.{SERVER_NAME}] in a form this command does not"
            " edit; change it by hand (docs/mcp.md)")
    return cut.rstrip("\n") + "\n" if cut.strip() else ""


def _toml_install(client: Client, path: Path, entry: dict[str, object],
                  write: bool) -> Change:
    text = _read(path)
    current = _toml_load(path, text).get(client.key, {}).get(SERVER_NAME)
    block = _toml_block(client, entry)
    if current == entry:
        return Change(client.name, path, "unchanged", block, _existing_backup(path))
    rest = _toml_cut(path, client, text or "")
    new = rest + ("\n" if rest else "") + block
    if _toml_load(path, new).get(client.key, {}).get(SERVER_NAME) != entry:
        raise AgentSetupError(f"{path}: the entry written would not read back as written;"
                              " the file is left as it is")
    backup = _write(path, new) if write else None
    return Change(client.name, path, "updated" if current else "added", block, backup)


def _toml_uninstall(client: Client, path: Path, write: bool) -> Change:
    text = _read(path)
    if _toml_load(path, text).get(client.key, {}).get(SERVER_NAME) is None:
        return Change(client.name, path, "absent", "")
    rest = _toml_cut(path, client, text or "")
    if write:
        if not rest.strip() and _created_by_us(path):
            path.unlink()
        else:
            _write(path, rest)
    return Change(client.name, path, "removed", "", _existing_backup(path))


# -- instructions ---------------------------------------------------------------------

INSTRUCTION_FILES = ("AGENTS.md", "CLAUDE.md", "GEMINI.md")
INSTRUCTIONS_VERSION = 1
_SECTION = re.compile(r"<!-- codeveil:agent v\d+ -->\n.*?<!-- /codeveil:agent -->\n?",
                      re.DOTALL)
_SECTION_AND_GAP = re.compile(r"\n*" + _SECTION.pattern + r"\n*", re.DOTALL)
INSTRUCTIONS = f"""\
<!-- codeveil:agent v{INSTRUCTIONS_VERSION} -->
## Code search (codeveil)

This repository is indexed by codeveil; its MCP server `codeveil` answers from the index,
faster and with less reading than opening files one by one:

- `search`: you do not know where something is. Ask in words, or paste an error message
  or a stack trace; `group="file"` says which files to open.
- `definition`: you know a name (`Session.send`) and want where it is defined.
- `outline`: what a file defines, before reading all of it.
- `references`: who uses a name, before you change or rename it.
- `grep`: an exact string or a regex over the indexed files.

After editing files, call `sync_index` if results look stale.
<!-- /codeveil:agent -->
"""


def instruction_files(repo: Path, clients: list[Client]) -> list[Path]:
    """AGENTS.md (read by most agents), and CLAUDE.md / GEMINI.md where the agents that
    read those are chosen or the file already exists."""
    names = {c.name for c in clients}
    chosen = [repo / "AGENTS.md"]
    if names & {"claude-code", "claude-desktop"} or (repo / "CLAUDE.md").exists():
        chosen.append(repo / "CLAUDE.md")
    if "gemini" in names or (repo / "GEMINI.md").exists():
        chosen.append(repo / "GEMINI.md")
    return chosen


def install_instructions(files: list[Path], *, write: bool = True) -> list[Change]:
    """Add (or replace) codeveil's section in each file."""
    changes = []
    for path in files:
        text = _read(path) or ""
        if _SECTION.search(text):
            new = _SECTION.sub(lambda _m: INSTRUCTIONS, text, count=1)
        else:
            new = (text.rstrip("\n") + "\n\n" if text.strip() else "") + INSTRUCTIONS
        action = "unchanged" if new == text else ("updated" if text else "added")
        if write and new != text:
            # No backup: the section is delimited, and the file is usually in git.
            _write(path, new, keep_backup=False)
        changes.append(Change("instructions", path, action, INSTRUCTIONS))
    return changes


def uninstall_instructions(repo: Path, *, write: bool = True) -> list[Change]:
    """Remove codeveil's section wherever it is; a file left empty is removed."""
    changes = []
    for name in INSTRUCTION_FILES:
        path = repo / name
        text = _read(path)
        if text is None or not _SECTION.search(text):
            continue
        rest = _SECTION_AND_GAP.sub("\n\n", text, count=1).strip("\n")
        if write:
            if rest.strip():
                _write(path, rest + "\n", keep_backup=False)
            else:
                path.unlink()
        changes.append(Change("instructions", path, "removed", ""))
    return changes
