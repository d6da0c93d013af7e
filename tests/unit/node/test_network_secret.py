"""The network secret from a file or the environment, and its rotation (two secrets
accepted): nodes that moved to the new secret and nodes that have not yet still admit each
other; nodes with disjoint secrets never do."""

import os
import pathlib

import pytest

from llmfabric.identity import PskAdmission
from llmfabric.identity.admission import AdmissionContext
from llmfabric.identity.errors import AdmissionError
from llmfabric.node.admission import admission_from_config, read_secret_file
from llmfabric.node.config import ConfigError, NodeConfig

pytestmark = pytest.mark.unit

OLD, NEW, OTHER = b"o" * 32, b"n" * 32, b"x" * 32


def _ctx(role: str) -> AdmissionContext:
    return AdmissionContext("net", "prover", "verifier", role, b"c" * 32, b"s" * 32, 0.0)


def _admits(prover: PskAdmission, verifier: PskAdmission) -> bool:
    try:
        verifier.check(prover.prove(_ctx("client")), _ctx("client"))
    except AdmissionError:
        return False
    return True


def test_rotation_keeps_every_pair_admitted_that_shares_a_secret() -> None:
    old_only, both, new_only = (PskAdmission("net", OLD), PskAdmission("net", NEW, OLD),
                                PskAdmission("net", NEW))
    for a, b in ((old_only, both), (both, old_only), (new_only, both), (both, new_only),
                 (both, both), (old_only, old_only)):
        assert _admits(a, b)
    assert not _admits(old_only, new_only) and not _admits(new_only, old_only)
    assert not _admits(PskAdmission("net", OTHER, OLD + b"!"), old_only)


def test_a_garbled_or_oversized_proof_is_refused() -> None:
    both = PskAdmission("net", NEW, OLD)
    for proof in (b"", b"x" * 31, b"x" * 96, both.prove(_ctx("client")) + b"x"):
        with pytest.raises(AdmissionError):
            both.check(proof, _ctx("client"))


def test_set_secrets_takes_effect_for_the_next_handshake() -> None:
    node = PskAdmission("net", OLD)
    peer = PskAdmission("net", NEW)
    assert not _admits(peer, node)
    node.set_secrets(NEW, OLD)
    assert _admits(peer, node)


def test_secret_file_two_lines_mode_0600(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "secret"
    f.write_text(NEW.decode() + "\n" + OLD.decode() + "\n")
    os.chmod(f, 0o600)
    assert read_secret_file(f) == (NEW, OLD)
    cfg = NodeConfig(network_secret_file=f, home=tmp_path)
    assert cfg.has_credential()
    adm = admission_from_config(cfg)
    assert _admits(PskAdmission("default", OLD), adm)  # type: ignore[arg-type]
    os.chmod(f, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        read_secret_file(f)
    os.chmod(f, 0o600)
    f.write_text("")
    with pytest.raises(ConfigError, match="line 1"):
        read_secret_file(f)


def test_previous_secret_from_config_is_accepted(tmp_path: pathlib.Path) -> None:
    cfg = NodeConfig(network_secret=NEW.decode(), network_secret_previous=OLD.decode(),
                     home=tmp_path)
    adm = admission_from_config(cfg)
    assert _admits(PskAdmission("default", OLD), adm)  # type: ignore[arg-type]
    assert _admits(adm, PskAdmission("default", OLD))  # type: ignore[arg-type]


@pytest.mark.hostile
def test_a_secret_file_swapped_after_its_check_is_not_read(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mode was checked on the path (stat), then the path was read: a world-readable
    file with a secret another user chose, swapped in between, was used."""
    f, evil = tmp_path / "secret", tmp_path / "evil"
    f.write_text(NEW.decode() + "\n")
    os.chmod(f, 0o600)
    evil.write_text(OTHER.decode() + "\n")
    os.chmod(evil, 0o644)
    real_stat, real_fstat = os.stat, os.fstat
    swapped: list[bool] = []

    def swap_once() -> None:
        if not swapped:
            swapped.append(True)
            os.replace(evil, f)

    def stat_then_swap(p: object, *a: object, **k: object) -> os.stat_result:
        st = real_stat(p, *a, **k)  # type: ignore[arg-type]
        if str(p) == str(f):
            swap_once()
        return st

    def fstat_then_swap(fd: int) -> os.stat_result:
        st = real_fstat(fd)
        swap_once()
        return st

    monkeypatch.setattr(os, "stat", stat_then_swap)
    monkeypatch.setattr(os, "fstat", fstat_then_swap)
    assert read_secret_file(f) == (NEW, None)
    assert swapped  # (the swap happened between the check and the read)


@pytest.mark.hostile
def test_a_fifo_as_the_secret_file_is_refused_without_hanging(tmp_path: pathlib.Path) -> None:
    """A FIFO (mode 0600) passed the check on the path, then its read waited for a writer:
    the node hung at start, or on SIGHUP."""
    import threading

    fifo = tmp_path / "secret"
    os.mkfifo(fifo, 0o600)
    out: list[BaseException | tuple[bytes, bytes | None]] = []

    def read() -> None:
        try:
            out.append(read_secret_file(fifo))
        except ConfigError as exc:
            out.append(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(5)
    if t.is_alive():  # unblock the old code's open so the thread ends
        with open(fifo, "w"):
            pass
        t.join(5)
        pytest.fail("reading a FIFO as the network secret file hung")
    assert isinstance(out[0], ConfigError) and "regular file" in str(out[0])


@pytest.mark.hostile
@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_secret_file_of_another_user_is_refused(tmp_path: pathlib.Path) -> None:
    """A 0600 file another user planted (and so knows) was taken as our network secret."""
    f = tmp_path / "secret"
    f.write_text(OTHER.decode() + "\n")
    os.chmod(f, 0o600)
    os.chown(f, 12345, 12345)
    with pytest.raises(ConfigError, match="another user"):
        read_secret_file(f)


@pytest.mark.hostile
@pytest.mark.parametrize("content", [b"\xff" * 32 + b"\n", b"x" * (1 << 20)])
def test_a_binary_or_huge_secret_file_is_a_config_error(tmp_path: pathlib.Path,
                                                        content: bytes) -> None:
    """Bytes that are not UTF-8 raised UnicodeDecodeError out of the start (a traceback);
    a huge file was read whole."""
    f = tmp_path / "secret"
    f.write_bytes(content)
    os.chmod(f, 0o600)
    with pytest.raises(ConfigError):
        read_secret_file(f)


def test_a_node_without_a_credential_is_told_every_way_to_give_one(
        tmp_path: pathlib.Path) -> None:
    """It named --network-secret and the variable, not the file its help recommends."""
    from llmfabric.node.daemon import Node, NodeError

    with pytest.raises(NodeError) as info:
        Node(NodeConfig(home=tmp_path))
    assert str(info.value) == (
        "a node joins only with a credential: pass --network-secret-file FILE (or "
        "--network-secret, env LLMFABRIC_NETWORK_SECRET) or --membership-cert FILE with "
        "--operator-key KEY")
