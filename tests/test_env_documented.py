"""Every `CODEVEIL_*` variable the code reads is in the README's table of them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_environment_variable_is_documented() -> None:
    used = set()
    for package in ("indexer", "sync", "retrieval"):
        for path in (ROOT / package).rglob("*.py"):
            used |= set(re.findall(r"\bCODEVEIL_[A-Z0-9_]+\b", path.read_text()))
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Environment variables"):]
    table = table[: table.index("\n## ", 1)]
    documented = set(re.findall(r"^\| `(CODEVEIL_[A-Z0-9_]+)` \|", table, re.MULTILINE))
    assert used, "no variable found: the scan is broken"
    assert used <= documented, sorted(used - documented)
