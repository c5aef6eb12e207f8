"""`codeveil agent install | uninstall` on real files in a temp home and repo: for every
client, the file is written and read back by a parser of its format, merged with an
entry that was there before (which survives), installed twice (one entry), backed up,
and uninstalled (only codeveil's entry goes)."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

from retrieval.faces.agent_setup.clients import CLIENTS, Client
from tests.cli_in_process import run_in_process

CASES = [(c, scope) for c in CLIENTS
         for scope in (("project", "user") if c.project else ("user",))]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    for name in ("XDG_CONFIG_HOME", "APPDATA", "CODEX_HOME"):
        monkeypatch.delenv(name, raising=False)
    return folder


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "app.py").write_text("def main():\n    return 1\n")
    return folder


def agent(args: list[str], repo: Path, home: Path):
    return run_in_process(["agent", *args, "-C", str(repo)], repo, HOME=str(home))


def _read(client: Client, path: Path) -> dict[str, Any]:
    text = path.read_text()
    return tomllib.loads(text) if client.format == "toml" else json.loads(text)


def _seed(client: Client, path: Path) -> str:
    """A config the user had: another server and a setting of the client's own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if client.format == "toml":
        text = ('model = "o3"  # the user\'s comment\n\n[mcp_servers.other]\n'
                'command = "other-mcp"\nargs = ["--flag"]\n\n[profiles.fast]\nmodel = "mini"\n')
    else:
        text = json.dumps({"theme": "dark",
                           client.key: {"other": {"command": "other-mcp", "args": ["--flag"]}}},
                          indent=4) + "\n"
    path.write_text(text)
    return text


@pytest.mark.parametrize(("client", "scope"), CASES,
                         ids=[f"{c.name}-{s}" for c, s in CASES])
def test_install_merges_is_idempotent_and_uninstall_removes_only_ours(
        client: Client, scope: str, repo: Path, home: Path) -> None:
    path = client.path(scope, repo, home)
    assert path.is_relative_to(repo if scope == "project" else home)
    original = _seed(client, path)
    before = _read(client, path)

    done = agent(["install", "--client", client.name, "--scope", scope], repo, home)
    assert done.returncode == 0, done.stderr
    data = _read(client, path)
    ours = data[client.key]["codeveil"]
    if scope == "project":  # committed, read by every teammate: no path of this machine
        assert ours["command"] == "codeveil" and ours["args"][0] == "mcp"
        assert str(repo) not in json.dumps(ours) and "env" not in ours
    else:
        assert Path(ours["command"]).is_absolute() and os.access(ours["command"], os.X_OK)
        assert ours["args"][-3:] == ["mcp", "-C", str(repo)]
        # The server the agent starts finds the keys where this codeveil does.
        assert ours["env"]["CODEVEIL_CONFIG_DIR"] == os.environ["CODEVEIL_CONFIG_DIR"]
    assert data[client.key]["other"] == before[client.key]["other"]
    assert {k: v for k, v in data.items() if k != client.key} == {
        k: v for k, v in before.items() if k != client.key}
    backup = path.with_name(path.name + ".bak")
    assert backup.read_text() == original
    if client.format == "json":
        assert '\n    "theme"' in path.read_text()  # the file's own indent is kept

    written = path.read_text()
    again = agent(["install", "--client", client.name, "--scope", scope], repo, home)
    assert again.returncode == 0 and "already in" in again.stdout
    assert path.read_text() == written
    assert list(_read(client, path)[client.key]) == ["other", "codeveil"]

    gone = agent(["uninstall", "--client", client.name, "--scope", scope], repo, home)
    assert gone.returncode == 0 and "removed from" in gone.stdout
    assert _read(client, path) == before
    if client.format == "toml":
        assert path.read_text() == original  # comments and layout included


@pytest.mark.parametrize("client", [c for c in CLIENTS if c.format == "json"][:1]
                         + [c for c in CLIENTS if c.format == "toml"],
                         ids=lambda c: c.name)
def test_a_file_install_created_is_removed_by_uninstall(client: Client, repo: Path,
                                                        home: Path) -> None:
    path = client.path("user", repo, home)
    assert agent(["install", "--client", client.name, "--scope", "user"], repo,
                 home).returncode == 0
    assert _read(client, path)[client.key]["codeveil"]
    assert not path.with_name(path.name + ".bak").exists()
    assert agent(["uninstall", "--client", client.name, "--scope", "user"], repo,
                 home).returncode == 0
    assert not path.exists()


def test_without_client_it_installs_for_the_clients_found(repo: Path, home: Path) -> None:
    (home / ".cursor").mkdir()
    (repo / ".vscode").mkdir()
    done = agent(["install"], repo, home)
    assert done.returncode == 0, done.stderr
    assert "Cursor" in done.stderr and "VS Code" in done.stderr
    assert "codeveil" in json.loads((repo / ".cursor" / "mcp.json").read_text())["mcpServers"]
    assert "codeveil" in json.loads((repo / ".vscode" / "mcp.json").read_text())["servers"]
    assert not (repo / ".mcp.json").exists() and not (home / ".gemini").exists()


def test_no_client_found_is_one_line(repo: Path, home: Path) -> None:
    refused = agent(["install"], repo, home)
    assert refused.returncode == 1 and "--client" in refused.stderr
    assert refused.stderr.count("\n") == 1


def test_print_writes_nothing(repo: Path, home: Path) -> None:
    shown = agent(["install", "--client", "codex", "--client", "cursor", "--print",
                   "--with-instructions"], repo, home)
    assert shown.returncode == 0, shown.stderr
    assert "[mcp_servers.codeveil]" in shown.stdout and '"mcpServers"' in shown.stdout
    assert sorted(p.name for p in repo.iterdir()) == ["app.py"]


JSONC = """{
  // the team's servers
  "servers": {
    /* a linter */
    "other": {"command": "other-mcp", "args": ["--flag"]}, // keep me
  },
  "inputs": [],
}
"""


def test_a_json_file_with_comments_keeps_them_through_install_and_uninstall(
        repo: Path, home: Path) -> None:
    path = repo / ".vscode" / "mcp.json"
    path.parent.mkdir()
    path.write_text(JSONC)
    done = agent(["install", "--client", "vscode"], repo, home)
    assert done.returncode == 0, done.stderr
    text = path.read_text()
    for comment in ("// the team's servers", "/* a linter */", "// keep me"):
        assert comment in text
    assert text.startswith(JSONC[:JSONC.index("}, // keep me")])
    from retrieval.faces.agent_setup.jsonc import loads

    ours = loads(text)["servers"]["codeveil"]
    assert ours == {"type": "stdio", "command": "codeveil",
                    "args": ["mcp", "-C", "${workspaceFolder}"]}
    again = agent(["install", "--client", "vscode"], repo, home)
    assert again.returncode == 0 and path.read_text() == text

    gone = agent(["uninstall", "--client", "vscode"], repo, home)
    assert gone.returncode == 0, gone.stderr
    assert path.read_text() == JSONC


def test_a_file_that_cannot_be_edited_stops_uninstall_before_any_change(
        repo: Path, home: Path) -> None:
    assert agent(["install", "--client", "claude-code", "--client", "cursor",
                  "--with-instructions"], repo, home).returncode == 0
    claude, cursor = repo / ".mcp.json", repo / ".cursor" / "mcp.json"
    cursor.write_text(cursor.read_text().replace("{", "{ oops", 1))  # not even JSONC
    before = {p: p.read_text() for p in (claude, cursor, repo / "AGENTS.md",
                                         repo / "CLAUDE.md")}
    refused = agent(["uninstall"], repo, home)
    assert refused.returncode == 1 and str(cursor) in refused.stderr
    assert refused.stderr.count("\n") == 1
    assert {p: p.read_text() for p in before} == before  # nothing removed, none halfway

    cursor.write_text(before[cursor].replace("{ oops", "{", 1))
    gone = agent(["uninstall"], repo, home)
    assert gone.returncode == 0, gone.stderr
    assert not claude.exists() and not cursor.exists()
    assert not (repo / "AGENTS.md").exists() and not (repo / "CLAUDE.md").exists()


def test_the_absolute_form_in_a_project_file_is_asked_for(repo: Path, home: Path) -> None:
    done = agent(["install", "--client", "cursor", "--absolute"], repo, home)
    assert done.returncode == 0, done.stderr
    ours = json.loads((repo / ".cursor" / "mcp.json").read_text())["mcpServers"]["codeveil"]
    assert Path(ours["command"]).is_absolute()
    assert ours["args"][-3:] == ["mcp", "-C", str(repo)] and "CODEVEIL_CONFIG_DIR" in ours["env"]
    helped = agent(["install", "--help"], repo, home)
    assert "--absolute" in helped.stdout and "portable" in helped.stdout


def test_an_inline_codex_entry_is_not_edited(repo: Path, home: Path) -> None:
    path = home / ".codex" / "config.toml"
    path.parent.mkdir()
    text = '[mcp_servers]\ncodeveil = { command = "old", args = [] }\n'
    path.write_text(text)
    refused = agent(["install", "--client", "codex", "--scope", "user"], repo, home)
    assert refused.returncode == 1 and "by hand" in refused.stderr
    assert path.read_text() == text


def test_instructions_are_one_versioned_section_replaced_and_removed(
        repo: Path, home: Path) -> None:
    (repo / "AGENTS.md").write_text("# Our rules\n\nUse tabs.\n")
    (repo / "CLAUDE.md").write_text(
        "Intro.\n\n<!-- codeveil:agent v0 -->\nold words\n<!-- /codeveil:agent -->\n\nOutro.\n")
    for _ in range(2):
        done = agent(["install", "--client", "cursor", "--with-instructions"], repo, home)
        assert done.returncode == 0, done.stderr
    for name in ("AGENTS.md", "CLAUDE.md"):
        text = (repo / name).read_text()
        assert text.count("<!-- codeveil:agent v1 -->") == 1
        assert "<!-- codeveil:agent v0 -->" not in text and "old words" not in text
        for tool in ("`search`", "`definition`", "`outline`", "`references`", "`grep`"):
            assert tool in text
    assert (repo / "AGENTS.md").read_text().startswith("# Our rules\n\nUse tabs.\n\n<!--")
    assert (repo / "CLAUDE.md").read_text().endswith("<!-- /codeveil:agent -->\n\nOutro.\n")
    assert not (repo / "GEMINI.md").exists()

    assert agent(["uninstall", "--client", "cursor"], repo, home).returncode == 0
    assert (repo / "AGENTS.md").read_text() == "# Our rules\n\nUse tabs.\n"
    assert (repo / "CLAUDE.md").read_text() == "Intro.\n\nOutro.\n"


def test_the_command_it_writes_starts_codeveil(repo: Path, home: Path) -> None:
    import subprocess

    assert agent(["install", "--client", "cursor", "--absolute"], repo, home).returncode == 0
    entry = json.loads((repo / ".cursor" / "mcp.json").read_text())["mcpServers"]["codeveil"]
    helped = subprocess.run([entry["command"], *entry["args"][:-3], "mcp", "--help"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert helped.returncode == 0 and "Model Context Protocol" in helped.stdout


def test_no_secret_is_written_and_uninstall_finds_either_scope(
        repo: Path, home: Path) -> None:
    done = run_in_process(["agent", "install", "--client", "codex", "--client", "gemini",
                           "--scope", "user", "-C", str(repo)], repo, HOME=str(home),
                          CODEVEIL_KEY="codeveil-key-v1:not-to-be-written",
                          CODEVEIL_TOKEN="not-to-be-written-either")
    assert done.returncode == 0, done.stderr
    codex = home / ".codex" / "config.toml"
    gemini = home / ".gemini" / "settings.json"
    for path in (codex, gemini):
        assert "not-to-be-written" not in path.read_text()
    env = tomllib.loads(codex.read_text())["mcp_servers"]["codeveil"]["env"]
    assert set(env) == {"CODEVEIL_CONFIG_DIR", "CODEVEIL_CACHE_DIR"}
    gone = agent(["uninstall"], repo, home)
    assert gone.returncode == 0 and gone.stdout.count("removed from") == 2
    assert not codex.exists() and not gemini.exists()


def test_the_installer_sits_beside_the_command_that_alone_uses_it() -> None:
    root = Path(__file__).resolve().parents[1]
    users = sorted(str(p.relative_to(root)) for p in (root / "retrieval").rglob("*.py")
                   if "agent_setup" in p.read_text() and "agent_setup" not in p.parts)
    assert users == ["retrieval/faces/cli_agent.py"]
    assert not [p.name for p in (root / "retrieval" / "agent").glob("*.py")
                if "mcpServers" in p.read_text()]
