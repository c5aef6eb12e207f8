"""grep over an index of real files: exactly the lines a full scan finds, reading fewer."""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from indexer.local_chunks import open_state_db
from indexer.trigrams import literal_trigrams, text_trigrams
from retrieval import Index
from retrieval.agent.agent_tools import AgentTools
from retrieval.agent.grep import Freshness, full_scan, grep_files
from retrieval.agent.symbols import ToolInputError
from retrieval.indexes import tree_watch
from retrieval.indexes.regex_trigrams import required_trigrams
from tests.conftest import SAMPLE_FILES, write_repo

EXTRA_FILES = {
    "units/kelvin.txt": "Temperature in \u212aelvin is absolute.\n",
    "units/spaces.py": "def pad():\n    return '    '\n\n\n    \n\nX = 'tail'\n",
    "web/Retry.ts": "export function retryUpload(n: number) {\n  return n * 2;\n}\n",
    "docs/notes.md": "# Notes\n\nUPLOAD retries are capped.\n\nCRLF line\r\nend\n",
}
PATTERNS = [
    "retries",
    "def (upload|hash_password)",
    r"self\.retries\b",
    "(?i)upload",
    "(?i)KELVIN",
    r"^\s+return",
    r"^def \w+",
    "retr(y|ies)+",
    "[Uu]pload",
    r"\d{3}",
    "x*",
    "line\r$",
    "    ",
    r"n \* 2",
    "(?i:RETRY)Upload",
    "pas+word",
    "nothing-matches-this",
]


def _repo(tmp_path: Path) -> Path:
    root = write_repo(tmp_path / "repo", {**SAMPLE_FILES, **EXTRA_FILES})
    _age(root)
    Index(root, embedder=HashingEmbedder()).index(wait=True)
    return root


def _age(root: Path) -> None:
    """Files written a minute ago: not racily clean, so the stat cache vouches for them
    (a file written within the last 2 s is always read, whatever the index says)."""
    past = time.time() - 60
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, (past, past))


def _indexed(root: Path) -> list[str]:
    import sqlite3
    with sqlite3.connect(root / ".codeveil" / "state.sqlite") as db:
        return [p for (p,) in db.execute("SELECT path FROM chunk_files")]


def test_grep_finds_what_a_full_scan_finds(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    idx = Index(root, embedder=HashingEmbedder())
    paths = _indexed(root)
    found_any = 0
    for pattern in PATTERNS:
        result = idx.grep(pattern)
        expected = full_scan(root, paths, pattern)
        assert result.matches == expected, pattern
        found_any += bool(expected)
    assert found_any >= len(PATTERNS) - 1  # the patterns do match something
    selective = idx.grep("hash_password")
    assert selective.narrowed and selective.files_read < selective.files_indexed


def test_random_patterns_from_the_files_match_a_full_scan(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    idx = Index(root, embedder=HashingEmbedder())
    paths = _indexed(root)
    texts = [(root / p).read_text() for p in paths]
    rng = random.Random(7)
    for _ in range(150):
        text = rng.choice(texts)
        start = rng.randrange(max(len(text) - 8, 1))
        piece = text[start : start + rng.randint(3, 9)]
        pattern = re.escape(piece)
        roll = rng.random()
        if roll < 0.2:
            pattern = f"(?i){pattern.upper()}"
        elif roll < 0.4:
            pattern = f"{pattern}|{re.escape(rng.choice(texts)[:4])}"
        elif roll < 0.6:
            pattern = f"{re.escape(piece[:1])}.{re.escape(piece[2:])}"
        assert idx.grep(pattern).matches == full_scan(root, paths, pattern), pattern


def test_a_file_edited_since_indexing_is_searched_as_it_is_now(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    idx = Index(root, embedder=HashingEmbedder())
    assert idx.grep("brand_new_token").matches == []
    (root / "auth/password.py").write_text("def brand_new_token():\n    pass\n")
    (root / "net/upload.py").unlink()
    result = idx.grep("brand_new_token|Uploader")
    assert [(m.path, m.line) for m in result.matches] == [("auth/password.py", 1)]
    assert result.matches == full_scan(root, _indexed(root), "brand_new_token|Uploader")


def test_the_grep_index_follows_the_chunk_table_incrementally(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    idx = Index(root, embedder=HashingEmbedder())
    idx.grep("retries")
    assert idx.tools.trigrams(root).last_refresh["mode"] == "rebuild"
    (root / "net/extra.py").write_text("SENTINEL_VALUE = 42\n")
    _age(root)
    idx.index(wait=True)
    result = idx.grep("SENTINEL_VALUE")
    refresh = idx.tools.trigrams(root).last_refresh
    assert refresh["mode"] in ("update", "merge") and refresh["read"] == 1
    assert [(m.path, m.line, m.column) for m in result.matches] == [("net/extra.py", 1, 1)]
    # A new process loads the saved index rather than building it again.
    again = Index(root, embedder=HashingEmbedder())
    assert again.grep("SENTINEL_VALUE").matches == result.matches
    assert again.tools.trigrams(root).last_refresh == {}


def test_a_path_glob_and_a_limit_narrow_the_lines(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    idx = Index(root, embedder=HashingEmbedder())
    everywhere = idx.grep("(?i)upload")
    in_python = idx.grep("(?i)upload", path="*.py")
    assert {m.path for m in in_python.matches} < {m.path for m in everywhere.matches}
    assert all(m.path.endswith(".py") for m in in_python.matches)
    capped = idx.grep("(?i)upload", limit=2)
    assert capped.truncated and capped.matches == everywhere.matches[:2]


def test_a_bad_pattern_is_a_clear_error(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    with pytest.raises(ToolInputError, match="not a valid regular expression"):
        Index(root, embedder=HashingEmbedder()).grep("def (")


def test_required_trigrams_are_never_more_than_a_match_holds() -> None:
    # Every line a pattern matches holds every trigram its query requires.
    cases = {"abc(def|ghi)": ["xabcdefx", "abcghi"], "(?i)HeLLo": ["hello", "HELLO"],
             "a+bcd": ["aaabcd"], "x(yz)?w{2}abc": ["xwwabc"], "[q]rst": ["qrst"]}
    for pattern, lines in cases.items():
        query = required_trigrams(pattern)
        assert query.op != "all", pattern
        for line in lines:
            assert re.search(pattern, line)
            assert _satisfied(query, set(text_trigrams([line]).tolist())), (pattern, line)
    assert required_trigrams("(?i)kelvin").op != "and"  # k folds beyond ASCII: broken up
    assert literal_trigrams("   ") == set()


def _satisfied(query, held: set[int]) -> bool:
    if query.op == "all":
        return True
    if query.op == "tri":
        return query.code in held
    results = [_satisfied(p, held) for p in query.parts]
    return all(results) if query.op == "and" else any(results)


@pytest.mark.skipif(shutil.which("rg") is None, reason="ripgrep is not installed")
def test_grep_equals_ripgrep_on_the_same_files(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    idx = Index(root, embedder=HashingEmbedder())
    paths = sorted(_indexed(root))
    for pattern in ["retries", r"def \w+", "(?i)upload", r"^\s+return"]:
        proc = subprocess.run(["rg", "--no-heading", "-n", "--no-config", "-e", pattern,
                               "--", *paths], cwd=root, capture_output=True, text=True,
                              check=False)
        rg = sorted((line.split(":", 2)[0], int(line.split(":", 2)[1]))
                    for line in proc.stdout.splitlines())
        ours = sorted((m.path, m.line) for m in idx.grep(pattern).matches)
        assert ours == rg, pattern


def test_a_final_newline_ends_the_last_line(tmp_path: Path) -> None:
    # As ripgrep counts lines: "a\nb\n" has two, so `^$` matches none of them.
    root = write_repo(tmp_path / "repo", {"two.txt": "alpha\nbeta\n", "gap.txt": "x\n\ny\n"})
    _age(root)
    Index(root, embedder=HashingEmbedder()).index(wait=True)
    result = Index(root, embedder=HashingEmbedder()).grep("^$")
    assert [(m.path, m.line) for m in result.matches] == [("gap.txt", 2)]
    assert [m.line for m in Index(root, embedder=HashingEmbedder()).grep("a*").matches
            if m.path == "two.txt"] == [1, 2]


@pytest.mark.skipif(not tree_watch.available(), reason="inotify is Linux-only")
def test_a_watched_tree_stats_only_the_changed_files_and_misses_no_edit(
        tmp_path: Path) -> None:
    root = _repo(tmp_path)
    paths = _indexed(root)
    freshness = Freshness()
    db = open_state_db(root / ".codeveil" / "state.sqlite")
    index = Index(root, embedder=HashingEmbedder()).tools.trigrams(root).current(db)

    def grep(pattern: str) -> list[tuple[str, int]]:
        result = grep_files(root, db, index, pattern, freshness=freshness)
        assert result.narrowed and result.matches == full_scan(root, paths, pattern)
        return [(m.path, m.line) for m in result.matches]

    assert grep("brand_new_token") == []
    assert freshness.last_stats == len(paths)  # the first call stats every file
    assert grep("brand_new_token") == []
    assert freshness.last_stats == 0  # nothing changed: the watch vouches for all
    # An edit in place (the directory's mtime stays as it was) of a file the index
    # rules out: found, and it is the only file stat'ed again.
    with (root / "units/kelvin.txt").open("r+") as f:
        f.write("brand_new_token")
    assert grep("brand_new_token") == [("units/kelvin.txt", 1)]
    assert freshness.last_stats == 1
    # An editor's save: a new file renamed over the old one.
    (root / "net/tmp-save").write_text("x = 1\nbrand_new_token = 2\n")
    os.replace(root / "net/tmp-save", root / "net/upload.py")
    assert grep("brand_new_token") == [("net/upload.py", 2), ("units/kelvin.txt", 1)]
    assert freshness.last_stats == 1
    # A directory change is not vouched for: everything is stat'ed again.
    (root / "units/new-folder").mkdir()
    assert grep("brand_new_token") == [("net/upload.py", 2), ("units/kelvin.txt", 1)]
    assert freshness.last_stats == len(paths)
    assert grep("brand_new_token") == [("net/upload.py", 2), ("units/kelvin.txt", 1)]
    assert freshness.last_stats == 0
    freshness.close()
    db.close()


def test_without_a_watch_every_call_stats_every_file(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    paths = _indexed(root)
    freshness = Freshness(watch=False)
    db = open_state_db(root / ".codeveil" / "state.sqlite")
    index = Index(root, embedder=HashingEmbedder()).tools.trigrams(root).current(db)
    for _ in range(2):
        result = grep_files(root, db, index, "hash_password", freshness=freshness)
        assert result.matches == full_scan(root, paths, "hash_password")
        assert freshness.last_stats == len(paths)
    db.close()


def test_right_after_a_first_index_grep_narrows_and_sees_a_same_stat_rewrite(
        tmp_path: Path) -> None:
    # Files written just before the first index are racily clean: their stat is not
    # trusted, so every one of them was read on every grep until a later index.
    root = write_repo(tmp_path / "repo", {**SAMPLE_FILES, **EXTRA_FILES})
    Index(root, embedder=HashingEmbedder()).index(wait=True)
    paths = _indexed(root)
    first = AgentTools(root, watch=False).grep("hash_password")
    assert first.matches == full_scan(root, paths, "hash_password")
    assert first.files_read < len(paths), first  # read to check them, not to match
    second = AgentTools(root, watch=False).grep("hash_password")  # another process
    assert second.matches == first.matches and second.files_read == first.files_read
    # A racy file rewritten in the same tick, same size: only its content tells (the
    # index rules the file out: it held no match when it was indexed).
    racy = root / "web" / "Retry.ts"
    racy.write_text("hash_passwore\n")
    Index(root, embedder=HashingEmbedder()).index(wait=True)
    st = racy.stat()
    racy.write_text("hash_password\n")
    os.utime(racy, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = AgentTools(root, watch=False).grep("hash_password")
    assert again.matches == full_scan(root, paths, "hash_password")
    assert [m.line for m in again.matches if m.path == "web/Retry.ts"] == [1]
