"""Package faces that import their names on first use (PEP 562).

Importing a package must stay cheap: `import indexer.walk` runs `indexer/__init__.py`
first, and the `codeveil` command starts in a fifth of a second only because no face
pulls in the model, the store or LanceDB before a command needs them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for a package whose names live in `homes`
    (name -> module); a name is imported once, then kept in the package's `namespace`."""

    def getattr_(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(homes)

    return getattr_, dir_


class LazyModule:
    """A module imported on first attribute access: `faiss = LazyModule("faiss")` at the
    top of a module keeps the import (and its tens of milliseconds) off every path that
    never touches it, such as a re-index with nothing to send."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)
