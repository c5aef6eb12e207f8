"""Index and search a real repo with the real model, in-process store: the user's path."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from retrieval import Index, SearchError
from tests.conftest import write_repo


@pytest.fixture
def indexed(sample_repo: Path, real_embedder) -> Index:
    idx = Index(sample_repo, embedder=real_embedder)
    idx.index(wait=True)
    yield idx
    idx.close()


def _top(idx: Index, query: str, **kw) -> str:
    hits = idx.search(query, k=3, **kw)
    assert hits, query
    return hits[0].path


def test_search_finds_the_right_code(indexed: Index) -> None:
    assert _top(indexed, "retry failed uploads with backoff") == "net/upload.py"
    assert _top(indexed, "salted password hashing") == "auth/password.py"
    assert _top(indexed, "great circle distance between coordinates") == "geo/distance.go"
    assert _top(indexed, "shopping cart total price with tax") == "web/routes.js"


def test_hits_carry_lines_symbol_and_the_text_on_disk(indexed: Index, sample_repo: Path) -> None:
    hit = indexed.search("retry failed uploads with backoff", k=1)[0]
    lines = (sample_repo / hit.path).read_text().splitlines(keepends=True)
    assert hit.text == "".join(lines[hit.start_line - 1 : hit.end_line])
    assert "def upload" in hit.text or "class Uploader" in hit.text
    assert hit.symbol.startswith("Uploader")
    assert hit.language == "python"
    assert 0 < hit.score <= 1.0001
    assert not hit.stale


def test_filters_by_path_glob_and_language(indexed: Index) -> None:
    hits = indexed.search("function", k=10, language="go")
    assert hits and {h.language for h in hits} == {"go"}
    hits = indexed.search("function", k=10, path="auth/*")
    assert hits and {h.path for h in hits} == {"auth/password.py"}


def test_second_index_with_nothing_changed_embeds_nothing(indexed: Index) -> None:
    report = indexed.index(wait=True)
    assert report.files_changed == 0
    assert report.chunks_embedded == 0
    assert report.files_deleted == 0
    assert report.files_scanned == 5


def test_edited_file_reindexes_only_that_file(indexed: Index, sample_repo: Path) -> None:
    path = sample_repo / "auth/password.py"
    path.write_text(path.read_text() + "\n\ndef rotate_api_token(user):\n"
                    "    '''Issue a fresh API token and revoke the old one.'''\n"
                    "    user.token = new_token()\n")
    report = indexed.index(wait=True)
    assert report.files_changed == 1
    assert report.chunks_embedded >= 1
    # Unchanged chunks of that file come from the embedding cache.
    assert report.chunks_embedded < report.chunks_total
    hit = indexed.search("revoke and issue a new api token", k=1)[0]
    assert hit.path == "auth/password.py" and "rotate_api_token" in hit.text


def test_deleted_file_disappears_from_results(indexed: Index, sample_repo: Path) -> None:
    (sample_repo / "geo/distance.go").unlink()
    # Before re-indexing: the file is gone from disk, so its chunks are never shown.
    assert all(h.path != "geo/distance.go" for h in indexed.search("great circle distance"))
    report = indexed.index(wait=True)
    assert report.files_deleted == 1
    assert all(h.path != "geo/distance.go" for h in indexed.search("great circle distance"))


def test_edited_since_indexing_relocates_or_marks_stale(indexed: Index, sample_repo: Path) -> None:
    path = sample_repo / "net/upload.py"
    original = path.read_text()
    hit = indexed.search("retry failed uploads with backoff", k=1)[0]
    # Shift everything down by three lines: the chunk is found at its new place.
    path.write_text("# a\n# b\n# c\n" + original)
    moved = indexed.search("retry failed uploads with backoff", k=1)[0]
    assert moved.path == hit.path and not moved.stale
    assert moved.start_line == hit.start_line + 3
    assert moved.text == hit.text
    # Rewrite the file: the old lines are gone, so the hit is stale and shows nothing.
    path.write_text("print('nothing here any more')\n" * 3)
    gone = [h for h in indexed.search("retry failed uploads with backoff", k=10)
            if h.path == "net/upload.py"]
    assert gone and all(h.stale and h.text == "" for h in gone)


def test_search_from_a_subfolder_finds_the_index(indexed: Index, sample_repo: Path,
                                                 real_embedder) -> None:
    sub = Index(sample_repo / "net", embedder=real_embedder)
    assert sub.root == sample_repo.resolve()
    assert sub.search("retry failed uploads", k=1)[0].path == "net/upload.py"
    sub.close()


def test_bad_queries_are_clear_errors(indexed: Index) -> None:
    with pytest.raises(SearchError, match="empty"):
        indexed.search("   ")
    with pytest.raises(SearchError, match="k must be"):
        indexed.search("x", k=0)


def test_index_of_a_copy_without_codeveil_dir_is_independent(
    indexed: Index, sample_repo: Path, tmp_path: Path, real_embedder
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(sample_repo, copy, ignore=shutil.ignore_patterns(".codeveil"))
    idx = Index(copy, embedder=real_embedder)
    report = idx.index(wait=True)
    # A new workspace (new key), but every chunk text was embedded before: all cached.
    assert report.chunks_embedded == 0 and report.chunks_from_cache == report.chunks_total
    idx.close()


def test_gitignore_is_honoured(tmp_path: Path, real_embedder) -> None:
    repo = write_repo(tmp_path / "r", {
        ".gitignore": "secret_dir/\n*.log\n",
        "keep.py": "def kept():\n    return 1\n",
        "secret_dir/hidden.py": "def hidden_function():\n    return 2\n",
        "debug.log": "hidden log line\n",
    })
    idx = Index(repo, embedder=real_embedder)
    report = idx.index(wait=True)
    assert report.files_scanned == 2  # keep.py and .gitignore itself
    paths = {h.path for h in idx.search("hidden function", k=10)}
    assert "secret_dir/hidden.py" not in paths and "debug.log" not in paths
    idx.close()


def test_how_deep_a_search_reads_depends_on_k_only_past_a_quarter_of_the_depth() -> None:
    from retrieval.faces.api import MAX_DEPTH, OVERFETCH, ranking_depth

    # Up to depth / OVERFETCH results, every k reads as deep: the first hits of a
    # search do not change with how many were asked for.
    assert {ranking_depth(100, k) for k in range(1, 100 // OVERFETCH + 1)} == {100}
    assert ranking_depth(100, 50) == 50 * OVERFETCH
    assert ranking_depth(100, 10**6) == MAX_DEPTH
