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
