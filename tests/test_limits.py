"""Each operation's result count is written once (retrieval.search.limits) and every face reads
it: the CLI's options and the MCP tools' defaults and caps agree."""

from __future__ import annotations

import asyncio
from pathlib import Path

from click.testing import CliRunner

from retrieval.faces.cli import main
from retrieval.search import limits


def _option(command: str, name: str):
    cmd = main.commands[command]
    (opt,) = [p for p in cmd.params if p.name == name]
    return opt


def test_the_cli_reads_the_limits() -> None:
    for command, name, count in (("search", "k", limits.SEARCH),
                                 ("def", "limit", limits.DEFINITIONS),
                                 ("uses", "limit", limits.REFERENCES)):
        opt = _option(command, name)
        assert opt.default == count.default, command
        assert opt.type.max == count.most, command
    out = CliRunner().invoke(main, ["search", "x", "-k", str(limits.SEARCH.most + 1)])
    assert out.exit_code == 2 and "-k" in out.output


def test_the_mcp_tools_default_to_the_same_limits(tmp_path: Path) -> None:
    from retrieval.faces.mcp_server import build_server

    tools = {t.name: t for t in asyncio.run(build_server(tmp_path).list_tools())}

    def default(tool: str, arg: str) -> object:
        return tools[tool].input_schema["properties"][arg].get("default")

    assert default("search", "k") == limits.SEARCH.default
    assert default("definition", "limit") == limits.DEFINITIONS.default
    assert default("references", "limit") == limits.REFERENCES.default
    assert default("grep", "limit") == limits.GREP.default


def test_clamp() -> None:
    assert limits.SEARCH.clamp(0) == 1
    assert limits.SEARCH.clamp(10_000) == limits.SEARCH.most
    assert limits.REFERENCES.clamp(7) == 7
