"""Workspace keys: derivation, the exported form, files on disk and CODEVEIL_KEY."""

from __future__ import annotations

import base64
import hmac
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from sync.crypto.keys import (
    ENV_KEY,
    EXPORT_PREFIX,
    WorkspaceKey,
    create_key,
    ensure_key_matches,
    export_key,
    import_key,
    key_path,
    load_key,
    parse_key,
    write_secret_file,
)
from sync.errors import (
    KeyChecksumError,
    KeyExistsError,
    KeyFormatError,
    KeyMismatchError,
    KeyMissingError,
    KeyPermissionError,
    WorkspaceKeyError,
)

WS = "0123456789abcdef0123456789abcdef"
SECRET = bytes(range(32))
LABELS = ("path", "tree", "chunk", "meta", "vector", "check")
posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")


@pytest.fixture(autouse=True)
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own config dir and no CODEVEIL_KEY: the real home is never touched."""
    folder = tmp_path / "config"
    monkeypatch.setenv("CODEVEIL_CONFIG_DIR", str(folder))
    monkeypatch.delenv(ENV_KEY, raising=False)
    return folder


def _subkeys(key: WorkspaceKey) -> dict[str, bytes]:
    return {label: getattr(key, f"{label}_key") for label in LABELS}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- derivation ------------------------------------------------------------------------


def test_subkeys_are_hkdf_with_distinct_labels() -> None:
    key = WorkspaceKey(SECRET)
    subkeys = _subkeys(key)
    assert len(set(subkeys.values())) == len(LABELS)
    for label, value in subkeys.items():
        expected = HKDF(
            algorithm=hashes.SHA256(),
            length=32,
            salt=b"codeveil/v1",
            info=f"codeveil/v1 {label}".encode(),
        ).derive(SECRET)
        assert value == expected, label


def test_subkeys_are_deterministic_and_differ_between_keys() -> None:
    assert _subkeys(WorkspaceKey(SECRET)) == _subkeys(WorkspaceKey(SECRET))
    other = _subkeys(WorkspaceKey(bytes(32)))
    for label, value in _subkeys(WorkspaceKey(SECRET)).items():
        assert other[label] != value


def test_derivation_is_pinned() -> None:
    """Changing the derivation would make every existing index unreadable."""
    key = WorkspaceKey(SECRET)
    assert key.path_key.hex() == "4cf107a7dba802304be436dbd4f57a73ae4ee2b17952cd82a08349111bbf2aa6"
    assert key.key_check.hex() == "5e29b32943adabc95f1bc92dc3b9db31"


def test_key_check_is_a_keyed_fingerprint() -> None:
    key = WorkspaceKey(SECRET)
    assert len(key.key_check) == 16
    assert key.key_check == WorkspaceKey(SECRET).key_check
    assert key.key_check != WorkspaceKey(bytes(32)).key_check
    assert key.key_check == hmac.digest(key.check_key, b"codeveil/v1 key check", "sha256")[:16]
    assert all(key.key_check not in sub for sub in (SECRET, *_subkeys(key).values()))


def test_key_equality_hash_and_repr_never_show_the_secret() -> None:
    a, b = WorkspaceKey(SECRET), WorkspaceKey(SECRET)
    assert a == b and hash(a) == hash(b)
    assert a != WorkspaceKey(bytes(32))
    assert SECRET.hex() not in repr(a) and a.key_check.hex() in repr(a)


def test_generated_keys_are_random() -> None:
    assert WorkspaceKey.generate() != WorkspaceKey.generate()


@pytest.mark.parametrize("bad", [b"", bytes(31), bytes(33)])
def test_key_must_be_32_bytes(bad: bytes) -> None:
    with pytest.raises(KeyFormatError):
        WorkspaceKey(bad)


# -- exported form ---------------------------------------------------------------------


def test_export_format() -> None:
    text = export_key(WorkspaceKey(SECRET))
    assert text.startswith(EXPORT_PREFIX)
    body = text[len(EXPORT_PREFIX) :]
    assert len(body) == 48 and set(body) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    )
    assert base64.urlsafe_b64decode(body)[:32] == SECRET


def test_export_parse_round_trip_tolerates_wrapping() -> None:
    key = WorkspaceKey.generate()
    text = export_key(key)
    assert parse_key(text) == key
    wrapped = f"  {text[:20]}\n  {text[20:40]}\r\n{text[40:]} \n"
    assert parse_key(wrapped) == key


def test_every_single_character_typo_is_caught() -> None:
    text = export_key(WorkspaceKey(SECRET))
    start = len(EXPORT_PREFIX)
    for i in range(start, len(text)):
        for replacement in ("A", "b", "7", "-"):
            if text[i] == replacement:
                continue
            typo = text[:i] + replacement + text[i + 1 :]
            with pytest.raises(KeyChecksumError):
                parse_key(typo)


def test_swapped_neighbours_are_caught() -> None:
    text = export_key(WorkspaceKey(SECRET))
    for i in range(len(EXPORT_PREFIX), len(text) - 1):
        if text[i] != text[i + 1]:
            swapped = text[:i] + text[i + 1] + text[i] + text[i + 2 :]
            with pytest.raises(KeyChecksumError):
                parse_key(swapped)


@pytest.mark.parametrize(
    ("mangle", "needle"),
    [
        (lambda t: t[:-1], "cut short"),
        (lambda t: t + "AAAA", "cut short or has extra"),
        (lambda t: t[:30] + "!" + t[31:], "not base64url"),
        (lambda t: t.replace("codeveil-key-v1:", ""), "starts with"),
        (lambda t: t.replace("-v1:", "-v2:"), "upgrade"),
    ],
)
def test_malformed_exports_say_what_is_wrong(mangle, needle: str) -> None:
    text = export_key(WorkspaceKey(SECRET))
    with pytest.raises(KeyFormatError, match=needle) as info:
        parse_key(mangle(text))
    assert text[len(EXPORT_PREFIX) :] not in str(info.value)  # a secret stays out of logs


# -- files -----------------------------------------------------------------------------


def test_key_path_is_under_the_config_dir(config_dir: Path) -> None:
    assert key_path(WS) == config_dir / "keys" / f"{WS}.key"


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "a\\b", "x" * 129, "a\0b"])
def test_workspace_ids_that_are_not_file_names_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="workspace id"):
        key_path(bad)


@posix_only
def test_create_writes_0600_in_a_0700_folder(config_dir: Path) -> None:
    old_umask = os.umask(0)  # the modes must not depend on the caller's umask
    try:
        key = create_key(WS)
    finally:
        os.umask(old_umask)
    path = key_path(WS)
    assert _mode(path) == 0o600
    assert _mode(path.parent) == 0o700
    assert path.read_text() == export_key(key) + "\n"
    assert load_key(WS) == key


def test_create_leaves_no_temp_files() -> None:
    create_key(WS)
    create_key("another-workspace")
    assert {p.name for p in key_path(WS).parent.iterdir()} == {
        "another-workspace.key",
        f"{WS}.key",
    }


def test_create_refuses_to_replace_a_key() -> None:
    first = create_key(WS)
    with pytest.raises(KeyExistsError, match=str(key_path(WS))):
        create_key(WS)
    assert load_key(WS) == first
    assert [p.name for p in key_path(WS).parent.iterdir()] == [f"{WS}.key"]


@posix_only
def test_an_open_keys_folder_is_tightened(config_dir: Path) -> None:
    folder = config_dir / "keys"
    folder.mkdir(parents=True)
    folder.chmod(0o755)
    create_key(WS)
    assert _mode(folder) == 0o700


def test_missing_key_names_the_path_and_what_to_do() -> None:
    with pytest.raises(KeyMissingError) as info:
        load_key(WS)
    message = str(info.value)
    assert str(key_path(WS)) in message
    assert ENV_KEY in message and "codeveil key import" in message


@posix_only
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o602])
def test_key_file_open_to_others_is_refused(mode: int) -> None:
    create_key(WS)
    path = key_path(WS)
    path.chmod(mode)
    with pytest.raises(KeyPermissionError, match=f"chmod 600 {path}"):
        load_key(WS)
    path.chmod(0o600)
    load_key(WS)


@pytest.mark.parametrize(
    "content", [b"", b"hello\n", b"\xff\xfe", b"codeveil-key-v1:" + b"A" * 48 + b"\n", b"x" * 5000]
)
def test_malformed_key_file_names_the_path(content: bytes) -> None:
    write_secret_file(key_path(WS), content)
    with pytest.raises(KeyFormatError, match=str(key_path(WS))):
        load_key(WS)


def test_key_file_that_is_a_folder_is_refused() -> None:
    key_path(WS).mkdir(parents=True)
    with pytest.raises(KeyFormatError, match="not a regular file"):
        load_key(WS)


# -- CODEVEIL_KEY ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "encode",
    [
        lambda s: s.hex(),
        lambda s: s.hex().upper(),
        lambda s: base64.urlsafe_b64encode(s).decode().rstrip("="),
        lambda s: base64.urlsafe_b64encode(s).decode(),
        lambda s: base64.b64encode(s).decode(),
        lambda s: export_key(WorkspaceKey(s)),
        lambda s: f"  {s.hex()}\n",
    ],
    ids=["hex", "HEX", "base64url", "base64url-padded", "base64", "exported", "spaces"],
)
def test_env_key_overrides_the_file(monkeypatch: pytest.MonkeyPatch, encode) -> None:
    stored = create_key(WS)
    monkeypatch.setenv(ENV_KEY, encode(SECRET))
    key = load_key(WS)
    assert key == WorkspaceKey(SECRET) and key != stored
    assert load_key("a-workspace-without-a-file") == key


def test_empty_env_key_falls_back_to_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    stored = create_key(WS)
    monkeypatch.setenv(ENV_KEY, "  ")
    assert load_key(WS) == stored


@pytest.mark.parametrize(
    "value",
    [
        "not a key",
        SECRET.hex()[:-2],
        SECRET.hex() + "00",
        "g" * 64,
        base64.urlsafe_b64encode(bytes(31)).decode(),
        base64.urlsafe_b64encode(bytes(33)).decode(),
    ],
)
def test_malformed_env_key_is_an_error_that_hides_the_value(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    create_key(WS)  # a valid file must not mask a broken override
    monkeypatch.setenv(ENV_KEY, value)
    with pytest.raises(KeyFormatError, match=ENV_KEY) as info:
        load_key(WS)
    assert value not in str(info.value)


def test_env_key_with_a_typo_in_the_exported_form(monkeypatch: pytest.MonkeyPatch) -> None:
    text = export_key(WorkspaceKey(SECRET))
    last = "A" if text[-1] != "A" else "B"
    monkeypatch.setenv(ENV_KEY, text[:-1] + last)
    with pytest.raises(KeyChecksumError):
        load_key(WS)


# -- import ----------------------------------------------------------------------------


@posix_only
def test_import_round_trip() -> None:
    key = WorkspaceKey.generate()
    assert import_key(WS, export_key(key) + "\n") == key
    assert load_key(WS) == key
    assert _mode(key_path(WS)) == 0o600


def test_import_validates_before_writing() -> None:
    text = export_key(WorkspaceKey(SECRET))
    with pytest.raises(KeyChecksumError):
        import_key(WS, text[:-1] + ("A" if text[-1] != "A" else "B"))
    assert not key_path(WS).exists()


def test_import_of_the_same_key_is_a_no_op() -> None:
    key = create_key(WS)
    assert import_key(WS, export_key(key)) == key
    assert load_key(WS) == key


def test_import_refuses_to_replace_a_different_key_unless_asked() -> None:
    old = create_key(WS)
    new = WorkspaceKey.generate()
    with pytest.raises(KeyExistsError, match="different key"):
        import_key(WS, export_key(new))
    assert load_key(WS) == old
    assert import_key(WS, export_key(new), replace=True) == new
    assert load_key(WS) == new
    assert [p.name for p in key_path(WS).parent.iterdir()] == [f"{WS}.key"]


def test_import_over_a_broken_key_file_needs_replace() -> None:
    write_secret_file(key_path(WS), b"garbage\n")
    key = WorkspaceKey.generate()
    with pytest.raises(KeyExistsError, match="cannot be used"):
        import_key(WS, export_key(key))
    assert import_key(WS, export_key(key), replace=True) == key


# -- write_secret_file, key check ------------------------------------------------------


@posix_only
def test_write_secret_file_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "token"
    write_secret_file(path, b"one")
    write_secret_file(path, b"two")
    assert path.read_bytes() == b"two"
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    with pytest.raises(FileExistsError):
        write_secret_file(path, b"three", replace=False)
    assert path.read_bytes() == b"two"
    assert [p.name for p in path.parent.iterdir()] == ["token"]


def test_write_secret_file_cleans_up_when_the_rename_fails(tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "token"
    path.mkdir(parents=True)  # os.replace cannot put a file over a folder
    with pytest.raises(OSError):
        write_secret_file(path, b"data")
    assert [p.name for p in path.parent.iterdir()] == ["token"]


def test_ensure_key_matches() -> None:
    key = WorkspaceKey(SECRET)
    ensure_key_matches(key, WS, key.key_check)
    with pytest.raises(KeyMismatchError, match=WS) as info:
        ensure_key_matches(WorkspaceKey(bytes(32)), WS, key.key_check)
    assert isinstance(info.value, WorkspaceKeyError)
