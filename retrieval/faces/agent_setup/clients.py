"""The coding-agent clients `codeveil agent install` knows: where each keeps its MCP
servers, in which format and under which key, and how codeveil's entry looks there.

    client          project scope             user scope                          key
    claude-code     .mcp.json                 ~/.claude.json                      mcpServers
    claude-desktop  -                         <app config>/Claude/claude_desktop_config.json
    cursor          .cursor/mcp.json          ~/.cursor/mcp.json                  mcpServers
    vscode          .vscode/mcp.json          <app config>/Code/User/mcp.json     servers
    windsurf        -                         ~/.codeium/windsurf/mcp_config.json mcpServers
    codex           .codex/config.toml        ~/.codex/config.toml (CODEX_HOME)   [mcp_servers]
    gemini          .gemini/settings.json     ~/.gemini/settings.json             mcpServers

A project file is committed and read by every teammate: codeveil's entry there is the
portable form (`Client.portable_command`), a user's file gets this machine's absolute
one (`mcp_command`, `mcp_env`).

<app config> is ~/Library/Application Support on macOS, %APPDATA% on Windows, and
$XDG_CONFIG_HOME or ~/.config elsewhere. The home dir is $HOME's, so tests (and a user
setting up another account) can point it elsewhere.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from indexer.errors import CodeveilError

__all__ = [
    "CLIENTS",
    "SERVER_NAME",
    "AgentSetupError",
    "Client",
    "client_named",
    "mcp_command",
    "mcp_env",
]

SERVER_NAME = "codeveil"


class AgentSetupError(CodeveilError):
    """An agent client's config file cannot be read or edited safely, or no client is known."""


def _app_config(home: Path) -> Path:
    """Where desktop apps keep their settings on this platform."""
    if sys.platform == "darwin":
        return home / "Library" / "Application Support"
    if sys.platform == "win32":
        return Path(os.environ.get("APPDATA") or home / "AppData" / "Roaming")
    return Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")


def _codex_home(home: Path) -> Path:
    return Path(os.environ.get("CODEX_HOME") or home / ".codex")


@dataclass(frozen=True)
class Client:
    """One agent client: its config files (relative to the repo, or from the home dir),
    the format and key its MCP servers live under, and the dir whose presence says the
    client is in use on this machine."""

    name: str
    title: str
    format: str  # "json" or "toml"
    key: str
    project: str | None
    user: Callable[[Path], Path]
    present: Callable[[Path], Path]
    stdio_type: bool = False  # VS Code's format wants "type": "stdio" on the entry
    #: The variable the client replaces by the folder it has open, in a project file's
    #: arguments (None: it starts its servers in that folder, so `codeveil mcp` finds
    #: the repo from its working folder).
    workspace_var: str | None = None

    def path(self, scope: str, repo: Path, home: Path) -> Path:
        """The file this client reads for `scope` ("project" or "user")."""
        if scope == "project" and self.project is not None:
            return repo / self.project
        return self.user(home)

    def scope_for(self, scope: str) -> str:
        """`scope`, or "user" for a client without project files."""
        return scope if self.project is not None else "user"

    def in_use(self, repo: Path, home: Path) -> bool:
        """Whether this machine or this repo shows signs of the client."""
        if self.present(home).exists():
            return True
        if self.project is None:
            return False
        # The client's own folder in the repo (.vscode/, .cursor/), or its file (.mcp.json).
        project = repo / self.project
        return (project.parent if project.parent != repo else project).exists()

    def portable_command(self) -> list[str]:
        """`codeveil mcp` as a project file committed to the repo wants it: `codeveil`
        from each teammate's PATH, the repo the client has open, no path of this
        machine's."""
        return ["codeveil", "mcp", *(["-C", self.workspace_var] if self.workspace_var
                                     else [])]

    def entry(self, command: list[str], env: dict[str, str] | None = None
              ) -> dict[str, object]:
        """codeveil's entry in this client's format."""
        entry: dict[str, object] = {"command": command[0], "args": list(command[1:])}
        if self.stdio_type:
            entry = {"type": "stdio", **entry}
        if env:
            entry["env"] = dict(env)
        return entry


CLIENTS: tuple[Client, ...] = (
    Client("claude-code", "Claude Code", "json", "mcpServers", ".mcp.json",
           user=lambda h: h / ".claude.json", present=lambda h: h / ".claude"),
    Client("claude-desktop", "Claude Desktop", "json", "mcpServers", None,
           user=lambda h: _app_config(h) / "Claude" / "claude_desktop_config.json",
           present=lambda h: _app_config(h) / "Claude"),
    Client("cursor", "Cursor", "json", "mcpServers", ".cursor/mcp.json",
           user=lambda h: h / ".cursor" / "mcp.json", present=lambda h: h / ".cursor",
           workspace_var="${workspaceFolder}"),
    Client("vscode", "VS Code", "json", "servers", ".vscode/mcp.json",
           user=lambda h: _app_config(h) / "Code" / "User" / "mcp.json",
           present=lambda h: _app_config(h) / "Code", stdio_type=True,
           workspace_var="${workspaceFolder}"),
    Client("windsurf", "Windsurf", "json", "mcpServers", None,
           user=lambda h: h / ".codeium" / "windsurf" / "mcp_config.json",
           present=lambda h: h / ".codeium" / "windsurf"),
    Client("codex", "Codex CLI", "toml", "mcp_servers", ".codex/config.toml",
           user=lambda h: _codex_home(h) / "config.toml", present=_codex_home),
    Client("gemini", "Gemini CLI", "json", "mcpServers", ".gemini/settings.json",
           user=lambda h: h / ".gemini" / "settings.json", present=lambda h: h / ".gemini"),
)


def client_named(name: str) -> Client:
    for client in CLIENTS:
        if client.name == name:
            return client
    raise AgentSetupError(f"no agent client {name!r}; known: "
                          + ", ".join(c.name for c in CLIENTS))


# Where this machine keeps codeveil's keys and cache, when moved from the default: the
# server an agent starts must look in the same place. Never CODEVEIL_KEY or
# CODEVEIL_TOKEN: a secret does not belong in an agent's config file.
_CARRIED_ENV = ("CODEVEIL_CONFIG_DIR", "CODEVEIL_CACHE_DIR")


def mcp_env() -> dict[str, str]:
    """The settings the MCP server must be started with to find what this shell's
    codeveil finds (absolute paths)."""
    return {name: str(Path(os.environ[name]).absolute()) for name in _CARRIED_ENV
            if os.environ.get(name)}


def mcp_command(repo: Path) -> list[str]:
    """The command that runs this installation's `codeveil mcp` on `repo` (the absolute
    form: a user's own config, or `agent install --absolute`): the `codeveil` script
    beside this Python (a venv's), else this Python with `-m`. Never one found on PATH:
    that may be another installation, of another version."""
    python = Path(sys.executable).absolute()  # not resolved: a venv's python is a link
    script = python.parent / ("codeveil.exe" if sys.platform == "win32" else "codeveil")
    head = [str(script)] if script.is_file() else [str(python), "-m", "retrieval"]
    return [*head, "mcp", "-C", str(repo)]
