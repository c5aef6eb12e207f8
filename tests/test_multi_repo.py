"""One query over several repositories (`MultiIndex`, `codeveil search -C a -C b`): real
indexes of three tmp repos of different sizes, the hashing embedder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from indexer.errors import CodeveilError
from retrieval import Index, MultiIndex
from retrieval.faces.multi import MERGE_RRF_K
from tests.conftest import write_repo


def _repo(root: Path, name: str, files: int) -> Path:
    body = {f"{name}/mod{i}.py": f"def {name}_helper_{i}(value):\n    return value + {i}\n"
            for i in range(files)}
    body[f"{name}/special.py"] = (f"def {name}_unique_entry_point(request):\n"
                                  f"    return dispatch_{name}(request)\n")
    write_repo(root, body)
    with Index(root, embedder=HashingEmbedder()) as idx:
        idx.index(wait=True)
    return root


@pytest.fixture
def repos(tmp_path: Path) -> list[Path]:
    return [_repo(tmp_path / "service", "service", 40), _repo(tmp_path / "client", "client", 8),
            _repo(tmp_path / "infra", "infra", 2)]


@pytest.mark.parametrize("name", ["service", "client", "infra"])
def test_the_answer_comes_from_its_repository(repos: list[Path], name: str) -> None:
    with MultiIndex(repos) as many:
        hits = many.search(f"{name}_unique_entry_point", k=5)
        alone = Index(repos[["service", "client", "infra"].index(name)])
        with alone:
            best_alone = alone.search(f"{name}_unique_entry_point", k=1)[0]
    assert hits[0].repo == str(repos[["service", "client", "infra"].index(name)])
    assert hits[0].path == f"{name}/special.py" == best_alone.path
    # First in the merge: first by fused score and by cosine in its repository.
    assert hits[0].score == pytest.approx(2 / (MERGE_RRF_K + 1))
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert {h.repo for h in hits} <= {str(r) for r in repos}


def test_the_repositories_share_one_embedder(repos: list[Path]) -> None:
    with MultiIndex(repos) as many:
        models = {id(idx.embedder.embedder) for idx in many.indexes}
    assert len(models) == 1


def test_bad_repository_lists_are_refused(repos: list[Path], tmp_path: Path) -> None:
    with pytest.raises(CodeveilError, match="named twice"):
        MultiIndex([repos[0], repos[0] / "service"])
    (tmp_path / "plain").mkdir()
    with pytest.raises(CodeveilError, match="no codeveil index"):
        MultiIndex([repos[0], tmp_path / "plain"])
    with pytest.raises(CodeveilError, match="no repository"):
        MultiIndex([])


def test_the_command_searches_several_repositories(repos: list[Path]) -> None:
    env = dict(os.environ, CODEVEIL_EMBEDDER="hashing")
    args = [a for r in repos for a in ("-C", str(r))]

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "retrieval", "search",
                               "client_unique_entry_point", *args, *extra],
                              env=env, capture_output=True, text=True, timeout=120)

    found = run("--json", "-k", "3")
    assert found.returncode == 0, found.stderr
    out = json.loads(found.stdout)
    assert out["hits"][0]["repo"] == str(repos[1])
    assert out["hits"][0]["path"] == "client/special.py"
    assert set(out["index"]) == {str(r) for r in repos}
    shown = run("-k", "1")
    assert shown.returncode == 0, shown.stderr
    assert "client/client/special.py:1-2" in shown.stdout  # repository, then its path
    one = subprocess.run([sys.executable, "-m", "retrieval", "search",
                          "client_unique_entry_point", "-C", str(repos[1]), "--json"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert "repo" not in json.loads(one.stdout)["hits"][0]  # one repository: as before
