"""Which paths a repository walk leaves out.

Three sources, from lowest to highest precedence:

1. Built-in defaults: heavy tool directories that are almost never wanted in a code
   index (`node_modules`, `__pycache__`, virtualenvs, tool caches). Any ignore file
   can bring one back with a negation, e.g. `!node_modules/` in `.codeveilignore`.
2. Git's rules: `.git/info/exclude` at the root, then every `.gitignore`, each one
   applying to its own directory's subtree with patterns relative to that directory;
   a deeper file overrides a shallower one, and within a file the last match wins.
3. `.codeveilignore` files (same syntax, at any level), which override all of Git's
   rules, so they can exclude tracked files or re-include ignored ones.

VCS metadata (`.git`, `.hg`, ...) and codeveil's own `.codeveil` folder are always
skipped; no rule can bring them back.

Files the walk skips by default though no rule ignores them (lock files, SVG, data,
vendored folders: indexer.walk and indexer.assets) come back only through a
`.codeveilignore` negation that matches the path itself (`IgnoreRules.keeps`).

As in Git, a file inside an excluded directory cannot be re-included by a pattern for
the file alone (the walk never enters that directory): re-include the directory
(`!build/`) and then exclude what is not wanted inside it. One exception, also as in
Git: `dir/**` excludes the *contents* of `dir`, not `dir` itself, so `dir/**` followed
by `!dir/keep.py` does keep `dir/keep.py`.

Patterns are translated into regexes by pathspec (`GitIgnoreSpec`) but matched the way
Git matches them: each path on its own, a directory before its contents, an excluded
directory never entered. pathspec's own matcher judges flat lists of files and differs
from Git on some negations (`!*/`) and on `dir/**/`; tests/test_walk.py compares the
walk with `git ls-files --others --exclude-standard`.

The user's global Git excludes file (`core.excludesFile`) is not read, and matching is
case-sensitive (Git's `core.ignorecase` is not consulted).
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from dataclasses import dataclass

from pathspec import GitIgnoreSpec

GITIGNORE = ".gitignore"
CODEVEILIGNORE = ".codeveilignore"

# Never indexed and never re-includable: version-control metadata and our own state.
ALWAYS_SKIPPED = frozenset({".git", ".hg", ".svn", ".bzr", "_darcs", ".codeveil"})

# Skipped unless an ignore file explicitly re-includes them.
DEFAULT_IGNORED_DIRS = frozenset(
    {"node_modules", "__pycache__", ".tox", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
)

# A directory holding this file is a Python virtualenv (whatever it is called:
# `.venv`, `venv`, `env`, ...) and is skipped by default like the directories above.
VENV_MARKER = "pyvenv.cfg"

_NAMED_GROUP = re.compile(r"\(\?P<[^>]+>")


def _read_lines(path: str) -> list[str]:
    """The lines of an ignore file, or none if it cannot be read (Git is silent too)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    return text.removeprefix("\ufeff").splitlines()


def _compile_spec(lines: list[str]) -> GitIgnoreSpec | None:
    """Compile gitignore lines, dropping malformed ones as Git does instead of failing."""
    try:
        spec = GitIgnoreSpec.from_lines(lines)
    except ValueError:
        valid = []
        for line in lines:
            try:
                GitIgnoreSpec.from_lines([line])
            except ValueError:
                continue
            valid.append(line)
        spec = GitIgnoreSpec.from_lines(valid)
    if not any(p.include is not None for p in spec.patterns):
        return None
    return spec


# Git reads `a/**` as "everything inside a" and `a/**/` as "every directory inside a";
# neither matches `a` itself. pathspec matches `a/` with the first and reads the second
# as `a/`; `a/**/*` and `a/**/*/` say the same as Git in a way pathspec translates right.
_TRAILING_STARSTAR = {"/**": "/**/*", "/**/": "/**/*/"}


def _normalise(line: str) -> str:
    stripped = line.rstrip()
    for suffix, replacement in _TRAILING_STARSTAR.items():
        if stripped.endswith(suffix):
            return stripped[: -len(suffix)] + replacement
    return line


_FLOATING = "^(?:.+/)?"  # how pathspec starts a pattern that matches at any depth


def _whole_path(source: str) -> str:
    """A pattern's regex, made to match only the whole path.

    pathspec's regexes also match a path *below* a matching directory (`build/` matches
    `build/x.py`), to judge flat file lists. The walk asks about every directory on
    the way down, as Git does, so only a match of the path itself may count: otherwise
    a negation such as `!*/` would also re-include every file below the directory.
    Group names are dropped because they repeat across patterns, which one union
    regex cannot hold.
    """
    return f"(?:{_NAMED_GROUP.sub('(?:', source)})\\Z"


def _union(sources: list[str]) -> re.Pattern[str] | None:
    """One regex that matches wherever any of pathspec's regexes `sources` would.

    Most paths match no pattern; one C-level search answers that far faster than
    trying the patterns one by one. Patterns that float to any depth share a single
    `^(?:.+/)?` prefix, so the backtracking over the path's directories happens once.
    """
    floating = [_whole_path(s.removeprefix(_FLOATING)) for s in sources if s.startswith(_FLOATING)]
    others = [_whole_path(s) for s in sources if not s.startswith(_FLOATING)]
    if floating:
        others.append(f"{_FLOATING}(?:{'|'.join(floating)})")
    try:
        return re.compile("|".join(others))
    except re.error:  # no prefilter, then: still correct, only slower
        return None


@dataclass(frozen=True, slots=True)
class _Layer:
    """The patterns of one ignore file, which apply below `prefix`."""

    prefix: str  # repo-relative directory of the ignore file: "" or "src/lib/"
    # (ignored?, regex) for every pattern, last pattern first: the first match decides.
    patterns: tuple[tuple[bool, re.Pattern[str]], ...]
    prefilter: re.Pattern[str] | None

    @classmethod
    def load(cls, path: str, prefix: str) -> _Layer | None:
        spec = _compile_spec([_normalise(line) for line in _read_lines(path)])
        if spec is None:
            return None
        patterns, sources = [], []
        for pattern in reversed(spec.patterns):
            regex = getattr(pattern, "regex", None)
            if pattern.include is None or not isinstance(regex, re.Pattern):
                continue
            patterns.append((pattern.include, re.compile(_whole_path(regex.pattern), regex.flags)))
            sources.append(regex.pattern)
        return cls(prefix, tuple(patterns), _union(sources))

    def verdict(self, rel: str, is_dir: bool) -> bool | None:
        """True (ignore), False (keep: a negation matched) or None (no pattern matched).

        `rel` is repo-relative and always lies below `prefix`, because layers are only
        stacked for the directories above it.
        """
        key = rel[len(self.prefix) :] + "/" if is_dir else rel[len(self.prefix) :]
        # pathspec searches (some of its regexes are not anchored at the start).
        if self.prefilter is not None and self.prefilter.search(key) is None:
            return None
        for ignored, regex in self.patterns:
            if regex.search(key) is not None:
                return ignored
        return None


@dataclass(frozen=True, slots=True)
class IgnoreRules:
    """The ignore layers in force for one directory of the walk (immutable, shared)."""

    # Each tuple is deepest first; `.git/info/exclude` is the last of `gitignore`.
    codeveil: tuple[_Layer, ...] = ()
    gitignore: tuple[_Layer, ...] = ()
    # Every layer in the order they are consulted: the first that matches decides.
    layers: tuple[_Layer, ...] = ()

    @classmethod
    def for_root(cls, root: str | os.PathLike[str]) -> IgnoreRules:
        """The rules before the root's own ignore files are read: `.git/info/exclude`."""
        return cls()._with(_Layer.load(os.path.join(root, ".git", "info", "exclude"), ""), None)

    def enter(self, abs_dir: str, prefix: str, names: Collection[str]) -> IgnoreRules:
        """The rules for a directory, given the names it contains.

        `prefix` is the directory's repo-relative path with a trailing "/" ("" at the root).
        """
        git = ours = None
        if GITIGNORE in names:
            git = _Layer.load(os.path.join(abs_dir, GITIGNORE), prefix)
        if CODEVEILIGNORE in names:
            ours = _Layer.load(os.path.join(abs_dir, CODEVEILIGNORE), prefix)
        return self._with(git, ours)

    def _with(self, git: _Layer | None, ours: _Layer | None) -> IgnoreRules:
        if git is None and ours is None:
            return self
        codeveil = self.codeveil if ours is None else (ours, *self.codeveil)
        gitignore = self.gitignore if git is None else (git, *self.gitignore)
        # Any .codeveilignore outranks every .gitignore, so it can re-include.
        return IgnoreRules(codeveil, gitignore, (*codeveil, *gitignore))

    def match(self, rel: str, is_dir: bool) -> bool | None:
        """True if ignored, False if explicitly kept (a negation), None if no rule applies."""
        for layer in self.layers:
            verdict = layer.verdict(rel, is_dir)
            if verdict is not None:
                return verdict
        return None

    def keeps(self, rel: str, is_dir: bool) -> bool:
        """Whether a `.codeveilignore` negation names this path itself.

        The way to bring back what the walk skips by default (assets, vendored folders,
        lock files): only our own ignore files count, since a `.gitignore` negation
        speaks about Git, and only a pattern that matches the path itself, since
        re-including a folder (`!build/`, or `!*/`) says nothing about its files.
        """
        for layer in self.codeveil:
            verdict = layer.verdict(rel, is_dir)
            if verdict is not None:
                return not verdict
        return False

    def skips_dir(self, rel: str, name: str) -> tuple[bool, bool]:
        """(skip this directory, an ignore file explicitly kept it)."""
        if name in ALWAYS_SKIPPED:
            return True, False
        verdict = self.match(rel, is_dir=True)
        if verdict is None:
            return name in DEFAULT_IGNORED_DIRS, False
        return verdict, not verdict

    def skips_file(self, rel: str, name: str) -> bool:
        """Whether a file (or a symlink, which Git also treats as a file) is ignored."""
        if name in ALWAYS_SKIPPED:  # e.g. the `.git` file of a worktree or submodule
            return True
        return self.match(rel, is_dir=False) is True
