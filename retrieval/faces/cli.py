"""The `codeveil` command. Thin: check the arguments, call the library, report.

This module holds the group and the index, search, status, init, key, serve and mcp
commands; `retrieval.faces.cli_tools` the lookups beside search, `retrieval.faces.cli_daemon` the
daemon's, `retrieval.faces.cli_base` what they share.

Every CodeveilError becomes one line on stderr and exit status 1; nothing prints a
traceback unless CODEVEIL_DEBUG=1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from indexer.errors import CodeveilError
from retrieval.faces.cli_agent import agent
from retrieval.faces.cli_base import (
    EXIT_ERROR,
    LibraryDefault,
    _fail,
    _Group,
    _index,
    _pipe_closed,
    folder_params,
    json_option,
    operation_params,
    print_report,
    repo_option,
)
from retrieval.faces.cli_daemon import daemon
from retrieval.faces.cli_refs import refs
from retrieval.faces.cli_team import invite, join
from retrieval.faces.cli_tools import definition, grep, outline, uses
from retrieval.faces.operations import INDEX_OP, SEARCH_OP, STATUS_OP
from sync.syncer.progress import Progress

if TYPE_CHECKING:
    from retrieval.search.coverage import Coverage
    from retrieval.search.hits import Hit


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="codeveil")
def main() -> None:
    """Private semantic code search.

    codeveil indexes a folder's code into an encrypted index (the server, or the embedded
    store under .codeveil/, only ever holds ciphertext) and searches it by meaning.

    \b
      codeveil index .                      index (or update) the folder
      codeveil search "retry failed uploads"
      codeveil def Session.send             where a symbol is defined
      codeveil outline src/app.py           what a file defines
      codeveil uses send                    list the references to a name
      codeveil grep 'retr(y|ies)' --path '*.py'   regex over the indexed files
    """

# -- index --------------------------------------------------------------------------


class _RichProgress(Progress):
    """A progress bar: files scanned, files done, chunks embedded and cached, rate, ETA."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            SpinnerColumn,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = __import__("rich.progress", fromlist=["Progress"]).Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self.task = self.bar.add_task("scanning", total=None, detail="")
        self.embedded = 0
        self.cached = 0
        self.rate = 0.0
        self.where = ""

    def __enter__(self) -> _RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def scanned(self, files: int) -> None:
        self.bar.update(self.task, description=f"scanned {files} files", detail="")

    def planned(self, files: int, chunks_hint: int) -> None:
        self.bar.update(self.task, description="indexing files", total=files, completed=0)

    def files_done(self, n: int) -> None:
        self.bar.advance(self.task, n)

    def chunks_done(self, embedded: int, cached: int) -> None:
        self.embedded += embedded
        self.cached += cached
        if not self.rate:  # until the first batch is sent, the rate since the start
            elapsed = self.bar.tasks[0].elapsed or 0.0
            self.rate = self.embedded / elapsed if elapsed > 0 else 0.0
        self._show()

    def stages(self, seconds: dict[str, float], embed_chunks_per_s: float) -> None:
        self.rate = embed_chunks_per_s
        self.where = " ".join(f"{name} {s:.1f}s" for name, s in seconds.items())
        self._show()

    def _show(self) -> None:
        detail = f"chunks: {self.embedded} embedded, {self.cached} cached, {self.rate:.1f}/s"
        if self.where:
            detail += f" | {self.where}"
        self.bar.update(self.task, detail=detail)


@main.command(name=INDEX_OP.command)
@folder_params("Index this folder (default: here).")
@operation_params(INDEX_OP)
@json_option("Print a machine-readable summary.")
def index(repo: Path, embed_on: str | None, wait: bool, quiet: bool, as_json: bool) -> None:
    """Index the folder (-C, or PATH; default: here), or bring its index up to date.

    Returns once the words, names and structure are indexed (seconds): search answers
    by them at once, and by meaning as the vectors land. The model's work and the sync
    run in a background builder (`codeveil status` shows it; `codeveil daemon stop`
    stops it); --wait blocks until they are done.

    The first run creates .codeveil/ in the folder and a workspace key in your config
    dir. Later runs read only files whose size or mtime changed, and send only what
    differs.
    """
    if not repo.exists():
        raise CodeveilError(f"no such folder: {repo}")
    wait = wait or bool(embed_on)
    idx = _index(repo)
    show_bar = wait and not (quiet or as_json) and sys.stderr.isatty()
    if show_bar:
        with _RichProgress() as bar:
            report = idx.index(wait=True, progress=bar, embed_on=embed_on)
    else:
        report = idx.index(embed_on=embed_on, wait=wait)
    from sync.records import MODE_SEALED

    mode = idx.mode
    builder = None if wait else idx.builder()
    coverage = idx.coverage() if builder is not None else None
    idx.close()
    if as_json:
        out = {**report.to_dict(), "mode": mode}
        if coverage is not None and builder is not None:
            out["searchable_now"] = ["words", "names", "structure", "static meaning"] + (
                [] if coverage.partial else ["vectors"])
            out["vectors"] = {**coverage.to_dict(), "builder": builder}
        click.echo(json.dumps(out, indent=2))
    else:
        print_report(report)
        if coverage is not None and builder is not None:
            click.echo(_builder_line(coverage.chunks, coverage.chunks_with_vectors, builder))
        if mode != MODE_SEALED:
            click.echo(_SERVER_SEARCH_NOTE, err=True)
    if report.offline:
        click.echo(f"codeveil: {report.offline}; this machine's index is up to date and"
                   " the changes are sent when the server answers (`codeveil index`)",
                   err=True)


def _builder_line(chunks: int, with_vectors: int, builder: dict[str, object]) -> str:
    """What `codeveil index` leaves to the builder, in one line."""
    if with_vectors >= chunks:
        return "searchable now by words, names, structure and meaning"
    now = (f"searchable now by words, names, structure and a quick model of meaning; by"
           f" the full model for {with_vectors} of {chunks} chunks")
    if builder.get("running"):
        return (f"{now}; vectors are being built in the background (process"
                f" {builder.get('pid')}): `codeveil status` shows how far, `codeveil index"
                " --wait` waits")
    if builder.get("given_up"):
        return f"{now}; the vector builder was given up ({builder['given_up']}): run" \
               " `codeveil index --wait`"
    return f"{now}; run `codeveil index --wait` to build the vectors"


_SERVER_SEARCH_NOTE = (
    "note: this workspace ranks on the server (server-search), which a server that knows"
    " some of the code can exploit (docs/threat-model.md). To seal it: remove .codeveil/"
    " and run `codeveil index` again (vectors come from the cache: nothing is embedded"
    " twice)."
)


# -- search -------------------------------------------------------------------------


@main.command(name=SEARCH_OP.command)
@operation_params(SEARCH_OP)
@json_option('Print JSON: {"hits": [...], "index": {"partial", "chunks", ...}}.')
@repo_option("Search the index of this folder (default: the one around here); repeat it"
             " to search several repositories as one.", multiple=True)
def search(query: str, k: int, path: str | None, language: str | None,
           kind: tuple[str, ...], group: str, as_json: bool, repos: tuple[Path, ...]) -> None:
    """Search the index for QUERY, by meaning and by name.

    QUERY may be a question, an identifier, an error message or a whole stack trace.
    Prints path:start-end, the symbol, and the lines as they are on disk now. With
    several -C, one ranking over all of them; each hit names its repository.
    """
    if len(repos) > 1:
        _search_many(query, k, path, language, kind, group, as_json, repos)
        return
    with _index(repos[0] if repos else Path(".")) as idx:
        hits = idx.search(query, k=k, path=path, language=language, kind=kind or None,
                          group=group)
        coverage = idx.coverage()
        offline = idx.offline
    if offline is not None:
        click.echo(offline.note(), err=True)
    if as_json:
        out = {"hits": [h.to_dict() for h in hits], "index": coverage.to_dict()}
        if offline is not None:
            out["offline"] = offline.to_dict()
        click.echo(json.dumps(out, indent=2))
        return
    if coverage.partial:
        click.echo(_partial_note(coverage), err=True)
    if not hits:
        click.echo(_no_results(repos[0] if repos else Path("."), path), err=True)
        return
    _print_hits(hits, query)


def _no_results(repo: Path, path: str | None) -> str:
    """"no results", and why when it is the --path glob: it matches no indexed file (a
    glob of a folder the tree does not have, or not relative to the repo's root)."""
    if path is None:
        return "no results"
    from indexer.local_chunks import open_state_db
    from retrieval.indexes.filters import HitFilter
    from sync.checkout.config import find_root, state_path

    keeps = HitFilter(path, None, None).keeps_path
    db = open_state_db(state_path(find_root(repo)))
    try:
        paths = [p for (p,) in db.execute("SELECT path FROM chunk_files ORDER BY path")]
    finally:
        db.close()
    if any(keeps(p) for p in paths):
        return "no results"
    example = f" (they are relative to the repo's root, as {paths[0]!r})" if paths else ""
    return f"no results: --path {path!r} matches no indexed file{example}"


def _search_many(query: str, k: int, path: str | None, language: str | None,
                 kind: tuple[str, ...], group: str, as_json: bool,
                 repos: tuple[Path, ...]) -> None:
    from retrieval.faces.multi import MultiIndex

    with MultiIndex(repos) as many:
        hits = many.search(query, k=k, path=path, language=language,
                           kind=kind or None, group=group)
        coverage = many.coverage()
        offline = many.offline()
    for root, unreachable in offline.items():
        click.echo(f"{root}: {unreachable.note()}", err=True)
    if as_json:
        out = {"hits": [h.to_dict() for h in hits],
               "index": {r: c.to_dict() for r, c in coverage.items()}}
        if offline:
            out["offline"] = {r: u.to_dict() for r, u in offline.items()}
        click.echo(json.dumps(out, indent=2))
        return
    for root, cov in coverage.items():
        if cov.partial:
            click.echo(f"{root}: {_partial_note(cov)}", err=True)
    if not hits:
        click.echo("no results", err=True)
        return
    _print_hits(hits, query, names=_repo_names([Path(r) for r in coverage]))


def _repo_names(roots: list[Path]) -> dict[str, str]:
    """How each repository is shown before its hits' paths: its folder's name, or its
    whole path where two share a name."""
    names = [r.name for r in roots]
    return {str(r): (r.name if names.count(r.name) == 1 else str(r)) for r in roots}


def _partial_note(coverage: Coverage) -> str:
    return (f"index is partial: {coverage.chunks_with_vectors} of {coverage.chunks}"
            " chunks have the full model's vectors so far (all are searched by name, words"
            " and a quick model of meaning); results improve as the vectors are built"
            " (`codeveil status` shows how far)")


def _print_hits(hits: list[Hit], query: str, *, names: dict[str, str] | None = None) -> None:
    from rich.console import Console
    from rich.syntax import Syntax

    console = Console(highlight=False)
    # Rich's own handler of a closed pipe exits 1; a reader that stopped is no error.
    console.on_broken_pipe = _pipe_closed  # type: ignore[method-assign]
    for hit in hits:
        where = f"{hit.path}:{hit.start_line}-{hit.end_line}"
        if hit.repo is not None and names:
            where = f"{names[hit.repo]}/{where}"
        symbol = f"  [cyan]{hit.symbol}[/cyan]" if hit.symbol else ""
        console.print(f"[bold green]{where}[/bold green]{symbol}  [dim]{hit.score:.3f}[/dim]")
        if hit.stale:
            console.print("  [yellow](changed since indexed; run `codeveil index`)[/yellow]")
            continue
        snippet = hit.text.rstrip("\n").splitlines()[:12]
        lexer = hit.language if hit.language not in ("text", "") else "text"
        # Piped (no terminal: 80 columns), a long line is wrapped, not cut: a script
        # or an agent reading the output gets every character of it.
        console.print(Syntax("\n".join(snippet), lexer, line_numbers=True,
                             start_line=hit.start_line, word_wrap=not console.is_terminal,
                             theme="ansi_dark"))
        console.print()

# -- doctor ---------------------------------------------------------------------------


@main.command()
@click.option("--repair", is_flag=True,
              help="Rebuild what is damaged (moved aside first, never deleted).")
@repo_option()
@click.option("--data", "data", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Check a server's data dir instead (read only).")
def doctor(repair: bool, repo: Path, data: Path | None) -> None:
    """Check every file of the index and its store; --repair rebuilds what it can.

    Exits 0 when everything is (or was repaired to be) in order, 1 otherwise.
    """
    from retrieval.faces.doctor import check_data_dir
    from retrieval.faces.doctor import doctor as run_doctor

    if data is not None and repair:
        raise click.UsageError("--repair works on a repo's index; a server's data dir is"
                               " restored from a backup")
    report = check_data_dir(data) if data is not None else run_doctor(repo, repair=repair)
    for line in report.lines():
        click.echo(line)
    if report.index is not None:
        print_report(report.index)
    if not report.healthy:
        hint = "" if repair else "; `codeveil doctor --repair` rebuilds what can be rebuilt"
        _fail(f"problems found in the index at {report.root}{hint}")


# -- status, init, key --------------------------------------------------------------


@main.command(name=STATUS_OP.command)
@operation_params(STATUS_OP)
@json_option("Print JSON: what the MCP tool index_status answers.")
@repo_option()
def status(server: bool, as_json: bool, repo: Path) -> None:
    """Show where the index is and what it holds (from this machine alone; --server
    asks the server too, and exits 1 when its tree is not this checkout's)."""
    from retrieval.faces.api import status_json

    with _index(repo) as idx:
        info = idx.status(server=server)
        offline = idx.offline
        out = status_json(idx, info)
    builder = out["builder"]
    assert isinstance(builder, dict)
    if offline is not None:
        click.echo(offline.note(), err=True)
    if as_json:
        click.echo(json.dumps(out, indent=2))
    else:
        for name, value in info.items():
            if name == "offline":
                continue  # said on stderr
            if name == "server_tree" and value is not None:
                value = value["summary"]
            if value is None and offline is not None and name.startswith("server_"):
                value = "unknown (server unreachable)"
            if value is not None:  # `ref` of a store of one tree
                click.echo(f"{name:>14}: {value}")
        if builder.get("state"):
            click.echo(f"{'builder':>14}: {_builder_progress(builder)}")
    # A sealed store's chunks are counted from this machine's state (its page index):
    # with the state lost, the store's own row count says it holds something.
    held = info.server_chunks or info.server_rows
    if not info.files and not held and not _was_indexed(Path(info.root)):
        from sync.checkout.index_state import never_completed_message

        _fail(never_completed_message(Path(info.root)))
    if not info.files and held:
        # The same state search refuses, in its words: a script must see it in the exit
        # code, not read "files: 0" as an empty index.
        from retrieval.faces.api import lost_state_message

        _fail(lost_state_message(Path(info.root), held))
    if info.server_tree is not None and not info.server_tree["in_step"]:
        _fail(f"{info.server_tree['summary']}; `codeveil index` sends this checkout's"
              " files again (`codeveil doctor` for more)")



def _was_indexed(root: Path) -> bool:
    from indexer.local_chunks import open_state_db
    from sync.checkout.config import state_path
    from sync.checkout.index_state import was_completed

    db = open_state_db(state_path(root))
    try:
        return was_completed(db)
    finally:
        db.close()


def _builder_progress(b: dict[str, object]) -> str:
    """The vector builder's state in one line: `codeveil status`."""
    if b.get("given_up"):
        return f"given up: {b['given_up']} (run `codeveil index --wait`)"
    state = "running" if b.get("running") else str(b.get("state"))
    if state == "running":
        running = f"running (process {b.get('pid')})"
        done, todo, rate = b.get("chunks_done"), b.get("chunks_todo"), b.get("chunks_per_s")
        if not done and not rate:
            # Loading the model and reading the files: no chunk is embedded yet, so a
            # rate of 0.0/s would read as a builder that is stuck.
            todo_line = f"; {todo} chunks to build" if todo else ""
            return f"{running}: preparing (loading the model){todo_line}"
        if not rate:
            return f"{running}: {done} of {todo} chunks, no rate yet"
        left = b.get("seconds_left")
        return (f"{running}: {done} of {todo} chunks, {rate}/s"
                + (f", about {int(left) // 60}m{int(left) % 60:02d}s left"  # type: ignore[call-overload]
                   if left is not None else ""))
    if state == "offline":
        return f"done on this machine; the server was unreachable ({b.get('offline')})"
    if state in ("failed", "starting"):
        return f"not running (last run: {b.get('error') or 'killed'}); `codeveil index` resumes"
    return state


@main.command()
@folder_params("Set up this folder (default: here).")
@click.option("--server", metavar="URL",
              help="A `codeveil serve` URL (default: a store inside the folder's"
                   " .codeveil/).")
@click.option("--workspace", metavar="ID", help="Join this existing workspace (key imported).")
@click.option("--token", metavar="TOKEN", help="Bearer token of the workspace to join.")
@click.option("--server-search", is_flag=True,
              help="Let the server rank encrypted vectors (for repos too big for this"
                   " machine's memory). It leaks distance structure: see"
                   " docs/threat-model.md. Default: sealed, search runs here.")
def init(repo: Path, server: str | None, workspace: str | None, token: str | None,
         server_search: bool) -> None:
    """Set up the folder's index (-C, or PATH; default: here): create its workspace (on
    a server, or embedded), or join one.

    A new workspace is sealed: the server stores one encrypted envelope per chunk, which
    it cannot compare or rank, and every search runs on this machine. A teammate who
    joins pulls the vectors instead of embedding them again. `codeveil index` runs this
    on first use with the defaults.
    """
    if workspace and server_search:
        raise click.UsageError("--server-search applies to a new workspace; a joined one"
                               " keeps its own mode")
    config = _index(repo).init(server=server, workspace_id=workspace, token=token,
                               server_search=server_search)
    click.echo(f"workspace {config.workspace_id} ({config.mode}) on {server or 'this machine'}")


@main.group()
def key() -> None:
    """Show, export or import the workspace key (kept outside the repo)."""


@key.command("show")
@repo_option()
def key_show(repo: Path) -> None:
    """Show the workspace id and the key's fingerprint (never the key)."""
    from sync.checkout.config import find_root, load_config
    from sync.crypto.keys import key_path, load_key

    config = load_config(find_root(repo))
    k = load_key(config.workspace_id)
    click.echo(f"workspace:   {config.workspace_id}")
    click.echo(f"fingerprint: {k.key_check.hex()}")
    click.echo(f"stored in:   {key_path(config.workspace_id)}")


@key.command("export")
@repo_option()
def key_export(repo: Path) -> None:
    """Print the key to share with a teammate (treat it like a password)."""
    from sync.checkout.config import find_root, load_config
    from sync.crypto.keys import export_key, load_key

    config = load_config(find_root(repo))
    click.echo(f"# workspace {config.workspace_id}", err=True)
    click.echo(export_key(load_key(config.workspace_id)))


@key.command("import")
@click.argument("text")
@click.option("--workspace", metavar="ID", help="Workspace id (default: this repo's).")
@repo_option()
def key_import(text: str, workspace: str | None, repo: Path) -> None:
    """Store a key exported by `codeveil key export` (TEXT, or - for stdin)."""
    from sync.checkout.config import find_root, load_config
    from sync.crypto.keys import import_key

    if text == "-":
        text = sys.stdin.read()
    if workspace is None:
        workspace = load_config(find_root(repo)).workspace_id
    import_key(workspace, text.strip())
    click.echo(f"key stored for workspace {workspace}")


# -- serve --------------------------------------------------------------------------


@main.command()
@click.option("--data", "data", type=click.Path(file_okay=False, path_type=Path),
              help="Folder holding the server's encrypted data.")
@click.option("--store", "store", metavar="URL|DIR", envvar="CODEVEIL_STORE",
              help="A PostgreSQL database (postgresql://...) that any number of replicas"
                   " share, or a data dir; read from CODEVEIL_STORE if not given (which"
                   " keeps a password out of `ps`).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", cls=LibraryDefault, default_from="sync.server.app:DEFAULT_PORT",
              type=click.IntRange(0, 65535))
@click.option("--max-workspaces", type=click.IntRange(0), default=None,
              help="Refuse to create workspaces beyond this many.")
@click.option("--open", "allow_open", is_flag=True,
              help="Let anyone who reaches a non-loopback --host create workspaces"
                   " (without it such a server needs CODEVEIL_ADMIN_TOKEN).")
def serve(data: Path | None, store: str | None, host: str, port: int,
          max_workspaces: int | None, allow_open: bool) -> None:
    """Run the codeveil server: it stores only ciphertext and keyed hashes.

    With CODEVEIL_ADMIN_TOKEN set, only clients that send that token (the same variable,
    on their side) can create workspaces. A server on a host other than loopback refuses
    to start without that token, unless given --open.
    """
    from sync.server.app import serve as run_server

    given = click.get_current_context().get_parameter_source("store")
    if data is not None and store and given == click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("give --data or --store, not both")
    spec: str | Path | None = data if data is not None else store
    if not spec:
        raise click.UsageError("give --data DIR or --store URL (or set CODEVEIL_STORE)")
    run_server(spec, host=host, port=port, max_workspaces=max_workspaces,
               allow_open=allow_open)


@main.command()
@repo_option("Serve the index of this folder (default: the one around here).")
def mcp(repo: Path) -> None:
    """Run a Model Context Protocol server on stdio, for coding agents.

    Tools: search, definition, outline, references, grep, index_status, sync_index.
    See docs/mcp.md for client configuration.
    """
    from retrieval.faces.mcp_server import run

    run(repo)


__all__ = ["EXIT_ERROR", "main"]

# The commands of their own modules (the help lists every command by name).
for _command in (definition, outline, uses, grep, daemon, refs, invite, join, agent):
    main.add_command(_command)


if __name__ == "__main__":
    main()
