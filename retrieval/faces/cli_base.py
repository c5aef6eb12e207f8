"""What the `codeveil` command's modules share: the group that turns library errors into
one line, the failure exit, the shared options and JSON output."""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, cast

import click

from indexer.errors import CodeveilError
from retrieval.faces.operations import CLI, Arg, Operation

if TYPE_CHECKING:
    from retrieval.faces.api import Index
    from sync.syncer.sync_report import SyncReport

EXIT_ERROR = 1
F = TypeVar("F", bound=Callable[..., Any])


class _Group(click.Group):
    """Turns library errors into one clear line instead of a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a closed pipe shows here, not in the exit's own flush
            return result
        except BrokenPipeError:
            _pipe_closed()
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except CodeveilError as exc:
            _fail(str(exc))
        except sqlite3.DatabaseError as exc:
            _fail(f"an index file is corrupt ({exc}); `codeveil doctor` finds which,"
                  " `codeveil doctor --repair` rebuilds it")
        except KeyboardInterrupt:
            _fail("interrupted; nothing is lost, run the command again to continue")
        except Exception as exc:
            if os.environ.get("CODEVEIL_DEBUG"):
                raise
            _fail(f"unexpected {type(exc).__name__}: {exc} (CODEVEIL_DEBUG=1 shows a traceback)")


def _index(*args: Any, **kwargs: Any) -> Index:
    """`retrieval.faces.api.Index`, imported on first use: the model, store and ranking stack
    take about a second to import, which `--help` and `daemon status` need not pay."""
    from retrieval.faces.api import Index

    return Index(*args, **kwargs)


def _pipe_closed() -> NoReturn:
    """The reader of stdout stopped reading (`codeveil status | head -1`): what it read
    is what it asked for, so exit 0, quietly, as Unix tools do. Stdout goes to /dev/null
    first, or the interpreter's flush at exit would fail on the same pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (a test's captured stdout)
        pass
    finally:
        os.close(devnull)
    sys.exit(0)


def _fail(message: str) -> NoReturn:
    click.echo(f"codeveil: error: {message}", err=True)
    sys.exit(EXIT_ERROR)


def repo_option(help: str = "Use the index of this folder (default: the one around here).",
                *, multiple: bool = False) -> Callable[[F], F]:
    """`-C/--repo`: the folder whose index a command works on, the same in every command."""
    return click.option("-C", "--repo", "repos" if multiple else "repo",
                        default=None if multiple else ".", multiple=multiple,
                        type=click.Path(file_okay=False, path_type=Path), help=help)


def folder_params(help: str = "Use the index of this folder (default: the one around"
                               " here).") -> Callable[[F], F]:
    """`-C/--repo`, with a positional PATH still taken for it: the spelling of the
    commands that took PATH first (`codeveil index .`). The command's function gets
    `repo`; both given, they must name one folder."""
    def decorate(func: F) -> F:
        @functools.wraps(func)
        def given(*args: Any, repo: Path | None, path: Path | None, **kwargs: Any) -> Any:
            if repo is not None and path is not None and repo.resolve() != path.resolve():
                raise click.UsageError(f"two folders given: -C {repo} and {path}")
            return func(*args, repo=repo or path or Path("."), **kwargs)

        folder = click.Path(file_okay=False, path_type=Path)
        given = click.argument("path", required=False, metavar="[PATH]", type=folder)(given)
        return cast(F, click.option("-C", "--repo", "repo", default=None, help=help,
                                    type=folder)(given))
    return decorate


def json_option(help: str = "Print JSON.") -> Callable[[F], F]:
    """`--json`: the answer as JSON on stdout, the same in every command."""
    return click.option("--json", "as_json", is_flag=True, help=help)


_REPO_OPTION = repo_option()
_JSON_OPTION = json_option()


class _AliasedOption(click.Option):
    """An option that still takes its old spellings (`aliases`), which --help leaves out:
    a script written for them keeps working."""

    def __init__(self, param_decls: Sequence[str], *, aliases: tuple[str, ...] = (),
                 **attrs: Any) -> None:
        super().__init__([*param_decls[:-1], *aliases, param_decls[-1]], **attrs)
        self.aliases = aliases

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        shown = self.opts
        self.opts = [o for o in shown if o not in self.aliases]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = shown


class LibraryDefault(click.Option):
    """An option whose default is a constant of the library (`default_from`,
    "module:NAME"), read when the default is first needed: the value is written once,
    there, --help still shows it, and a command that never needs it (`codeveil search`
    beside `daemon run`'s options) does not import that module."""

    def __init__(self, param_decls: Sequence[str], *, default_from: str,
                 **attrs: Any) -> None:
        super().__init__(param_decls, show_default=True, **attrs)
        self.default_from = default_from

    def get_default(self, ctx: click.Context, call: bool = True) -> Any:
        import importlib

        module, name = self.default_from.split(":")
        return getattr(importlib.import_module(module), name)


def operation_params(op: Operation) -> Callable[[F], F]:
    """The command's arguments and options of `op`, built from its table entry
    (retrieval.faces.operations): each reaches the command's function by the library's name."""
    def decorate(func: F) -> F:
        for arg in reversed(op.face_args(CLI)):
            func = _param(arg)(func)
        return func
    return decorate


def _param(arg: Arg) -> Callable[[F], F]:
    kind = click.Path(path_type=Path) if arg.type is Path else arg.type
    if arg.positional:
        return click.argument(arg.name, type=kind)
    if arg.type is bool:
        return click.option(*arg.flags, arg.name, is_flag=True, default=arg.default,
                            help=arg.help)
    attrs: dict[str, Any] = {"default": arg.default, "help": arg.help, "metavar": arg.metavar,
                             "envvar": arg.envvar}
    if arg.count is not None:
        # A count that defaults to everything has no most for a person (grep).
        most = None if arg.default is None else arg.count.most
        attrs.update(type=click.IntRange(1, most), show_default=arg.default is not None)
    elif arg.choices:
        attrs.update(type=click.Choice(arg.choices), show_default=True)
    if arg.repeat:
        attrs.update(multiple=True, default=(), help=f"{arg.help} Repeat it for several.")
    return click.option(*arg.flags, arg.name, cls=_AliasedOption, aliases=arg.aliases,
                        **attrs)


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def print_report(r: SyncReport) -> None:
    """One line of what an index did, for a person.

    "changed" counts the files whose content was new to this machine (read and chunked
    here or taken from another worktree). A sync's `files_changed` counts the files it
    sent to the store, which after the words pass of `codeveil index` are files that did
    not change at all: those are said apart, as sent."""
    changed = r.files_parsed + r.files_reused
    sent = (f"; {r.files_changed} sent to the store" if r.files_changed != changed
            else "")
    click.echo(
        f"{r.files_scanned} files scanned, {changed} changed, {r.files_deleted} deleted,"
        f" {r.files_skipped} skipped{sent}; {r.chunks_total} chunks in the index"
        f" ({r.chunks_embedded} embedded, {r.chunks_from_cache} from cache"
        + (f", {r.chunks_pulled} pulled from the workspace" if r.chunks_pulled else "")
        + f") in {r.seconds:.1f}s"
        + (f"; {r.files_reused} files' chunks taken from another worktree"
           if r.files_reused else "")
    )
