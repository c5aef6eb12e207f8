"""The local Merkle tree: digests move exactly when content under them moves."""

from __future__ import annotations

from sync.merkle import ROOT, LocalTree, ancestors_of


def _tree(files: dict[str, bytes]) -> LocalTree:
    return LocalTree.build(files)


def test_ancestors_root_first() -> None:
    assert ancestors_of("a/b/c.py") == ["", "a", "a/b"]
    assert ancestors_of("top.py") == [""]


def test_structure_and_children_sorted() -> None:
    t = _tree({"b/x.py": b"1" * 16, "a.py": b"2" * 16, "b/c/y.py": b"3" * 16})
    assert t.children[ROOT] == ["a.py", "b"]
    assert t.children["b"] == ["b/c", "b/x.py"]
    assert t.is_dir("b/c") and not t.is_dir("b/x.py")
    assert sorted(t.files_under("b")) == ["b/c/y.py", "b/x.py"]


def test_a_change_moves_every_ancestor_and_nothing_else() -> None:
    files = {"a/one.py": b"1" * 16, "a/two.py": b"2" * 16, "b/three.py": b"3" * 16}
    before = _tree(dict(files))
    files["a/two.py"] = b"9" * 16
    after = _tree(files)
    assert after.dirs[ROOT] != before.dirs[ROOT]
    assert after.dirs["a"] != before.dirs["a"]
    assert after.dirs["b"] == before.dirs["b"]


def test_rename_changes_the_digest_even_with_same_content() -> None:
    a = _tree({"d/x.py": b"1" * 16})
    b = _tree({"d/y.py": b"1" * 16})
    assert a.dirs[ROOT] != b.dirs[ROOT]


def test_file_and_directory_of_same_name_differ() -> None:
    # "x" as a file vs "x" as a directory holding a file with the same digest.
    a = _tree({"x": b"1" * 16})
    b = _tree({"x/x": b"1" * 16})
    assert a.dirs[ROOT] != b.dirs[ROOT]


def test_build_is_deterministic_regardless_of_insertion_order() -> None:
    files = {f"p{i % 7}/q{i % 3}/f{i}.py": bytes([i % 256]) * 16 for i in range(200)}
    reordered = dict(reversed(list(files.items())))
    assert _tree(files).dirs == _tree(reordered).dirs
