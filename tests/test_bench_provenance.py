"""Every benchmark result says where it came from: `bench._common.write_json` and
`save_figure` record the commit, the command line, the date and the machine's load, no
benchmark writes a result around them, every file in bench/results/ carries that record,
and the docs name only result files that are there (or, for a retired one, the commit
that holds it in git history)."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

import bench._common as common

BENCH = Path(common.__file__).resolve().parent


def test_a_result_records_commit_command_date_and_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(sys, "argv", ["bench/example.py", "--trials", "3"])
    path = common.write_json("example", {"figure": 0.5})
    written = json.loads(path.read_text())
    assert path.parent == tmp_path / "results" and written["figure"] == 0.5
    prov = written["provenance"]
    assert prov["command"] == "python bench/example.py --trials 3"
    assert datetime.strptime(prov["date"], "%Y-%m-%dT%H:%M:%SZ")
    assert set(prov["load"]) == {"1min", "5min", "15min"}
    assert all(isinstance(v, float) and v >= 0 for v in prov["load"].values())
    assert prov["machine"]["cpus"] >= 1 and "numpy" in prov["machine"]["packages"]
    if shutil.which("git") and (BENCH.parent / ".git").exists():
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCH.parent,
                              capture_output=True, text=True, check=True).stdout.strip()
        assert prov["commit"] == head
        assert isinstance(prov["dirty"], bool)


def test_a_figure_carries_its_provenance(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = common.save_figure(fig, "example")
    plt.close(fig)
    meta = json.loads(Image.open(path).text["Description"])
    assert {"commit", "command", "date", "load"} <= set(meta)


def _calls(tree: ast.AST, name: str) -> list[int]:
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == name]


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")
                                          if p.name != "_common.py"))
def test_no_benchmark_writes_a_result_around_the_helpers(script: str) -> None:
    tree = ast.parse((BENCH / script).read_text())
    assert not _calls(tree, "savefig"), f"{script}: use bench._common.save_figure"
    assert not _calls(tree, "dump"), f"{script}: use bench._common.write_json"


FULL = {"commit", "command", "date", "machine", "load"}
ROOT = BENCH.parent
DOCS = ROOT / "docs" / "benchmarks.md"
IN_GIT = shutil.which("git") is not None and (ROOT / ".git").exists()


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def _result_files(*suffixes: str) -> list[Path]:
    """The result files in the repository (git's list where there is one: a local run's
    uncommitted result is no business of this test), else those on disk."""
    if IN_GIT:
        listed = _git("ls-files", "bench/results").stdout.split()
        files = [ROOT / name for name in listed]
    else:
        files = [p for p in (BENCH / "results").iterdir() if p.is_file()]
    return sorted(p for p in files if not suffixes or p.suffix in suffixes)


def _assert_full(prov: object, name: str) -> None:
    assert isinstance(prov, dict), f"{name}: no provenance"
    assert set(prov) >= FULL, f"{name}: lacks {sorted(FULL - set(prov))}"
    # A commit id (a run from a `git archive` of another commit names that one, with why).
    assert isinstance(prov["commit"], str) and re.match(r"[0-9a-f]{7,40}\b", prov["commit"]), name
    assert isinstance(prov["command"], str) and prov["command"].startswith("python "), name
    assert datetime.strptime(prov["date"], "%Y-%m-%dT%H:%M:%SZ"), name
    assert set(prov["load"]) == {"1min", "5min", "15min"}, name


def test_every_result_file_is_a_json_or_a_figure() -> None:
    # A log or a table pasted into a file has nowhere to keep its provenance.
    others = [p.name for p in _result_files() if p.suffix not in (".json", ".png")]
    assert not others, f"results that cannot record their provenance: {others}"


@pytest.mark.parametrize("path", _result_files(".json"), ids=lambda p: p.name)
def test_every_result_records_commit_command_date_and_load(path: Path) -> None:
    _assert_full(json.loads(path.read_text()).get("provenance"), path.name)


@pytest.mark.parametrize("path", _result_files(".png"), ids=lambda p: p.name)
def test_every_figure_carries_its_provenance(path: Path) -> None:
    from PIL import Image

    text = getattr(Image.open(path), "text", {})
    assert "Description" in text, f"{path.name}: no provenance in its metadata"
    _assert_full(json.loads(text["Description"]), path.name)


# A result file named in the docs: `bench/results/NAME` or, in docs/benchmarks.md, a bare
# `NAME.json`; `COMMIT:bench/results/NAME` (as `git show` takes it) names a retired one,
# kept in git history at that commit.
NAMED = re.compile(r"(?<![\w./:-])(?:(?P<commit>[0-9a-f]{7,40}):)?(?:bench/results/)?"
                   r"(?P<name>[\w*-]+\.(?:json|png|log))\b")
NAMED_IN_RESULTS = re.compile(r"(?<![\w./:-])(?:(?P<commit>[0-9a-f]{7,40}):)?bench/results/"
                              r"(?P<name>[\w*-]+\.(?:json|png|log))\b")


def _named(doc: Path) -> list[tuple[int, str | None, str]]:
    """(line, commit or None, name) for every result file `doc` names."""
    pattern = NAMED if doc == DOCS else NAMED_IN_RESULTS
    return [(number, m["commit"], m["name"])
            for number, line in enumerate(doc.read_text().splitlines(), 1)
            for m in pattern.finditer(line)]


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", _docs(), ids=lambda p: p.name)
def test_every_result_file_the_docs_name_exists(doc: Path) -> None:
    results = BENCH / "results"
    missing = [f"{doc.name}:{line}: {name}" for line, commit, name in _named(doc)
               if commit is None and not list(results.glob(name))]
    assert not missing, f"result files named but not in bench/results: {missing}"


@pytest.mark.parametrize("doc", _docs(), ids=lambda p: p.name)
def test_a_retired_result_is_where_the_docs_say(doc: Path) -> None:
    if not IN_GIT or _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("needs the repository's full history")
    absent = [f"{doc.name}:{line}: {commit}:{name}" for line, commit, name in _named(doc)
              if commit is not None
              and _git("cat-file", "-e", f"{commit}:bench/results/{name}").returncode != 0]
    assert not absent, f"historical results not in git at the commit named: {absent}"


def test_the_docs_name_result_files() -> None:
    # The pattern above still finds what it looks for (an edit that breaks it would
    # otherwise pass every check by finding nothing).
    named = _named(DOCS)
    assert len({name for _, commit, name in named if commit is None}) > 10
    assert len(_result_files(".json")) > 10
