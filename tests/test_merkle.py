"""The local Merkle tree: digests move exactly when content under them moves, and the
tree the store sees has buckets of keyed file ids, not the repo's directories."""

from __future__ import annotations

import os

from sync.crypto import ciphers
from sync.crypto.keys import WorkspaceKey
from sync.crypto.merkle import FANOUT, LEVELS, ROOT, LocalTree, bucket_path, level_of

KEY = WorkspaceKey(os.urandom(32))


def _tree(files: dict[str, bytes], key: WorkspaceKey = KEY) -> LocalTree:
    return LocalTree.build(files, key)


def test_every_file_hangs_under_its_buckets_at_one_depth() -> None:
    files = {"a.py": b"1" * 16, "b/x.py": b"2" * 16, "b/c/d/e/f/y.py": b"3" * 16}
    t = _tree(files)
    for path in files:
        chain = bucket_path(KEY, path)
        assert chain[0] == ROOT and len(chain) == LEVELS + 1
        assert t.ancestors[path] == chain
        assert path in t.children[chain[-1]]
        # Nothing of the path is in a bucket's name: only the keyed file id picks it.
        key = ciphers.node_key(KEY, path)
        assert chain[1:] == [
            "\0" + "".join(f"{key[j] % FANOUT:02x}" for j in range(level + 1))
            for level in range(LEVELS)]
    assert {level_of(d) for d in t.children} == set(range(LEVELS + 1))
    # No directory of the repo is a node: "b" and "b/c" are nowhere.
    assert not {"b", "b/c", "b/c/d"} & set(t.children)


def test_the_shape_does_not_follow_directories() -> None:
    # 64 files in one directory and 64 spread over 64 directories give trees of the
    # same shape statistics: what a bucket holds depends on the keyed ids alone.
    flat = _tree({f"one/f{i}.py": b"1" * 16 for i in range(64)})
    spread = _tree({f"d{i}/f.py": b"1" * 16 for i in range(64)})
    for t in (flat, spread):
        assert len(t.children[ROOT]) > 16  # spread over buckets, not one directory
        assert max(len(c) for d, c in t.children.items() if d != ROOT) < 16


def test_another_key_puts_files_in_other_buckets() -> None:
    files = {f"pkg/m{i}.py": b"1" * 16 for i in range(20)}
    other = WorkspaceKey(os.urandom(32))
    assert [bucket_path(KEY, p) for p in files] != [bucket_path(other, p) for p in files]


def test_a_change_moves_its_buckets_and_nothing_else() -> None:
    files = {f"a/m{i}.py": bytes([i]) * 16 for i in range(40)}
    before = _tree(dict(files))
    files["a/m7.py"] = b"9" * 16
    after = _tree(files)
    moved = {d for d in after.dirs if after.dirs[d] != before.dirs.get(d)}
    assert moved == set(bucket_path(KEY, "a/m7.py"))


def test_rename_changes_the_digest_even_with_same_content() -> None:
    a = _tree({"d/x.py": b"1" * 16})
    b = _tree({"d/y.py": b"1" * 16})
    assert a.dirs[ROOT] != b.dirs[ROOT]


def test_build_is_deterministic_regardless_of_insertion_order() -> None:
    files = {f"p{i % 7}/q{i % 3}/f{i}.py": bytes([i % 256]) * 16 for i in range(200)}
    reordered = dict(reversed(list(files.items())))
    assert _tree(files).dirs == _tree(reordered).dirs
    assert sorted(_tree(files).files_under(ROOT)) == sorted(files)
