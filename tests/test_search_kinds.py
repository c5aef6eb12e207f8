"""What gets indexed and how results are classed, end to end through the `codeveil`
command on real files, with the hashing embedder: run in-process (the command's code,
not the process, is what these measure), but for the one-line error of a real process."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_in_process import run_in_process
from tests.conftest import write_repo
from tests.test_cli import assert_one_line_error, run

# The same words in code, tests, docs and examples, so that each kind has hits.
FILES = {
    "net/backoff.py": '''
        def retry_with_backoff(send, attempts=5):
            """Retry a failed request with exponential backoff."""
            for attempt in range(attempts):
                if send():
                    return True
            return False
        ''',
    "tests/test_backoff.py": '''
        from net.backoff import retry_with_backoff


        def test_retry_with_backoff_gives_up():
            assert not retry_with_backoff(lambda: False, attempts=2)
        ''',
    "docs/backoff.md": '''
        # Retry with backoff

        A failed request is retried with exponential backoff, five attempts at most.
        ''',
    "examples/backoff_demo.py": '''
        from net.backoff import retry_with_backoff

        print(retry_with_backoff(lambda: True))
        ''',
    "config/retry.yaml": '''
        retry:
          backoff: exponential
          attempts: 5
        ''',
}

QUERY = "retry failed request with exponential backoff"


def search(repo: Path, *args: str) -> list[dict]:
    proc = run_in_process(["search", QUERY, "--json", "-k", "20", *args], repo)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["hits"]


def test_every_hit_has_a_kind_and_kind_filters_keep_those_kinds(tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo", FILES)
    assert run_in_process(["index", "--wait", "-q"], repo).returncode == 0

    everything = search(repo)
    assert {h["path"]: h["kind"] for h in everything} == {
        "net/backoff.py": "code", "tests/test_backoff.py": "tests",
        "docs/backoff.md": "docs", "examples/backoff_demo.py": "examples",
        "config/retry.yaml": "config",
    }
    assert {h["path"] for h in search(repo, "--kind", "code")} == {"net/backoff.py"}
    both = search(repo, "--kind", "tests,docs")
    assert {h["kind"] for h in both} == {"tests", "docs"}
    repeated = search(repo, "--kind", "examples", "--kind", "config")
    assert {h["path"] for h in repeated} == {"examples/backoff_demo.py", "config/retry.yaml"}
    # Beside the other filters, as they are applied: all must hold.
    assert search(repo, "--kind", "code", "--path", "tests/*") == []
    grouped = search(repo, "--kind", "tests", "--group", "file")
    assert [h["path"] for h in grouped] == ["tests/test_backoff.py"]

    assert_one_line_error(run(["search", QUERY, "--kind", "source"], repo),
                          "unknown kind 'source'")


def test_assets_are_skipped_with_a_reason_and_a_negation_brings_one_back(
    tmp_path: Path,
) -> None:
    repo = write_repo(tmp_path / "repo", {
        **FILES,
        "docs/diagram.svg": "<svg><text>retry backoff diagram</text></svg>\n",
        "tests/fixtures/requests.json": '{"retry": "backoff"}\n',
        "data/attempts.csv": "attempt,delay\n1,0.5\n",
        "vendor/lib/backoff.go": "package lib\n// retry backoff\n",
    })
    proc = run_in_process(["index", "--wait", ".", "--json"], repo)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert {s["path"]: s["reason"] for s in summary["skipped"]} == {
        "docs/diagram.svg": "SVG image",
        "tests/fixtures/requests.json": "data file: in a data folder",
        "data/attempts.csv": "data file",
        "vendor": "vendored: folder",
    }
    assert summary["files_scanned"] == len(FILES)

    (repo / ".codeveilignore").write_text("!docs/diagram.svg\n!vendor/\n")
    summary = json.loads(run_in_process(["index", "--wait", ".", "--json"], repo).stdout)
    assert sorted(s["path"] for s in summary["skipped"]) == [
        "data/attempts.csv", "tests/fixtures/requests.json"]
    assert summary["files_changed"] == 3  # the two brought back and the ignore file
    paths = {h["path"] for h in search(repo)}
    assert {"docs/diagram.svg", "vendor/lib/backoff.go"} <= paths

    # Taking the negation away drops them from the index again.
    (repo / ".codeveilignore").unlink()
    run_in_process(["index", "--wait", "-q"], repo)
    assert {h["path"] for h in search(repo)}.isdisjoint(
        {"docs/diagram.svg", "vendor/lib/backoff.go"})


def test_notebook_hits_open_at_the_cell_and_never_show_outputs(tmp_path: Path) -> None:
    cells = [
        {"cell_type": "markdown", "metadata": {},
         "source": ["# Penguin measurements\n", "\n", "Load the flipper lengths.\n"]},
        {"cell_type": "code", "execution_count": 1, "metadata": {},
         "outputs": [{"output_type": "stream", "name": "stdout",
                      "text": ["zebra giraffe output line\n"]}],
         "source": ["def load_flipper_lengths(table):\n",
                    "    return table['flipper_length_mm'].dropna()\n"]},
    ]
    text = json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5},
                      indent=1) + "\n"
    repo = write_repo(tmp_path / "repo", {"analysis/penguins.ipynb": text,
                                          "broken.ipynb": '{"cells": ['})
    summary = json.loads(run_in_process(["index", "--wait", ".", "--json"], repo).stdout)
    assert summary["skipped"] == [{"path": "broken.ipynb", "reason": "not a valid notebook"}]

    proc = run_in_process(["search", "load_flipper_lengths", "--json", "-k", "5"], repo)
    hits = json.loads(proc.stdout)["hits"]
    top = hits[0]
    lines = text.splitlines(keepends=True)
    assert (top["path"], top["language"], top["kind"]) == (
        "analysis/penguins.ipynb", "python", "code")
    assert top["symbol"] == "load_flipper_lengths"
    assert lines[top["start_line"] - 1].strip() == '"def load_flipper_lengths(table):\\n",'
    assert top["text"] == "".join(lines[top["start_line"] - 1 : top["end_line"]])
    assert {h["language"] for h in hits} == {"python", "markdown"}
    outputs = run_in_process(["search", "zebra giraffe output line", "--json"], repo)
    assert all("zebra" not in h["text"] for h in json.loads(outputs.stdout)["hits"])


def test_a_language_is_named_in_any_case_or_by_extension_and_an_unknown_one_refused(
        tmp_path: Path) -> None:
    # `--lang py` and `--lang Python` matched no chunk ("no results") while only
    # `python` worked; an unknown language said nothing either.
    repo = write_repo(tmp_path / "repo", FILES)
    assert run_in_process(["index", "--wait", "-q"], repo).returncode == 0
    python = {h["path"] for h in search(repo, "--lang", "python")}
    assert python == {"net/backoff.py", "tests/test_backoff.py", "examples/backoff_demo.py"}
    for name in ("py", "Python", ".py", "PY"):
        assert {h["path"] for h in search(repo, "--lang", name)} == python, name
    assert {h["path"] for h in search(repo, "--lang", "yml")} == {"config/retry.yaml"}
    assert_one_line_error(run(["search", QUERY, "--lang", "klingon"], repo),
                          "unknown language 'klingon'; use one of")


def test_piped_search_output_wraps_a_long_line_rather_than_cutting_it(tmp_path: Path) -> None:
    # Not a terminal: 80 columns, and the end of a longer code line was cut, unmarked.
    tail = "the_very_end_of_the_line_marker"
    repo = write_repo(tmp_path / "repo", {"net/long.py": (
        "def retry_with_backoff(send):\n"
        f"    return send('retry failed request with exponential backoff' * 2, {tail}=1)\n")})
    assert run_in_process(["index", "--wait", "-q"], repo).returncode == 0
    proc = run_in_process(["search", QUERY, "-k", "1"], repo)
    assert proc.returncode == 0, proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80
    assert tail in "".join(line.strip() for line in proc.stdout.splitlines())


def test_a_path_glob_that_matches_no_indexed_file_is_said_to(tmp_path: Path) -> None:
    # `--path 'src/*'` on a tree without src/ said "no results", as a query that found
    # nothing would.
    repo = write_repo(tmp_path / "repo", FILES)
    assert run_in_process(["index", "--wait", "-q"], repo).returncode == 0
    proc = run_in_process(["search", QUERY, "--path", "src/*"], repo)
    assert proc.returncode == 0
    assert proc.stderr.strip() == ("no results: --path 'src/*' matches no indexed file (they"
                                   " are relative to the repo's root, as 'config/retry.yaml')")
    assert search(repo, "--path", "net/*")  # a glob that matches still finds
