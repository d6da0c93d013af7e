import os
import pathlib
import stat
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.identity import (
    IdentityError,
    InvalidSignature,
    KeyFileError,
    NodeKey,
    peer_id_from_public_key,
    verify,
)
from llmfabric.identity.certs import cert_identity, make_self_signed_cert
from llmfabric.identity.peer_id import b58decode, b58encode, check_peer_id, matches


def test_key_is_created_once_with_0600_and_reloaded(tmp_path):
    home = tmp_path / "home"
    key, created = NodeKey.load_or_create(home)
    assert created
    path = home / "node.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    again, created_again = NodeKey.load_or_create(home)
    assert not created_again
    assert again.peer_id == key.peer_id


def test_home_defaults_to_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMFABRIC_HOME", str(tmp_path / "env-home"))
    key, created = NodeKey.load_or_create()
    assert created
    assert (tmp_path / "env-home" / "node.key").exists()
    assert NodeKey.load(tmp_path / "env-home" / "node.key").peer_id == key.peer_id


def test_world_readable_key_is_refused(tmp_path):
    NodeKey.load_or_create(tmp_path)
    os.chmod(tmp_path / "node.key", 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        NodeKey.load(tmp_path / "node.key")


def test_save_never_overwrites(tmp_path):
    NodeKey.generate().save(tmp_path / "k")
    with pytest.raises(KeyFileError):
        NodeKey.generate().save(tmp_path / "k")


def test_peer_id_is_stable_and_well_formed():
    raw = bytes(range(32))
    pid = peer_id_from_public_key(raw)
    # Known answer: pins the derivation (multibase z + base58btc(0x1220 || sha256(raw))).
    assert pid == peer_id_from_public_key(bytes(range(32)))
    assert pid.startswith("zQm") and len(pid) == 47
    check_peer_id(pid)
    assert matches(pid, raw)
    assert not matches(pid, bytes(32))


def test_peer_id_known_vector():
    expected = "zQmVEQhMp7w4BEzXfCnTWGfritiWAgfWamMxmLQ2n3SdACt"
    assert peer_id_from_public_key(b"\x00" * 32) == expected


@given(st.binary(max_size=64))
def test_base58_roundtrip(data):
    assert b58decode(b58encode(data)) == data


def test_sign_verify_and_tampering():
    key = NodeKey.generate()
    sig = key.sign(b"message")
    verify(key.public_bytes, b"message", sig)
    with pytest.raises(InvalidSignature):
        verify(key.public_bytes, b"messagE", sig)
    bad = bytes([sig[0] ^ 1]) + sig[1:]
    with pytest.raises(InvalidSignature):
        verify(key.public_bytes, b"message", bad)
    with pytest.raises(InvalidSignature):
        verify(NodeKey.generate().public_bytes, b"message", sig)


def test_self_signed_cert_yields_the_peer_id():
    key = NodeKey.generate()
    der = make_self_signed_cert(key)
    pid, raw = cert_identity(der)
    assert pid == key.peer_id
    assert raw == key.public_bytes


def test_tampered_cert_is_rejected():
    der = bytearray(make_self_signed_cert(NodeKey.generate()))
    der[-5] ^= 0xFF  # inside the signature
    with pytest.raises(IdentityError):
        cert_identity(bytes(der))


@pytest.mark.hostile
def test_a_key_swapped_after_its_permission_check_is_not_loaded(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a directory another user can write, they swap node.key between the permission
    check and the read for a readable file holding a key they know: the node ran with it."""
    mine, theirs = NodeKey.generate(), NodeKey.generate()
    path = tmp_path / "node.key"
    mine.save(path)
    planted = tmp_path / "planted"
    planted.write_bytes(theirs.private_pem())
    os.chmod(planted, 0o644)
    real_stat = pathlib.Path.stat

    def stat_then_swap(self: pathlib.Path, **kw: Any) -> os.stat_result:
        result = real_stat(self, **kw)
        if self == path:
            os.replace(planted, path)
        return result

    monkeypatch.setattr(pathlib.Path, "stat", stat_then_swap)
    try:
        loaded = NodeKey.load(path)
    except KeyFileError:
        return  # refused: fine
    assert loaded.peer_id == mine.peer_id


@pytest.mark.hostile
def test_a_key_planted_in_a_directory_everyone_may_write_is_refused(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    """A state directory everyone may write (a Kubernetes emptyDir is 0777) is used, with a
    warning: a key another user planted there is refused (it belongs to them), our own is
    loaded."""
    home = tmp_path / "shared"
    home.mkdir()
    os.chmod(home, 0o777)
    key, created = NodeKey.load_or_create(home)
    assert created and "writable by everyone" in caplog.text
    assert NodeKey.load_or_create(home)[0].peer_id == key.peer_id
    if os.geteuid() != 0:
        return  # (planting a file of another user's needs root: CI runs as root)
    planted = tmp_path / "planted"
    planted.mkdir()
    os.chmod(planted, 0o777)
    NodeKey.generate().save(planted / "node.key")
    os.chown(planted / "node.key", 65534, 65534)  # (nobody's)
    with pytest.raises(KeyFileError, match="belongs to another user"):
        NodeKey.load_or_create(planted)


@pytest.mark.hostile
def test_a_fifo_planted_as_the_key_does_not_hang_the_load(tmp_path: pathlib.Path) -> None:
    os.mkfifo(tmp_path / "node.key", 0o600)
    with pytest.raises(KeyFileError, match="regular file"):
        NodeKey.load(tmp_path / "node.key")
