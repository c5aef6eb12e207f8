"""What a file is for, from its path alone: code, tests, docs, examples or config.

Every hit carries its file's kind, and searches can keep some kinds only
(`--kind code`). The rules, first match wins:

1. prose (Markdown, reStructuredText, AsciiDoc; README, CHANGELOG, LICENSE and the
   like) is `docs` wherever it sits: a `tests/README.md` documents;
2. `tests`: a file under a test folder (`tests/`, `__tests__/`, `spec/`, `testdata/`,
   `fixtures/`, ...) or named as a test in its language (`test_*.py`, `*_test.go`,
   `*.spec.ts`, `*_spec.rb`, `FooTest.java`, `conftest.py`, ...);
3. `docs`: anything under a docs folder (`docs/`, `doc/`, `documentation/`, `man/`)
   but source in a programming language: a `doc/` package of Go files that generates
   documentation is code, as its language says;
4. `examples`: anything under `examples/`, `samples/`, `demo/`, `tutorials/`, ...;
5. `config`: YAML, TOML, JSON, INI and XML files, dotfiles such as `.gitignore`, and
   `requirements*.txt`; other plain text and LaTeX are `docs`;
6. everything else is `code`.

Folder names are compared in lower case; test file names keep their case where the
convention is CamelCase (`FooTest.kt`, but not `Contest.kt`).
"""

from __future__ import annotations

import functools
from enum import StrEnum
from typing import Final

from indexer.languages import CONFIG_LANGUAGES, PROSE_LANGUAGES, language_for_path


class FileKind(StrEnum):
    """What a file is for."""

    CODE = "code"
    TESTS = "tests"
    DOCS = "docs"
    EXAMPLES = "examples"
    CONFIG = "config"


KINDS: Final = tuple(kind.value for kind in FileKind)

TEST_DIRS: Final = frozenset(
    {"test", "tests", "testing", "spec", "specs", "__tests__", "__test__", "__mocks__",
     "e2e", "androidtest", "unittest", "unittests", "testdata", "test_data", "test-data",
     "fixtures", "__fixtures__", "testsuite", "t"}
)
DOC_DIRS: Final = frozenset({"doc", "docs", "documentation", "man", "manual", "guide", "guides",
                             "_docs", "website"})
EXAMPLE_DIRS: Final = frozenset(
    {"example", "examples", "_example", "_examples", "sample", "samples", "demo", "demos",
     "tutorial", "tutorials", "cookbook", "showcase", "playground", "gallery"}
)
_DOC_LANGUAGES: Final = PROSE_LANGUAGES - {"text"}  # Markdown, reStructuredText
# What a docs folder holds as docs: prose, markup, styles, data, config and notebooks (a
# tutorial's); anything else there is a program (None: no language known, an asset).
_NOT_PROGRAMS: Final = frozenset({*PROSE_LANGUAGES, *CONFIG_LANGUAGES, "html", "css", "scss",
                                  "less", "latex", "notebook", None})
_PROSE_EXTENSIONS: Final = (".adoc", ".asciidoc", ".textile", ".org", ".pod")

# Lower-case stem endings and starts that name a test file in some language.
_TEST_STEM_ENDS: Final = ("_test", "_tests", "-test", "-tests", ".test", ".tests", "_spec",
                          "-spec", ".spec", "_unittest", ".e2e", "_e2e")
_TEST_STEM_STARTS: Final = ("test_", "test-", "tests_")
_TEST_STEMS: Final = frozenset({"test", "tests", "conftest", "spec_helper", "rails_helper",
                                "test_helper"})
# CamelCase conventions (JUnit, NUnit, XCTest, ScalaTest, PHPUnit, Spock), case kept.
_CAMEL_TEST_ENDS: Final = ("Test", "Tests", "Spec", "IT", "TestCase")
_CAMEL_TEST_EXTENSIONS: Final = frozenset(
    {".java", ".kt", ".kts", ".scala", ".groovy", ".cs", ".fs", ".swift", ".php", ".m", ".mm",
     ".dart", ".vb"}
)


@functools.lru_cache(maxsize=1 << 16)  # a filtered search asks once per file of the index
def file_kind(path: str) -> FileKind:
    """The kind of the file at the repo-relative POSIX `path`."""
    folders_and_name = path.split("/")
    name = folders_and_name[-1]
    lower = name.lower()
    folders = {part.lower() for part in folders_and_name[:-1]}
    language = language_for_path(name)
    plain_text = language == "text" and lower.endswith((".txt", ".text"))
    if language == "text" and lower.startswith("."):  # .gitignore, .dockerignore
        return FileKind.CONFIG
    if language in _DOC_LANGUAGES or lower.endswith(_PROSE_EXTENSIONS) or (
        language == "text" and not plain_text  # README, CHANGELOG, LICENSE, ...
    ):
        return FileKind.DOCS
    if not folders.isdisjoint(TEST_DIRS) or _is_test_name(name):
        return FileKind.TESTS  # plain text and LaTeX there are test inputs
    if not folders.isdisjoint(DOC_DIRS) and language in _NOT_PROGRAMS:
        return FileKind.DOCS
    if not folders.isdisjoint(EXAMPLE_DIRS):
        return FileKind.EXAMPLES
    if language in CONFIG_LANGUAGES or lower.startswith("requirements"):
        return FileKind.CONFIG
    if plain_text or language == "latex":
        return FileKind.DOCS
    return FileKind.CODE


def _is_test_name(name: str) -> bool:
    stem, dot, extension = name.rpartition(".")
    if not dot:
        stem, extension = name, ""
    lower = stem.lower()
    if lower in _TEST_STEMS or lower.startswith(_TEST_STEM_STARTS):
        return True
    if lower.endswith(_TEST_STEM_ENDS):
        return True
    return f".{extension.lower()}" in _CAMEL_TEST_EXTENSIONS and stem.endswith(_CAMEL_TEST_ENDS)


def parse_kinds(values: str | list[str] | tuple[str, ...] | None) -> frozenset[FileKind] | None:
    """The kinds named by `values` ("code,docs", or a list of such), None for all.

    Raises ValueError naming the unknown kind and the known ones.
    """
    if values is None:
        return None
    items = [values] if isinstance(values, str) else list(values)
    kinds: set[FileKind] = set()
    for item in items:
        for word in item.split(","):
            word = word.strip().lower()
            if not word:
                continue
            if word not in KINDS:
                raise ValueError(f"unknown kind {word!r}; use one of {', '.join(KINDS)}")
            kinds.add(FileKind(word))
    return frozenset(kinds) if kinds else None
