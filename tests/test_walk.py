"""The repository walk and the content checks, on real files in a temporary directory."""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xxhash

from indexer.dir_handles import DirHandles
from indexer.walk import (
    Skipped,
    SkipReason,
    SourceFile,
    WalkResult,
    read_source,
    walk_repo,
)


def write(root: Path, rel: str, content: bytes | str = "x = 1\n") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


def paths(result: WalkResult) -> list[str]:
    return [entry.path for entry in result.files]


def reasons(result: WalkResult) -> dict[str, SkipReason]:
    return {skipped.path: skipped.reason for skipped in result.skipped}


def read_reason(root: Path, rel: str, **kwargs: int) -> SkipReason:
    outcome = read_source(root, rel, **kwargs)
    assert isinstance(outcome, Skipped), f"{rel} was not skipped"
    return outcome.reason


# --- ignore rules ---------------------------------------------------------------------


def test_nested_gitignore_negation_dir_only_and_anchored(tmp_path: Path) -> None:
    write(tmp_path, ".gitignore", "*.log\nbuild/\n/only_root.txt\n*.tmp\n")
    write(tmp_path, "src/.gitignore", "!important.log\ngen/\n/local.py\nsub/deep.py\n")
    for rel in [
        "app.py",
        "debug.log",
        "build/out.py",
        "src/build",  # a file: the dir-only pattern `build/` does not match it
        "only_root.txt",
        "src/only_root.txt",  # `/only_root.txt` is anchored to the root
        "src/important.log",
        "src/other.log",
        "src/gen/x.py",
        "gen/y.py",  # src/.gitignore does not reach outside src/
        "src/local.py",
        "src/sub/local.py",  # `/local.py` is anchored to src/
        "local.py",
        "src/sub/deep.py",  # `sub/deep.py` is relative to src/
        "sub/deep.py",
        "a.tmp",
    ]:
        write(tmp_path, rel)

    assert paths(walk_repo(tmp_path)) == [
        ".gitignore",
        "app.py",
        "gen/y.py",
        "local.py",
        "src/.gitignore",
        "src/build",
        "src/important.log",
        "src/only_root.txt",
        "src/sub/local.py",
        "sub/deep.py",
    ]


def test_double_star_patterns(tmp_path: Path) -> None:
    write(tmp_path, ".gitignore", "docs/**/draft.md\n**/fixtures/\ncache/**\n!cache/keep.py\n")
    for rel in [
        "docs/draft.md",
        "docs/a/b/draft.md",
        "docs/final.md",
        "fixtures/f.py",
        "pkg/tests/fixtures/g.py",
        "cache/drop.py",
        "cache/keep.py",
    ]:
        write(tmp_path, rel)

    assert paths(walk_repo(tmp_path)) == [".gitignore", "cache/keep.py", "docs/final.md"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to compare against")
def test_agrees_with_git_on_tricky_patterns(tmp_path: Path) -> None:
    rules = {
        ".gitignore": "*.log\n!keep.log\nc/**/\nb/**\n!b/keep.py\n/top/\n**/deep\n",
        "sub/.gitignore": "*\n!*/\n!*.py\n!*.log\n/a/\nx/**/y.py\n",
        "sub/inner/.gitignore": "!a/\n",
    }
    files = [
        "a.log", "keep.log", "c/f.py", "c/d/g.py", "b/x.py", "b/keep.py", "b/s/keep.py",
        "top/t.py", "x/top/t.py", "deep/e.py", "x/deep", "sub/a/f.py", "sub/x/q/y.py",
        "sub/n.log", "sub/n.txt", "sub/inner/a/f.py", "sub/inner/m.py", "sub/c/d/h.py",
    ]  # fmt: skip
    for rel, text in rules.items():
        write(tmp_path, rel, text)
    for rel in files:
        write(tmp_path, rel)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    git = subprocess.run(
        ["git", "ls-files", "--others", "--exclude-standard"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )

    listed = paths(walk_repo(tmp_path))
    assert listed == sorted(git.stdout.split())
    assert "c/f.py" in listed  # `c/**/` ignores the directories inside c/, not its files


def test_codeveilignore_applies_after_gitignore(tmp_path: Path) -> None:
    write(tmp_path, ".gitignore", "*.gen.py\nvendor/\n")
    write(tmp_path, ".codeveilignore", "!keep.gen.py\n!vendor/\nsecret/\n!x.py\n")
    write(tmp_path, "src/deep/.gitignore", "x.py\ny.py\n")
    write(tmp_path, "notes/.codeveilignore", "*.md\n")
    for rel in [
        "a.gen.py",
        "keep.gen.py",  # re-included by .codeveilignore
        "vendor/lib.py",  # a whole directory re-included
        "secret/key.py",  # tracked by git, excluded from the index
        "src/deep/x.py",  # a root .codeveilignore outranks even a deeper .gitignore
        "src/deep/y.py",
        "notes/a.md",
        "notes/b.txt",
        "a.md",  # notes/.codeveilignore does not reach the root
    ]:
        write(tmp_path, rel)

    assert paths(walk_repo(tmp_path)) == [
        ".codeveilignore",
        ".gitignore",
        "a.md",
        "keep.gen.py",
        "notes/.codeveilignore",
        "notes/b.txt",
        "src/deep/.gitignore",
        "src/deep/x.py",
        "vendor/lib.py",
    ]


def test_file_in_excluded_directory_cannot_be_reincluded_alone(tmp_path: Path) -> None:
    # As in Git: the walk never enters an excluded directory.
    write(tmp_path, ".gitignore", "out/\n!out/keep.py\n")
    write(tmp_path, "out/keep.py")
    assert paths(walk_repo(tmp_path)) == [".gitignore"]


def test_git_info_exclude(tmp_path: Path) -> None:
    write(tmp_path, ".git/info/exclude", "scratch.py\n")
    write(tmp_path, ".gitignore", "!keep/scratch.py\n")
    write(tmp_path, "scratch.py")
    write(tmp_path, "keep/scratch.py")  # .gitignore outranks info/exclude
    write(tmp_path, "main.py")
    assert paths(walk_repo(tmp_path)) == [".gitignore", "keep/scratch.py", "main.py"]


def test_malformed_ignore_line_is_dropped_not_fatal(tmp_path: Path) -> None:
    write(tmp_path, ".gitignore", "!\n*.log\n")
    write(tmp_path, "a.log")
    write(tmp_path, "a.py")
    assert paths(walk_repo(tmp_path)) == [".gitignore", "a.py"]


def test_vcs_and_state_directories_always_skipped(tmp_path: Path) -> None:
    write(tmp_path, ".codeveilignore", "!.git/\n!.hg/\n")
    for rel in [
        ".git/config",
        ".git/objects/ab/cdef",
        ".hg/store/data",
        ".svn/entries",
        ".bzr/branch",
        "_darcs/patches",
        ".codeveil/state.sqlite",
        "sub/module/.git",  # a submodule's gitlink file
        "sub/module/lib.py",
    ]:
        write(tmp_path, rel)

    result = walk_repo(tmp_path)
    assert paths(result) == [".codeveilignore", "sub/module/lib.py"]
    assert result.skipped == []  # ignored, so not reported


def test_default_heavy_directories(tmp_path: Path) -> None:
    for rel in [
        "node_modules/pkg/index.js",
        "web/node_modules/pkg/index.js",
        "__pycache__/m.py",
        ".tox/py311/x.py",
        ".mypy_cache/x.json",
        ".pytest_cache/v/x",
        ".ruff_cache/x",
        ".venv/pyvenv.cfg",
        ".venv/lib/site.py",
        "env311/pyvenv.cfg",  # any directory with pyvenv.cfg is a virtualenv
        "env311/lib/site.py",
        "venv/__init__.py",  # no pyvenv.cfg: a package that happens to be called venv
        "main.py",
    ]:
        write(tmp_path, rel)

    assert paths(walk_repo(tmp_path)) == ["main.py", "venv/__init__.py"]


def test_codeveilignore_brings_back_default_directories(tmp_path: Path) -> None:
    write(tmp_path, ".codeveilignore", "!node_modules/\n!.venv/\n")
    write(tmp_path, "node_modules/pkg/index.js")
    write(tmp_path, ".venv/pyvenv.cfg", "home = /usr\n")
    write(tmp_path, "__pycache__/m.py")

    assert paths(walk_repo(tmp_path)) == [
        ".codeveilignore",
        ".venv/pyvenv.cfg",
        "node_modules/pkg/index.js",
    ]


# --- name- and stat-based filters -----------------------------------------------------


def test_lock_files_skipped(tmp_path: Path) -> None:
    locks = [
        "package-lock.json",
        "yarn.lock",
        "pnpm-lock.yaml",
        "poetry.lock",
        "Cargo.lock",
        "Gemfile.lock",
        "composer.lock",
        "go.sum",
        "uv.lock",
        "Pipfile.lock",
        "web/flake.lock",
    ]
    for rel in [*locks, "lockfile.py", "block.py", "go.mod"]:
        write(tmp_path, rel, "{}\n")

    result = walk_repo(tmp_path)
    assert paths(result) == ["block.py", "go.mod", "lockfile.py"]
    assert reasons(result) == dict.fromkeys(locks, SkipReason.LOCK_FILE)


def test_binary_extensions_skipped_without_reading(tmp_path: Path) -> None:
    # Text contents: only the name can have caused the skip.
    for rel in ["logo.png", "lib.so", "app.exe", "Main.class", "m.pyc", "w.whl", "doc.PDF"]:
        write(tmp_path, rel, "not really binary\n")
    write(tmp_path, "font.woff2", "x")
    write(tmp_path, "main.py")

    result = walk_repo(tmp_path)
    assert paths(result) == ["main.py"]
    assert set(reasons(result).values()) == {SkipReason.BINARY}
    assert len(result.skipped) == 8


def test_minified_and_generated_names_skipped(tmp_path: Path) -> None:
    for rel in ["app.min.js", "style.min.css", "app.js.map", "api_pb2.py", "api.pb.go"]:
        write(tmp_path, rel)
    write(tmp_path, "client.generated.ts")
    write(tmp_path, "app.js", "let a = 1;\n")

    result = walk_repo(tmp_path)
    assert paths(result) == ["app.js"]
    assert reasons(result) == {
        "app.min.js": SkipReason.MINIFIED,
        "style.min.css": SkipReason.MINIFIED,
        "app.js.map": SkipReason.MINIFIED,
        "api_pb2.py": SkipReason.GENERATED,
        "api.pb.go": SkipReason.GENERATED,
        "client.generated.ts": SkipReason.GENERATED,
    }


def test_too_large_file_skipped(tmp_path: Path) -> None:
    write(tmp_path, "small.py", b"#" * 100)
    write(tmp_path, "big.py", b"#" * 101)

    result = walk_repo(tmp_path, max_file_bytes=100)
    assert paths(result) == ["small.py"]
    assert reasons(result) == {"big.py": SkipReason.TOO_LARGE}
    # The limit holds at read time too, for a file that grew after the walk.
    assert read_reason(tmp_path, "big.py", max_file_bytes=100) == SkipReason.TOO_LARGE


def test_walk_result_is_sorted_posix_with_stat(tmp_path: Path) -> None:
    for rel in ["b/z.py", "a.py", "b/a.py", "a-b.py", "c/d/e.py"]:
        write(tmp_path, rel)

    result = walk_repo(tmp_path)
    assert paths(result) == sorted(paths(result))
    assert paths(result) == ["a-b.py", "a.py", "b/a.py", "b/z.py", "c/d/e.py"]
    entry = result.files[-1]
    st = os.stat(tmp_path / "c" / "d" / "e.py")
    assert (entry.stat.size, entry.stat.mtime_ns, entry.stat.inode) == (
        st.st_size,
        st.st_mtime_ns,
        st.st_ino,
    )


def test_walk_of_5000_files(tmp_path: Path) -> None:
    for d in range(50):
        folder = tmp_path / f"pkg{d:02d}"
        folder.mkdir()
        for f in range(100):
            (folder / f"mod{f:03d}.py").write_text(f"VALUE = {f}\n")

    result = walk_repo(tmp_path)
    assert len(result.files) == 5000
    assert result.files[0].path == "pkg00/mod000.py"
    assert result.files[-1].path == "pkg49/mod099.py"
    assert result.skipped == []


# --- assets: text nobody searches -----------------------------------------------------


def skips(result: WalkResult) -> dict[str, str]:
    return {skipped.path: skipped.describe() for skipped in result.skipped}


def test_svg_and_data_files_skipped_with_a_reason(tmp_path: Path) -> None:
    for rel in ["docs/logo.svg", "icons/Arrow.SVG", "data.csv", "table.tsv", "events.jsonl",
                "locale/de/LC_MESSAGES/app.po", "locale/app.pot", "app.py", "README.md",
                "settings.yaml"]:
        write(tmp_path, rel)

    result = walk_repo(tmp_path)
    assert paths(result) == ["README.md", "app.py", "locale/app.pot", "settings.yaml"]
    assert skips(result) == {
        "docs/logo.svg": "SVG image", "icons/Arrow.SVG": "SVG image",
        "data.csv": "data file", "table.tsv": "data file", "events.jsonl": "data file",
        "locale/de/LC_MESSAGES/app.po": "translations",
    }


def test_config_json_and_xml_stay_large_data_does_not(tmp_path: Path) -> None:
    big = "{\n" + '  "k": "v",\n' * 7000 + "}\n"  # ~84 KB, in short lines
    assert len(big) > 64 * 1024
    for rel in ["package.json", "tsconfig.json", "tsconfig.build.json", "composer.json",
                ".eslintrc.json", "pom.xml", "app/src/main/AndroidManifest.xml",
                "src/locales/en.json", "layout/main.xml"]:
        write(tmp_path, rel, '{"name": "x"}\n')
    for rel in ["schema/records.json", "dump.xml", "package.json.d/records.json"]:
        write(tmp_path, rel, big)
    write(tmp_path, "web/package.json", big)  # a config name: kept at any size

    result = walk_repo(tmp_path)
    assert paths(result) == [
        ".eslintrc.json", "app/src/main/AndroidManifest.xml", "composer.json",
        "layout/main.xml", "package.json", "pom.xml", "src/locales/en.json",
        "tsconfig.build.json", "tsconfig.json", "web/package.json",
    ]
    assert skips(result) == {
        "dump.xml": "data file: xml over 64 KiB",
        "package.json.d/records.json": "data file: json over 64 KiB",
        "schema/records.json": "data file: json over 64 KiB",
    }


def test_data_folders_keep_their_code_and_docs_only(tmp_path: Path) -> None:
    for rel in ["tests/fixtures/package.json", "tests/fixtures/users.xml",
                "tests/fixtures/conf.yaml", "tests/fixtures/expected.txt",
                "tests/fixtures/header.hdr", "tests/fixtures/make_users.py",
                "tests/fixtures/README.md", "pkg/testdata/golden.out",
                "pkg/testdata/input.go", "astro/data/sites.json",
                "astro/data/ReadMe", "src/Data/models.ts", "src/__fixtures__/a.json",
                "src/metadata/config.json"]:
        write(tmp_path, rel)

    result = walk_repo(tmp_path)
    assert paths(result) == [
        "astro/data/ReadMe", "pkg/testdata/input.go", "src/Data/models.ts",
        "src/metadata/config.json", "tests/fixtures/README.md",
        "tests/fixtures/make_users.py",
    ]
    assert set(skips(result).values()) == {"data file: in a data folder"}
    assert sorted(skips(result)) == [
        "astro/data/sites.json", "pkg/testdata/golden.out", "src/__fixtures__/a.json",
        "tests/fixtures/conf.yaml", "tests/fixtures/expected.txt",
        "tests/fixtures/header.hdr", "tests/fixtures/package.json",
        "tests/fixtures/users.xml",
    ]


def test_vendored_folders_skipped_whole_and_bundles(tmp_path: Path) -> None:
    for rel in ["vendor/github.com/x/y/y.go", "lib/third_party/zlib/zlib.c",
                "pip/_vendor/six.py", "cextern/wcslib/C/wcs.c", "static/app.bundle.js",
                "dist/index.js", "dist/style.css", "dist/README.md", "web/dist/chunk.mjs",
                "main.go", "distance/dist.py", "vendors.py"]:
        write(tmp_path, rel)

    result = walk_repo(tmp_path)
    assert paths(result) == ["dist/README.md", "distance/dist.py", "main.go", "vendors.py"]
    assert skips(result) == {
        "vendor": "vendored: folder",  # one entry for the folder, not one per file
        "lib/third_party": "vendored: folder",
        "pip/_vendor": "vendored: folder",
        "cextern": "vendored: folder",
        "static/app.bundle.js": "bundle",
        "dist/index.js": "bundle: in dist/",
        "dist/style.css": "bundle: in dist/",
        "web/dist/chunk.mjs": "bundle: in dist/",
    }


def test_codeveilignore_negation_brings_a_skipped_file_back(tmp_path: Path) -> None:
    write(tmp_path, ".codeveilignore",
          "!docs/logo.svg\n!tests/fixtures/**\n!vendor/\n!yarn.lock\n!big.json\n")
    for rel in ["docs/logo.svg", "docs/other.svg", "tests/fixtures/a.json",
                "tests/fixtures/sub/b.csv", "other/fixtures/c.json", "vendor/lib/x.go",
                "yarn.lock", "Cargo.lock"]:
        write(tmp_path, rel)
    write(tmp_path, "big.json", "[\n" + "1,\n" * 30000 + "1]\n")

    result = walk_repo(tmp_path)
    assert paths(result) == [
        ".codeveilignore", "big.json", "docs/logo.svg", "tests/fixtures/a.json",
        "tests/fixtures/sub/b.csv", "vendor/lib/x.go", "yarn.lock",
    ]
    assert sorted(skips(result)) == ["Cargo.lock", "docs/other.svg", "other/fixtures/c.json"]


def test_skipped_assets_do_not_come_back_by_accident(tmp_path: Path) -> None:
    # A .gitignore negation speaks about Git; re-including folders says nothing of files.
    write(tmp_path, ".gitignore", "*\n!*/\n!*.svg\n!*.py\n!*.json\n!.gitignore\n"
                                  "!.codeveilignore\n")
    write(tmp_path, ".codeveilignore", "!fixtures/\n!*.py\n")
    for rel in ["logo.svg", "fixtures/a.json", "vendor/v.py", "app.py"]:
        write(tmp_path, rel)

    result = walk_repo(tmp_path)
    assert paths(result) == [".codeveilignore", ".gitignore", "app.py"]
    assert skips(result) == {"logo.svg": "SVG image",
                             "fixtures/a.json": "data file: in a data folder",
                             "vendor": "vendored: folder"}


def test_invalid_notebook_skipped_with_a_reason(tmp_path: Path) -> None:
    write(tmp_path, "good.ipynb", '{"cells": [], "metadata": {}, "nbformat": 4}\n')
    write(tmp_path, "broken.ipynb", '{"cells": [{"cell_type": "code", "source": ["x = 1\n"')
    write(tmp_path, "not_cells.ipynb", '{"metadata": {}}\n')
    write(tmp_path, "bad_source.ipynb", '{"cells": [{"cell_type": "code", "source": 3}]}')

    assert isinstance(read_source(tmp_path, "good.ipynb"), SourceFile)
    for rel in ["broken.ipynb", "not_cells.ipynb", "bad_source.ipynb"]:
        assert read_reason(tmp_path, rel) == SkipReason.BAD_NOTEBOOK, rel
    assert str(read_source(tmp_path, "broken.ipynb")) == "broken.ipynb: not a valid notebook"


# --- symlinks, special files, unreadable entries --------------------------------------


def test_symlinks(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    outside = write(tmp_path, "outside/secret.py")
    write(root, "src/real.py")
    (root / "inside_link.py").symlink_to("src/real.py")
    (root / "outside_link.py").symlink_to(outside)
    (root / "linked_dir").symlink_to(root / "src", target_is_directory=True)
    (root / "outside_dir").symlink_to(tmp_path / "outside", target_is_directory=True)
    (root / "dangling.py").symlink_to(root / "nowhere.py")
    (root / "loop_a").symlink_to("loop_b")
    (root / "loop_b").symlink_to("loop_a")
    write(root, ".git/config", "[remote] url = https://token@example.com/r.git\n")
    (root / "git_config").symlink_to(root / ".git" / "config")  # as ignored as .git

    result = walk_repo(root)
    assert paths(result) == ["inside_link.py", "src/real.py"]
    assert reasons(result) == {
        "outside_link.py": SkipReason.SYMLINK_OUTSIDE,
        "linked_dir": SkipReason.SYMLINK_DIR,
        "outside_dir": SkipReason.SYMLINK_DIR,
        "dangling.py": SkipReason.UNREADABLE,
        "loop_a": SkipReason.UNREADABLE,
        "loop_b": SkipReason.UNREADABLE,
    }
    # The link is listed with its target's stat, and reads as the target.
    link = next(e for e in result.files if e.path == "inside_link.py")
    assert link.stat.inode == os.stat(root / "src" / "real.py").st_ino
    assert isinstance(read_source(root, "inside_link.py"), SourceFile)


def test_symlink_inside_repo_reached_through_a_symlinked_root(tmp_path: Path) -> None:
    write(tmp_path, "real_repo/a.py")
    (tmp_path / "real_repo" / "b.py").symlink_to(tmp_path / "real_repo" / "a.py")
    (tmp_path / "root_link").symlink_to(tmp_path / "real_repo", target_is_directory=True)

    assert paths(walk_repo(tmp_path / "root_link")) == ["a.py", "b.py"]


def test_fifo_is_skipped_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    write(tmp_path, "a.py")

    result = walk_repo(tmp_path)
    assert paths(result) == ["a.py"]
    assert reasons(result) == {"pipe": SkipReason.NOT_REGULAR}
    # Opening a FIFO for reading would wait for a writer; read_source must not.
    assert read_reason(tmp_path, "pipe") == SkipReason.NOT_REGULAR


def test_unreadable_files_are_skipped_not_fatal(tmp_path: Path) -> None:
    # Root can open anything with mode 000, so use failures that hold for root too:
    # a file that vanished after the walk, a symlink loop, a dangling symlink.
    write(tmp_path, "gone.py")
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "dangling.py").symlink_to("missing.py")
    listed = paths(walk_repo(tmp_path))
    assert listed == ["gone.py"]
    (tmp_path / "gone.py").unlink()

    for rel in ["gone.py", "loop", "dangling.py"]:
        outcome = read_source(tmp_path, rel)
        assert isinstance(outcome, Skipped)
        assert outcome.reason == SkipReason.UNREADABLE
        assert outcome.describe().startswith("unreadable: ")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read files with mode 000")
def test_permission_denied_is_skipped(tmp_path: Path) -> None:
    locked = write(tmp_path, "locked.py")
    locked_dir = write(tmp_path, "private/a.py").parent
    locked.chmod(0)
    locked_dir.chmod(0)
    try:
        result = walk_repo(tmp_path)
        assert reasons(result) == {"private": SkipReason.UNREADABLE}
        assert read_reason(tmp_path, "locked.py") == SkipReason.UNREADABLE
    finally:
        locked_dir.chmod(0o755)
        locked.chmod(0o644)


def test_non_utf8_file_name_reported(tmp_path: Path) -> None:
    (tmp_path / os.fsdecode(b"caf\xe9.py")).write_text("x = 1\n")
    write(tmp_path, "a.py")

    result = walk_repo(tmp_path)
    assert paths(result) == ["a.py"]
    assert [s.reason for s in result.skipped] == [SkipReason.BAD_NAME]


# --- content checks -------------------------------------------------------------------


def test_read_source_returns_exact_text_and_digest(tmp_path: Path) -> None:
    data = "\ufeff# é\r\nprint('hi')\r\n".encode()
    write(tmp_path, "m.py", data)

    source = read_source(tmp_path, "m.py")
    assert isinstance(source, SourceFile)
    assert source.text.encode("utf-8") == data  # BOM and CRLF kept
    assert source.digest == xxhash.xxh3_128_digest(data)
    assert source.stat.size == len(data)


def test_binary_content_skipped(tmp_path: Path) -> None:
    write(tmp_path, "blob.dat", b"\x00\x01\x02binary")
    # A NUL far past the first 8 KiB still makes the file binary.
    write(tmp_path, "mixed.txt", b"a = 1\n" * 3000 + b"\x00" + b"b = 2\n" * 10)

    assert read_reason(tmp_path, "blob.dat") == SkipReason.BINARY
    assert read_reason(tmp_path, "mixed.txt") == SkipReason.BINARY


def test_non_utf8_content_reported(tmp_path: Path) -> None:
    write(tmp_path, "latin.py", "name = 'café'\n".encode("latin-1"))
    write(tmp_path, "wide.txt", "hello\n".encode("utf-16"))

    assert read_reason(tmp_path, "latin.py") == SkipReason.NOT_UTF8
    assert read_reason(tmp_path, "wide.txt") == SkipReason.NOT_UTF8
    assert str(read_source(tmp_path, "latin.py")) == "latin.py: not UTF-8"


def test_minified_content_skipped(tmp_path: Path) -> None:
    write(tmp_path, "bundle.js", "var a=1;" * 800 + "\n")  # one 6,400-char line
    write(tmp_path, "style.css", ("a{b:c}" * 60 + "\n") * 5)  # 361 chars per line
    write(tmp_path, "data.json", "[" + "1," * 3000 + "1]\n")
    write(tmp_path, "mostly_short.js", "x;\n" * 5000 + "y" * 5001 + "\n")
    write(tmp_path, "app.js", "function f() {\n  return 1;\n}\n" * 100)
    write(tmp_path, "long_line.py", "X = '" + "a" * 6000 + "'\n")  # not a minifiable type

    for rel in ["bundle.js", "style.css", "data.json", "mostly_short.js"]:
        assert read_reason(tmp_path, rel) == SkipReason.MINIFIED, rel
    assert isinstance(read_source(tmp_path, "app.js"), SourceFile)
    assert isinstance(read_source(tmp_path, "long_line.py"), SourceFile)


def test_generated_marker_skipped(tmp_path: Path) -> None:
    write(tmp_path, "api.go", "// Code generated by protoc-gen-go. DO NOT EDIT.\npackage api\n")
    write(tmp_path, "schema.py", "# @generated by tool\nX = 1\n")
    license_header = "".join(f"# License line {i}\n" for i in range(10))
    write(tmp_path, "late.py", license_header + "# DO NOT EDIT: made by gen.py\nX = 1\n")
    write(tmp_path, "doc.py", '"""Files marked DO NOT EDIT or @generated are skipped."""\n')
    write(tmp_path, "deep.py", "X = 1\n" * 30 + "# DO NOT EDIT\n")

    for rel in ["api.go", "schema.py", "late.py"]:
        assert read_reason(tmp_path, rel) == SkipReason.GENERATED, rel
    # A mention outside a comment, or far below the top, is not a marker.
    assert isinstance(read_source(tmp_path, "doc.py"), SourceFile)
    assert isinstance(read_source(tmp_path, "deep.py"), SourceFile)


def test_empty_file_is_indexable(tmp_path: Path) -> None:
    write(tmp_path, "__init__.py", b"")
    assert paths(walk_repo(tmp_path)) == ["__init__.py"]
    source = read_source(tmp_path, "__init__.py")
    assert isinstance(source, SourceFile)
    assert source.text == ""


_FLIPPER = """
import os, sys
link, targets = sys.argv[1], sys.argv[2:]
tmp, i = link + ".flip", 0
while True:
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(targets[i % len(targets)], tmp)
    os.replace(tmp, link)
    i += 1
"""


@pytest.mark.parametrize("swap", ["file link", "directory"])
@pytest.mark.parametrize("beneath", [False, True], ids=["by path", "beneath handles"])
def test_a_link_flipped_during_reads_never_reads_an_outside_file(
    tmp_path: Path, swap: str, beneath: bool
) -> None:
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    (repo / "pkg").mkdir(parents=True)
    outside.mkdir()
    (outside / "mod.py").write_text("OUTSIDE_SECRET = 1\n")
    (repo / "inside.py").write_text("inside = 1\n")
    if swap == "file link":
        # link.py -> inside.py (fine), flipped to the outside file and back.
        link, targets, rel = repo / "link.py", ["inside.py", str(outside / "mod.py")], "link.py"
        os.symlink("inside.py", link)
    else:
        # pkg/ is a real directory when walked; a symlink to outside/ now and then.
        (repo / "pkg" / "mod.py").write_text("pkg = 1\n")
        real = repo / "pkg.real"
        (repo / "pkg").rename(real)
        link, targets, rel = repo / "pkg", ["pkg.real", str(outside)], "pkg/mod.py"
        os.symlink("pkg.real", link)
    # Another process retargets the link atomically (rename), as fast as it can.
    flipper = subprocess.Popen([sys.executable, "-c", _FLIPPER, str(link), *targets])
    outcomes: collections.Counter[str] = collections.Counter()

    def race_met() -> bool:
        return outcomes[SkipReason.SYMLINK_OUTSIDE] > 10 and (
            outcomes["read"] > 10 or swap == "directory")

    # At least 3000 reads, and on until both sides of the race were met: on a loaded
    # machine the flipper may get few turns in the first thousands.
    deadline = time.monotonic() + 60
    dirs = DirHandles(repo) if beneath else None
    try:
        reads = 0
        while reads < 3000 or (not race_met() and time.monotonic() < deadline):
            got = read_source(repo, rel, dirs=dirs)
            reads += 1
            if isinstance(got, SourceFile):
                assert "OUTSIDE_SECRET" not in got.text
                outcomes["read"] += 1
            else:
                outcomes[got.reason] += 1
    finally:
        flipper.kill()
        flipper.wait()
        if dirs is not None:
            dirs.close()
    # The race was run, not dodged: the outside file was met and refused many times.
    assert outcomes[SkipReason.SYMLINK_OUTSIDE] > 10, outcomes
    assert outcomes["read"] > 10 or swap == "directory", outcomes


def test_a_link_replaced_between_its_stat_and_its_resolution_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race a flipping link opens (os.replace of a temporary link between the walk's
    # stat and realpath) made realpath raise; the walk must skip the link, not fail.
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "inside.py").write_text("x = 1\n")
    os.symlink("inside.py", repo / "link.py")
    real_realpath = os.path.realpath

    def vanishing_realpath(path: str, *args: object, **kwargs: object) -> str:
        if str(path).endswith("link.py"):
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_realpath(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os.path, "realpath", vanishing_realpath)
    result = walk_repo(repo)
    assert [e.path for e in result.files] == ["inside.py"]
    assert [(s.path, s.reason) for s in result.skipped] == [("link.py", SkipReason.UNREADABLE)]


# --- reading beneath directory handles ------------------------------------------------


def test_reads_beneath_handles_match_reads_by_path(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for rel in ["a.py", "pkg/b.py", "pkg/sub/c.py", "other/deep/er/d.py"]:
        write(repo, rel, f"name = {rel!r}\n")
    (repo / "link.py").symlink_to("pkg/b.py")  # an inside link: read by path, checked
    write(repo, "pkg/blob.bin", b"\x00\x01binary")
    with DirHandles(repo, limit=2) as dirs:  # fewer than the directories: some re-opened
        for _ in range(2):
            for rel in ["a.py", "pkg/b.py", "pkg/sub/c.py", "other/deep/er/d.py", "link.py",
                        "pkg/blob.bin", "pkg/missing.py"]:
                by_path, beneath = read_source(repo, rel), read_source(repo, rel, dirs=dirs)
                assert type(by_path) is type(beneath), rel
                if isinstance(by_path, SourceFile):
                    assert isinstance(beneath, SourceFile)
                    assert (beneath.text, beneath.digest, beneath.stat) == \
                        (by_path.text, by_path.digest, by_path.stat)
                else:
                    assert isinstance(beneath, Skipped) and beneath.reason == by_path.reason
            assert len(dirs._dirs) <= 2 + 3  # the limit, plus one chain being opened


def test_a_directory_swapped_for_an_outside_link_is_not_followed(tmp_path: Path) -> None:
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    write(repo, "pkg/mod.py", "inside = 1\n")
    write(repo, "lib/mod.py", "inside = 2\n")
    write(outside, "mod.py", "OUTSIDE_SECRET = 1\n")
    with DirHandles(repo) as dirs:
        assert isinstance(read_source(repo, "pkg/mod.py", dirs=dirs), SourceFile)  # pkg/ open
        for name in ("pkg", "lib"):  # swapped after its handle was opened, and before
            (repo / name).rename(repo / f"{name}.old")
            (repo / name).symlink_to(outside, target_is_directory=True)
        held = read_source(repo, "pkg/mod.py", dirs=dirs)
        # The handle names the directory it was opened on, which was inside.
        assert isinstance(held, SourceFile) and held.text == "inside = 1\n"
        fresh = read_source(repo, "lib/mod.py", dirs=dirs)
        assert isinstance(fresh, Skipped) and fresh.reason == SkipReason.SYMLINK_OUTSIDE
