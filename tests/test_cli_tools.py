"""`codeveil def`, `outline`, `uses` and `grep` on an indexed repo: in-process (the
commands' output is what these measure), but for the one-line errors of a real process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_in_process import run_in_process
from tests.test_cli import assert_one_line_error, run


@pytest.fixture
def indexed(sample_repo: Path) -> Path:
    proc = run_in_process(["index", "--wait", ".", "-q"], sample_repo)
    assert proc.returncode == 0, proc.stderr
    return sample_repo


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().split("\n"), 1) if needle in line)


def test_def_prints_where_and_json_says_the_same(indexed: Path) -> None:
    line = _line_of(indexed / "net/upload.py", "def upload(")
    proc = run_in_process(["def", "Uploader.upload"], indexed)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith(f"net/upload.py:{line}-")
    data = json.loads(run_in_process(["def", "Uploader.upload", "--json"], indexed).stdout)
    assert data["definitions"][0]["start_line"] == line
    missing = run_in_process(["def", "NoSuchName"], indexed)
    assert missing.returncode == 0 and "no definition of NoSuchName" in missing.stderr


def test_outline_from_a_subfolder_takes_the_path_from_there(indexed: Path) -> None:
    proc = run_in_process(["outline", "password.py", "--json"], indexed / "auth")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["path"] == "auth/password.py"
    assert [s["name"] for s in data["symbols"]] == ["hash_password", "verify_password"]
    text = run_in_process(["outline", "auth/password.py"], indexed).stdout
    assert "function hash_password" in text and "| def verify_password(" in text


def test_uses_lists_references_and_says_so_in_help(indexed: Path) -> None:
    helped = run_in_process(["uses", "--help"], indexed)
    assert "references" in helped.stdout
    data = json.loads(run_in_process(["uses", "cartTotal", "--json"], indexed).stdout)
    line = _line_of(indexed / "web/routes.js", "cartTotal(req")
    assert [(r["path"], r["lines"]) for r in data["references"]] == [("web/routes.js", [line])]
    plain = run_in_process(["uses", "cartTotal"], indexed).stdout
    assert plain.startswith("web/routes.js:") and f"{line}:" in plain


def test_grep_prints_path_line_text_and_narrows_by_glob(indexed: Path) -> None:
    proc = run_in_process(["grep", "pbkdf2_hmac|taxRate", "--path", "*.js"], indexed)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and all(ln.startswith("web/routes.js:") for ln in lines)
    assert any("function cartTotal(items, taxRate)" in ln for ln in lines)
    data = json.loads(run_in_process(["grep", "-i", "PBKDF2_HMAC", "--json"], indexed).stdout)
    assert {m["path"] for m in data["matches"]} == {"auth/password.py"}


def test_bad_input_is_one_line(indexed: Path) -> None:
    assert_one_line_error(run(["grep", "def ("], indexed), "not a valid regular expression")
    assert_one_line_error(run(["outline", "nope.py"], indexed), "no file nope.py")
    assert_one_line_error(run(["uses", "a-b"], indexed), "not an identifier")
