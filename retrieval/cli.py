"""The `codeveil` command. Thin: check the arguments, call the library, report.

Every CodeveilError becomes one line on stderr and exit status 1; nothing prints a
traceback unless CODEVEIL_DEBUG=1.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path

import click

from indexer.errors import CodeveilError
from retrieval.api import Index
from retrieval.hits import Hit
from sync.syncer import Progress, SyncReport

EXIT_ERROR = 1


class _Group(click.Group):
    """Turns library errors into one clear line instead of a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except CodeveilError as exc:
            _fail(str(exc))
        except sqlite3.DatabaseError as exc:
            _fail(f"the index files are corrupt ({exc}); delete .codeveil/ and run"
                  " `codeveil index` again")
        except KeyboardInterrupt:
            _fail("interrupted; nothing is lost, run the command again to continue")
        except Exception as exc:
            if os.environ.get("CODEVEIL_DEBUG"):
                raise
            _fail(f"unexpected {type(exc).__name__}: {exc} (CODEVEIL_DEBUG=1 shows a traceback)")


def _fail(message: str) -> None:
    click.echo(f"codeveil: error: {message}", err=True)
    sys.exit(EXIT_ERROR)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="codeveil")
def main() -> None:
    """Private semantic code search.

    codeveil indexes a folder's code into an encrypted index (the server, or the embedded
    store under .codeveil/, only ever holds ciphertext) and searches it by meaning.

    \b
      codeveil index .                      index (or update) the folder
      codeveil search "retry failed uploads"
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
        elapsed = self.bar.tasks[0].elapsed or 0.0
        rate = self.embedded / elapsed if elapsed > 0 else 0.0
        self.bar.update(
            self.task,
            detail=f"chunks: {self.embedded} embedded, {self.cached} cached, {rate:.1f}/s",
        )


@main.command()
@click.argument("path", default=".", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def index(path: Path, as_json: bool, quiet: bool) -> None:
    """Index PATH (default: here), or bring its index up to date.

    The first run creates PATH/.codeveil/ and a workspace key in your config dir.
    Later runs read only files whose size or mtime changed, and send only what differs.
    """
    if not path.exists():
        raise CodeveilError(f"no such folder: {path}")
    idx = Index(path)
    show_bar = not (quiet or as_json) and sys.stderr.isatty()
    if show_bar:
        with _RichProgress() as bar:
            report = idx.index(progress=bar)
    else:
        report = idx.index()
    idx.close()
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        _print_report(report)


def _print_report(r: SyncReport) -> None:
    click.echo(
        f"{r.files_scanned} files scanned, {r.files_changed} changed, {r.files_deleted} deleted,"
        f" {r.files_skipped} skipped; {r.chunks_total} chunks in the index"
        f" ({r.chunks_embedded} embedded, {r.chunks_from_cache} from cache) in {r.seconds:.1f}s"
    )


# -- search -------------------------------------------------------------------------


@main.command()
@click.argument("query")
@click.option("-k", "k", default=10, show_default=True, type=click.IntRange(1, 200),
              help="How many results.")
@click.option("--path", "path_glob", metavar="GLOB", help="Only paths matching GLOB.")
@click.option("--lang", "language", metavar="LANG", help="Only this language (python, go...).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of hits.")
@click.option("-C", "--repo", "repo", default=".", type=click.Path(path_type=Path),
              help="Search the index of this folder (default: the one around here).")
def search(query: str, k: int, path_glob: str | None, language: str | None, as_json: bool,
           repo: Path) -> None:
    """Search the index for QUERY, by meaning.

    Prints path:start-end, the symbol, and the lines as they are on disk now.
    """
    with Index(repo) as idx:
        hits = idx.search(query, k=k, path=path_glob, language=language)
    if as_json:
        click.echo(json.dumps([h.to_dict() for h in hits], indent=2))
        return
    if not hits:
        click.echo("no results", err=True)
        return
    _print_hits(hits, query)


def _print_hits(hits: list[Hit], query: str) -> None:
    from rich.console import Console
    from rich.syntax import Syntax

    console = Console(highlight=False)
    for hit in hits:
        where = f"{hit.path}:{hit.start_line}-{hit.end_line}"
        symbol = f"  [cyan]{hit.symbol}[/cyan]" if hit.symbol else ""
        console.print(f"[bold green]{where}[/bold green]{symbol}  [dim]{hit.score:.3f}[/dim]")
        if hit.stale:
            console.print("  [yellow](changed since indexed; run `codeveil index`)[/yellow]")
            continue
        snippet = hit.text.rstrip("\n").splitlines()[:12]
        lexer = hit.language if hit.language not in ("text", "") else "text"
        console.print(Syntax("\n".join(snippet), lexer, line_numbers=True,
                             start_line=hit.start_line, word_wrap=False,
                             theme="ansi_dark"))
        console.print()


# -- status, init, key --------------------------------------------------------------


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("-C", "--repo", "repo", default=".", type=click.Path(path_type=Path))
def status(as_json: bool, repo: Path) -> None:
    """Show where the index is and what it holds."""
    with Index(repo) as idx:
        info = idx.status()
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        for name, value in info.items():
            click.echo(f"{name:>14}: {value}")


@main.command()
@click.argument("path", default=".", type=click.Path(file_okay=False, path_type=Path))
@click.option("--server", required=True, metavar="URL", help="A `codeveil serve` URL.")
@click.option("--workspace", metavar="ID", help="Join this existing workspace (key imported).")
@click.option("--token", metavar="TOKEN", help="Bearer token of the workspace to join.")
def init(path: Path, server: str, workspace: str | None, token: str | None) -> None:
    """Point PATH at a server (creating its workspace there, or joining one)."""
    from sync.workspace import codeveil_dir

    if (codeveil_dir(path) / "config.json").exists():
        raise CodeveilError(
            f"{path} is already indexed; remove {codeveil_dir(path)} first to re-point it"
        )
    config = Index(path).init(server=server, workspace_id=workspace, token=token)
    click.echo(f"workspace {config.workspace_id} on {server}")


@main.group()
def key() -> None:
    """Show, export or import the workspace key (kept outside the repo)."""


@key.command("show")
@click.option("-C", "--repo", "repo", default=".", type=click.Path(path_type=Path))
def key_show(repo: Path) -> None:
    """Show the workspace id and the key's fingerprint (never the key)."""
    from sync.keys import key_path, load_key
    from sync.workspace import find_root, load_config

    config = load_config(find_root(repo))
    k = load_key(config.workspace_id)
    click.echo(f"workspace:   {config.workspace_id}")
    click.echo(f"fingerprint: {k.key_check.hex()}")
    click.echo(f"stored in:   {key_path(config.workspace_id)}")


@key.command("export")
@click.option("-C", "--repo", "repo", default=".", type=click.Path(path_type=Path))
def key_export(repo: Path) -> None:
    """Print the key to share with a teammate (treat it like a password)."""
    from sync.keys import export_key, load_key
    from sync.workspace import find_root, load_config

    config = load_config(find_root(repo))
    click.echo(f"# workspace {config.workspace_id}", err=True)
    click.echo(export_key(load_key(config.workspace_id)))


@key.command("import")
@click.argument("text")
@click.option("--workspace", metavar="ID", help="Workspace id (default: this repo's).")
@click.option("-C", "--repo", "repo", default=".", type=click.Path(path_type=Path))
def key_import(text: str, workspace: str | None, repo: Path) -> None:
    """Store a key exported by `codeveil key export` (TEXT, or - for stdin)."""
    from sync.keys import import_key
    from sync.workspace import find_root, load_config

    if text == "-":
        text = sys.stdin.read()
    if workspace is None:
        workspace = load_config(find_root(repo)).workspace_id
    import_key(workspace, text.strip())
    click.echo(f"key stored for workspace {workspace}")


# -- serve --------------------------------------------------------------------------


@main.command()
@click.option("--data", "data", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder holding the server's encrypted data.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=7400, show_default=True, type=click.IntRange(0, 65535))
def serve(data: Path, host: str, port: int) -> None:
    """Run the codeveil server: it stores only ciphertext and keyed hashes."""
    from sync.server import serve as run_server

    run_server(data, host=host, port=port)


if __name__ == "__main__":
    main()
