"""`codeveil invite` and `codeveil join` end to end, on a real server on loopback: one
teammate indexes and invites, another joins a copy of the repo with the string and pulls
every vector instead of embedding. A cut, altered, expired or refused string leaves no
trace: no `.codeveil/`, no key, no token."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from sync.crypto.keys import WorkspaceKey
from sync.workspace.invite import Invite, InviteError, decode_invite, parse_duration
from tests.cli_in_process import run_in_process
from tests.conftest import write_repo


def _config(tmp: Path, who: str) -> dict[str, str]:
    # A cache of one's own too: a shared one would answer Bob's chunks from Alice's run.
    return {"CODEVEIL_CONFIG_DIR": str(tmp / f"{who}-config"),
            "CODEVEIL_CACHE_DIR": str(tmp / f"{who}-cache")}


def _nothing_written(clone: Path, config_dir: Path) -> None:
    assert not (clone / ".codeveil").exists()
    assert not list(config_dir.rglob("*.key")) and not list(config_dir.rglob("*.token"))


@pytest.fixture
def invited(server_url: str, tmp_path: Path) -> tuple[str, Path]:
    """Alice's indexed repo on the server, and the invite she printed."""
    alice = write_repo(tmp_path / "alice")
    env = _config(tmp_path, "alice")
    made = run_in_process(["init", "--server", server_url], alice, **env)
    assert made.returncode == 0, made.stderr
    indexed = run_in_process(["index", "--wait", "-q"], alice, **env)
    assert indexed.returncode == 0, indexed.stderr
    printed = run_in_process(["invite"], alice, **env)
    assert printed.returncode == 0, printed.stderr
    assert "secret" in printed.stderr and "password" in printed.stderr
    return printed.stdout.strip(), alice


def _clone(alice: Path, tmp: Path) -> Path:
    bob = tmp / "bob"
    shutil.copytree(alice, bob, ignore=shutil.ignore_patterns(".codeveil"))
    return bob


def test_a_teammate_joins_with_the_string_and_pulls_every_vector(
        invited: tuple[str, Path], tmp_path: Path) -> None:
    string, alice = invited
    assert string.startswith("cvinv1_") and "\n" not in string
    # The string carries a token made for it, not the workspace's own.
    workspace_id = decode_invite(string).workspace_id
    own = (tmp_path / "alice-config" / "tokens" / f"{workspace_id}.token").read_text()
    assert decode_invite(string).token != own.strip()
    bob, env = _clone(alice, tmp_path), _config(tmp_path, "bob")
    joined = run_in_process(["join", string, str(bob), "--json"], tmp_path, **env)
    assert joined.returncode == 0, joined.stderr
    report = json.loads(joined.stdout)
    assert report["chunks_embedded"] == 0
    assert report["chunks_pulled"] > 0
    assert report["chunks_pulled"] == report["chunks_total"]
    found = run_in_process(["search", "hash a password", "--json"], bob, **env)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["hits"]
    alice_ws = json.loads(run_in_process(["status", "--json"], alice,
                                         **_config(tmp_path, "alice")).stdout)
    bob_ws = json.loads(run_in_process(["status", "--json"], bob, **env).stdout)
    assert bob_ws["workspace_id"] == alice_ws["workspace_id"]


def _tamper(string: str) -> str:
    middle = len(string) // 2
    return string[:middle] + ("A" if string[middle] != "A" else "B") + string[middle + 1:]


@pytest.mark.parametrize("spoil", [_tamper, lambda s: s[:-5], lambda s: s[:len(s) // 2]],
                         ids=["one-char-changed", "end-cut", "half"])
def test_a_spoiled_string_is_refused_in_one_line_before_anything_is_written(
        invited: tuple[str, Path], tmp_path: Path, spoil) -> None:
    string, alice = invited
    bob, env = _clone(alice, tmp_path), _config(tmp_path, "bob")
    bad = spoil(string)
    assert bad != string
    refused = run_in_process(["join", bad, str(bob)], tmp_path, **env)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and "invite" in refused.stderr
    assert bad[8:40] not in refused.stderr  # the secret is never echoed
    _nothing_written(bob, tmp_path / "bob-config")


def test_an_expired_string_is_refused_before_anything_is_written(
        invited: tuple[str, Path], tmp_path: Path) -> None:
    string, alice = invited
    good = decode_invite(string)
    expired = Invite(good.server, good.workspace_id, good.token, good.key,
                     expires_at=time.time() - 1).encode()
    bob, env = _clone(alice, tmp_path), _config(tmp_path, "bob")
    refused = run_in_process(["join", expired, str(bob)], tmp_path, **env)
    assert refused.returncode == 1 and "expired" in refused.stderr
    _nothing_written(bob, tmp_path / "bob-config")


def _token_id(stderr: str) -> str:
    match = re.search(r"--revoke ([0-9a-f]{16})", stderr)
    assert match, stderr
    return match.group(1)


def test_a_revoked_invite_is_refused_alone_and_writes_nothing(
        server_url: str, tmp_path: Path) -> None:
    alice = write_repo(tmp_path / "alice")
    env = _config(tmp_path, "alice")
    assert run_in_process(["init", "--server", server_url], alice, **env).returncode == 0
    assert run_in_process(["index", "--wait", "-q"], alice, **env).returncode == 0
    first = run_in_process(["invite"], alice, **env)
    second = run_in_process(["invite", "--expires", "7d"], alice, **env)
    assert first.stdout != second.stdout
    first_id, second_id = _token_id(first.stderr), _token_id(second.stderr)
    listed = run_in_process(["invite", "--list"], alice, **env).stdout
    assert first_id in listed and second_id in listed and "until revoked" in listed

    bob, bob_env = _clone(alice, tmp_path), _config(tmp_path, "bob")
    assert run_in_process(["join", first.stdout.strip(), str(bob), "--no-index"],
                          tmp_path, **bob_env).returncode == 0
    # A teammate who joined cannot hand out invites of their own.
    refused = run_in_process(["invite"], bob, **bob_env)
    assert refused.returncode == 1 and "only the token" in refused.stderr

    revoked = run_in_process(["invite", "--revoke", first_id], alice, **env)
    assert revoked.returncode == 0, revoked.stderr
    assert first_id not in run_in_process(["invite", "--list"], alice, **env).stdout
    carol = tmp_path / "carol"
    shutil.copytree(bob, carol, ignore=shutil.ignore_patterns(".codeveil"))
    again = run_in_process(["join", first.stdout.strip(), str(carol)], tmp_path,
                           **_config(tmp_path, "carol"))
    assert again.returncode == 1 and "refuses the invite's token" in again.stderr
    assert again.stderr.count("\n") == 1
    _nothing_written(carol, tmp_path / "carol-config")
    # Bob's access went with his token; Alice's and the other invite's stay.
    assert run_in_process(["index", "--wait", "-q"], bob, **bob_env).returncode == 1
    assert run_in_process(["index", "--wait", "-q"], alice, **env).returncode == 0
    # A new invite lets Bob back into the same checkout: only his token changes.
    third = run_in_process(["invite"], alice, **env)
    rejoined = run_in_process(["join", third.stdout.strip(), str(bob)], tmp_path, **bob_env)
    assert rejoined.returncode == 0, rejoined.stderr
    assert run_in_process(["index", "--wait", "-q"], bob, **bob_env).returncode == 0
    dave = tmp_path / "dave"
    shutil.copytree(bob, dave, ignore=shutil.ignore_patterns(".codeveil"))
    joined = run_in_process(["join", second.stdout.strip(), str(dave), "--no-index"],
                            tmp_path, **_config(tmp_path, "dave"))
    assert joined.returncode == 0, joined.stderr


def test_a_string_whose_token_the_server_never_made_writes_nothing(
        invited: tuple[str, Path], tmp_path: Path) -> None:
    string, alice = invited
    good = decode_invite(string)
    unknown = Invite(good.server, good.workspace_id, "no-such-token", good.key).encode()
    bob, env = _clone(alice, tmp_path), _config(tmp_path, "bob")
    refused = run_in_process(["join", unknown, str(bob)], tmp_path, **env)
    assert refused.returncode == 1 and "refuses the invite's token" in refused.stderr
    _nothing_written(bob, tmp_path / "bob-config")


def test_a_string_with_another_key_writes_nothing(invited: tuple[str, Path],
                                                  tmp_path: Path) -> None:
    string, alice = invited
    good = decode_invite(string)
    wrong = Invite(good.server, good.workspace_id, good.token, WorkspaceKey.generate()).encode()
    bob, env = _clone(alice, tmp_path), _config(tmp_path, "bob")
    refused = run_in_process(["join", wrong, str(bob)], tmp_path, **env)
    assert refused.returncode == 1 and "not the key" in refused.stderr
    _nothing_written(bob, tmp_path / "bob-config")


def test_an_embedded_workspace_cannot_be_invited_to(sample_repo: Path) -> None:
    assert run_in_process(["index", "--wait", "-q"], sample_repo).returncode == 0
    refused = run_in_process(["invite"], sample_repo)
    assert refused.returncode == 1
    assert "embedded" in refused.stderr and refused.stderr.count("\n") == 1
    assert not refused.stdout


def test_the_string_round_trips_and_checks_each_field() -> None:
    key = WorkspaceKey.generate()
    made = Invite("https://cv.example:7400", "ws-1", "tok_en", key, expires_at=None)
    back = decode_invite(made.encode())
    assert (back.server, back.workspace_id, back.token, back.key) == (
        made.server, made.workspace_id, made.token, key)
    assert "tok_en" not in repr(back)
    wrapped = made.encode()
    assert decode_invite(wrapped[:30] + "\n  " + wrapped[30:]).key == key
    for bad_server in ("ftp://x", ""):
        with pytest.raises(InviteError, match="server"):
            decode_invite(Invite(bad_server, "ws-1", "t", key).encode())
    with pytest.raises(InviteError, match="workspace id"):
        decode_invite(Invite("http://x", "../etc", "t", key).encode())
    with pytest.raises(InviteError, match="v2"):
        decode_invite("cvinv2_" + made.encode()[7:])
    with pytest.raises(InviteError, match="not a codeveil invite"):
        decode_invite("codeveil-key-v1:abc")


def test_durations() -> None:
    assert parse_duration("12h") == 12 * 3600
    assert parse_duration("7d") == 7 * 86_400
    for bad in ("0d", "soon", "5y", "-1h"):
        with pytest.raises(InviteError):
            parse_duration(bad)
    # "0s" was "not a duration", and a huge one got the server's raw validation text.
    with pytest.raises(InviteError, match=r"would be expired when made.*leave --expires out"):
        parse_duration("0s")
    with pytest.raises(InviteError, match="longer than an invite may last, 366 days"):
        parse_duration("99999999999d")
    assert parse_duration("366d") == 366 * 86_400


def test_the_owner_joining_a_second_clone_keeps_the_right_to_invite(
        invited: tuple[str, Path], tmp_path: Path) -> None:
    string, alice = invited
    env = _config(tmp_path, "alice")
    workspace_id = decode_invite(string).workspace_id
    token_file = tmp_path / "alice-config" / "tokens" / f"{workspace_id}.token"
    own = token_file.read_text()
    second = tmp_path / "alice-second"
    shutil.copytree(alice, second, ignore=shutil.ignore_patterns(".codeveil"))
    joined = run_in_process(["join", string, str(second), "--no-index"], tmp_path, **env)
    assert joined.returncode == 0, joined.stderr
    assert token_file.read_text() == own
    assert run_in_process(["invite"], second, **env).returncode == 0


def test_a_checkout_of_another_workspace_is_not_re_pointed(
        invited: tuple[str, Path], sample_repo: Path, tmp_path: Path) -> None:
    string, _alice = invited
    assert run_in_process(["index", "--wait", "-q"], sample_repo).returncode == 0
    config = (sample_repo / ".codeveil" / "config.json").read_text()
    refused = run_in_process(["join", string, str(sample_repo)], tmp_path,
                             **_config(tmp_path, "bob"))
    assert refused.returncode == 1 and "another workspace" in refused.stderr
    assert (sample_repo / ".codeveil" / "config.json").read_text() == config
    assert not list((tmp_path / "bob-config").rglob("*.key"))
