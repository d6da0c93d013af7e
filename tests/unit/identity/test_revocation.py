"""Revocation lists (identity/revocation.py): signed by the operator key, bound to a network,
parsed strictly, never replaced by an older list; a revoked key or certificate is refused at
admission. `keys revoke-node` creates and extends them."""

from __future__ import annotations

import base64
import json
import pathlib
import time

import pytest
from click.testing import CliRunner

from llmfabric.cli.keys import command
from llmfabric.clock import utc_time
from llmfabric.identity import AdmissionContext, AdmissionError, CertAdmission, NodeKey
from llmfabric.identity.admission import sign_membership
from llmfabric.identity.errors import CertificateRevoked
from llmfabric.identity.revocation import (
    MAX_REVOKED,
    RevocationList,
    Revocations,
    sign_revocations,
)

NOW = 1_700_000_000.0
NET = "lab"
OPERATOR = NodeKey.generate()


def ctx(prover: str) -> AdmissionContext:
    return AdmissionContext(NET, prover, "zV", "client", b"c" * 32, b"s" * 32, NOW)


def test_a_list_round_trips_and_verifies() -> None:
    peer = NodeKey.generate().peer_id
    rl = sign_revocations(OPERATOR, NET, NOW, [peer], ["ab" * 32])
    back = RevocationList.from_json(rl.to_json())
    assert back == rl
    back.verify(OPERATOR.public_bytes, NET)
    assert back.revokes(peer) and back.revokes("zX", "ab" * 32) and not back.revokes("zX")
    with pytest.raises(AdmissionError, match="network"):
        back.verify(OPERATOR.public_bytes, "other")
    with pytest.raises(AdmissionError, match="another operator"):
        back.verify(NodeKey.generate().public_bytes, NET)


@pytest.mark.hostile
def test_a_list_with_an_entry_removed_or_an_older_date_does_not_verify() -> None:
    peers = [NodeKey.generate().peer_id for _ in range(2)]
    obj = json.loads(sign_revocations(OPERATOR, NET, NOW, peers).to_json())
    obj["peer_ids"] = peers[:1]  # a member trying to take itself off the list
    with pytest.raises(AdmissionError, match="signature"):
        RevocationList.from_json(json.dumps(obj)).verify(OPERATOR.public_bytes, NET)
    obj = json.loads(sign_revocations(OPERATOR, NET, NOW, peers).to_json())
    obj["issued_at"] = NOW + 1e6  # to outrank the operator's next list
    with pytest.raises(AdmissionError, match="signature"):
        RevocationList.from_json(json.dumps(obj)).verify(OPERATOR.public_bytes, NET)


def _mutated(**fields: object) -> str:
    obj = json.loads(sign_revocations(OPERATOR, NET, NOW, [NodeKey.generate().peer_id])
                     .to_json())
    obj.update(fields)
    return json.dumps(obj)


@pytest.mark.hostile
@pytest.mark.parametrize(("text", "why"), [
    ("[]", "not a JSON object"),
    (_mutated(v=2), "version"),
    (_mutated(extra=1), "unknown field"),
    (_mutated(issued_at=float("nan")), "issued_at"),
    (_mutated(issued_at=True), "issued_at"),
    (_mutated(issued_at=-5), "issued_at"),
    (_mutated(issued_at=1e400), "issued_at"),
    (_mutated(peer_ids="z"), "list of strings"),
    (_mutated(peer_ids=["not-a-peer"]), "peer id"),
    (_mutated(peer_ids=["z" * 5000]), "too long"),
    (_mutated(cert_ids=["AB" * 32]), "64 lowercase hex"),
    (_mutated(cert_ids=["ab" * 32, "ab" * 32]), "twice"),
    (_mutated(cert_ids=[f"{i:064x}" for i in range(MAX_REVOKED + 1)]), "entries"),
    (_mutated(operator="not base64!"), "malformed"),
    ('{"v":1,"v":1}', "duplicate key"),
    ("[" * 5000, "malformed"),
    ('{"v":1,"pad":"' + "x" * (1 << 20) + '"}', "bytes"),
])
def test_a_malformed_list_is_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(AdmissionError, match=why):
        RevocationList.from_json(text)


def test_the_list_is_bounded_when_signed() -> None:
    with pytest.raises(AdmissionError, match="at most"):
        sign_revocations(OPERATOR, NET, NOW, cert_ids=[f"{i:064x}"
                                                      for i in range(MAX_REVOKED + 1)])
    with pytest.raises(AdmissionError, match="finite"):
        sign_revocations(OPERATOR, NET, float("inf"))


@pytest.mark.hostile
def test_an_older_list_does_not_replace_a_newer_one() -> None:
    """A revoked member replaying the operator's earlier list (before its revocation) must
    not get itself re-admitted."""
    peer = NodeKey.generate().peer_id
    revs = Revocations(OPERATOR.public_bytes, NET)
    earlier = sign_revocations(OPERATOR, NET, NOW)
    later = sign_revocations(OPERATOR, NET, NOW + 10, [peer])
    assert revs.offer(later) is True
    with pytest.raises(AdmissionError, match="older"):
        revs.offer(earlier)
    assert revs.current is later and revs.refusal(peer) is not None
    same_time = sign_revocations(OPERATOR, NET, NOW + 10, [peer])
    assert revs.offer(same_time) is False  # (not older: accepted; nothing changed)
    forged = sign_revocations(NodeKey.generate(), NET, NOW + 20)
    with pytest.raises(AdmissionError, match="another operator"):
        revs.offer(forged)
    assert revs.current is same_time


@pytest.mark.hostile
def test_a_revoked_key_or_certificate_is_refused_at_admission() -> None:
    """Certificates could not be revoked: a leaked member key stayed admitted until its
    certificate expired."""
    leaked, narrowed, other = NodeKey.generate(), NodeKey.generate(), NodeKey.generate()
    mine = sign_membership(OPERATOR, other.peer_id, NET, NOW + 3600)
    revs = Revocations(OPERATOR.public_bytes, NET)
    adm = CertAdmission(OPERATOR.public_bytes, mine, revs)
    leaked_cert = sign_membership(OPERATOR, leaked.peer_id, NET, NOW + 3600)
    broad = sign_membership(OPERATOR, narrowed.peer_id, NET, NOW + 3600)
    narrow = sign_membership(OPERATOR, narrowed.peer_id, NET, NOW + 3600, models=("m",))
    for c in (leaked_cert, broad, narrow):
        adm.check(c.to_json().encode(), ctx(c.peer_id))
    revs.offer(sign_revocations(OPERATOR, NET, NOW, [leaked.peer_id], [broad.cert_id]))
    with pytest.raises(CertificateRevoked, match="key is on the operator's revocation list"):
        adm.check(leaked_cert.to_json().encode(), ctx(leaked.peer_id))
    with pytest.raises(CertificateRevoked, match="certificate is on"):
        adm.check(broad.to_json().encode(), ctx(narrowed.peer_id))
    adm.check(narrow.to_json().encode(), ctx(narrowed.peer_id))  # its other certificate


def run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(command, list(args))
    return res.exit_code, res.output


def test_revoke_node_creates_then_extends_the_list(tmp_path: pathlib.Path) -> None:
    home, lst = str(tmp_path), tmp_path / "revoked.json"
    code, out = run("operator-init", "--home", home, "--json")
    operator_pub = json.loads(out)["public_key"]
    a, b = NodeKey.generate().peer_id, NodeKey.generate().peer_id
    code, out = run("revoke-node", a, "--list", str(lst), "--network", NET, "--home", home)
    assert code == 0, out
    first = RevocationList.load(lst)
    first.verify(base64.b64decode(operator_pub), NET)
    assert first.peer_ids == {a}
    assert f"(issued at {utc_time(first.issued_at)})" in out  # (ISO-8601 UTC, not Unix s)
    cert = tmp_path / "member.json"
    assert run("sign-node", b, "--network", NET, "--out", str(cert), "--home", home)[0] == 0
    code, out = run("revoke-node", "--cert", str(cert), "--list", str(lst), "--network", NET,
                    "--home", home)
    assert code == 0, out
    second = RevocationList.load(lst)
    assert second.peer_ids == {a} and len(second.cert_ids) == 1
    assert second.issued_at > first.issued_at  # (strictly: nodes pass on newer lists only)
    # even when the clock is behind the list's issue time
    future = round(time.time() + 1e6, 3)
    lst.write_text(sign_revocations(NodeKey.load(tmp_path / "operator.key"), NET, future,
                                    second.peer_ids, second.cert_ids).to_json())
    assert run("revoke-node", b, "--list", str(lst), "--network", NET, "--home", home)[0] == 0
    assert RevocationList.load(lst).issued_at == pytest.approx(future + 0.001)
    assert not list(tmp_path.glob(".revoked.json.*"))  # (written, then renamed)


def test_issue_times_are_printed_as_iso_8601_utc() -> None:
    assert utc_time(1767225600.0) == "2026-01-01T00:00:00.000Z"
    assert utc_time(1767225600.1236) == "2026-01-01T00:00:00.124Z"  # (as the file rounds)
    assert utc_time(0.001) == "1970-01-01T00:00:00.001Z"
    assert utc_time(1e300) == "1e+300 Unix seconds"  # (past year 9999: no ISO form)
    assert utc_time(float("inf")) == "inf Unix seconds"
    assert utc_time(float("nan")) == "nan Unix seconds"


def test_the_admission_messages_give_issue_times_in_utc() -> None:
    """They gave Unix seconds ("issued at 1700000000.000", "issued at 1700000010")."""
    peer = NodeKey.generate().peer_id
    revs = Revocations(OPERATOR.public_bytes, NET)
    revs.offer(sign_revocations(OPERATOR, NET, NOW + 10.25, [peer]))
    with pytest.raises(AdmissionError) as err:
        revs.offer(sign_revocations(OPERATOR, NET, NOW))
    assert str(err.value) == (
        "revocation list issued at 2023-11-14T22:13:20.000Z is older than the list in force "
        "(issued at 2023-11-14T22:13:30.250Z): an old list does not replace a newer one")
    assert revs.refusal(peer) == (
        f"the membership of peer {peer} is revoked: its key is on the operator's revocation "
        "list (issued at 2023-11-14T22:13:30.250Z)")


@pytest.mark.hostile
def test_revoke_node_refuses_to_extend_a_list_it_cannot_verify(tmp_path: pathlib.Path) -> None:
    """A list another key signed (or for another network) is not silently re-signed: that
    would launder whatever it names under the operator's key."""
    home, lst = str(tmp_path), tmp_path / "revoked.json"
    run("operator-init", "--home", home)
    rogue = sign_revocations(NodeKey.generate(), NET, NOW, [NodeKey.generate().peer_id])
    lst.write_text(rogue.to_json())
    code, out = run("revoke-node", NodeKey.generate().peer_id, "--list", str(lst),
                    "--network", NET, "--home", home)
    assert code != 0 and "another operator" in out
    assert RevocationList.load(lst) == rogue
    code, out = run("revoke-node", "--list", str(lst), "--home", home)
    assert code != 0 and "PEER_ID" in out
    code, out = run("revoke-node", "not-a-peer", "--list", str(lst), "--home", home)
    assert code != 0 and "multibase" in out
