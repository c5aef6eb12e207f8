"""Short questions, the kind agents and people type: a bare name finds the file that
defines it in any language, and code comes before the tests, docs and examples that
share its words, unless the query asks for them. Real files, a real index (the hashing
embedder: the signals measured here are the ones a first index serves with no vectors)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from indexer.kinds import FileKind
from indexer.location import ChunkLocation
from retrieval import Index
from retrieval.search.query import extract_refs
from retrieval.search.signals import kinds_asked, prefer_code
from tests.conftest import write_repo

FILES = {
    # The definition: each name once.
    "src/headers.js": '''
        export class Headers {
          static fromRawHeaders(raw) {
            return new Headers(raw.map(pair => pair.split(":")));
          }
        }
        ''',
    "lib/rack/request.rb": '''
        module Rack
          class Request
            def has_header?(name)
              @env.key?(name)
            end
          end
        end
        ''',
    # Uses of the same names, many of them: on words alone these outrank the definitions.
    "test/headers.test.js": '''
        import { Headers } from "../src/headers.js";
        test("fromRawHeaders splits pairs", () => {
          const h = Headers.fromRawHeaders(["a:b"]);
          expect(Headers.fromRawHeaders([])).toEqual(Headers.fromRawHeaders([]));
          expect(h).toBeDefined(); // fromRawHeaders fromRawHeaders
        });
        ''',
    "README.md": '''
        # Headers

        Build headers with `Headers.fromRawHeaders(raw)`. fromRawHeaders takes raw pairs;
        fromRawHeaders never throws. Ask a request `has_header?` before reading one;
        `has_header?` is cheap.
        ''',
    "examples/demo.rb": '''
        req = Rack::Request.new(env)
        puts req.has_header?("X") if req.has_header?("Y") || req.has_header?("Z")
        ''',
}


@pytest.fixture
def index(tmp_path: Path, hashing_embedder: HashingEmbedder) -> Index:
    repo = write_repo(tmp_path / "repo", FILES)
    idx = Index(repo, embedder=hashing_embedder)
    idx.index(wait=True)
    return idx


def first_file(idx: Index, query: str) -> str:
    return idx.search(query, k=5, group="file")[0].path


@pytest.mark.parametrize(("query", "defined_in"), [
    ("fromRawHeaders", "src/headers.js"),          # lowerCamel (JavaScript, Java, Go, ...)
    ("Headers.fromRawHeaders", "src/headers.js"),
    ("has_header?", "lib/rack/request.rb"),        # a Ruby predicate
    ("Rack::Request#has_header?", "lib/rack/request.rb"),
])
def test_a_bare_name_finds_the_file_that_defines_it(index: Index, query: str,
                                                    defined_in: str) -> None:
    assert first_file(index, query) == defined_in


def test_before_these_signals_the_uses_outranked_the_definition(index: Index) -> None:
    # The same index ranked as before: Python's names only, every kind alike. The test
    # above can fail: the file full of uses wins on words alone.
    shipped = index.search_options
    try:
        index.search_options = replace(shipped, identifier_refs=False, w_non_code=1.0)
        assert first_file(index, "fromRawHeaders") != "src/headers.js"
    finally:
        index.search_options = shipped


def test_a_query_that_asks_for_tests_or_docs_gets_them_first(index: Index) -> None:
    assert first_file(index, "tests of fromRawHeaders") == "test/headers.test.js"
    assert first_file(index, "readme fromRawHeaders never throws") == "README.md"


def test_names_of_every_language_are_read_from_a_query() -> None:
    refs = extract_refs("where does parseJson fail")
    assert refs.symbols == ["parseJson"] and not refs.identifier
    assert extract_refs("Sinatra::Base").symbols == ["Sinatra.Base"]
    assert "Request.params" in extract_refs("where is Request#params set").symbols
    # A URL's fragment is no Ruby method.
    assert not any("filing" in s for s in extract_refs("see CONTRIBUTING.md#filing").symbols)
    assert extract_refs("#parseJson").symbols == ["parseJson"]
    assert extract_refs("has_name?").symbols == ["has_name?", "has_name"]
    one_word = extract_refs("Signer")
    assert one_word.identifier and one_word.symbols == ["Signer"]
    # Prose stays prose, and Python-only reading is kept for the ranking's ablation.
    assert not extract_refs("how are routes grouped and mounted")
    assert extract_refs("where does parseJson fail", identifiers=False).symbols == []
    # A common word alone names nothing.
    assert extract_refs("type").symbols == []


def test_kinds_a_query_asks_for() -> None:
    assert kinds_asked("how is the retry policy tested") == {FileKind.TESTS}
    assert kinds_asked("tests for the retry policy") == {FileKind.TESTS}
    assert kinds_asked("docs and examples of routing") == {FileKind.DOCS, FileKind.EXAMPLES}
    assert kinds_asked("where are routes mounted") == frozenset()


def test_prefer_code_scales_only_what_words_gave_other_kinds() -> None:
    docs = {"r": ChunkLocation("README.md", 1, 2, "", "markdown"),
            "t": ChunkLocation("tests/test_a.py", 1, 2, "", "python"),
            "c": ChunkLocation("src/a.py", 1, 2, "", "python")}
    fused = {"r": 3.0, "t": 2.0, "c": 1.5}
    words = {"r": 2.0, "t": 1.0, "c": 1.0}  # the rest of each score came from vectors

    def order(query: str) -> list[str]:
        scores = prefer_code(fused, words, docs, query, 0.4)
        return sorted(scores, key=lambda key: -scores[key])

    # README: 3 - 0.6 * 2 = 1.8; the test: 2 - 0.6 = 1.4; code keeps its 1.5.
    assert order("retry") == ["r", "c", "t"]
    scores = prefer_code(fused, words, docs, "tests of retry", 0.4)
    assert scores["t"] == 2.0 and scores["c"] == 1.5 and scores["r"] == pytest.approx(1.8)
    # Every vote scaled: the README and the test keep 0.4 of their whole scores.
    assert prefer_code(fused, fused, docs, "retry", 0.4) == pytest.approx(
        {"r": 1.2, "t": 0.8, "c": 1.5})
