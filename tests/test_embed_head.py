"""What the model reads of a chunk: all of it by default, or its first lines up to a
number of characters, cut at a line end; the cache key follows the text embedded."""

from __future__ import annotations

from indexer.chunk import Chunk, embed_head
from indexer.embed_cache import cache_key

TEXT = "".join(f"line number {i} of the body\n" for i in range(40))


def test_no_limit_keeps_every_character() -> None:
    assert embed_head(TEXT, 0) == TEXT
    assert embed_head("short\n", 320) == "short\n"


def test_a_cut_ends_at_the_last_line_end_within_the_limit() -> None:
    head = embed_head(TEXT, 100)
    assert TEXT.startswith(head) and len(head) <= 100 and head.endswith("\n")
    assert head.count("\n") == len(head) // len("line number 1 of the body\n")


def test_a_single_long_line_is_cut_at_the_limit() -> None:
    line = "x" * 1000 + "\n"
    assert embed_head(line, 320) == "x" * 320


def test_the_chunk_embeds_its_header_then_its_head() -> None:
    chunk = Chunk("pkg/mod.py", 1, 40, "python", "f", TEXT)
    assert chunk.embed_text == f"pkg/mod.py > f\n{TEXT}"  # EMBED_CHARS is 0 in tests
    cut = f"pkg/mod.py > f\n{embed_head(TEXT, 100)}"
    assert cache_key("m", cut) != cache_key("m", chunk.embed_text)
