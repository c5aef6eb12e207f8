"""Damage every file the index keeps, in several ways: is an answer ever silently wrong?

A small repo is indexed (the hashing embedder: the model is not the point), searched and
grepped, edited and indexed again (so that the derived indexes have a base and a delta),
and a second checkout of it is indexed beside it. Then, for every file under `.codeveil/`
and the embedding cache, for each damage:

- flip:      one byte in 512 (and the middle one) XORed, as bit rot or a bad copy;
- truncate:  cut to half its size, as a full disk or a killed copy;
- swap:      in an integer array (.npy, or an .npz member), half the entries replaced by
             other values of the same array: valid ids, in the wrong places;
- delete:    the file gone;
- other:     the same kind of file of the other checkout copied over it;

it records what `codeveil doctor` says, what grep and search then answer (the same as
before the damage, or an error), and whether `doctor --repair` brings the answers back.
Run against a fresh copy of the index each time. A case passes when the answers are right
or the error is one line naming the file and a remedy, no error is `unexpected` (not a
`CodeveilError`), the doctor names every damage that is not rebuilt by the next read
anyway, and after the repair the answers are the fresh ones and the doctor finds nothing.

    .venv/bin/python bench/corruption.py    # the table of docs/benchmarks.md, and
                                            # bench/results/corruption.json

`tests/test_corruption.py` runs every case.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sqlite3
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import write_json  # noqa: E402
from indexer.embedder import HashingEmbedder  # noqa: E402
from indexer.errors import CodeveilError  # noqa: E402
from retrieval.agent.agent_tools import AgentTools  # noqa: E402
from retrieval.faces.api import Index  # noqa: E402
from retrieval.faces.doctor import doctor  # noqa: E402

PATTERNS = ["def ", "return", r"total\w*", "class [A-Z]", "import", "retry", "x"]
QUERIES = ["password hash", "distance between points", "sum the gamma prices of cart 5",
           "retry the failed kappa upload", "shop eleven", "cart 77 prices", "upload sigma"]
DAMAGES = ("flip", "truncate", "swap", "delete", "other")
#: Files whose loss or damage changes no answer and is nobody's to repair: empty locks,
#: the folder's .gitignore.
INERT = re.compile(r"(\.lock|\.gitignore)$")
#: Files whose absence is a state like any other: a derived index not built yet (the next
#: read builds it), an embedding cache not filled yet. The doctor need not name their loss.
ABSENT_IS_NORMAL = re.compile(
    r"(trigrams/state\.npz|(vectors|static)/delta\.npz|embeddings\.sqlite)$")
#: Files nothing on this machine derives from: the workspace key. Its damage must be
#: refused and named, with the remedy (import it again); no repair can make it anew.
IRREPLACEABLE = re.compile(r"^config/keys/")


_WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota",
          "kappa", "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau",
          "upsilon", "phi", "chi", "psi", "omega"]


def _module(i: int) -> str:
    """A module of words of its own: no two score alike (the order of a tie is the
    index's row order, which a rebuild may change)."""
    a, b, c = (_WORDS[(i * 7 + j * 5) % len(_WORDS)] for j in range(3))
    return (f"def total_{a}_{i}(items):\n    '''Sum the {b} prices of cart {i}.'''\n"
            f"    return sum(x.{c} for x in items) + {i}\n\n\n"
            f"class Shop{i}{b.title()}:\n    def retry_{c}(self, upload):\n"
            f"        '''Retry the failed {a} upload {i}, {c} then {b}.'''\n"
            f"        return upload.send_{a}({i} * {i + 3})\n")


FILES = {
    **{f"pkg{i % 3}/mod_{i}.py": _module(i) for i in range(12)},
    "auth/password.py": "import hashlib\n\n\ndef password_hash(text):\n"
                        "    return hashlib.sha256(text.encode()).hexdigest()\n",
    "geo/distance.py": "import math\n\n\ndef distance(a, b):\n"
                       "    return math.hypot(a.x - b.x, a.y - b.y)\n",
}


@dataclass
class Built:
    """An indexed repo and a pristine copy of its index, cache and a second checkout."""

    base: Path
    repo: Path
    other: Path
    config: Path  # CODEVEIL_CONFIG_DIR: the keys
    pristine: Path  # the repo's .codeveil/, as built
    pristine_cache: Path
    pristine_config: Path
    fresh: tuple  # the answers of the undamaged index


@contextlib.contextmanager
def env(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _write(repo: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        # Old enough that the stat cache trusts it: grep then narrows by the index
        # (a racily clean file is read whatever the index says, hiding its damage).
        os.utime(path, (1.6e9, 1.6e9))


def answers(repo: Path) -> tuple:
    """What grep finds for each pattern and, for each query, search's best hit: below it,
    in a repo this small, hits tie (by rank, in the fusion of words and vectors), and a
    tie's order is the index's row order, which a rebuild changes."""
    tools = AgentTools(repo, watch=False)
    greps = tuple(tuple((m.path, m.line, m.text) for m in tools.grep(p).matches)
                  for p in PATTERNS)
    out = []
    with Index(repo, embedder=HashingEmbedder()) as idx:
        for q in QUERIES:
            hits = idx.search(q, k=1)
            out.append((hits[0].path, hits[0].start_line, hits[0].text) if hits else None)
    return greps, tuple(out)


def build(base: Path) -> Built:
    """Index the repo and its second checkout under `base` (env: config and cache)."""
    repo, other = base / "repo", base / "other"
    _write(repo, FILES)
    _write(other, {**FILES, "pkg0/mod_0.py": _module(99), "extra.py": _module(50)})
    for checkout in (other, repo):
        with Index(checkout, embedder=HashingEmbedder()) as idx:
            idx.index(wait=True)
        answers(checkout)  # builds the lexical, vector and grep indexes
        # An edit and a new file: the derived indexes now have a delta beside the base.
        _write(checkout, {"pkg1/mod_4.py": _module(4) + "\ndef added():\n    return 4\n",
                          "late.py": _module(77)})
        with Index(checkout, embedder=HashingEmbedder()) as idx:
            idx.index(wait=True)
        answers(checkout)
    fresh = answers(repo)
    for db in [*repo.rglob("*.sqlite"), *Path(os.environ["CODEVEIL_CACHE_DIR"]).rglob("*.sqlite")]:
        _checkpoint(db)
    pristine, cache = base / "pristine", base / "pristine-cache"
    shutil.copytree(repo / ".codeveil", pristine, symlinks=True)
    shutil.copytree(os.environ["CODEVEIL_CACHE_DIR"], cache, symlinks=True)
    config = Path(os.environ["CODEVEIL_CONFIG_DIR"])
    shutil.copytree(config, base / "pristine-config", symlinks=True)
    return Built(base, repo, other, config, pristine, cache, base / "pristine-config", fresh)


def _checkpoint(path: Path) -> None:
    """Move what SQLite's write-ahead log holds into the file itself, so that a damage
    to the file reaches the data (a damage under a log that still holds every page is
    invisible until the next checkpoint)."""
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()


def kind_of(rel: str) -> str:
    """A file's kind: its path with ids (hex names) as `*`."""
    return re.sub(r"[0-9a-f]{16,}", "*", rel)


def file_kinds(built: Built) -> dict[str, str]:
    """kind -> path (relative to the repo, or `cache/...`) of one file of that kind."""
    out: dict[str, str] = {}
    for path in sorted(built.pristine.rglob("*")):
        if path.is_file() and not INERT.search(path.name):
            rel = ".codeveil/" + path.relative_to(built.pristine).as_posix()
            out.setdefault(kind_of(rel), rel)
    for path in sorted(built.pristine_cache.rglob("*")):
        if path.is_file() and not path.name.endswith(("-wal", "-shm")):
            rel = "cache/" + path.relative_to(built.pristine_cache).as_posix()
            out.setdefault(kind_of(rel), rel)
    mine = json.loads((built.pristine / "config.json").read_text())["workspace_id"]
    for path in sorted(built.pristine_config.rglob("*")):
        ids = re.findall(r"[0-9a-f]{32}", path.name)
        if path.is_file() and all(i == mine for i in ids):  # not the other checkout's
            rel = "config/" + path.relative_to(built.pristine_config).as_posix()
            out.setdefault(kind_of(rel), rel)
    return out


# -- damages ------------------------------------------------------------------------------


def flip(path: Path, built: Built) -> bool:
    data = bytearray(path.read_bytes())
    if not data:
        return False
    for i in [*range(100, len(data), 512), len(data) // 2]:
        data[min(i, len(data) - 1)] ^= 0x5A
    path.write_bytes(bytes(data))
    return True


def truncate(path: Path, built: Built) -> bool:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return True


def _swap_at(f, offset: int, dtype: np.dtype, count: int) -> bool:
    """Half the `count` entries of the array at `offset` of `f`, permuted in place."""
    if count < 4 or dtype.kind not in "iu":
        return False
    f.seek(offset)
    values = np.frombuffer(f.read(count * dtype.itemsize), dtype=dtype).copy()
    rng = np.random.default_rng(58)
    picked = rng.choice(count, count // 2, replace=False)
    swapped = rng.permutation(values[picked])
    if np.array_equal(swapped, values[picked]):
        return False
    values[picked] = swapped
    f.seek(offset)
    f.write(values.tobytes())
    return True


def swap(path: Path, built: Built) -> bool:
    """Other valid values in the file's integer arrays (bytes changed in place: a
    checksum or CRC beside them is left as it was)."""
    if path.suffix == ".npy":
        with path.open("r+b") as f:
            version = np.lib.format.read_magic(f)
            shape, _, dtype = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)(f)
            return _swap_at(f, f.tell(), dtype, int(np.prod(shape)))
    if path.suffix != ".npz":
        return False
    done = False
    with zipfile.ZipFile(path) as zf:
        members = [i for i in zf.infolist() if not i.filename.startswith("_")]
    with path.open("r+b") as f:
        for info in members:
            f.seek(info.header_offset + 26)
            name_len, extra_len = np.frombuffer(f.read(4), dtype="<u2")
            f.seek(info.header_offset + 30 + int(name_len) + int(extra_len))
            version = np.lib.format.read_magic(f)
            shape, _, dtype = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)(f)
            if len(shape) == 1:
                done |= _swap_at(f, f.tell(), dtype, int(np.prod(shape)))
    return done


def delete(path: Path, built: Built) -> bool:
    path.unlink()
    return True


def other(path: Path, built: Built) -> bool:
    """The other checkout's file of the same kind, under this one's name."""
    if path.is_relative_to(built.base / "cache"):
        return False  # one cache per machine: the checkouts share it
    if path.is_relative_to(built.config):  # the other workspace's file beside it
        for candidate in sorted(path.parent.iterdir()):
            if candidate != path and kind_of(candidate.name) == kind_of(path.name):
                shutil.copyfile(candidate, path)
                return True
        return False
    rel = path.relative_to(built.repo).as_posix()
    wanted = kind_of(rel)
    for candidate in sorted((built.other / ".codeveil").rglob("*")):
        if candidate.is_file() and kind_of(candidate.relative_to(built.other).as_posix()) \
                == wanted:
            shutil.copyfile(candidate, path)
            return True
    return False


DAMAGE: dict[str, Callable[[Path, Built], bool]] = {
    "flip": flip, "truncate": truncate, "swap": swap, "delete": delete, "other": other}


# -- one case -------------------------------------------------------------------------------


@dataclass
class Outcome:
    kind: str
    damage: str
    applies: bool = True
    doctor: str = ""  # "named", "ok" or "unexpected ..."
    read: str = ""  # "right", "refused: <line>", "WRONG", "unexpected ..."
    repaired: str = ""  # "right" or what went wrong
    problem: str = ""  # why the case fails, empty when it passes

    @property
    def cell(self) -> str:
        """The outcome in a few words: what the read answered (right, refused in one
        line, rebuilt unasked by the read), whether the doctor named it, the repair."""
        if not self.applies:
            return "n/a"
        read = "refused" if self.read.startswith("refused") else self.read
        if read == "right" and self.doctor == "ok":
            return "right, rebuilt when next needed" if self.repaired == "right" else \
                f"right; repair {self.repaired}"
        named = "named" if self.doctor == "named" else f"doctor {self.doctor}"
        repaired = ("repaired" if self.repaired == "right"
                    else "only a copy restores it" if IRREPLACEABLE.search(self.kind)
                    else f"repair {self.repaired}")
        return f"{read}, {named}, {repaired}"


def restore(built: Built) -> None:
    shutil.rmtree(built.repo / ".codeveil", ignore_errors=True)
    shutil.copytree(built.pristine, built.repo / ".codeveil", symlinks=True)
    cache = built.base / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    shutil.copytree(built.pristine_cache, cache, symlinks=True)
    shutil.rmtree(built.config, ignore_errors=True)
    shutil.copytree(built.pristine_config, built.config, symlinks=True)


def target(built: Built, rel: str) -> Path:
    if rel.startswith("config/"):
        return built.config / rel.removeprefix("config/")
    return built.base / rel if rel.startswith("cache/") else built.repo / rel


def _names(message: str, path: Path, built: Built) -> bool:
    """Whether an error names the damaged file (or the folder or store holding it) and a
    remedy, in one line."""
    places = {path.name, path.parent.name}
    remedy = ("doctor --repair", "codeveil index", "init --server", "key import")
    return "\n" not in message.strip() and any(p in message for p in places) \
        and any(r in message for r in remedy)


def _within(finding: str, path: Path) -> bool:
    found = Path(finding.split(" (")[0])
    return found == path or found in path.parents or path in found.parents


def run_case(built: Built, kind: str, rel: str, damage: str) -> Outcome:
    """Damage a fresh copy of the index's file `rel` (of `kind`) and record it all."""
    out = Outcome(kind, damage)
    restore(built)
    path = target(built, rel)
    with env(CODEVEIL_CACHE_DIR=str(built.base / "cache"),
             CODEVEIL_CONFIG_DIR=str(built.config)):
        if not DAMAGE[damage](path, built):
            out.applies = False
            return out
        try:
            found = doctor(built.repo, embedder=HashingEmbedder())
            named = [f for f in found.findings if f.problem and not f.advisory]
            out.doctor = "named" if any(_within(f.path, path) for f in named) else (
                f"named another ({named[0].path})" if named else "ok")
        except Exception as exc:
            out.doctor = f"unexpected {type(exc).__name__}: {exc}"
        try:
            out.read = "right" if answers(built.repo) == built.fresh else "WRONG"
        except CodeveilError as exc:
            out.read = f"refused: {exc}"
        except Exception as exc:
            out.read = f"unexpected {type(exc).__name__}: {exc}"
        try:
            fixed = doctor(built.repo, repair=True, embedder=HashingEmbedder())
            again = doctor(built.repo, embedder=HashingEmbedder())
            left = [f for f in again.findings if f.problem and not f.advisory]
            if not fixed.healthy or left:
                out.repaired = f"left {(fixed.remaining or left)[0].path}"
            else:
                out.repaired = "right" if answers(built.repo) == built.fresh else "WRONG"
        except Exception as exc:
            out.repaired = f"unexpected {type(exc).__name__}: {exc}"
    out.problem = _judge(out, path, built)
    return out


def _judge(out: Outcome, path: Path, built: Built) -> str:
    if out.read.startswith("refused: ") and not _names(out.read[9:], path, built):
        return f"the error does not name {path.name} and a remedy in one line: {out.read}"
    if out.read == "WRONG" or out.read.startswith("unexpected"):
        return f"read {out.read}"
    if out.doctor.startswith("unexpected") or out.doctor.startswith("named another"):
        return f"doctor {out.doctor}"
    if out.doctor == "ok" and not (out.damage == "delete"
                                   and ABSENT_IS_NORMAL.search(path.as_posix())):
        return "the doctor does not see it"
    if out.repaired != "right" and not (IRREPLACEABLE.search(out.kind)
                                        and out.read.startswith("refused")):
        return f"repair {out.repaired}"
    return ""


def cases(built: Built) -> list[tuple[str, str, str]]:
    return [(kind, rel, damage) for kind, rel in file_kinds(built).items()
            for damage in DAMAGES]


def table(outcomes: list[Outcome]) -> str:
    kinds = list(dict.fromkeys(o.kind for o in outcomes))
    cell = {(o.kind, o.damage): o for o in outcomes}
    lines = ["| file | " + " | ".join(DAMAGES) + " |", "|---" * (len(DAMAGES) + 1) + "|"]
    for kind in kinds:
        row = []
        for d in DAMAGES:
            o = cell.get((kind, d))
            row.append("" if o is None else o.cell + (" **FAILS**" if o.problem else ""))
        lines.append(f"| `{kind}` | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-json", action="store_true", help="do not write results")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="codeveil-corruption-"))
    try:
        with env(CODEVEIL_CONFIG_DIR=str(base / "config"),
                 CODEVEIL_CACHE_DIR=str(base / "cache")):
            built = build(base)
        outcomes = [run_case(built, kind, rel, damage) for kind, rel, damage in cases(built)]
        print(table(outcomes))
        failed = [o for o in outcomes if o.problem]
        applied = [o for o in outcomes if o.applies]
        print(f"\n{len(applied)} cases, {len(failed)} failing")
        for o in failed:
            print(f"  {o.kind} {o.damage}: {o.problem}")
        if not args.no_json:
            write_json("corruption", {
                "cases": len(applied), "failing": len(failed),
                "outcomes": [{"file": o.kind, "damage": o.damage, "applies": o.applies,
                              "doctor": o.doctor, "read": o.read, "repaired": o.repaired,
                              "problem": o.problem} for o in outcomes]})
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
