"""The error tree drawn in indexer/errors.py is the tree the code defines, class for class."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import indexer.errors
from indexer.errors import CodeveilError

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("indexer", "sync", "retrieval")
# Modules that need an optional extra to import; their errors are checked where it is.
OPTIONAL = {"retrieval.faces.mcp_server"}
_ROW = re.compile(r"^(?P<indent>[ │├└─]*)(?P<name>[A-Z][A-Za-z]+)\b")


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        # Subpackages (sync.daemon) too: walk_packages imports each package to list it.
        for info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
            names.append(info.name)
    return sorted(names)


def _defined_errors() -> dict[str, type]:
    """Every public exception class defined in the three packages, by name."""
    found: dict[str, type] = {}
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ImportError:
            if name in OPTIONAL:
                continue
            raise
        for attr, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__ == name and not attr.startswith("_")):
                found[attr] = value
    return found


def _drawn_tree() -> dict[str, str | None]:
    """class name -> parent name, read from the drawing in indexer/errors.py."""
    doc = indexer.errors.__doc__ or ""
    body = doc.split("::", 1)[1]
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in body.splitlines():
        text = line[4:] if line.startswith("    ") else line
        match = _ROW.match(text)
        if not match or not line.startswith("    "):
            continue
        depth = len(match.group("indent"))
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[match.group("name")] = stack[-1][1] if stack else None
        stack.append((depth, match.group("name")))
    return parents


def test_the_drawing_is_read_as_a_tree() -> None:
    tree = _drawn_tree()
    assert tree["CodeveilError"] is None
    assert tree["KeyChecksumError"] == "KeyFormatError"
    assert tree["PermissionDenied"] == "AuthError"
    assert tree["SearchError"] == "CodeveilError"


def test_every_error_class_derives_from_codeveil_error() -> None:
    strays = [name for name, cls in _defined_errors().items()
              if not issubclass(cls, CodeveilError)]
    assert not strays, f"exceptions outside the tree: {strays}"


def test_every_error_class_is_drawn_under_its_parent() -> None:
    tree = _drawn_tree()
    defined = _defined_errors()
    missing = sorted(set(defined) - set(tree))
    assert not missing, f"error classes missing from the drawing in indexer/errors.py: {missing}"
    wrong = {}
    for name, cls in defined.items():
        parent = cls.__mro__[1].__name__ if cls is not CodeveilError else None
        if tree[name] != parent:
            wrong[name] = (tree[name], parent)
    assert not wrong, f"drawn parent != real parent: {wrong}"


def test_the_drawing_names_no_class_that_does_not_exist() -> None:
    extra = sorted(set(_drawn_tree()) - set(_defined_errors()))
    assert not extra, f"drawn but not defined: {extra}"


def test_wrong_key_is_the_key_mismatch_error() -> None:
    from retrieval import WrongKeyError
    from sync.errors import KeyMismatchError

    assert WrongKeyError is KeyMismatchError
    with pytest.raises(WrongKeyError):
        raise KeyMismatchError("the key does not match")
