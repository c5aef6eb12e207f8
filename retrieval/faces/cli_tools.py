"""`codeveil def|outline|uses|grep`: the lookups beside search."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from retrieval.faces.cli_base import _JSON_OPTION, _REPO_OPTION, _echo_json, operation_params
from retrieval.faces.operations import DEFINITION_OP, GREP_OP, OUTLINE_OP, REFERENCES_OP

if TYPE_CHECKING:
    from retrieval.agent.agent_tools import AgentTools

# -- agent tools: def, outline, uses, grep ------------------------------------------
# Answered from the client state and the grep index alone (retrieval.agent.agent_tools): no
# model or store is loaded, and no server is asked.

def _tools(repo: Path) -> AgentTools:
    from retrieval.agent.agent_tools import AgentTools

    return AgentTools(repo, watch=False)  # one call: watches would never be read


@click.command(name=DEFINITION_OP.command)
@operation_params(DEFINITION_OP)
@_JSON_OPTION
@_REPO_OPTION
def definition(name: str, limit: int, as_json: bool, repo: Path) -> None:
    """Where NAME is defined: send, Session.send, Sinatra::Base, pkg.Func.

    From the syntax trees read at index time; best candidate first (the whole name
    over a tail of it, source over tests and docs).
    """
    hits = _tools(repo).definition(name, limit=limit)
    out = {"name": name, "definitions": [h.to_dict() for h in hits]}
    if as_json:
        _echo_json(out)
        return
    if not hits:
        click.echo(f"no definition of {name} in the index", err=True)
        return
    for hit in hits:
        stale = "  (changed since indexed)" if hit.stale else ""
        click.echo(f"{hit.path}:{hit.start_line}-{hit.end_line}  {hit.kind}  {hit.symbol}{stale}")
        click.echo(f"    {hit.signature}")


@click.command(name=OUTLINE_OP.command)
@operation_params(OUTLINE_OP)
@_JSON_OPTION
@_REPO_OPTION
def outline(path: Path, as_json: bool, repo: Path) -> None:
    """The symbols of the file at PATH, with their lines and signatures."""
    result = _tools(repo).outline(path.absolute())
    out = result.to_dict()
    if as_json:
        _echo_json(out)
        return
    if result.reparsed:
        click.echo(f"{result.path} changed since indexed: parsed as it is now", err=True)
    for entry in result.symbols:
        where = f"{entry.start_line}-{entry.end_line}"
        click.echo(f"{where:>11}  {'  ' * entry.depth}{entry.kind} {entry.name}  "
                   f"| {entry.signature}")


@click.command(name=REFERENCES_OP.command)
@operation_params(REFERENCES_OP)
@_JSON_OPTION
@_REPO_OPTION
def uses(name: str, path: str | None, limit: int, as_json: bool, repo: Path) -> None:
    """List the references to NAME: the chunks that use it.

    In languages with a grammar only identifiers count (not comments or strings);
    elsewhere whole words, marked approximate. The definition itself is left out.
    """
    hits = _tools(repo).references(name, path=path, limit=limit)
    out = {"name": name, "references": [h.to_dict() for h in hits]}
    if as_json:
        _echo_json(out)
        return
    if not hits:
        click.echo(f"no uses of {name} in the index", err=True)
        return
    for hit in hits:
        note = ("  (approximate)" if hit.approximate else "") + (
            "  (resolved)" if hit.resolved else "")
        symbol = f"  {hit.symbol}" if hit.symbol else ""
        click.echo(f"{hit.path}:{hit.start_line}-{hit.end_line}{symbol}{note}")
        for line in hit.text.split("\n"):
            click.echo(f"    {line}")
        if hit.truncated:
            click.echo(f"    ... and {len(hit.lines) - len(hit.text.splitlines())} more")


@click.command(name=GREP_OP.command)
@operation_params(GREP_OP)
@_JSON_OPTION
@_REPO_OPTION
def grep(pattern: str, path: str | None, ignore_case: bool, limit: int | None,
         as_json: bool, repo: Path) -> None:
    """The lines of the indexed files matching the regular expression PATTERN.

    Python regex syntax, matched line by line; files are read as they are on disk now,
    and only those the index cannot rule out are read. Prints path:line:text.
    """
    result = _tools(repo).grep(pattern, path=path, ignore_case=ignore_case, limit=limit)
    out = result.to_dict()
    if as_json:
        _echo_json(out)
        return
    for match in result.matches:
        click.echo(f"{match.path}:{match.line}:{match.text}")
    if result.truncated:
        click.echo(f"stopped after {limit} lines (-k/--limit)", err=True)
