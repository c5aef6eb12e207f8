"""Every file the index keeps, damaged in every way bench/corruption.py knows (bytes
flipped, truncated, valid ids swapped, deleted, another checkout's copy): grep and search
answer as before or fail in one line naming the file and the remedy, the doctor names
the damage, and `doctor --repair` (or the next read) restores the answers (the key: only
a copy of it can). And every file under `.codeveil/`, the cache and the config dir
belongs to a part of the index that the doctor checks."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

from bench import corruption
from retrieval.faces.doctor import PARTS
from retrieval.indexes.derived.store import DerivedStore


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> corruption.Built:
    base = tmp_path_factory.mktemp("corruption")
    with corruption.env(CODEVEIL_CONFIG_DIR=str(base / "config"),
                        CODEVEIL_CACHE_DIR=str(base / "cache")):
        return corruption.build(base)


@pytest.mark.parametrize("damage", corruption.DAMAGES)
def test_no_damage_gives_a_wrong_answer_or_an_unexpected_error(
        built: corruption.Built, damage: str) -> None:
    outcomes = [corruption.run_case(built, kind, rel, damage)
                for kind, rel in corruption.file_kinds(built).items()]
    # Swapping ids needs an id array (.npy, .npz); the rest takes any file.
    assert sum(o.applies for o in outcomes) >= (6 if damage == "swap" else 10)
    failing = [f"{o.kind}: {o.problem}" for o in outcomes if o.problem]
    assert not failing, "\n".join(failing)


def _part_of(rel: str) -> list[str]:
    return [part.name for part in PARTS
            if any(fnmatch.fnmatch(rel, glob) for glob in part.owns)]


def test_every_file_of_the_index_belongs_to_one_part(built: corruption.Built) -> None:
    corruption.restore(built)
    files = [p for p in (built.repo / ".codeveil").rglob("*") if p.is_file()]
    assert len(files) > 10
    for path in files:
        rel = path.relative_to(built.repo / ".codeveil").as_posix()
        assert len(_part_of(rel)) == 1, f"{rel} belongs to {_part_of(rel) or 'no part'}"
    for prefix, folder in (("cache", built.base / "cache"), ("config", built.config)):
        for path in folder.rglob("*"):
            if path.is_file():
                rel = f"{prefix}:{path.relative_to(folder).as_posix()}"
                assert len(_part_of(rel)) == 1, f"{rel} belongs to {_part_of(rel) or 'no part'}"


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_subclasses(sub)}
    return out


def test_every_derived_index_is_a_part_the_doctor_checks() -> None:
    import retrieval.indexes.lexical
    import retrieval.indexes.local_vectors
    import retrieval.indexes.trigram_index  # noqa: F401 (their stores, subclassed)

    checked = {part.store for part in PARTS if part.check is not None}
    stores = _subclasses(DerivedStore)
    assert len(stores) >= 3
    assert stores <= checked, f"no doctor check for {stores - checked}"


def test_a_damaged_part_is_named_in_one_doctor_line(built: corruption.Built,
                                                     tmp_path: Path) -> None:
    corruption.restore(built)
    files = next((built.repo / ".codeveil" / "trigrams").glob("base-*.files.npy"))
    assert corruption.swap(files, built)
    with corruption.env(CODEVEIL_CACHE_DIR=str(built.base / "cache"),
                        CODEVEIL_CONFIG_DIR=str(built.config)):
        from indexer.embedder import HashingEmbedder
        from retrieval.faces.doctor import doctor

        report = doctor(built.repo, embedder=HashingEmbedder())
    [line] = [line for line in report.lines() if line.startswith("PROBLEM")]
    assert "trigrams" in line and files.name in line and "fails its checksum" in line
