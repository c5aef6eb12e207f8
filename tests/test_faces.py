"""Each lookup is defined once (retrieval.faces.operations): this walks the table and checks
every face against it. The command's options are read from the click commands, the MCP
tools' JSON schemas from a running server's tool list, the Python API's defaults from
its signatures."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import click
import pytest

from retrieval.agent.agent_tools import AgentTools
from retrieval.faces.api import Index
from retrieval.faces.cli import main
from retrieval.faces.multi import MultiIndex
from retrieval.faces.operations import API, CLI, MCP, OPERATIONS, REQUIRED, Arg, Operation

# The options every command shares, rather than each operation (retrieval.faces.cli_base).
SHARED = {"as_json", "repo", "repos", "help"}


def _commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    """Every command of the `codeveil` tree, by its full name (`key show`)."""
    out: dict[str, click.Command] = {}
    for name, cmd in group.commands.items():
        out[prefix + name] = cmd
        if isinstance(cmd, click.Group):
            out.update(_commands(cmd, f"{prefix}{name} "))
    return out


def _tools(tmp_path: Path) -> dict[str, Any]:
    from retrieval.faces.mcp_server import build_server

    return {t.name: t for t in asyncio.run(build_server(tmp_path).list_tools())}


def _folder_alias(param: click.Parameter) -> bool:
    """The positional PATH some commands still take for -C (cli_base.folder_params)."""
    return (isinstance(param, click.Argument) and isinstance(param.type, click.Path)
            and not param.type.file_okay)


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.method)
def test_the_command_takes_the_table_arguments(op: Operation) -> None:
    cmd = main.commands[op.command]
    params = [p for p in cmd.params if p.name not in SHARED and not _folder_alias(p)]
    assert [p.name for p in params] == [a.name for a in op.face_args(CLI)]
    ctx = click.Context(cmd)
    for param, arg in zip(params, op.face_args(CLI), strict=True):
        if arg.positional:
            assert isinstance(param, click.Argument) and param.required, arg.name
            continue
        assert isinstance(param, click.Option), arg.name
        assert param.opts == [*arg.flags, *arg.aliases], arg.name
        assert param.multiple == arg.repeat, arg.name
        assert param.default == (() if arg.repeat else arg.default), arg.name
        assert param.help is not None and param.help.startswith(arg.help), arg.name
        shown = param.get_help_record(ctx)
        assert shown is not None and not any(a in shown[0].split(", ") for a in arg.aliases)
        if arg.count is not None:
            assert isinstance(param.type, click.IntRange), arg.name
            assert param.type.min == 1
            assert param.type.max == (None if arg.default is None else arg.count.most)
        if arg.choices:
            assert isinstance(param.type, click.Choice)
            assert tuple(param.type.choices) == arg.choices


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.method)
def test_the_mcp_tool_schema_is_the_table(op: Operation, tmp_path: Path) -> None:
    schema = _tools(tmp_path)[op.tool].input_schema
    args = op.face_args(MCP)
    assert list(schema["properties"]) == [a.name for a in args]
    assert sorted(schema.get("required", [])) == sorted(
        a.name for a in args if a.for_agent is REQUIRED)
    for arg in args:
        prop = schema["properties"][arg.name]
        assert prop["description"] == arg.agent_help(), arg.name
        if arg.for_agent is not REQUIRED:
            assert prop["default"] == arg.for_agent, arg.name
        if arg.choices:
            assert tuple(prop["enum"]) == arg.choices
        if arg.count is not None:
            assert f"1-{arg.count.most}" in prop["description"]


def _api_methods(op: Operation) -> list[Any]:
    methods = [getattr(Index, op.method)]
    if hasattr(AgentTools, op.method):  # the lookups that need no model
        methods.append(getattr(AgentTools, op.method))
    if hasattr(MultiIndex, op.method):
        methods.append(getattr(MultiIndex, op.method))
    return methods


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.method)
def test_the_api_signatures_keep_the_table_defaults(op: Operation) -> None:
    for method in _api_methods(op):
        sig = inspect.signature(method)
        params = [p for p in sig.parameters.values() if p.name != "self"]
        assert [p.name for p in params] == [a.name for a in op.face_args(API)], method
        for param, arg in zip(params, op.face_args(API), strict=True):
            expected = inspect.Parameter.empty if arg.default is REQUIRED else arg.default
            assert param.default == expected, (method, arg.name)
        assert sig.return_annotation == op.result, method


def test_every_face_of_every_operation_is_in_the_table() -> None:
    from retrieval.faces.mcp_server import build_server

    assert {a.name for op in OPERATIONS for a in op.args if not a.faces} == set()
    assert {op.command for op in OPERATIONS} <= set(main.commands)
    tools = asyncio.run(build_server(Path(".")).list_tools())
    assert {t.name for t in tools} == {op.tool for op in OPERATIONS}


def test_repo_json_and_result_counts_are_spelt_one_way_in_every_command() -> None:
    for name, cmd in _commands(main).items():
        for param in cmd.params:
            if not isinstance(param, click.Option):
                continue
            if "-C" in param.opts or "--repo" in param.opts:
                assert param.opts == ["-C", "--repo"], name
                assert param.name in ("repo", "repos"), name
            if "--json" in param.opts:
                assert param.name == "as_json" and param.is_flag, name
            if "--limit" in param.opts or "-k" in param.opts:
                assert param.opts[:2] == ["-k", "--limit"], name


@pytest.mark.parametrize(("command", "old"), [("def", "-n"), ("uses", "-n"), ("grep", "-n")])
def test_the_old_spelling_of_a_count_still_works(command: str, old: str) -> None:
    cmd = main.commands[command]
    for spelling in ("-k", "--limit", old):
        ctx = cmd.make_context(command, ["x", spelling, "7"])
        assert ctx.params["limit"] == 7, spelling
    assert old not in cmd.get_help(click.Context(cmd))


def test_a_changed_table_entry_changes_both_built_faces(tmp_path: Path) -> None:
    """The faces are built from an entry, not copied from it: a made-up operation gets
    its option and its schema property from the one Arg."""
    from mcp.server.mcpserver import MCPServer

    from retrieval.faces.cli_base import operation_params
    from retrieval.faces.mcp_server import _add_tool, _State
    from retrieval.search.limits import ResultCount

    count = ResultCount(default=3, most=9)
    op = Operation(method="probe", command="probe", tool="probe", result="dict", args=(
        Arg("word", str, "A word."),
        Arg("limit", int, "How many.", default=3, count=count, flags=("-k", "--limit")),
    ))

    @click.command()
    @operation_params(op)
    def probe(word: str, limit: int) -> None:
        click.echo(f"{word} {limit}")

    from click.testing import CliRunner

    assert CliRunner().invoke(probe, ["w"]).output == "w 3\n"
    assert CliRunner().invoke(probe, ["w", "-k", "10"]).exit_code == 2

    def answer(state: _State, word: str, limit: int) -> dict[str, Any]:
        """Probe."""
        return {"word": word, "limit": limit}

    server: MCPServer = MCPServer(name="t")
    _add_tool(server, _State(tmp_path), op, answer)
    (tool,) = asyncio.run(server.list_tools())
    assert tool.input_schema["properties"]["limit"]["default"] == 3
    result = asyncio.run(server.call_tool("probe", {"word": "w", "limit": 50}))
    assert '"limit": 9' in str(result)  # brought into 1..9


def test_the_daemon_tuning_and_the_port_are_written_once_in_the_library() -> None:
    from sync.daemon import loop
    from sync.server.app import DEFAULT_PORT

    daemon = main.commands["daemon"]
    assert isinstance(daemon, click.Group)
    expected = {("serve", "port"): DEFAULT_PORT}
    for command in ("start", "run"):
        expected |= {(f"daemon {command}", "interval"): loop.DEFAULT_FULL_INTERVAL,
                     (f"daemon {command}", "debounce"): loop.DEFAULT_DEBOUNCE,
                     (f"daemon {command}", "max_backoff"): loop.DEFAULT_BACKOFF_MAX}
    commands = _commands(main)
    for (command, name), value in expected.items():
        cmd = commands[command]
        (param,) = [p for p in cmd.params if p.name == name]
        assert param.get_default(click.Context(cmd)) == value, (command, name)
        assert f"default: {value}" in cmd.get_help(click.Context(cmd)), (command, name)
    faces = Path(__file__).resolve().parents[1] / "retrieval" / "faces"
    for source in faces.glob("cli*.py"):
        text = source.read_text()
        for literal in ("7400", "300.0", "default=0.5", "60.0"):
            assert literal not in text, (source.name, literal)


def test_every_command_that_takes_a_folder_takes_it_as_C(tmp_path: Path) -> None:
    from click.testing import CliRunner

    commands = _commands(main)
    for name, cmd in commands.items():
        folders = [p for p in cmd.params if isinstance(p, click.Argument)
                   and isinstance(p.type, click.Path) and not p.type.file_okay]
        if folders:  # the older positional PATH, kept as another spelling of -C
            assert [(p.name, p.required) for p in folders] == [("path", False)], name
            assert any(isinstance(p, click.Option) and p.opts == ["-C", "--repo"]
                       for p in cmd.params), name
    for name in ("index", "init", "join", "status", "doctor", "mcp", "daemon start",
                 "daemon run", "daemon stop", "daemon status"):
        assert any(p.opts == ["-C", "--repo"] for p in commands[name].params
                   if isinstance(p, click.Option)), name

    runner = CliRunner()
    by_option = runner.invoke(main, ["daemon", "status", "-C", str(tmp_path)])
    by_path = runner.invoke(main, ["daemon", "status", str(tmp_path)])
    assert by_option.exit_code == by_path.exit_code == 3
    assert by_option.output == by_path.output and str(tmp_path) in by_option.output
    both = runner.invoke(main, ["daemon", "status", "-C", str(tmp_path), "/"])
    assert both.exit_code == 2 and "two folders given" in both.output


def test_index_waits_or_not_by_one_default_in_every_face(tmp_path: Path) -> None:
    # The API waited by default while the command and the tool did not.
    from retrieval.faces.operations import INDEX_OP

    (wait,) = [a for a in INDEX_OP.args if a.name == "wait"]
    assert wait.faces == {API, CLI, MCP}
    cli = {p.name: p for p in main.commands["index"].params}["wait"]
    mcp = _tools(tmp_path)["sync_index"].input_schema["properties"]["wait"]
    api = inspect.signature(Index.index).parameters["wait"]
    assert cli.default is mcp["default"] is api.default is wait.default is False
