"""Which language a file is written in, judged by its name alone.

Names returned for code with a tree-sitter grammar are the grammar names of
tree-sitter-language-pack; everything else goes to the line/paragraph splitter,
which still uses the name to pick its break points (headings, top-level keys).
"""

from __future__ import annotations

from typing import Final

GRAMMAR_LANGUAGES: Final = frozenset(
    {
        "python",
        "javascript",
        "typescript",
        "tsx",
        "go",
        "rust",
        "java",
        "c",
        "cpp",
        "csharp",
        "ruby",
        "php",
        "kotlin",
        "swift",
        "scala",
        "bash",
        "lua",
    }
)
"""Languages chunked along their syntax tree."""

PROSE_LANGUAGES: Final = frozenset({"markdown", "rst", "text"})
CONFIG_LANGUAGES: Final = frozenset({"yaml", "toml", "json", "ini", "xml"})
NOTEBOOK: Final = "notebook"
"""A Jupyter notebook: chunked cell by cell, each chunk in its cell's own language."""

_EXTENSIONS: Final[dict[str, str]] = {
    # grammar languages
    ".py": "python",
    ".pyi": "python",
    ".pyw": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".c": "c",
    ".h": "c",  # the chunker re-reads a .h file as C++ when only that parses
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".c++": "cpp",
    ".hpp": "cpp",
    ".hh": "cpp",
    ".hxx": "cpp",
    ".h++": "cpp",
    ".ipp": "cpp",
    ".inl": "cpp",
    ".cs": "csharp",
    ".rb": "ruby",
    ".rake": "ruby",
    ".gemspec": "ruby",
    ".php": "php",
    ".kt": "kotlin",
    ".kts": "kotlin",
    ".swift": "swift",
    ".scala": "scala",
    ".sc": "scala",
    ".sh": "bash",
    ".bash": "bash",
    ".zsh": "bash",
    ".lua": "lua",
    # prose and configuration
    ".md": "markdown",
    ".markdown": "markdown",
    ".mdx": "markdown",
    ".rst": "rst",
    ".txt": "text",
    ".text": "text",
    ".yml": "yaml",
    ".yaml": "yaml",
    ".toml": "toml",
    ".json": "json",
    ".jsonc": "json",
    ".json5": "json",
    ".ini": "ini",
    ".cfg": "ini",
    ".conf": "ini",
    ".properties": "ini",
    ".xml": "xml",
    ".plist": "xml",
    ".svg": "xml",
    ".ipynb": NOTEBOOK,
    # source without a grammar here: split by lines and blank lines
    ".sql": "sql",
    ".html": "html",
    ".htm": "html",
    ".css": "css",
    ".scss": "scss",
    ".sass": "scss",
    ".less": "less",
    ".vue": "vue",
    ".svelte": "svelte",
    ".dart": "dart",
    ".r": "r",
    ".pl": "perl",
    ".pm": "perl",
    ".ex": "elixir",
    ".exs": "elixir",
    ".erl": "erlang",
    ".hrl": "erlang",
    ".hs": "haskell",
    ".ml": "ocaml",
    ".mli": "ocaml",
    ".fs": "fsharp",
    ".fsx": "fsharp",
    ".clj": "clojure",
    ".cljs": "clojure",
    ".el": "elisp",
    ".jl": "julia",
    ".m": "objc",
    ".mm": "objc",
    ".groovy": "groovy",
    ".gradle": "groovy",
    ".zig": "zig",
    ".nim": "nim",
    ".v": "verilog",
    ".sv": "verilog",
    ".vhd": "vhdl",
    ".tf": "hcl",
    ".hcl": "hcl",
    ".proto": "protobuf",
    ".graphql": "graphql",
    ".gql": "graphql",
    ".ps1": "powershell",
    ".bat": "batch",
    ".cmd": "batch",
    ".fish": "fish",
    ".cmake": "cmake",
    ".mk": "make",
    ".tex": "latex",
    ".sol": "solidity",
    ".cu": "cuda",
    ".cuh": "cuda",
    ".f90": "fortran",
    ".pas": "pascal",
    ".asm": "asm",
    ".s": "asm",
}

# Whole file names (compared in lower case) that carry no telling extension.
_FILENAMES: Final[dict[str, str]] = {
    "readme": "text",
    "license": "text",
    "licence": "text",
    "copying": "text",
    "authors": "text",
    "contributors": "text",
    "changelog": "text",
    "changes": "text",
    "news": "text",
    "notice": "text",
    "todo": "text",
    "makefile": "make",
    "gnumakefile": "make",
    "dockerfile": "dockerfile",
    "containerfile": "dockerfile",
    "jenkinsfile": "groovy",
    "vagrantfile": "ruby",
    "gemfile": "ruby",
    "rakefile": "ruby",
    "podfile": "ruby",
    "brewfile": "ruby",
    "cmakelists.txt": "cmake",
    ".bashrc": "bash",
    ".bash_profile": "bash",
    ".profile": "bash",
    ".zshrc": "bash",
    ".gitignore": "text",
    ".gitattributes": "text",
    ".dockerignore": "text",
    ".editorconfig": "ini",
    ".env": "ini",
}


def language_for_path(path: str) -> str | None:
    """The language of the file at `path` (repo-relative or absolute), or None if unknown."""
    # String operations, not PurePosixPath: this runs once per file of every scan.
    lowered = path.replace("\\", "/").rpartition("/")[2].lower()
    if lowered in _FILENAMES:
        return _FILENAMES[lowered]
    dot = lowered.rfind(".")
    suffix = lowered[dot:] if 0 < dot < len(lowered) - 1 else ""  # as PurePath.suffix
    if suffix in _EXTENSIONS:
        return _EXTENSIONS[suffix]
    stem = lowered.split(".", 1)[0]
    # README.zh, LICENSE-MIT, Dockerfile.dev and the like
    for prefix in ("readme", "license", "licence", "changelog", "dockerfile", "makefile"):
        if stem.startswith(prefix):
            return _FILENAMES[prefix]
    return None


# Names users type for a language besides its own name and its files' extensions.
_ALIASES: Final[dict[str, str]] = {
    "golang": "go", "c++": "cpp", "c#": "csharp", "shell": "bash", "sh": "bash",
    "jupyter": NOTEBOOK, "ipython": "python", "py3": "python",
}


def known_languages() -> list[str]:
    """The language names chunks are given, sorted."""
    return sorted({*_EXTENSIONS.values(), *_FILENAMES.values()})


def parse_language(name: str) -> str:
    """The language name the index gives chunks, for one a user types: in any case, as a
    file extension (`py`, `.rs`) or a common alias (`golang`, `c#`). Raises ValueError
    naming the known ones: a filter on a name no chunk has would match nothing, silently."""
    word = name.strip().lower()
    if word in _ALIASES:
        return _ALIASES[word]
    known = known_languages()
    if word in known:
        return word
    extension = word if word.startswith(".") else f".{word}"
    if extension in _EXTENSIONS:
        return _EXTENSIONS[extension]
    raise ValueError(f"unknown language {name!r}; use one of {', '.join(known)}"
                     " (or a file extension: py, rs)")
