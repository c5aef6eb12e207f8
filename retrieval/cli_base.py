"""What the `codeveil` command's modules share: the group that turns library errors into
one line, the failure exit, the shared options and JSON output."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from indexer.errors import CodeveilError

if TYPE_CHECKING:
    from retrieval.api import Index

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
            _fail(f"an index file is corrupt ({exc}); `codeveil doctor` finds which,"
                  " `codeveil doctor --repair` rebuilds it")
        except KeyboardInterrupt:
            _fail("interrupted; nothing is lost, run the command again to continue")
        except Exception as exc:
            if os.environ.get("CODEVEIL_DEBUG"):
                raise
            _fail(f"unexpected {type(exc).__name__}: {exc} (CODEVEIL_DEBUG=1 shows a traceback)")


def _index(*args: Any, **kwargs: Any) -> Index:
    """`retrieval.api.Index`, imported on first use: the model, store and ranking stack
    take about a second to import, which `--help` and `daemon status` need not pay."""
    from retrieval.api import Index

    return Index(*args, **kwargs)


def _fail(message: str) -> NoReturn:
    click.echo(f"codeveil: error: {message}", err=True)
    sys.exit(EXIT_ERROR)



_REPO_OPTION = click.option("-C", "--repo", "repo", default=".",
                            type=click.Path(path_type=Path),
                            help="Use the index of this folder (default: the one around here).")
_JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))
