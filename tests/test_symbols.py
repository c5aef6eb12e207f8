"""Definitions and outlines, read from the syntax trees of an index of real files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from indexer.languages import GRAMMAR_LANGUAGES
from indexer.local_chunks import STATE_FORMAT
from retrieval import Index
from retrieval.agent.symbols import ToolInputError, split_name
from tests.conftest import write_repo

# One file per grammar language: (path, source, a qualified name defined in it, the
# line that definition starts on).
LANGUAGE_FILES: dict[str, tuple[str, str, str, int]] = {
    "python": ("pkg/sessions.py",
               "import os\n\nclass Session:\n    @property\n    def send(self, x):\n"
               "        return x\n", "Session.send", 5),
    "javascript": ("web/app.js",
                   "const LIMIT = 3;\nclass Cart {\n  total() { return 1; }\n}\n",
                   "Cart.total", 3),
    "typescript": ("web/types.ts",
                   "export interface Shape {\n  area(): number;\n}\ntype Id = string;\n",
                   "Id", 4),
    "tsx": ("web/view.tsx", "export const Banner = () => <div/>;\n", "Banner", 1),
    "go": ("store/cache.go",
           "package store\n\ntype Cache struct{}\n\nfunc (c *Cache) Get(k string) {}\n",
           "store.Cache.Get", 5),
    "rust": ("src/lib.rs", "pub struct Pool;\n\nimpl Pool {\n    pub fn acquire(&self) {}\n}\n",
             "Pool::acquire", 4),
    "java": ("src/Main.java",
             "class Main {\n  static final int LIMIT = 2;\n  void run() {}\n}\n",
             "Main.LIMIT", 2),
    "c": ("src/util.c", "#define MAX_ITEMS 9\n\nint clamp(int x) { return x; }\n",
          "clamp", 3),
    "cpp": ("src/geo.cpp", "namespace geo {\nclass Point {\n  double norm();\n};\n}\n"
            "double geo::Point::norm() { return 0; }\n", "geo::Point", 2),
    "csharp": ("src/Bank.cs", "namespace Bank {\n  class Account {\n    void Deposit() {}\n"
               "  }\n}\n", "Account.Deposit", 3),
    "ruby": ("lib/base.rb", "module Sinatra\n  class Base\n    def call(env)\n    end\n"
             "  end\nend\n", "Sinatra::Base", 2),
    "php": ("src/Repo.php", "<?php\nclass Repo {\n  function find($id) {}\n}\n",
            "Repo.find", 3),
    "kotlin": ("src/Greeter.kt", "class Greeter {\n  fun greet() {}\n}\n", "Greeter.greet", 2),
    "swift": ("src/Drawable.swift", "protocol Drawable {\n  func draw()\n}\n", "Drawable", 1),
    "scala": ("src/Calc.scala", "object Calc {\n  def add(a: Int) = a\n}\n", "Calc.add", 2),
    "bash": ("bin/deploy.sh", "#!/bin/bash\ndeploy() {\n  echo go\n}\n", "deploy", 2),
    "lua": ("lua/mod.lua", "local M = {}\nfunction M.start()\nend\nreturn M\n", "M.start", 2),
}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    files = {path: source for path, source, _, _ in LANGUAGE_FILES.values()}
    files["tests/test_sessions.py"] = "class Session:\n    def send(self):\n        pass\n"
    files["README.md"] = "# Guide\n\nSome words.\n\n## Install\n\nRun it.\n"
    root = write_repo(tmp_path / "repo", files)
    Index(root, embedder=HashingEmbedder()).index(wait=True)
    return root


def test_every_grammar_language_has_its_definitions_found(repo: Path) -> None:
    assert set(LANGUAGE_FILES) == GRAMMAR_LANGUAGES  # a new grammar needs a case here
    idx = Index(repo, embedder=HashingEmbedder())
    for language, (path, _source, name, line) in LANGUAGE_FILES.items():
        hits = idx.definition(name)
        assert hits, f"{language}: nothing found for {name}"
        best = hits[0]
        assert (best.path, best.start_line) == (path, line), (language, hits)
        lines = (repo / path).read_text().split("\n")
        assert best.signature == " ".join(lines[line - 1].split())
        assert best.language == language


def test_source_ranks_before_tests_and_the_full_name_before_a_tail(repo: Path) -> None:
    idx = Index(repo, embedder=HashingEmbedder())
    hits = idx.definition("Session.send")
    assert [h.path for h in hits] == ["pkg/sessions.py", "tests/test_sessions.py"]
    assert hits[0].match == "exact" and hits[0].kind == "method"
    # Through the module path: the file's stem, then the symbol path.
    assert idx.definition("sessions.Session")[0].match == "module"
    # Rust's struct before its impl block.
    assert [h.kind for h in idx.definition("Pool")] == ["struct", "impl"]
    assert idx.definition("NoSuchThing") == []


def test_a_name_in_another_case_is_still_found(repo: Path) -> None:
    hits = Index(repo, embedder=HashingEmbedder()).definition("session.SEND")
    assert hits and hits[0].path == "pkg/sessions.py"


def test_a_definition_moved_by_an_edit_is_found_at_its_new_line(repo: Path) -> None:
    path = repo / "pkg/sessions.py"
    path.write_text("# a comment\n# another\n" + path.read_text())
    hit = Index(repo, embedder=HashingEmbedder()).definition("Session.send")[0]
    assert (hit.start_line, hit.stale) == (7, False)
    path.write_text("class Other:\n    pass\n")
    assert Index(repo, embedder=HashingEmbedder()).definition("Session.send")[0].stale


def test_outline_reads_the_index_and_reparses_only_a_changed_file(repo: Path) -> None:
    idx = Index(repo, embedder=HashingEmbedder())
    outline = idx.outline("pkg/sessions.py")
    assert not outline.reparsed
    assert [(s.symbol, s.kind, s.start_line, s.end_line, s.depth) for s in outline.symbols] == [
        ("Session", "class", 3, 6, 0), ("Session > send", "method", 5, 6, 1)]
    assert outline.symbols[1].signature == "def send(self, x):"
    (repo / "pkg/sessions.py").write_text("def fresh():\n    pass\n")
    changed = idx.outline(repo / "pkg/sessions.py")  # an absolute path works too
    assert changed.reparsed
    assert [s.symbol for s in changed.symbols] == ["fresh"]


def test_outline_of_prose_lists_its_headings(repo: Path) -> None:
    outline = Index(repo, embedder=HashingEmbedder()).outline("README.md")
    assert outline.language == "markdown" and not outline.reparsed
    assert [s.symbol for s in outline.symbols][:1] == ["Guide"]


def test_outline_of_a_missing_file_is_a_clear_error(repo: Path) -> None:
    with pytest.raises(ToolInputError, match=r"no file nope\.py"):
        Index(repo, embedder=HashingEmbedder()).outline("nope.py")


def test_a_state_of_the_previous_format_is_migrated_and_read_from_its_chunks(
        repo: Path) -> None:
    state = repo / ".codeveil" / "state.sqlite"
    with sqlite3.connect(state) as db:  # as format 1 left it: no definition tables
        db.execute("DROP TABLE definitions")
        db.execute("DROP TABLE definition_files")
        db.execute("PRAGMA user_version = 1")
    hits = Index(repo, embedder=HashingEmbedder()).definition("Sinatra::Base")
    assert [(h.path, h.start_line) for h in hits] == [("lib/base.rb", 2)]
    with sqlite3.connect(state) as db:
        assert int(db.execute("PRAGMA user_version").fetchone()[0]) == STATE_FORMAT
        kept = db.execute("SELECT count(*) FROM definition_files").fetchone()[0]
    assert kept == len(LANGUAGE_FILES) + 2  # every file read once, then kept


def test_names_split_at_every_separator() -> None:
    assert split_name("Sinatra::Base") == ("Sinatra", "Base")
    assert split_name("pkg.Func") == ("pkg", "Func")
    assert split_name("a/b#c") == ("a", "b", "c")
    assert split_name("Session > send") == ("Session", "send")
    assert split_name("Job:pid") == ("Job", "pid")  # Lua's method call syntax
    with pytest.raises(ToolInputError):
        split_name(" :: ")


def test_signatures_are_the_definitions_own_lines_after_leading_blanks_and_comments(
        tmp_path: Path) -> None:
    # The syntax tree's root starts at the first node, not at the file's first line.
    root = tmp_path / "repo"
    root.mkdir()
    (root / "m.py").write_text("\n\n# header\n\nclass A:\n    x = 1\n")
    Index(root, embedder=HashingEmbedder()).index(wait=True)
    outline = Index(root, embedder=HashingEmbedder()).outline("m.py")
    assert [(s.symbol, s.start_line, s.signature) for s in outline.symbols] == [
        ("A", 5, "class A:"), ("A > x", 6, "x = 1")]


def test_a_long_name_is_found_whole(tmp_path: Path) -> None:
    # Chunk headers shorten long names; the definition table keeps them whole.
    name = "test_" + "that_a_very_long_descriptive_name_" * 3 + "still_resolves"
    root = write_repo(tmp_path / "repo", {"t.py": f"class Suite:\n    def {name}(self):\n"
                                                  "        pass\n"})
    Index(root, embedder=HashingEmbedder()).index(wait=True)
    hits = Index(root, embedder=HashingEmbedder()).definition(f"Suite.{name}")
    assert [(h.path, h.start_line, h.symbol) for h in hits] == [("t.py", 2, f"Suite > {name}")]


def test_lua_functions_held_by_variables_and_methods_are_definitions(tmp_path: Path) -> None:
    source = ("local Job = {}\n"
              "function Job:pid()\n  return 1\nend\n"
              "local helper = function(a) return a end\n"
              "Job.reset = function() end\n"
              "local function loader()\n  local filter = function() end\n  return filter\nend\n"
              "local LIMIT = 5\n"
              "return Job\n")
    root = write_repo(tmp_path / "repo", {"lua/job.lua": source})
    idx = Index(root, embedder=HashingEmbedder())
    idx.index(wait=True)
    found = {name: [(h.start_line, h.kind) for h in idx.definition(name)]
             for name in ("Job:pid", "helper", "Job.reset", "filter", "LIMIT")}
    assert found == {"Job:pid": [(2, "method")], "helper": [(5, "function")],
                     "Job.reset": [(6, "method")], "filter": [(8, "function")],
                     "LIMIT": []}  # a plain value inside no table is no definition


def test_a_cpp_header_full_of_macros_is_read_as_cpp(tmp_path: Path) -> None:
    # Neither grammar parses a header whose declarations carry macros; the C++ reading
    # breaks in fewer places, so its templates and aliases are definitions.
    header = ("#pragma once\n#define APP_INLINE inline\n\nnamespace app {\n"
              "template <typename Mutex>\nclass color_sink {\npublic:\n"
              "    APP_INLINE bool should_color();\n};\n\n"
              "template <typename Mutex>\n"
              "APP_INLINE bool color_sink<Mutex>::should_color() {\n    return true;\n}\n\n"
              "template <typename... Args>\n"
              "constexpr auto count_named_args() -> size_t {\n    return sizeof...(Args);\n}\n\n"
              "using color_sink_st = color_sink<int>;\n}\n")
    root = write_repo(tmp_path / "repo", {"include/sink.h": header})
    idx = Index(root, embedder=HashingEmbedder())
    idx.index(wait=True)
    found = {name: [(h.path, h.start_line) for h in idx.definition(name)][:1]
             for name in ("should_color", "count_named_args", "color_sink_st")}
    assert found == {"should_color": [("include/sink.h", 12)],
                     "count_named_args": [("include/sink.h", 17)],
                     "color_sink_st": [("include/sink.h", 21)]}


def test_javascript_functions_assigned_to_a_field_are_definitions(tmp_path: Path) -> None:
    source = ("export function makeParser() {\n  const parser = {};\n"
              "  parser.onHeaderField = function (bytes) {\n    return bytes;\n  };\n"
              "  this.onEnd = () => {};\n  parser.count = 3;\n  return parser;\n}\n")
    root = write_repo(tmp_path / "repo", {"src/parser.js": source})
    idx = Index(root, embedder=HashingEmbedder())
    idx.index(wait=True)
    found = {name: [(h.path, h.start_line) for h in idx.definition(name)]
             for name in ("onHeaderField", "parser.onHeaderField", "onEnd", "count")}
    assert found == {"onHeaderField": [("src/parser.js", 3)],
                     "parser.onHeaderField": [("src/parser.js", 3)],
                     "onEnd": [("src/parser.js", 6)],
                     "count": []}  # a plain value set on a field is no definition
