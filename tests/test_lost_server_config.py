"""A checkout of a workspace on a server survives a lost `.codeveil/config.json`: this
machine records which server and workspace the checkout belongs to (sync.checkout.checkouts),
doctor names the missing or damaged file, `--repair` rebuilds it for the same server and
workspace, and no command starts a new, detached workspace over it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from retrieval import Index
from sync.checkout.checkouts import load_checkout, record_path
from tests.cli_in_process import run_in_process
from tests.conftest import write_repo


def _indexed(tmp_path: Path, url: str) -> tuple[Path, dict]:
    repo = write_repo(tmp_path / "repo", {"a.py": "def alpha():\n    return 1\n"})
    with Index(repo, embedder=HashingEmbedder()) as idx:
        idx.init(server=url)
        idx.index(wait=True)
    return repo, json.loads((repo / ".codeveil" / "config.json").read_text())


@pytest.mark.parametrize("damage", ["deleted", "garbled"])
def test_doctor_names_a_lost_server_config_and_repair_restores_it(
        tmp_path: Path, server_url: str, damage: str) -> None:
    repo, config = _indexed(tmp_path, server_url)
    config_file = repo / ".codeveil" / "config.json"
    assert load_checkout(repo) is not None
    if damage == "deleted":
        config_file.unlink()
    else:
        config_file.write_text("{not json")

    found = run_in_process(["doctor"], repo)
    assert found.returncode == 1
    line = next(ln for ln in found.stdout.splitlines() if "config.json" in ln)
    assert line.startswith("PROBLEM") and "doctor --repair" in line, found.stdout
    if damage == "deleted":
        assert config["workspace_id"] in line and server_url in line

    repaired = run_in_process(["doctor", "--repair"], repo)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert f"on {server_url} from this machine's record" in repaired.stdout
    assert json.loads(config_file.read_text()) == config
    assert run_in_process(["search", "alpha"], repo).returncode == 0


def test_no_command_starts_a_detached_workspace_over_a_lost_server_config(
        tmp_path: Path, server_url: str) -> None:
    repo, config = _indexed(tmp_path, server_url)
    (repo / ".codeveil" / "config.json").unlink()
    for args in (["search", "alpha"], ["index"], ["def", "alpha"], ["status"]):
        result = run_in_process(args, repo)
        assert result.returncode == 1, (args, result.stdout)
        line = result.stderr.strip()
        assert "config.json is missing" in line and config["workspace_id"] in line, line
        assert "codeveil doctor --repair" in line and "\n" not in line
    assert not (repo / ".codeveil" / "config.json").exists()
    assert not (repo / ".codeveil" / "store").exists()  # no embedded workspace made


def test_a_checkout_pointed_at_an_embedded_store_is_forgotten(
        tmp_path: Path, server_url: str) -> None:
    repo, _config = _indexed(tmp_path, server_url)
    assert record_path(repo).is_file()
    shutil.rmtree(repo / ".codeveil")
    result = run_in_process(["init"], repo)  # explicitly a new workspace: allowed
    assert result.returncode == 0, result.stderr
    assert load_checkout(repo) is None and not record_path(repo).exists()
    assert run_in_process(["index"], repo).returncode == 0


def test_the_advice_for_a_lost_key_leads_out(tmp_path: Path, server_url: str) -> None:
    # It went in a circle: "delete .codeveil/ and index again" -> index refused and said
    # `doctor --repair` -> the repair said "delete .codeveil/" again.
    import os

    repo, config = _indexed(tmp_path, server_url)
    key = Path(os.environ["CODEVEIL_CONFIG_DIR"]) / "keys" / f"{config['workspace_id']}.key"
    key.unlink()
    lost = run_in_process(["search", "alpha"], repo)
    assert lost.returncode == 1
    assert "delete .codeveil/, then `codeveil init --server URL`" in lost.stderr, lost.stderr

    shutil.rmtree(repo / ".codeveil")  # as it says
    way_out = f"`codeveil init {repo} --server {server_url}`"
    refused = run_in_process(["index"], repo)
    assert refused.returncode == 1 and way_out in refused.stderr, refused.stderr
    doctor = run_in_process(["doctor", "--repair"], repo)
    assert doctor.returncode == 1 and way_out in doctor.stdout, doctor.stdout

    assert run_in_process(["init", str(repo), "--server", server_url], repo).returncode == 0
    assert run_in_process(["index"], repo).returncode == 0
    found = run_in_process(["search", "alpha"], repo)
    assert found.returncode == 0 and "a.py" in found.stdout
