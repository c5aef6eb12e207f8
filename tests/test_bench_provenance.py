"""Every benchmark result says where it came from: `bench._common.write_json` and
`save_figure` record the commit, the command line, the date and the machine's load, and
no benchmark writes a result around them."""

from __future__ import annotations

import ast
import json
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


def _result_files() -> list[Path]:
    """The result files in the repository (git's list where there is one: a local run's
    uncommitted result is no business of this test), else those on disk."""
    results = BENCH / "results"
    if shutil.which("git") and (BENCH.parent / ".git").exists():
        listed = subprocess.run(["git", "ls-files", "bench/results/*.json"], cwd=BENCH.parent,
                                capture_output=True, text=True, check=True).stdout.split()
        return sorted(BENCH.parent / name for name in listed)
    return sorted(results.glob("*.json"))


@pytest.mark.parametrize("path", _result_files(), ids=lambda p: p.name)
def test_every_result_says_where_it_came_from_or_that_it_cannot(path: Path) -> None:
    prov = json.loads(path.read_text()).get("provenance")
    assert isinstance(prov, dict), f"{path.name}: no provenance block"
    if prov.get("missing") is True:
        # A result older than the helper: it says so, why, and the last commit that
        # changed it, never a made-up commit or load.
        assert isinstance(prov.get("reason"), str) and prov["reason"], path.name
        commit = prov.get("last_commit")
        assert isinstance(commit, str) and len(commit) == 40, path.name
        assert not FULL & set(prov), f"{path.name}: a missing block with provenance in it"
    else:
        assert set(prov) >= FULL, f"{path.name}: lacks {sorted(FULL - set(prov))}"


def test_the_result_files_are_found() -> None:
    assert len(_result_files()) > 10
