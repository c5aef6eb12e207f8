"""The lookups codeveil answers, each defined once: its arguments (type, default, the
limits of a result count, the choices, the help text), the library method that answers
it and what that returns.

Three faces offer them: the `codeveil` command, the MCP tools and the Python API
(`retrieval.faces.api.Index`, `retrieval.agent.agent_tools.AgentTools`). The command's arguments and
options (`retrieval.faces.cli_base.operation_params`) and the tools' JSON schemas
(`retrieval.faces.mcp_server`) are built from this table, so a default, a limit or a help text
cannot differ between them. The API keeps its signatures written out, for its readers and
its type checker; `tests/test_faces.py` walks the table and checks them, with the other
two faces, against it.

Beside the lookups, the two operations every face offers on the index itself: `index`
(the MCP tool `sync_index`) and `status` (`index_status`), so that `wait`, say, has one
default in the API, the command and the tool.

What is not here is the same in every command rather than per operation: `-C/--repo`
and `--json` (`retrieval.faces.cli_base`). The commands only a person runs (init,
doctor, daemon, ...) are not here either: their options are one face's only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from retrieval.search.grouping import LEVELS
from retrieval.search.limits import DEFINITIONS, GREP, REFERENCES, SEARCH, ResultCount

CLI: Final = "cli"
MCP: Final = "mcp"
API: Final = "api"
EVERY_FACE: Final = frozenset({CLI, MCP, API})


class _Required:
    """The default of an argument that has none."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = _Required()


@dataclass(frozen=True)
class Arg:
    """One argument of an operation.

    `name` is the library's keyword, the MCP argument's name and the name the command's
    function receives it by. `type` is `str`, `int`, `bool`, `Path` (a file: taken from
    where the command runs, repo-relative for an agent) or `list[str]`.

    A result count (`count`) is spelt `-k/--limit` by the command, which takes a number in
    1..count.most; an agent's number under 1 is refused by its schema's bound, and one
    over the most is taken as the most (`ResultCount.clamp`). A count whose `default` is
    None means "all" to a person, without a most; an agent gets `agent_default` then, at
    most count.most (grep: retrieval.search.limits).
    """

    name: str
    type: object  # an argument of the API alone may be of any type (a progress sink)
    help: str
    default: object = REQUIRED
    count: ResultCount | None = None
    agent_default: object = REQUIRED  # REQUIRED: the same as `default`
    choices: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()  # the command's spellings; none: a positional argument
    aliases: tuple[str, ...] = ()  # old spellings the command still takes, not in --help
    metavar: str | None = None
    repeat: bool = False  # the command's option may be given several times
    envvar: str | None = None  # the command's option is read from it when not given
    faces: frozenset[str] = EVERY_FACE

    @property
    def positional(self) -> bool:
        return not self.flags

    @property
    def for_agent(self) -> object:
        """The default an agent's call gets."""
        return self.default if self.agent_default is REQUIRED else self.agent_default

    def agent_help(self) -> str:
        """The help text with what the command shows beside it (range, choices)."""
        if self.count is not None:
            most = self.count.most
            return f"{self.help.rstrip('.')} (1-{most}; more is taken as {most})."
        return self.help


@dataclass(frozen=True)
class Operation:
    """One lookup: `method` of `Index` (and of `AgentTools` where it answers without the
    model), offered as the command `command` and the MCP tool `tool`."""

    method: str
    command: str
    tool: str
    args: tuple[Arg, ...]
    result: str  # the method's return annotation

    def face_args(self, face: str) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if face in a.faces)


def _count(help: str, count: ResultCount, name: str = "limit", *,
           aliases: tuple[str, ...] = ("-n",), default: object = REQUIRED,
           agent_default: object = REQUIRED) -> Arg:
    """A result count: `-k/--limit` on the command line (`-n`, its old spelling in some
    commands, still taken)."""
    return Arg(name, int, help, default=count.default if default is REQUIRED else default,
               count=count, agent_default=agent_default, flags=("-k", "--limit"),
               aliases=aliases)


_GLOB = Arg("path", str, "Only files whose path matches this glob (src/*, *.py).",
            default=None, flags=("--path",), metavar="GLOB")

SEARCH_OP: Final = Operation(
    method="search", command="search", tool="search", result="list[Hit]", args=(
        Arg("query", str, "A question, a description of behaviour, an identifier, an error"
            " message or a whole stack trace."),
        _count("How many results.", SEARCH, "k", aliases=()),
        _GLOB,
        Arg("language", str, "Only this language (python, go...).", default=None,
            flags=("--lang",), metavar="LANG"),
        Arg("kind", str, "Only files of these kinds: code, tests, docs, examples or config"
            " (a comma list: code,tests).", default=None,
            flags=("--kind",), metavar="KIND", repeat=True),
        Arg("group", str, "One result per chunk (line ranges), per symbol (function, class)"
            " or per file.", default="chunk", choices=LEVELS, flags=("--group",)),
        # The command names several repositories by repeating -C (retrieval.faces.cli).
        Arg("repos", list[str], "Other indexed folders (paths) to search together with this"
            " repository, as one ranking; each hit then names its repo.", default=None,
            faces=frozenset({MCP})),
    ))

DEFINITION_OP: Final = Operation(
    method="definition", command="def", tool="definition", result="list[DefinitionHit]",
    args=(
        Arg("name", str, "A symbol's name, bare (send) or qualified (Session.send,"
            " Sinatra::Base, pkg.Func)."),
        _count("How many candidates.", DEFINITIONS),
    ))

OUTLINE_OP: Final = Operation(
    method="outline", command="outline", tool="outline", result="Outline", args=(
        Arg("path", Path, "The file (repo-relative for an agent; from where the command"
            " runs for a person)."),
    ))

REFERENCES_OP: Final = Operation(
    method="references", command="uses", tool="references", result="list[ReferenceHit]",
    args=(
        Arg("name", str, "An identifier; for Session.send the uses of send, those naming"
            " Session first."),
        _GLOB,
        _count("How many chunks.", REFERENCES),
    ))

GREP_OP: Final = Operation(
    method="grep", command="grep", tool="grep", result="GrepResult", args=(
        Arg("pattern", str, "A regular expression (Python syntax), matched line by line."),
        _GLOB,
        Arg("ignore_case", bool, "Match regardless of case.", default=False,
            flags=("-i", "--ignore-case")),
        _count("Stop after this many lines.", GREP, default=None,
               agent_default=GREP.default),
    ))

INDEX_OP: Final = Operation(
    method="index", command="index", tool="sync_index", result="SyncReport", args=(
        Arg("progress", object, "Told of each step (sync.syncer.progress.Progress).", default=None,
            faces=frozenset({API})),
        Arg("reupload", bool, "Send every file to the store again.", default=False,
            faces=frozenset({API})),
        Arg("embed_on", str, "Embed on a Ray cluster you trust (it sees the code;"
            " ?actors=N). Implies --wait.", default=None, flags=("--embed-on",),
            metavar="ray://HOST:PORT", envvar="CODEVEIL_EMBED_ON", faces=frozenset({CLI, API})),
        Arg("wait", bool, "Block until every chunk has its vectors and the store holds"
            " them, instead of leaving that to the background builder (which search uses"
            " as they land).", default=False, flags=("--wait",)),
        Arg("quiet", bool, "No progress bar.", default=False, flags=("--quiet", "-q"),
            faces=frozenset({CLI})),
    ))

STATUS_OP: Final = Operation(
    method="status", command="status", tool="index_status", result="WorkspaceStatus",
    args=(
        Arg("server", bool, "Also ask the server: its counts, and whether its tree of this"
            " checkout's ref is the one this checkout synced.", default=False,
            flags=("--server",)),
    ))

OPERATIONS: Final = (SEARCH_OP, DEFINITION_OP, OUTLINE_OP, REFERENCES_OP, GREP_OP,
                     INDEX_OP, STATUS_OP)
