"""Jupyter notebooks read as their cells, with where each source line sits in the file.

A `.ipynb` file is JSON: cells with their source, outputs (often images as base64) and
metadata. Only the sources are worth indexing. Each source line is kept with the line
of the file it is written on, so that a hit opens the notebook at the cell's own JSON
lines: Jupyter writes a cell's source as a list of strings, one per line of the cell,
each on its own line of the file.

The JSON is walked by hand down to the cells (`cells`, or nbformat 3's
`worksheets[].cells`) and each cell's `source` (`input` in nbformat 3); every other
value is read, and so checked, by the standard library's decoder. Nothing here imports
the chunker: the walk uses `parse_notebook` to reject a broken notebook at read time.
"""

from __future__ import annotations

import json
import json.scanner
import re
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from indexer.languages import language_for_path

DEFAULT_LANGUAGE: Final = "python"
_WHITESPACE = re.compile(r"[ \t\n\r]*")
# The decoder's scanner reads one value at an offset and says where it ended.
_SCAN_ONCE: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(
    json.JSONDecoder()  # type: ignore[arg-type]  # typeshed names the wrong class
)


class NotebookError(ValueError):
    """A .ipynb file that is not a notebook's JSON."""


@dataclass(frozen=True, slots=True)
class SourceLine:
    """One string of a cell's source, and the 0-based line of the file it is written on."""

    file_line: int
    text: str


@dataclass(frozen=True, slots=True)
class Cell:
    """A cell: `code`, `markdown` or `raw`, and the strings of its source in order.

    `mimetype` is what a raw cell says it holds (`text/restructuredtext`, ...), or "".
    """

    kind: str
    source: tuple[SourceLine, ...]
    mimetype: str = ""

    @property
    def text(self) -> str:
        return "".join(line.text for line in self.source)

    def one_line_each(self) -> bool:
        """Whether each line of the cell's text is one string on a line of its own
        (as Jupyter writes it), so that lines of the text map to lines of the file."""
        last = len(self.source) - 1
        previous = -1
        for index, line in enumerate(self.source):
            body = line.text[:-1] if line.text.endswith("\n") else line.text
            if line.file_line <= previous or "\n" in body:
                return False
            if index < last and not line.text.endswith("\n"):
                return False
            previous = line.file_line
        return True


@dataclass(frozen=True, slots=True)
class Notebook:
    """The cells of a notebook and the language of its code cells."""

    language: str
    cells: tuple[Cell, ...]


def parse_notebook(text: str) -> Notebook:
    """The cells of the notebook `text`; raises NotebookError if it is not one."""
    scan = _Scan(text)
    cells: list[Cell] = []
    metadata: Any = None
    cell_languages: list[str] = []
    found = False
    for key in scan.members():
        if key == "cells":
            found = True
            cells.extend(scan.cells(cell_languages))
        elif key == "worksheets":  # nbformat 3
            found = True
            for _ in scan.items():
                for sheet_key in scan.members():
                    if sheet_key == "cells":
                        cells.extend(scan.cells(cell_languages))
                    else:
                        scan.value()
        elif key == "metadata":
            metadata = scan.value()
        else:
            scan.value()
    scan.end()
    if not found:
        raise NotebookError("no cells")
    return Notebook(_language(metadata, cell_languages), tuple(cells))


def _language(metadata: Any, cell_languages: list[str]) -> str:
    """Our name for the language of the code cells (python when the notebook is silent)."""
    candidates: list[str] = []
    if isinstance(metadata, dict):
        info = metadata.get("language_info")
        if isinstance(info, dict):
            extension = info.get("file_extension")
            if isinstance(extension, str):
                candidates.append("x" + extension)
            if isinstance(info.get("name"), str):
                candidates.append(info["name"])
        spec = metadata.get("kernelspec")
        if isinstance(spec, dict) and isinstance(spec.get("language"), str):
            candidates.append(spec["language"])
    candidates.extend(cell_languages)
    for candidate in candidates:
        language = _language_name(candidate)
        if language is not None:
            return language
    return DEFAULT_LANGUAGE


_LANGUAGE_EXTENSIONS: Final = {"python": ".py", "python3": ".py", "r": ".r", "julia": ".jl",
                               "c++": ".cpp", "scala": ".scala", "javascript": ".js",
                               "typescript": ".ts", "bash": ".sh", "ruby": ".rb",
                               "go": ".go", "rust": ".rs", "kotlin": ".kt", "java": ".java",
                               "csharp": ".cs", "c#": ".cs", "lua": ".lua"}


def _language_name(candidate: str) -> str | None:
    if candidate.startswith("x."):
        return language_for_path(candidate)
    extension = _LANGUAGE_EXTENSIONS.get(candidate.lower())
    return language_for_path("x" + extension) if extension else None


class _Scan:
    """A cursor over the JSON text that knows where it is."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0
        self._line_starts: list[int] | None = None

    def cells(self, languages: list[str]) -> Iterator[Cell]:
        for _ in self.items():
            kind = mimetype = ""
            source: tuple[SourceLine, ...] = ()
            for key in self.members():
                if key == "cell_type":
                    value = self.value()
                    kind = value if isinstance(value, str) else ""
                elif key == "metadata":
                    value = self.value()
                    if isinstance(value, dict):
                        found = value.get("raw_mimetype") or value.get("format")
                        mimetype = found if isinstance(found, str) else ""
                elif key in ("source", "input"):
                    source = self.source()
                elif key == "language":  # nbformat 3: on each code cell
                    value = self.value()
                    if isinstance(value, str):
                        languages.append(value)
                else:
                    self.value()
            if kind == "heading":  # nbformat 3's headings are markdown's
                kind = "markdown"
            yield Cell(kind, source, mimetype)

    def source(self) -> tuple[SourceLine, ...]:
        """A cell's source: one string, or a list of strings."""
        if self._peek() != "[":
            return (self._string(),)
        return tuple(self._string() for _ in self.items())

    def _string(self) -> SourceLine:
        self._skip_space()
        start = self.at
        value = self.value()
        if not isinstance(value, str):
            raise NotebookError(f"a cell's source holds a {type(value).__name__}")
        return SourceLine(self._line_of(start), value)

    def _line_of(self, offset: int) -> int:
        if self._line_starts is None:
            self._line_starts = [0, *(m.end() for m in re.finditer("\n", self.text))]
        return bisect_right(self._line_starts, offset) - 1

    def members(self) -> Iterator[str]:
        """The keys of the object here; the caller reads each key's value in between."""
        self._expect("{")
        if self._peek() == "}":
            self.at += 1
            return
        while True:
            self._skip_space()
            key = self.value()
            if not isinstance(key, str):
                raise NotebookError("an object key is not a string")
            self._expect(":")
            yield key
            if self._next_of(",}") == "}":
                return

    def items(self) -> Iterator[None]:
        """Once per element of the array here; the caller reads each element."""
        self._expect("[")
        if self._peek() == "]":
            self.at += 1
            return
        while True:
            yield None
            if self._next_of(",]") == "]":
                return

    def value(self) -> Any:
        self._skip_space()
        try:
            value, self.at = _SCAN_ONCE(self.text, self.at)
        except (StopIteration, ValueError) as exc:
            raise NotebookError(f"invalid JSON near character {self.at}") from exc
        return value

    def end(self) -> None:
        self._skip_space()
        if self.at != len(self.text):
            raise NotebookError(f"text after the notebook at character {self.at}")

    def _skip_space(self) -> None:
        match = _WHITESPACE.match(self.text, self.at)
        assert match is not None  # the pattern matches the empty string
        self.at = match.end()

    def _peek(self) -> str:
        self._skip_space()
        return self.text[self.at : self.at + 1]

    def _expect(self, char: str) -> None:
        if self._peek() != char:
            raise NotebookError(f"expected {char!r} at character {self.at}")
        self.at += 1

    def _next_of(self, chars: str) -> str:
        char = self._peek()
        if not char or char not in chars:
            raise NotebookError(f"expected one of {chars!r} at character {self.at}")
        self.at += 1
        return char
