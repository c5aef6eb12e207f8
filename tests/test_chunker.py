"""Chunking: coverage, token budget, symbol paths, fallbacks; real tokenizer and files."""

from __future__ import annotations

import itertools
import json
import random
import re
import time
from pathlib import Path

import pytest

from indexer.chunk import Chunk
from indexer.chunker import DEFAULT_MAX_TOKENS, chunk_file
from indexer.languages import GRAMMAR_LANGUAGES, language_for_path
from indexer.tokens import CONTENT_MAX_TOKENS, MODEL_MAX_TOKENS, TokenCounter, get_tokenizer

FIXTURES = Path(__file__).parent / "fixtures" / "langs"
FIXTURE_NAMES = sorted(p.name for p in FIXTURES.iterdir() if p.is_file())


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter()


def read(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def chunks_of(name: str, max_tokens: int = DEFAULT_MAX_TOKENS) -> list[Chunk]:
    return chunk_file(f"tests/fixtures/langs/{name}", read(name), max_tokens=max_tokens)


def lines_of(text: str) -> list[str]:
    """Lines split at "\\n" only, endings kept (written independently of the chunker)."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def assert_partition(chunks: list[Chunk], text: str) -> None:
    """Chunks are ordered, disjoint runs of whole lines covering each non-blank line once."""
    lines = lines_of(text)
    covered = [0] * len(lines)
    previous_end = 0
    for chunk in chunks:
        assert previous_end < chunk.start_line <= chunk.end_line <= len(lines)
        assert chunk.text == "".join(lines[chunk.start_line - 1 : chunk.end_line])
        assert lines[chunk.start_line - 1].strip() and lines[chunk.end_line - 1].strip()
        for index in range(chunk.start_line - 1, chunk.end_line):
            covered[index] += 1
        previous_end = chunk.end_line
    missing = [i + 1 for i, line in enumerate(lines) if line.strip() and covered[i] != 1]
    assert not missing, f"lines not covered exactly once: {missing[:10]}"


def assert_fits(
    chunks: list[Chunk], counter: TokenCounter, limit: int = CONTENT_MAX_TOKENS
) -> None:
    """Every embedded text fits the model, except a chunk that is one over-long line."""
    for chunk in chunks:
        size = counter.count(chunk.embed_text)
        assert size <= limit or chunk.start_line == chunk.end_line, (
            f"{chunk.path}:{chunk.start_line}-{chunk.end_line} has {size} tokens"
        )


def chunk_with(chunks: list[Chunk], needle: str) -> Chunk:
    """The chunk holding the first line that contains `needle`."""
    found = [c for c in chunks if needle in c.text]
    assert found, f"no chunk contains {needle!r}"
    return found[0]


def names_match(symbol: str, expected: str) -> bool:
    """`symbol` fits a chunk holding `expected`: it is `expected`, or lists it among
    siblings (`Session > send, close`), or names an enclosing definition that the
    chunk holds whole (`Session` for a chunk with all of class Session)."""
    want = expected.split(" > ")
    *scope, last = symbol.split(" > ")
    return any(want[: len(scope) + 1] == [*scope, name] for name in last.split(", "))


# --- every fixture ------------------------------------------------------------------------


def test_fixtures_cover_every_grammar_and_prose() -> None:
    languages = {language_for_path(name) for name in FIXTURE_NAMES}
    assert languages >= GRAMMAR_LANGUAGES
    assert {"markdown", "yaml", "toml", "json", "text", "sql"} <= languages
    for name in FIXTURE_NAMES:
        assert 60 <= len(lines_of(read(name))) <= 200, name


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_is_partitioned_and_fits(name: str, counter: TokenCounter) -> None:
    text = read(name)
    chunks = chunks_of(name)
    assert len(chunks) >= 2
    assert_partition(chunks, text)
    assert_fits(chunks, counter)
    assert {c.language for c in chunks} == {language_for_path(name)}


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_small_budgets_still_partition(name: str, counter: TokenCounter) -> None:
    text = read(name)
    for max_tokens in (24, 64, 128):
        chunks = chunks_of(name, max_tokens=max_tokens)
        assert_partition(chunks, text)
        for chunk in chunks:
            assert counter.count(chunk.text) <= max_tokens or chunk.start_line == chunk.end_line


# --- symbol paths -------------------------------------------------------------------------

SYMBOLS = [
    ("session.py", "return 200 <= self.status < 300", "Response > ok"),
    ("session.py", "self._pool.clear()", "Session > close"),
    ("session.py", "for attempt in range(self.retries + 1):", "Session > send"),
    ("session.py", "self._stamp = now", "RateLimiter > acquire"),
    ("cart.js", "this.items = this.items.filter", "Cart > remove"),
    ("cart.js", "return cart.subtotal() * rate;", "applyDiscounts > percentOff"),
    ("scheduler.ts", "this.states.set(job.id, JobState.Pending);", "Scheduler > register"),
    ("scheduler.ts", "const policy = job.retry ??", "runWithRetry"),
    ("Dashboard.tsx", "return { failed: true };", "ErrorBoundary > getDerivedStateFromError"),
    ("Dashboard.tsx", "if (!cancelled) setMetrics(body);", "useMetrics > load"),
    ("cache.go", "delete(c.items, el.Value.(*entry).key)", "Cache > removeElement"),
    ("cache.go", "prev := el.Prev()", "Cache > Purge"),
    ("tokenizer.rs", 'write!(f, "at {}: {}"', "LexError > fmt"),
    ("tokenizer.rs", "Lexer { chars: source.char_indices().peekable(), source }", "Lexer > new"),
    ("tokenizer.rs", "Lexer::new(s).tokenize().unwrap()", "tests > lex"),
    ("Inventory.java", "return onHand - reserved;", "Inventory > Stock > available"),
    ("Inventory.java", ".mapToInt(Stock::available)", "Inventory > totalAvailable"),
    ("ringbuf.c", "global_stats.bytes_in++;", "ring_push"),
    ("ringbuf.c", "free(r);", "ring_free"),
    ("geometry.cpp", "sum += a.x * b.y - b.x * a.y;", "geo > Polygon > area"),
    ("geometry.cpp", "return std::max(low, std::min(value, high));", "geo > clamp_to"),
    (
        "Ledger.cs",
        "_store.Append(new Entry(now, from, -amount, memo));",
        "Accounting > Ledger > Transfer",
    ),
    ("Ledger.cs", "date.DayOfWeek == DayOfWeek.Saturday", "Accounting > Ledger > IsWeekend"),
    ("mailer.rb", "ERB.new(template).result_with_hash(locals)", "Notifications > Mailer > render"),
    ("mailer.rb", "transform_values(&:size)", "Notifications > digest"),
    ("Router.php", "$this->add('POST', $pattern, $handler);", "Router > post"),
    ("Router.php", "JSON_THROW_ON_ERROR", "json_response"),
    ("Thermostat.kt", "history.removeFirst()", "Thermostat > record"),
    ("Thermostat.kt", "celsius * 9 / 5 + 32", "Thermostat > Companion > fahrenheit"),
    ("Playlist.swift", "state ^= state >> 7", "SeededGenerator > next"),
    ("Playlist.swift", "tracks.remove(at: index)", "Playlist > remove"),
    ("WordCount.scala", "documents += doc", "Corpus > add"),
    ("WordCount.scala", "counts.toSeq.sortBy", "WordCount > top"),
    ("deploy.sh", "exit 1", "die"),
    ("deploy.sh", "[deploy] %s", "log"),
    ("inventory.lua", "slot.count = slot.count + count", "Inventory > add"),
    ("inventory.lua", 'string.format("%s (%.1f kg)"', "describe"),
    # Functions given to fields and locals inside the function a module returns.
    ("reporter.lua", "io.stderr:write(paint(line, 31)", "reporter > testFailure"),
    ("reporter.lua", "os.clock() - started_at", "elapsed"),
]


def test_a_block_that_names_nothing_is_named_after_the_definitions_in_it() -> None:
    # An `#ifdef` that fits in one chunk: the functions inside name the chunk, as a
    # class would if they were its methods.
    fast = "\n".join(f"static int fast_{op}(const int *xs, int n) {{\n    return xs[n - 1];\n}}\n"
                      for op in ("sum", "max"))
    chunks = chunk_file("fast.c", f"#include <stdio.h>\n\n#ifdef USE_FAST\n{fast}#endif\n")
    assert [c.symbol for c in chunks] == ["fast_sum, fast_max"]


@pytest.mark.parametrize(("name", "needle", "expected"), SYMBOLS)
def test_symbol_paths(name: str, needle: str, expected: str) -> None:
    for max_tokens in (48, DEFAULT_MAX_TOKENS):
        chunk = chunk_with(chunks_of(name, max_tokens=max_tokens), needle)
        assert names_match(chunk.symbol, expected), (max_tokens, chunk.symbol)
        assert chunk.header == f"tests/fixtures/langs/{name} > {chunk.symbol}"


LONG_FUNCTIONS = [
    ("session.py", "summarize_traffic"),
    ("cart.js", "checkout"),
    ("scheduler.ts", "parseCron"),
    ("Dashboard.tsx", "Dashboard"),
    ("cache.go", "Cache > Stats"),
    ("tokenizer.rs", "Lexer > tokenize"),
    ("Inventory.java", "Inventory > reserve"),
    ("ringbuf.c", "ring_read_line"),
    ("geometry.cpp", "geo > Polygon > clip"),
    ("Ledger.cs", "Accounting > Ledger > Statement"),
    ("mailer.rb", "Notifications > Mailer > flush"),
    ("Router.php", "Router > dispatch"),
    ("Thermostat.kt", "Thermostat > step"),
    ("Playlist.swift", "Playlist > smartShuffle"),
    ("WordCount.scala", "Corpus > analyze"),
    ("deploy.sh", "deploy_host"),
    ("inventory.lua", "Inventory > compact"),
]


@pytest.mark.parametrize(("name", "symbol"), LONG_FUNCTIONS)
def test_long_function_is_split_and_named(name: str, symbol: str) -> None:
    chunks = chunks_of(name)
    holding = [c for c in chunks if names_match(c.symbol, symbol)]
    assert len(holding) >= 2, [c.symbol for c in chunks]


@pytest.mark.parametrize(
    ("name", "comment", "definition"),
    [
        ("session.py", "# Retries back off exponentially", "def send("),
        ("cache.go", "// Get returns the value", "func (c *Cache) Get("),
        ("tokenizer.rs", "/// Reads the whole input.", "pub fn tokenize("),
        ("Inventory.java", "// Receiving stock never fails", "public void receive("),
        ("tokenizer.rs", "#[derive(Debug)]", "pub struct LexError"),
    ],
)
def test_comment_stays_with_definition(name: str, comment: str, definition: str) -> None:
    for max_tokens in (64, 128, DEFAULT_MAX_TOKENS):
        chunks = chunks_of(name, max_tokens=max_tokens)
        assert chunk_with(chunks, comment) is chunk_with(chunks, definition), max_tokens


def test_small_neighbours_are_merged(counter: TokenCounter) -> None:
    text = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(60))
    chunks = chunk_file("small.py", text)
    assert_partition(chunks, text)
    assert_fits(chunks, counter)
    assert 1 < len(chunks) < 60 / 4
    # a chunk of several siblings names (at most three of) them
    assert re.fullmatch(r"f\d+, f\d+, f\d+", chunks[0].symbol)


def test_method_chunk_of_class_with_many_methods() -> None:
    methods = "".join(f"    def m{i}(self):\n        return {i}\n\n" for i in range(40))
    text = f"class Big:\n    '''Many methods.'''\n\n{methods}"
    chunks = chunk_file("big.py", text)
    assert_partition(chunks, text)
    assert len(chunks) >= 2
    assert all(c.symbol.startswith("Big > m") for c in chunks)


def test_module_level_statements_have_no_symbol() -> None:
    text = "".join(f"CONSTANT_{i} = {i}\n" for i in range(10))
    (chunk,) = chunk_file("consts.py", text)
    assert chunk.symbol == ""
    assert chunk.header == "consts.py"


# --- broken, empty and odd files ----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "later_definition"),
    [("broken_parser.py", "merge"), ("broken.js", "validate")],
)
def test_syntax_errors_keep_the_whole_file(name: str, later_definition: str) -> None:
    text = read(name)
    chunks = chunks_of(name)
    assert_partition(chunks, text)
    assert any(later_definition in c.symbol for c in chunks)


def test_garbage_in_a_grammar_language_is_covered() -> None:
    text = "}}}{{{ ))) def class ((( \n" * 30 + "\x00\x01 binary-ish \x7f\n" * 5
    for language in sorted(GRAMMAR_LANGUAGES):
        chunks = chunk_file("garbage", text, language=language, max_tokens=40)
        assert_partition(chunks, text)


@pytest.mark.parametrize("text", ["", "\n", "\n\n  \n\t\n", "   ", "\r\n\r\n"])
def test_blank_files_give_no_chunks(text: str) -> None:
    assert chunk_file("empty.py", text) == []
    assert chunk_file("empty.md", text) == []


def test_crlf_line_endings() -> None:
    text = read("session.py").replace("\n", "\r\n")
    chunks = chunk_file("session.py", text)
    assert_partition(chunks, text)
    assert all(c.text.endswith("\r\n") for c in chunks)
    plain = chunk_file("session.py", read("session.py"))
    assert [(c.start_line, c.end_line, c.symbol) for c in chunks] == [
        (c.start_line, c.end_line, c.symbol) for c in plain
    ]


@pytest.mark.parametrize("name", ["session.py", "guide.md", "cache.go"])
def test_no_trailing_newline(name: str) -> None:
    text = read(name).rstrip("\n")
    chunks = chunk_file(name, text)
    assert_partition(chunks, text)
    assert chunks[-1].end_line == text.count("\n") + 1
    assert text.endswith(chunks[-1].text) and not chunks[-1].text.endswith("\n")


def test_non_ascii_text(counter: TokenCounter) -> None:
    text = (
        "# -*- coding: utf-8 -*-\n"
        '"""Grüße aus Köln — 日本語のコメント, emoji 🎉."""\n\n'
        "def grüße(name: str) -> str:\n"
        '    """Sagt Hallo. 你好世界."""\n'
        '    return f"Hallo, {name}! ✓"\n\n'
        "class Café:\n"
        "    def crème(self):\n"
        "        return 'brûlée' * 3  # ½ price\n"
    )
    chunks = chunk_file("unicode.py", text, max_tokens=24)
    assert_partition(chunks, text)
    assert_fits(chunks, counter)
    assert names_match(chunk_with(chunks, "Hallo, {name}").symbol, "grüße")
    assert names_match(chunk_with(chunks, "brûlée").symbol, "Café > crème")


def test_over_long_line_is_a_chunk_of_its_own(counter: TokenCounter) -> None:
    blob = "DATA = [" + ", ".join(f"'item{i}'" for i in range(400)) + "]\n"
    text = "import os\n\n\n" + blob + "\n\ndef after():\n    return os.sep\n"
    chunks = chunk_file("blob.py", text)
    assert_partition(chunks, text)
    (long_chunk,) = [c for c in chunks if "item399" in c.text]
    assert long_chunk.text == blob
    assert counter.count(long_chunk.text) > CONTENT_MAX_TOKENS
    assert_fits(chunks, counter)


def test_cpp_in_a_header_named_dot_h() -> None:
    chunks = chunk_file("include/geometry.h", read("geometry.cpp"), max_tokens=64)
    assert {c.language for c in chunks} == {"c"}
    clip = chunk_with(chunks, "std::vector<Point> output = points_;")
    assert names_match(clip.symbol, "geo > Polygon > clip")


def test_unknown_language_is_text() -> None:
    text = "alpha beta\ngamma\n\ndelta\n"
    (chunk,) = chunk_file("notes.unknownext", text)
    assert chunk.language == "text"
    (chunk,) = chunk_file("script.py", text, language="text")
    assert chunk.language == "text"


def test_long_path_shrinks_the_budget(counter: TokenCounter) -> None:
    path = "/".join(f"very_long_directory_name_number_{i}" for i in range(12)) + "/session.py"
    chunks = chunk_file(path, read("session.py"))
    assert_partition(chunks, read("session.py"))
    assert_fits(chunks, counter)


# --- prose and configuration ----------------------------------------------------------------


def test_markdown_heading_paths() -> None:
    chunks = chunks_of("guide.md", max_tokens=64)
    assert chunk_with(chunks, "git clone").symbol == "Widget Server > Install > From source"
    assert chunk_with(chunks, "WIDGET_LOG").symbol.endswith("Environment variables")
    assert chunk_with(chunks, "MIT. See").symbol.endswith("License")


def test_markdown_prefers_heading_boundaries() -> None:
    sections = "".join(
        f"## Part {i}\n\n" + "Some words about this part of the guide.\n" * 3 + "\n"
        for i in range(12)
    )
    text = "# Guide\n\n" + sections
    chunks = chunk_file("guide.md", text, max_tokens=80)
    assert_partition(chunks, text)
    starts = [c.text.splitlines()[0] for c in chunks]
    assert sum(line.startswith("#") for line in starts) >= len(starts) - 1
    # fenced code is not mistaken for headings
    fenced = "# Title\n\n```bash\n# not a heading\necho hi\n```\n"
    (chunk,) = chunk_file("x.md", fenced)
    assert chunk.symbol == "Title"


def test_config_keys_as_symbols() -> None:
    assert names_match(chunk_with(chunks_of("pipeline.yaml"), "ruff check .").symbol, "jobs")
    toml = chunks_of("settings.toml", max_tokens=48)
    assert chunk_with(toml, "statement_timeout_ms").symbol == "sources > warehouse"
    assert chunk_with(chunks_of("package.json", max_tokens=48), "vitest run").symbol == "scripts"


def test_rst_style_titles_in_text() -> None:
    chunks = chunks_of("notes.txt", max_tokens=64)
    assert chunk_with(chunks, "Release manager this quarter").symbol == (
        "Release checklist > Contacts"
    )


# --- tokens and languages -----------------------------------------------------------------


def test_line_counts_match_the_tokenizer(counter: TokenCounter) -> None:
    odd = [
        "plain words here\n",
        "form\x0cfeed and\x1cgroup\x85next\n",
        "nbsp\u00a0and\u2028line separator\n",
        "日本語 and émigré café\n",
        "x" * 150 + " long word\n",
        "\x00\x01\x7f controls\n",
        "zero\u200bwidth \ufffd replacement\n",
        "emoji 🎉🎉 mixed👍text\n",
    ]
    lines = odd + lines_of(read("session.py")) + lines_of(read("Router.php"))
    tokenizer = get_tokenizer()
    expected = [len(tokenizer.encode(line, add_special_tokens=False).ids) for line in lines]
    assert counter.line_counts(lines) == expected
    assert sum(expected) == counter.count("".join(lines))
    assert counter.count_batch(odd) == expected[: len(odd)]
    assert tokenizer.truncation is None and tokenizer.padding is None
    assert MODEL_MAX_TOKENS == CONTENT_MAX_TOKENS + 2


LANGUAGES = [
    ("a/b/session.py", "python"),
    ("stubs/x.pyi", "python"),
    ("web/app.mjs", "javascript"),
    ("web/App.jsx", "javascript"),
    ("web/app.cts", "typescript"),
    ("web/App.tsx", "tsx"),
    ("main.go", "go"),
    ("lib.rs", "rust"),
    ("A.java", "java"),
    ("x.h", "c"),
    ("x.hpp", "cpp"),
    ("x.cc", "cpp"),
    ("P.cs", "csharp"),
    ("Rakefile", "ruby"),
    ("x.rb", "ruby"),
    ("index.php", "php"),
    ("build.gradle.kts", "kotlin"),
    ("App.swift", "swift"),
    ("Main.scala", "scala"),
    ("run.sh", "bash"),
    ("init.lua", "lua"),
    ("README.md", "markdown"),
    ("docs/index.rst", "rst"),
    ("ci.yml", "yaml"),
    ("Cargo.toml", "toml"),
    ("package.json", "json"),
    ("notes.txt", "text"),
    ("README", "text"),
    ("LICENSE-MIT", "text"),
    ("Makefile", "make"),
    ("Dockerfile", "dockerfile"),
    ("Dockerfile.dev", "dockerfile"),
    ("schema.sql", "sql"),
    ("page.html", "html"),
    ("widget.vue", "vue"),
    ("main.dart", "dart"),
    ("lib.ex", "elixir"),
    ("Main.hs", "haskell"),
    ("C:\\repo\\src\\x.py", "python"),
    ("data.bin", None),
    ("no_extension", None),
]


def test_language_for_path() -> None:
    wrong = [(path, language_for_path(path), want) for path, want in LANGUAGES]
    assert [w for w in wrong if w[1] != w[2]] == []


# --- randomised coverage property -----------------------------------------------------------

_WORDS = ["alpha", "beta", "gamma", "résumé", "日本", "x", "value_1", "🎉", "ÄÖÜ", "a" * 120]
_CODE_LINES = [
    "def {w}({w}, *args):",
    "class {W}({W}):",
    "    return {w} + {w}",
    "    if {w} > 1:",
    "        {w} = [{w}, {w}, {w}]",
    "# {w} {w} comment",
    '    """{w} docstring {w}"""',
    "@decorator({w})",
    "{w} = {{'{w}': ({w}, ",  # unbalanced on purpose
    "    )]}}",
    "function {w}() {{ return {w}; }}",
    "## {W} heading",
    "{w}: {w}",
    "  - {w}",
    "{w} " * 80,
    "",
    "   ",
]


def _random_file(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(0, 120)):
        template = rng.choice(_CODE_LINES)
        word = rng.choice(_WORDS)
        indent = " " * rng.choice([0, 0, 4, 8])
        lines.append(indent + template.format(w=word, W=word.capitalize()))
    newline = rng.choice(["\n", "\r\n"])
    text = newline.join(lines)
    return text + newline if rng.random() < 0.7 else text


def test_random_files_are_always_partitioned(counter: TokenCounter) -> None:
    rng = random.Random(20240611)
    languages = [None, "python", "javascript", "rust", "markdown", "yaml", "text", "sql"]
    for _ in range(150):
        text = _random_file(rng)
        language = rng.choice(languages)
        max_tokens = rng.choice([8, 16, 40, 100, DEFAULT_MAX_TOKENS])
        chunks = chunk_file("r/file", text, language=language, max_tokens=max_tokens)
        assert_partition(chunks, text)
        for chunk in chunks:
            size = sum(counter.line_counts(lines_of(chunk.text)))
            assert size <= max_tokens or chunk.start_line == chunk.end_line


# --- speed ------------------------------------------------------------------------------------


def test_two_thousand_lines_chunk_quickly() -> None:
    text = read("session.py") * 16  # ~2,100 lines, repeated definitions included
    chunk_file("warm.py", text)
    started = time.process_time()
    chunks = chunk_file("big.py", text)
    elapsed = time.process_time() - started
    assert_partition(chunks, text)
    assert elapsed < 0.25, f"{elapsed * 1000:.0f} ms of CPU"


# --- notebooks ------------------------------------------------------------------------------


def notebook(cells: list[dict], metadata: dict | None = None) -> str:
    """A notebook as Jupyter writes it (one-space indent, one string per source line)."""
    for cell in cells:
        source = cell["source"]
        if isinstance(source, str):
            lines = source.splitlines(keepends=True)
            cell["source"] = lines
        cell.setdefault("metadata", {})
        if cell["cell_type"] == "code":
            cell.setdefault("outputs", [])
            cell.setdefault("execution_count", 1)
    meta = metadata if metadata is not None else {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}}
    return json.dumps({"cells": cells, "metadata": meta, "nbformat": 4, "nbformat_minor": 5},
                      indent=1) + "\n"


PLOT_OUTPUT = {"output_type": "display_data", "metadata": {},
               "data": {"image/png": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB" * 400,
                        "text/plain": ["<Figure size 640x480 with 1 Axes> OUTPUTWORD"]}}


def test_notebook_cells_point_at_their_lines_and_leave_outputs_out(counter: TokenCounter) -> None:
    text = notebook([
        {"cell_type": "markdown", "source": "# Loading penguins\n\nRead the table first.\n"},
        {"cell_type": "code", "source": "import pandas as pd\n\ndef load_penguins(path):\n"
                                        "    return pd.read_csv(path)\n",
         "outputs": [{"output_type": "stream", "name": "stdout", "text": ["OUTPUTWORD\n"]}]},
        {"cell_type": "code", "source": "plot(load_penguins('p.csv'))\n",
         "outputs": [PLOT_OUTPUT]},
    ])
    lines = lines_of(text)
    chunks = chunk_file("docs/tour.ipynb", text)

    assert [c.language for c in chunks] == ["markdown", "python", "python"]
    assert not any("OUTPUTWORD" in c.text or "iVBOR" in c.text for c in chunks)
    for chunk in chunks:  # the lines as they are in the file, so hits open at them
        assert chunk.text == "".join(lines[chunk.start_line - 1 : chunk.end_line])
    heading, code, call = chunks
    assert lines[heading.start_line - 1].strip() == '"# Loading penguins\\n",'
    assert lines[code.start_line - 1].strip() == '"import pandas as pd\\n",'
    assert lines[code.end_line - 1].strip() == '"    return pd.read_csv(path)\\n"'
    assert lines[call.start_line - 1].strip() == "\"plot(load_penguins('p.csv'))\\n\""
    assert heading.symbol == "Loading penguins"
    assert code.symbol == "load_penguins"  # parsed as Python, not as JSON
    assert_fits(chunks, counter)


def test_long_notebook_cell_is_split_within_the_window(counter: TokenCounter) -> None:
    body = "".join(f"def step_{i}(frame):\n    frame['c{i}'] = frame['a'] * {i} + frame['b']\n"
                   f"    return frame.dropna(subset=['c{i}'])\n\n" for i in range(40))
    text = notebook([{"cell_type": "code", "source": body}])
    chunks = chunk_file("analysis.ipynb", text)

    assert len(chunks) > 3
    # The budget counts the JSON lines (quotes, escapes) that are embedded, not the code.
    assert_fits(chunks, counter)
    assert all(c.symbol.startswith("step_") for c in chunks)
    assert [c.start_line for c in chunks] == sorted({c.start_line for c in chunks})
    assert all(a.end_line < b.start_line for a, b in itertools.pairwise(chunks))


@pytest.mark.parametrize(("metadata", "language"), [
    ({"language_info": {"name": "R", "file_extension": ".r"}}, "r"),
    ({"kernelspec": {"language": "julia", "name": "julia-1.10"}}, "julia"),
    ({"language_info": {"name": "go", "file_extension": ".go"}}, "go"),
    ({}, "python"),
])
def test_notebook_language_comes_from_its_metadata(metadata: dict, language: str) -> None:
    text = notebook([{"cell_type": "code", "source": "x <- 1\n"},
                     {"cell_type": "markdown", "source": "Some *prose*.\n"}], metadata)
    assert [c.language for c in chunk_file("n.ipynb", text)] == [language, "markdown"]


def test_notebook_source_written_as_one_string_and_empty_cells() -> None:
    text = json.dumps({"cells": [
        {"cell_type": "code", "source": "a = 1\nb = 2\n", "outputs": [], "metadata": {}},
        {"cell_type": "code", "source": [], "outputs": [], "metadata": {}},
        {"cell_type": "raw", "source": ["plain words\n"], "metadata": {}},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1)
    lines = lines_of(text)
    chunks = chunk_file("one.ipynb", text)
    assert [(c.language, c.text.strip()) for c in chunks] == [
        ("python", '"source": "a = 1\\nb = 2\\n",'), ("text", '"plain words\\n"')]
    for chunk in chunks:
        assert chunk.text == "".join(lines[chunk.start_line - 1 : chunk.end_line])


def test_broken_notebook_given_to_the_chunker_is_still_covered() -> None:
    text = '{"cells": [{"cell_type": "code",\n "source": ["x = 1\\n"\n'
    chunks = chunk_file("broken.ipynb", text)
    assert_partition(chunks, text)
    # All on one line: the cells share it, so the file is chunked as the JSON it is.
    spread = notebook([{"cell_type": "code", "source": "a = 1\n"},
                       {"cell_type": "code", "source": "b = 2\n"}])
    one_line = json.dumps(json.loads(spread)) + "\n"
    chunks = chunk_file("minified.ipynb", one_line)
    assert [(c.start_line, c.end_line, c.language) for c in chunks] == [(1, 1, "json")]


def test_raw_notebook_cells_take_the_language_their_metadata_names() -> None:
    text = notebook([
        {"cell_type": "raw", "metadata": {"raw_mimetype": "text/restructuredtext"},
         "source": "Plotting\n========\n\nSee :func:`plot`.\n"},
        {"cell_type": "raw", "source": "anything\n"},
    ])
    chunks = chunk_file("doc/tour.ipynb", text)
    assert [(c.language, c.symbol) for c in chunks] == [("rst", "Plotting"), ("text", "")]
