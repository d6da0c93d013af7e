import json
import pathlib
import stat

import pytest
from click.testing import CliRunner

from llmfabric.cli.keys import command, keys_group
from llmfabric.identity import MembershipCert, NodeKey
from llmfabric.identity.admission import decode_public_key


def run(*args: str):
    return CliRunner().invoke(command, list(args), catch_exceptions=False)


def test_keys_init_creates_then_shows_the_same_peer_id(tmp_path):
    first = run("init", "--home", str(tmp_path), "--json")
    assert first.exit_code == 0
    info = json.loads(first.output)
    assert info["created"] is True
    assert stat.S_IMODE((tmp_path / "node.key").stat().st_mode) == 0o600
    second = json.loads(run("init", "--home", str(tmp_path), "--json").output)
    assert second["created"] is False and second["peer_id"] == info["peer_id"]
    assert NodeKey.load(tmp_path / "node.key").peer_id == info["peer_id"]


def test_sign_node_writes_a_certificate_the_operator_key_verifies(tmp_path):
    op = json.loads(run("operator-init", "--home", str(tmp_path), "--json").output)
    node = NodeKey.generate()
    out = tmp_path / "member.json"
    res = run(
        "sign-node",
        node.peer_id,
        "--network",
        "lab",
        "--out",
        str(out),
        "--expires",
        "2",
        "--home",
        str(tmp_path),
    )
    assert res.exit_code == 0, res.output
    cert = MembershipCert.load(out)
    cert.verify(
        decode_public_key(op["public_key"]),
        peer_id=node.peer_id,
        network="lab",
        now=cert.expires_at - 86400,
    )


def test_sign_node_errors_are_clear(tmp_path):
    peer = NodeKey.generate().peer_id
    res = CliRunner().invoke(
        command, ["sign-node", peer, "--out", str(tmp_path / "x"), "--home", str(tmp_path)]
    )
    assert res.exit_code != 0 and "operator-init" in res.output
    run("operator-init", "--home", str(tmp_path))
    res = CliRunner().invoke(
        command, ["sign-node", "not-a-peer", "--out", str(tmp_path / "x"), "--home", str(tmp_path)]
    )
    assert res.exit_code != 0 and "multibase" in res.output


def test_group_is_extensible():
    assert command is keys_group
    assert {"init", "operator-init", "sign-node"} <= set(keys_group.commands)


def test_sign_node_binds_a_provider_models_and_a_session_cap(tmp_path):
    op = json.loads(run("operator-init", "--home", str(tmp_path), "--json").output)
    node = NodeKey.generate()
    out = tmp_path / "member.json"
    res = run("sign-node", node.peer_id, "--network", "lab", "--out", str(out), "--provider",
              "my-lab", "--model", "llama", "--model", "l3", "--max-sessions", "2",
              "--home", str(tmp_path))
    assert res.exit_code == 0, res.output
    cert = MembershipCert.load(out)
    assert (cert.provider, cert.models, cert.max_sessions) == ("my-lab", ("llama", "l3"), 2)
    cert.verify(decode_public_key(op["public_key"]), peer_id=node.peer_id, network="lab",
                now=cert.expires_at - 86400)


@pytest.mark.hostile
@pytest.mark.parametrize("days", ["nan", "inf", "-inf", "1e306"])
def test_sign_node_refuses_an_expiry_that_is_not_a_finite_date(tmp_path: pathlib.Path,
                                                              days: str) -> None:
    """`--expires nan` signed a certificate NaN compared as never expired: valid forever."""
    run("operator-init", "--home", str(tmp_path))
    out = tmp_path / "member.json"
    res = CliRunner().invoke(command, ["sign-node", NodeKey.generate().peer_id, "--out",
                                       str(out), "--expires", days, "--home", str(tmp_path)])
    assert res.exit_code != 0 and not out.exists(), res.output


def test_sign_node_says_its_expires_is_a_number_of_days(tmp_path: pathlib.Path) -> None:
    """`keys create --expires 30d` takes a duration; `sign-node --expires 30d` said "'30d' is
    not a valid float"."""
    run("operator-init", "--home", str(tmp_path))
    out = tmp_path / "member.json"
    args = ["sign-node", NodeKey.generate().peer_id, "--out", str(out), "--home", str(tmp_path)]
    res = CliRunner().invoke(command, [*args, "--expires", "30d"])
    assert res.exit_code == 2 and not out.exists()
    assert ("Invalid value for --expires: '30d' is not a positive number of days: give e.g. "
            "30, or 0.5 for 12 hours") in res.output
    assert run(*args, "--expires", "0.5").exit_code == 0
    cert = MembershipCert.load(out)
    assert 43_000 < cert.expires_at - cert.not_before < 44_100


def test_sign_node_sets_a_not_before_a_little_in_the_past(tmp_path: pathlib.Path) -> None:
    import time

    run("operator-init", "--home", str(tmp_path))
    out = tmp_path / "member.json"
    peer = NodeKey.generate().peer_id
    res = run("sign-node", peer, "--out", str(out), "--home", str(tmp_path))
    assert res.exit_code == 0 and "certificate id:" in res.output, res.output
    cert = MembershipCert.load(out)
    assert time.time() - 3600 < cert.not_before < time.time() - 600
    assert cert.cert_id in res.output
    # the hint names the option that takes an id (--cert takes a certificate file)
    assert "`keys revoke-node --cert-id` revokes" in res.output
    res = run("sign-node", peer, "--out", str(out), "--not-before", "none",
              "--home", str(tmp_path))
    assert res.exit_code == 0 and MembershipCert.load(out).not_before == 0.0
    res = run("sign-node", peer, "--out", str(out), "--not-before", "2", "--home",
              str(tmp_path))
    assert res.exit_code == 0 and MembershipCert.load(out).not_before > time.time() + 86400


@pytest.mark.parametrize("days", ["nan", "inf", "31", "soon"])
def test_sign_node_refuses_a_not_before_that_is_not_before_the_expiry(
        tmp_path: pathlib.Path, days: str) -> None:
    run("operator-init", "--home", str(tmp_path))
    out = tmp_path / "member.json"
    res = CliRunner().invoke(command, ["sign-node", NodeKey.generate().peer_id, "--out",
                                       str(out), "--not-before", days, "--home", str(tmp_path)])
    assert res.exit_code != 0 and not out.exists() and "--not-before" in res.output
