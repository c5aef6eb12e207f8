"""Whether a file's use of a name is bound to one of the files that define it, read from
the file's import statements where the language makes that cheap.

- Python: `from a.b import X [as Y]` and relative `from .b import X` name module a.b;
  `import a.b [as c]` and `from a import b` bind a module whose `X` the file uses as
  `c.X` / `a.b.X` / `b.X`. A module is `a/b.py` or `a/b/__init__.py`, under any folder
  (a `src/` layout, a repository holding several projects).
- JavaScript / TypeScript: `import {X, Y as Z} from './y'`, `import X from './y'`,
  `import * as ns from './y'` (used as `ns.X`), `require('./y')`; only relative
  specifiers (a package name says nothing about this repository's files), resolved as
  the bundlers do: `y`, `y.ts`, `y.tsx`, `y.js`, ..., `y/index.*`.
- Go: a file of the defining package (the same folder) uses its names unqualified;
  another imports the package by a path ending in that folder and uses `pkg.X` (or the
  import's alias).

A file that defines the name itself is bound to it. The rest (languages without such
a rule here, imports through packages this repository does not hold) is not bound:
those uses are only same-name occurrences.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from typing import Final

__all__ = ["binds_to_definition"]

_PY_FROM: Final = re.compile(
    r"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*(?:\\\n[^\n#]*)*)",
    re.MULTILINE)
_PY_IMPORT: Final = re.compile(r"^[ \t]*import[ \t]+([^\n#;]+)", re.MULTILINE)
_JS_IMPORT: Final = re.compile(
    r"""\bimport\s+(?:type\s+)?([\w$*{}\s,]+?)\s+from\s+['"]([^'"]+)['"]"""
    r"""|\b(?:const|let|var)\s+([\w${}\s,:]+?)\s*=\s*require\(\s*['"]([^'"]+)['"]\s*\)""")
_JS_EXTENSIONS: Final = ("", ".ts", ".tsx", ".js", ".jsx", ".mjs", ".cjs", ".mts", ".cts")
_GO_IMPORT_BLOCK: Final = re.compile(r"^import\s*\(([^)]*)\)", re.MULTILINE)
_GO_IMPORT_LINE: Final = re.compile(r'^import\s+(?:([\w.]+)\s+)?"([^"]+)"', re.MULTILINE)
_GO_SPEC: Final = re.compile(r'^\s*(?:([\w.]+)\s+)?"([^"]+)"', re.MULTILINE)


def binds_to_definition(rel: str, text: str, language: str, name: str,
                        defining: Iterable[str]) -> bool:
    """Whether the file `rel` (its `text`, in `language`) uses `name` as the one defined
    in one of the `defining` files (repo-relative paths), by the rules above."""
    defining = set(defining)
    if rel in defining:
        return True
    if language == "python":
        return _python(rel, text, name, defining)
    if language in ("javascript", "typescript", "tsx"):
        return _javascript(rel, text, name, defining)
    if language == "go":
        return _go(rel, text, name, defining)
    return False


def _python_module_files(module: str, rel: str) -> tuple[str, ...] | None:
    """The path suffixes a module's file may have; relative modules resolved against
    `rel`'s folder (then the paths are whole, marked by a leading "/")."""
    dots = len(module) - len(module.lstrip("."))
    parts = [p for p in module[dots:].split(".") if p]
    if dots:
        folder = posixpath.dirname(rel).split("/") if posixpath.dirname(rel) else []
        if dots - 1 > len(folder):
            return None
        folder = folder[:len(folder) - (dots - 1)]
        parts = folder + parts
        prefix = "/"
    else:
        prefix = ""
    if not parts:
        return None
    base = "/".join(parts)
    return (f"{prefix}{base}.py", f"{prefix}{base}/__init__.py")


def _is_module(files: tuple[str, ...] | None, defining: set[str]) -> bool:
    if files is None:
        return False
    for path in defining:
        for suffix in files:
            if suffix.startswith("/"):
                if f"/{path}" == suffix:
                    return True
            elif path == suffix or path.endswith(f"/{suffix}"):
                return True
    return False


def _uses_attribute(text: str, owner: str, name: str) -> bool:
    return re.search(rf"(?<![\w.$]){re.escape(owner)}\s*\.\s*{re.escape(name)}\b",
                     text) is not None


def _python(rel: str, text: str, name: str, defining: set[str]) -> bool:
    for module, names in _PY_FROM.findall(text):
        for item in names.strip("()").replace("\\\n", " ").split(","):
            words = item.split()
            if not words:
                continue
            imported, bound = words[0], words[-1]
            if imported == name and _is_module(_python_module_files(module, rel), defining):
                return True
            # `from a import b`: b may be the module a.b, used as `b.name`.
            sub = f"{module}.{imported}" if not module.endswith(".") else module + imported
            if (_uses_attribute(text, bound, name)
                    and _is_module(_python_module_files(sub, rel), defining)):
                return True
    for clause in _PY_IMPORT.findall(text):
        for item in clause.split(","):
            words = item.split()
            if not words:
                continue
            module = words[0]
            bound = words[2] if len(words) == 3 and words[1] == "as" else module
            if (_uses_attribute(text, bound, name)
                    and _is_module(_python_module_files(module, rel), defining)):
                return True
    return False


def _js_targets(rel: str, spec: str) -> list[str]:
    base = posixpath.normpath(posixpath.join(posixpath.dirname(rel), spec))
    out = [base + ext for ext in _JS_EXTENSIONS]
    out += [f"{base}/index{ext}" for ext in _JS_EXTENSIONS if ext]
    # TypeScript's ESM style imports './y.js' for the file y.ts.
    stem, ext = posixpath.splitext(base)
    if ext in (".js", ".jsx", ".mjs", ".cjs"):
        out += [stem + e for e in (".ts", ".tsx", ".mts", ".cts")]
    return out


def _js_bindings(clause: str) -> tuple[set[str], set[str]]:
    """(names imported by name, namespace/default bindings) of an import clause."""
    named: set[str] = set()
    whole: set[str] = set()
    braces = re.search(r"\{([^}]*)\}", clause)
    if braces:
        for item in braces.group(1).split(","):
            words = item.replace(":", " as ").split()
            if words and words[0] != "type":
                named.add(words[0])
            elif len(words) > 1:
                named.add(words[1])
    rest = re.sub(r"\{[^}]*\}", "", clause)
    for item in rest.split(","):
        words = item.split()
        if words:
            whole.add(words[-1])  # `X` (default) or `* as ns`
    return named, whole


def _javascript(rel: str, text: str, name: str, defining: set[str]) -> bool:
    for clause_a, spec_a, clause_b, spec_b in _JS_IMPORT.findall(text):
        clause, spec = (clause_a, spec_a) if spec_a else (clause_b, spec_b)
        if not spec.startswith("."):
            continue
        if not defining.intersection(_js_targets(rel, spec)):
            continue
        named, whole = _js_bindings(clause)
        if name in named or name in whole:
            return True
        if any(_uses_attribute(text, ns, name) for ns in whole):
            return True
    return False


def _go(rel: str, text: str, name: str, defining: set[str]) -> bool:
    folder = posixpath.dirname(rel)
    go_folders = {posixpath.dirname(p) for p in defining if p.endswith(".go")}
    if folder in go_folders:
        return True  # the same package: its names are used unqualified
    specs = _GO_IMPORT_LINE.findall(text)
    for block in _GO_IMPORT_BLOCK.findall(text):
        specs += _GO_SPEC.findall(block)
    for alias, path in specs:
        for target in go_folders:
            if not target or not (path == target or path.endswith(f"/{target}")):
                continue
            bound = alias or path.rsplit("/", 1)[-1]
            if bound == "." or _uses_attribute(text, bound, name):
                return True
    return False
