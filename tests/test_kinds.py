"""File kinds from paths: a table across languages and layouts, and the filter's parser."""

from __future__ import annotations

import pytest

from indexer.kinds import KINDS, FileKind, file_kind, parse_kinds

CODE, TESTS, DOCS, EXAMPLES, CONFIG = (FileKind.CODE, FileKind.TESTS, FileKind.DOCS,
                                       FileKind.EXAMPLES, FileKind.CONFIG)

TABLE = [
    # Python
    ("src/requests/adapters.py", CODE),
    ("tests/test_adapters.py", TESTS),
    ("src/pkg/test_utils.py", TESTS),
    ("src/pkg/utils_test.py", TESTS),
    ("conftest.py", TESTS),
    ("testing/helpers.py", TESTS),
    # A program in a docs folder is code: Sphinx's conf.py, a Go package that makes docs.
    ("docs/conf.py", CODE),
    ("doc/generate.go", CODE),
    ("cmd/doc/main.go", CODE),
    ("docs/theme/layout.html", DOCS),
    ("examples/plot_scatter.py", EXAMPLES),
    ("src/pkg/contest.py", CODE),
    ("src/pkg/latest.py", CODE),
    # Go
    ("internal/retry/policy.go", CODE),
    ("internal/retry/policy_test.go", TESTS),
    ("pkg/testdata/input.go", TESTS),
    ("_examples/server/main.go", EXAMPLES),
    # JavaScript and TypeScript
    ("src/router.ts", CODE),
    ("src/router.spec.ts", TESTS),
    ("src/router.test.tsx", TESTS),
    ("src/__tests__/router.js", TESTS),
    ("e2e/app.e2e-spec.ts", TESTS),
    ("demo/index.js", EXAMPLES),
    # Ruby
    ("lib/sinatra/base.rb", CODE),
    ("spec/base_spec.rb", TESTS),
    ("test/test_helper.rb", TESTS),
    # Java, Kotlin, C#, Swift, Scala, PHP
    ("src/main/java/com/acme/HttpClient.java", CODE),
    ("src/test/java/com/acme/HttpClientTest.java", TESTS),
    ("core/src/RetryPolicyTests.cs", TESTS),
    ("app/src/main/kotlin/Contest.kt", CODE),
    ("app/src/main/kotlin/ParserSpec.kt", TESTS),
    ("Sources/Net/Session.swift", CODE),
    ("Tests/NetTests/SessionTests.swift", TESTS),
    ("src/Routing/RouterTest.php", TESTS),
    ("modules/core/src/main/scala/Codec.scala", CODE),
    # Rust, C, C++
    ("src/lib.rs", CODE),
    ("tests/integration.rs", TESTS),
    ("src/net/socket_unittest.cc", TESTS),
    ("src/net/socket.cc", CODE),
    ("include/net/socket.h", CODE),
    # docs, wherever they are
    ("README.md", DOCS),
    ("tests/README.md", DOCS),
    ("CHANGELOG", DOCS),
    ("LICENSE-MIT", DOCS),
    ("docs/guide/routing.rst", DOCS),
    ("doc/source/index.md", DOCS),
    ("man/codeveil.1", DOCS),
    ("docs/notes.txt", DOCS),
    ("NOTES.txt", DOCS),
    ("guide/intro.adoc", DOCS),
    ("paper/main.tex", DOCS),
    ("examples/README.md", DOCS),
    # test inputs in plain text stay tests
    ("tests/fixtures/expected.txt", TESTS),
    ("astropy/io/ascii/tests/data/latex1.tex", TESTS),
    # config
    ("pyproject.toml", CONFIG),
    (".github/workflows/ci.yml", CONFIG),
    ("package.json", CONFIG),
    ("config/settings.ini", CONFIG),
    ("requirements-dev.txt", CONFIG),
    (".gitignore", CONFIG),
    ("tests/fixtures/config.yaml", TESTS),
    ("docs/_config.yml", DOCS),
    # notebooks and code without a grammar
    ("analysis/clean.ipynb", CODE),
    ("doc/tutorial/intro.ipynb", DOCS),
    ("samples/quickstart.ipynb", EXAMPLES),
    ("db/schema.sql", CODE),
    ("Makefile", CODE),
    ("Dockerfile", CODE),
]


@pytest.mark.parametrize(("path", "kind"), TABLE)
def test_file_kind(path: str, kind: FileKind) -> None:
    assert file_kind(path) == kind


def test_table_covers_every_kind() -> None:
    assert {kind for _, kind in TABLE} == set(FileKind)
    assert KINDS == ("code", "tests", "docs", "examples", "config")


@pytest.mark.parametrize(("values", "kinds"), [
    (None, None),
    ("code", {CODE}),
    ("code,docs", {CODE, DOCS}),
    (["tests", " Examples "], {TESTS, EXAMPLES}),
    (["code,tests", "docs"], {CODE, TESTS, DOCS}),
    ("", None),
])
def test_parse_kinds(values: str | list[str] | None, kinds: set[FileKind] | None) -> None:
    parsed = parse_kinds(values)
    assert parsed == (None if kinds is None else frozenset(kinds))


def test_parse_kinds_names_the_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown kind 'source'; use one of code, tests"):
        parse_kinds("code,source")
