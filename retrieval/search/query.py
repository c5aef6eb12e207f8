"""What a query says, before any index is asked: its parts and the code it names.

Long queries. An issue report or a stack trace often runs past the model's window (256
word pieces). Rather than let the model truncate it, `split_query` cuts it into parts that
each fit, at the weakest boundary available (blank line, line, sentence, word, and only
for a single unbroken run of text, a word piece), and the parts together are exactly the
query: nothing is dropped. Each part is embedded and searched on its own; the rankings
are fused (see `retrieval.search.fusion`).

Named code. Queries written by developers name code directly: file paths, module paths
(`xarray.core.dataset`), qualified names (`Session.send`), calls (`prepare_body()`),
backticked identifiers, and traceback frames (`File "x.py", line 12, in f`, pytest's
`x.py:12: in f`). `extract_refs` finds these; `Evidence.resolve` keeps the ones that exist
in the indexed repo (matching paths by their trailing components, so a frame from
`/usr/lib/python3/site-packages/pkg/mod.py` finds `src/pkg/mod.py`) and scores the chunks
they point at.
"""

from __future__ import annotations

import math
import posixpath
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from indexer.tokens import CONTENT_MAX_TOKENS

# Boundaries to cut a long query at, weakest first.
_PARAGRAPH: Final = re.compile(r"\n[ \t]*\n\s*")
_LINE: Final = re.compile(r"\n")
_SENTENCE: Final = re.compile(r"(?<=[.!?;:])\s+")
_SPACE: Final = re.compile(r"\s+")
_LEVELS: Final = (_PARAGRAPH, _LINE, _SENTENCE, _SPACE)


def split_query(
    text: str,
    count: Callable[[str], int],
    max_tokens: int = CONTENT_MAX_TOKENS,
    *,
    count_many: Callable[[Sequence[str]], list[int]] | None = None,
    hard_split: Callable[[str, int], list[str]] | None = None,
) -> list[str]:
    """Cut `text` into consecutive parts of at most `max_tokens` each (by `count`).

    `"".join(parts) == text` always holds: separators stay with the part before them.
    Parts are as few as the boundaries allow: neighbouring pieces are packed greedily.
    A run with no whitespace longer than the window is cut by `hard_split` (default:
    by characters, halving until each piece fits). `count_many` counts several texts in
    one call (a tokenizer's batch); pieces are counted once each, not once per packing
    step, since word-piece counts add up across cuts made after whitespace.
    """
    if not text:
        return []
    many = count_many or (lambda texts: [count(t) for t in texts])
    total = count(text)
    if total <= max_tokens:
        return [text]
    pieces, sizes = _pieces(text, total, many, max_tokens, hard_split or _halve(count))
    groups: list[list[int]] = []
    size = 0
    for i, n in enumerate(sizes):
        if groups and size + n <= max_tokens:
            groups[-1].append(i)
            size += n
        else:
            groups.append([i])
            size = n
    parts = ["".join(pieces[i] for i in g) for g in groups]
    # Sums are exact at whitespace cuts; a part joined across a hard cut may count
    # higher, and then goes out as its pieces, each of which was counted on its own.
    out: list[str] = []
    for part, group, n in zip(parts, groups, many(parts), strict=True):
        out.extend([part] if n <= max_tokens else [pieces[i] for i in group])
    return _absorb_blank(out)


def _pieces(text: str, total: int, many: Callable[[Sequence[str]], list[int]],
            max_tokens: int, hard_split: Callable[[str, int], list[str]],
            ) -> tuple[list[str], list[int]]:
    """Pieces of `text` that each fit, and their sizes: cut at paragraphs, then lines,
    sentences and spaces, going finer only inside pieces that are still too big."""
    pieces, sizes = [text], [total]
    for boundary in _LEVELS:
        if all(n <= max_tokens for n in sizes):
            return pieces, sizes
        new_pieces: list[str] = []
        fresh: list[int] = []  # indices into new_pieces that need counting
        kept: dict[int, int] = {}
        for piece, n in zip(pieces, sizes, strict=True):
            if n <= max_tokens:
                kept[len(new_pieces)] = n
                new_pieces.append(piece)
            else:
                for sub in _cut(piece, boundary):
                    fresh.append(len(new_pieces))
                    new_pieces.append(sub)
        counted = many([new_pieces[i] for i in fresh])
        kept.update(zip(fresh, counted, strict=True))
        pieces, sizes = new_pieces, [kept[i] for i in range(len(new_pieces))]
    out_p: list[str] = []
    out_n: list[int] = []
    for piece, n in zip(pieces, sizes, strict=True):
        if n <= max_tokens:
            out_p.append(piece)
            out_n.append(n)
        else:
            subs = hard_split(piece, max_tokens)
            out_p.extend(subs)
            out_n.extend(many(subs))
    return out_p, out_n


def _cut(text: str, boundary: re.Pattern[str]) -> list[str]:
    """Split after each match of `boundary`, the separator kept with the left piece."""
    pieces = []
    start = 0
    for m in boundary.finditer(text):
        if m.end() > start and m.start() > start:
            pieces.append(text[start : m.end()])
            start = m.end()
    if start < len(text):
        pieces.append(text[start:])
    return pieces or [text]


def _halve(count: Callable[[str], int]) -> Callable[[str, int], list[str]]:
    def split(text: str, max_tokens: int) -> list[str]:
        if count(text) <= max_tokens or len(text) <= 1:
            return [text]
        mid = len(text) // 2
        return split(text[:mid], max_tokens) + split(text[mid:], max_tokens)

    return split


def _absorb_blank(parts: list[str]) -> list[str]:
    """Fold whitespace-only parts into the part before them (they carry no meaning)."""
    out: list[str] = []
    for part in parts:
        if out and not part.strip():
            out[-1] += part
        else:
            out.append(part)
    if len(out) > 1 and not out[0].strip():
        out[1] = out[0] + out[1]
        out.pop(0)
    return out


# -- words for BM25 --------------------------------------------------------------------

# Lucene's English stop words (the list `bm25s` and Elasticsearch's `english` use).
STOPWORDS: Final = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into",
    "is", "it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then",
    "there", "these", "they", "this", "to", "was", "will", "with",
})


# The words that frame a question rather than say what it is about ("how does the pool
# retry", "where is the config read"): rare in code, so BM25 would weigh them highly
# wherever a comment happens to hold them.
QUESTION_WORDS: Final = frozenset({
    "how", "what", "where", "which", "when", "why", "who", "does", "do", "did", "can",
    "should", "would", "from", "we", "our", "i", "you", "your", "my", "me", "its",
    "code", "implemented", "implements", "implementation", "handled", "done", "get", "gets",
    "happen", "happens", "work", "works", "way", "part", "logic", "place",
})


def lexical_terms(text: str, *, stopwords: bool = True, code_weight: int = 1,
                  stop: frozenset[str] = STOPWORDS) -> list[str]:
    """The BM25 terms of a query (`indexer.lexical_tokens.tokenize`), each term once.

    With `stopwords`, English stop words (`stop`) are left out; words in capitals stay (`IN`,
    `AND` in an SQL dialect's issue are keywords). With `code_weight` n > 1, the terms of
    words that look like code (`snake_case`, `camelCase`, `Class`-style names with
    an inner capital, dotted names, anything in backticks or an indented or fenced code
    line) are listed n times, for a BM25 that counts repeats: an issue's identifiers
    and traceback lines then weigh more than its prose.
    """
    from indexer.lexical_tokens import tokenize

    code_words: set[str] = set()
    if code_weight > 1:
        for line in text.splitlines():
            if line.startswith(("    ", "\t", ">>>", "```")) or _PY_FRAME.search(line):
                code_words.update(_WORDS.findall(line))
        for m in _BACKTICK.finditer(text):
            code_words.update(_WORDS.findall(m.group(1)))
        code_words.update(w for w in _WORDS.findall(text)
                          if "_" in w.strip("_") or _INNER_CAP.search(w))
    seen: dict[str, int] = {}
    for word in _WORDS.findall(text):
        if stopwords and word.lower() in stop and not word.isupper():
            continue
        n = code_weight if word in code_words else 1
        for t in tokenize(word):
            seen[t] = max(seen.get(t, 0), n)
    return [t for t, n in seen.items() for _ in range(n)]


_INNER_CAP: Final = re.compile(r"[a-z0-9][A-Z]")
_WORDS: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")


# -- references to code ---------------------------------------------------------------

_EXT: Final = (
    r"py|pyi|pyx|js|jsx|mjs|cjs|ts|tsx|go|rs|java|kt|kts|scala|c|h|cc|cpp|cxx|hpp|hh|cs|rb|"
    r"php|swift|m|mm|lua|sh|bash|zsh|pl|r|jl|ex|exs|erl|hs|ml|clj|dart|vue|svelte|sql|"
    r"toml|yaml|yml|json|cfg|ini|md|rst|txt|html|css|scss|proto|gradle|cmake|mk"
)
_PATH: Final = re.compile(
    rf"(?<![\w/.-])((?:[A-Za-z]:)?[\w.~-]*(?:[/\\][\w.@+-]+)*\.(?:{_EXT}))(?![\w/-])"
)
_PY_FRAME: Final = re.compile(r'File "([^"]+)", line (\d+)(?:, in ([\w<>.]+))?')
_COLON_FRAME: Final = re.compile(
    rf"([\w./\\~@+-]+\.(?:{_EXT})):(\d+)(?::\d+)?(?::? in ([\w<>.]+))?"
)
_JS_FRAME: Final = re.compile(
    rf"at (?:([\w$.<>]+) )?\(?([\w./\\~@+-]+\.(?:{_EXT})):(\d+)(?::\d+)?\)?"
)
_JAVA_FRAME: Final = re.compile(r"at ([\w$]+(?:\.[\w$<>]+)+)\(([\w$]+\.(?:java|kt|scala)):(\d+)\)")
_DOTTED: Final = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(\(\))?(?![\w(])")
_CALL: Final = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\(")
_BACKTICK: Final = re.compile(r"`([^`\n]{1,80})`")
_CAMEL: Final = re.compile(r"(?<![\w.])([A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+|[A-Z]{2,}[a-z]\w*)(?!\w)")
_SNAKE: Final = re.compile(r"(?<![\w.])(_*[a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?!\w)")
_IDENT: Final = re.compile(r"[A-Za-z_]\w*")
# `fromRawHeaders`: the method and variable names of JavaScript, Java, Go, Kotlin, Swift.
_LOWER_CAMEL: Final = re.compile(r"(?<![\w.$#])([a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)+)(?!\w)")
# `Sinatra::Base`, `$obj->method`: scoped names of C++, Rust, Ruby and PHP, and Ruby's
# `Rack::Request#params` (a capitalised class before the `#`, so that a URL's
# `README.md#install` is no name), resolved as dotted ones.
_SCOPED: Final = re.compile(
    r"(?<![\w:./#-])([A-Za-z_]\w*(?:(?:::|->)[A-Za-z_]\w*[?!]?)+(?:#[a-z_]\w*[?!]?)?"
    r"|[A-Z]\w*#[a-z_]\w*[?!]?)(?![\w/])")
_SCOPE_SEP: Final = re.compile(r"::|#|->")
# A query that is one name and nothing else (`Signer`, `has_name?`, `#parseJson`,
# `pkg.Func`, `Sinatra::Base`, `send()`): a lookup, whatever its case.
_IDENTIFIER_QUERY: Final = re.compile(
    r"[#$@]?[A-Za-z_][\w$]*[?!]?(?:(?:\.|::|#|->)[#$]?[A-Za-z_][\w$]*[?!]?)*(?:\(\))?")

# Words that look like code in prose but name nothing specific.
_COMMON_NAMES: Final = frozenset({
    "self", "cls", "print", "len", "str", "int", "float", "list", "dict", "set", "tuple",
    "object", "type", "none", "true", "false", "return", "import", "from", "def", "class",
    "if", "else", "for", "while", "try", "except", "raise", "with", "as", "in", "is", "not",
    "and", "or", "lambda", "module", "main", "init", "args", "kwargs", "e.g", "i.e", "etc",
})


@dataclass(frozen=True, slots=True)
class Frame:
    """One stack frame a query quotes: a file, maybe a line, maybe a function."""

    path: str
    line: int | None
    function: str | None


@dataclass
class QueryRefs:
    """Code a query names, in order of appearance (duplicates removed)."""

    paths: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    symbols: list[str] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)
    identifier: bool = False  # the whole query is one name: a definition lookup

    def __bool__(self) -> bool:
        return bool(self.paths or self.modules or self.symbols or self.frames)


def extract_refs(text: str, *, identifiers: bool = True) -> QueryRefs:
    """File paths, module paths, symbol names and stack frames named in `text`.

    `identifiers` also reads the names other languages write (`lowerCamel`, `A::B`,
    `A#b`) and takes a query that is one bare name as a lookup (`QueryRefs.identifier`);
    off, only what Python's names look like (the ranking tuned on Python issues)."""
    refs = QueryRefs()
    seen_frames: set[Frame] = set()

    def frame(path: str, line: str | None, fn: str | None) -> None:
        fn = fn if fn and not fn.startswith("<") else None
        f = Frame(_norm_path(path), int(line) if line else None, fn)
        if f not in seen_frames:
            seen_frames.add(f)
            refs.frames.append(f)

    for m in _PY_FRAME.finditer(text):
        frame(m.group(1), m.group(2), m.group(3))
    for m in _COLON_FRAME.finditer(text):
        frame(m.group(1), m.group(2), m.group(3))
    for m in _JS_FRAME.finditer(text):
        fn = m.group(1).rsplit(".", 1)[-1] if m.group(1) else None
        frame(m.group(2), m.group(3), fn)
    for m in _JAVA_FRAME.finditer(text):
        qual = m.group(1).split(".")
        frame(m.group(2), m.group(3), qual[-1])
        refs.symbols.append(".".join(qual[-2:]))

    paths = [_norm_path(m.group(1)) for m in _PATH.finditer(text)]
    refs.paths = _unique(p for p in paths if "/" in p or "." in p.strip("."))

    names: list[str] = []
    for m in _BACKTICK.finditer(text):
        inner = m.group(1).strip().rstrip("()")
        if _IDENT.fullmatch(inner) or _DOTTED.fullmatch(inner):
            names.append(inner)
    for m in _DOTTED.finditer(text):
        dotted = m.group(1)
        if _looks_like_file(dotted) or dotted.lower() in ("e.g", "i.e"):
            continue
        parts = dotted.split(".")
        if len(parts) >= 3 and all(p.islower() or "_" in p for p in parts[:-1]):
            refs.modules.append(dotted)
        names.append(dotted)
    names += [m.group(1) for m in _CALL.finditer(text)]
    names += [m.group(1) for m in _CAMEL.finditer(text)]
    names += [m.group(1) for m in _SNAKE.finditer(text)]
    if identifiers:
        names += [m.group(1) for m in _LOWER_CAMEL.finditer(text)]
        names += [_dotted(m.group(1)) for m in _SCOPED.finditer(text)]
    names += [f.function for f in refs.frames if f.function]
    whole = text.strip()
    if identifiers and _IDENTIFIER_QUERY.fullmatch(whole) and not refs.paths:
        # A bare name is a lookup even in lower case or one word (`Signer`, `headers`):
        # resolved against the names the repo defines, it either names code or nothing.
        refs.identifier = True
        name = _dotted(whole.removesuffix("()").lstrip("#$@"))
        names.insert(0, name)
        if name.endswith(("?", "!")):
            names.insert(1, name[:-1])
    refs.symbols = _unique([*refs.symbols, *(n for n in names if _is_specific(n))])
    refs.modules = _unique(refs.modules)
    return refs


def stem_key(name: str) -> str:
    """A file stem or a name, compared without case or separators (`network_error`,
    `network-error` and `NetworkError` are one key)."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _dotted(name: str) -> str:
    return _SCOPE_SEP.sub(".", name)


def _is_specific(name: str) -> bool:
    """Whether a name can point at code: not a builtin or keyword, not a one- or
    two-letter variable, and not a `test_*` function (in an issue that is nearly always
    the reporter's own test, and a repo test of the same name is a coincidence)."""
    last = name.split(".")[-1]
    return (last.lower() not in _COMMON_NAMES and len(last) > 2
            and not last.lower().startswith("test"))


def _looks_like_file(dotted: str) -> bool:
    return re.fullmatch(rf".*\.(?:{_EXT})", dotted) is not None and dotted.count(".") == 1


def _norm_path(path: str) -> str:
    path = path.replace("\\", "/")
    while path.startswith("./"):
        path = path[2:]
    return path


def _unique(items: Sequence[str] | object) -> list[str]:
    return list(dict.fromkeys(items))  # type: ignore[arg-type]


# -- resolving references against the repo --------------------------------------------

# How much each kind of evidence counts (relative; an evidence list is ranked by it).
W_FRAME_LINE: Final = 4.0  # a frame's file and its line falls in the chunk
W_FRAME_FUNC: Final = 3.0  # a frame's file and function name match the chunk
W_FRAME_FILE: Final = 1.0  # a frame's file
W_PATH: Final = 2.0  # a file path named in the text
W_MODULE: Final = 2.0  # a module path resolved to a file
W_SYMBOL: Final = 2.0  # a symbol name defined in the chunk
W_STEM: Final = 1.0  # a name that is the file's stem (`NetworkError` -> NetworkError.ts)


def _symbol_names(symbol: str) -> list[str]:
    """Names in a chunk's symbol path (`Session > send, close` -> Session, send, close)."""
    return [n for n in re.split(r"\s*>\s*|,\s*|\s+", symbol) if n]


class RepoNames:
    """The repo's paths and symbol names, to resolve what a query names.

    Built from the lexical index's doc list (path, symbol, lines per chunk; path "" for
    a slot to ignore), so doc numbers are the lexical index's.
    """

    def __init__(self, paths: Sequence[str], symbols: Sequence[str],
                 lines: Sequence[tuple[int, int]]) -> None:
        self.doc_path = list(paths)
        self.doc_lines = list(lines)
        self.by_path: dict[str, list[int]] = defaultdict(list)
        self.by_basename: dict[str, set[str]] = defaultdict(set)
        self.by_name: dict[str, list[int]] = defaultdict(list)
        self.by_name_lower: dict[str, list[int]] = defaultdict(list)
        self._by_stem: dict[str, set[str]] | None = None
        self.doc_names: list[list[str]] = []
        for i, (path, symbol) in enumerate(zip(paths, symbols, strict=True)):
            names = _symbol_names(symbol)
            self.doc_names.append(names)
            if not path:
                continue  # a deleted chunk keeps its slot but resolves from nothing
            self.by_path[path].append(i)
            self.by_basename[posixpath.basename(path)].add(path)
            # `#parseJson`, `$value`, `@name`: found by the bare name too.
            for name in dict.fromkeys([*names, *(n.lstrip("#$@") for n in names)]):
                self.by_name[name].append(i)
                self.by_name_lower[name.lower()].append(i)

    @property
    def by_stem(self) -> dict[str, set[str]]:
        """Paths by `stem_key` of their file stem, derived from `by_basename` on first
        use (only the stem evidence asks)."""
        if self._by_stem is None:
            self._by_stem = defaultdict(set)
            for base, paths in self.by_basename.items():
                self._by_stem[stem_key(base.split(".", 1)[0])].update(paths)
        return self._by_stem

    def resolve_path(self, path: str) -> list[str]:
        """Repo paths a named path means: those sharing the most trailing components.

        `/home/u/proj/xarray/core/merge.py` -> `xarray/core/merge.py`; a bare `merge.py`
        -> every `merge.py` in the repo.
        """
        parts = [p for p in path.split("/") if p and p != ".."]
        if not parts:
            return []
        candidates = self.by_basename.get(parts[-1], set())
        best: list[str] = []
        best_n = 0
        for cand in candidates:
            cparts = cand.split("/")
            n = 0
            while n < min(len(parts), len(cparts)) and parts[-1 - n] == cparts[-1 - n]:
                n += 1
            if n > best_n:
                best, best_n = [cand], n
            elif n == best_n:
                best.append(cand)
        # A one-component match of a longer named path is another file of the same name.
        if best_n == 1 and len(parts) > 1:
            return []
        return sorted(best)

    def resolve_module(self, dotted: str) -> list[tuple[str, list[str]]]:
        """(repo path, remaining names) for the longest module prefix that is a file."""
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            stem = "/".join(parts[:cut])
            for cand in (f"{stem}.py", f"{stem}/__init__.py"):
                hits = [p for p in self.resolve_path(cand)
                        if p == cand or p.endswith("/" + cand)]
                if hits:
                    return [(p, parts[cut:]) for p in hits]
        return []

    def symbol_docs(self, name: str) -> list[int]:
        """Chunks whose symbol path holds `name` (`A.b`: holds A, then b after it)."""
        parts = [p for p in name.split(".") if p]
        if not parts:
            return []
        last = parts[-1]
        docs = self.by_name.get(last) or []
        if len(parts) == 1:
            return list(docs)
        # Qualified: keep chunks whose symbol path also holds the qualifier before the
        # name; a lower-case qualifier is usually a variable (`ds.merge`): name alone.
        qual = parts[-2]
        if qual[:1].islower():
            return list(docs)
        return [i for i in docs if qual in self.doc_names[i][:-1]]


@dataclass
class Evidence:
    """Chunk scores from what a query names directly, for fusion as one more ranking."""

    scores: dict[int, float]
    matched: dict[str, list[str]]  # kind -> names that resolved, for explaining a result

    @classmethod
    def resolve(cls, refs: QueryRefs, names: RepoNames, *,
                max_symbol_docs: int = 50, stems: bool = False) -> Evidence:
        scores: dict[int, float] = defaultdict(float)
        matched: dict[str, list[str]] = defaultdict(list)

        def file_docs(path: str) -> list[int]:
            return names.by_path.get(path, [])

        for f in refs.frames:
            for path in names.resolve_path(f.path):
                matched["frames"].append(path)
                fn = f.function
                for i in file_docs(path):
                    s, e = names.doc_lines[i]
                    w = W_FRAME_FILE
                    if f.line is not None and s <= f.line <= e:
                        w += W_FRAME_LINE
                    if fn and fn in names.doc_names[i]:
                        w += W_FRAME_FUNC
                    scores[i] += w
        for p in refs.paths:
            resolved = names.resolve_path(p)
            for path in resolved:
                matched["paths"].append(path)
                for i in file_docs(path):
                    scores[i] += W_PATH / len(resolved)
        for mod in refs.modules:
            for path, rest in names.resolve_module(mod):
                matched["modules"].append(path)
                for i in file_docs(path):
                    w = W_MODULE
                    if rest and rest[-1] in names.doc_names[i]:
                        w += W_SYMBOL
                    scores[i] += w
        for sym in refs.symbols:
            docs = names.symbol_docs(sym)
            if not docs or len(docs) > max_symbol_docs:
                continue  # unknown here, or so common it points nowhere
            matched["symbols"].append(sym)
            # Rarer names say more: a name defined once is worth more than one of twenty.
            w = W_SYMBOL / math.log2(1 + len(docs))
            for i in docs:
                scores[i] += w
        if stems:
            for sym in refs.symbols:
                files = names.by_stem.get(stem_key(sym.split(".")[-1]), ())
                for path in files:
                    matched["stems"].append(path)
                    for i in file_docs(path):
                        scores[i] += W_STEM / len(files)
        return cls(dict(scores), dict(matched))

    def __bool__(self) -> bool:
        return bool(self.scores)
