"""Writes bench/swebench_split.tsv: the fixed tune/report split of the SWE-bench dev set.

    python bench/swebench_split.py

Rule: every instance of the repos below (the ones whose repository can be fetched here),
from the shared Verified dev and Lite dev files. Within each repo, instances are sorted
by the SHA-256 of their id (hex); the 1st, 3rd, 5th ... go to `tune`, the 2nd, 4th ...
to `report`. So each repo is split in half (a repo of one instance goes to tune), and
the split depends on nothing but the ids. The file lists the instances in that order,
so "the first n of a repo's half" is a fixed, id-determined subset too.

Settings are chosen on `tune`; every number published comes from `report`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

SHARED = Path("/work/shared/bench/swebench")
SOURCES = ("verified_dev.jsonl", "lite_dev.jsonl")
REPOS = (
    "psf/requests", "pallets/flask", "pytest-dev/pytest", "sphinx-doc/sphinx",
    "pydata/xarray", "astropy/astropy", "pylint-dev/pylint", "mwaskom/seaborn",
    "sqlfluff/sqlfluff", "pvlib/pvlib-python", "pylint-dev/astroid", "pydicom/pydicom",
    "marshmallow-code/marshmallow",
)
OUT = Path(__file__).with_name("swebench_split.tsv")


def split(rows: list[dict]) -> list[tuple[str, str, str]]:
    """(instance id, repo, half) of `rows`, repo by repo, in hash order."""
    out = []
    for repo in REPOS:
        ids = sorted((r["id"] for r in rows if r["repo"] == repo),
                     key=lambda i: hashlib.sha256(i.encode()).hexdigest())
        out += [(i, repo, "tune" if n % 2 == 0 else "report") for n, i in enumerate(ids)]
    return out


def main() -> None:
    rows = [json.loads(line) for name in SOURCES for line in (SHARED / name).open()]
    lines = ["# id\trepo\thalf  (written by bench/swebench_split.py; rule in its docstring)"]
    lines += ["\t".join(t) for t in split(rows)]
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}: {len(lines) - 1} instances")


if __name__ == "__main__":
    main()
