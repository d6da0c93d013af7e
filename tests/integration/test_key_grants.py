"""Keys reach every ingress without a shared database: a key created at one ingress works at
another that trusts it as a key issuer (only the key's hash travels, in the issuer's signed
registry record), and a revocation takes effect there within 10 s (measured)."""

from __future__ import annotations

import json
import pathlib
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from llmfabric.launch.local import EngineSpec, LocalFabric, NodeProcess
from llmfabric.testing.poll import wait_until_sync

pytestmark = pytest.mark.slow
MODEL = "qwen3-1.7b"


@pytest.fixture(scope="module")
def two_ingresses(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalFabric, NodeProcess, NodeProcess]]:
    root: pathlib.Path = tmp_path_factory.mktemp("grants")
    with LocalFabric(root) as fab:
        issuer = fab.start_ingress()
        issuer_id = issuer.get_json("/v1/fabric/self")["peer_id"]
        fab.add_node(EngineSpec(MODEL, "L40S", provider="uni", speed=50))
        # a second ingress with its own accounts database, trusting the first as key issuer
        other = fab._spawn("ingress2", ["--ingress", "--bootstrap", issuer.peer_addr,
                                        "--key-issuer", issuer_id])
        fab.wait_http(other)
        fab.wait_serving({MODEL: 1}, timeout=120)
        fab.wait_serving({MODEL: 1}, timeout=60, via=other)
        yield fab, issuer, other


def _call(node: NodeProcess, method: str, path: str, key: str,
          body: dict[str, Any] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(
        node.http_url + path, method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, None


def _chat(node: NodeProcess, key: str) -> int:
    status, _ = _call(node, "POST", "/v1/chat/completions", key, {
        "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    return status


def _until(cond: Any, timeout: float) -> float:
    return wait_until_sync(cond, timeout, interval=0.1)


def test_a_key_works_at_every_trusting_ingress_and_a_revocation_reaches_it_within_10s(
    two_ingresses: tuple[LocalFabric, NodeProcess, NodeProcess],
) -> None:
    fab, issuer, other = two_ingresses
    admin = fab.admin_key()
    status, created = _call(issuer, "POST", "/v1/fabric/keys", admin,
                            {"name": "roaming", "owner": "alice"})
    assert status == 201
    key = created["key"]
    assert _chat(issuer, key) == 200
    # (no bound is promised for a new key to spread; a loaded CI machine may take a while)
    spread = _until(lambda: _chat(other, key) == 200, 30.0)
    # the second ingress's own admin key is not valid at the issuer (trust is one way)
    other_admin = (other.home / "admin.key").read_text().strip()
    assert _chat(issuer, other_admin) == 401
    status, _ = _call(issuer, "DELETE", f"/v1/fabric/keys/{created['id']}", admin)
    assert status == 200
    revoked_in = _until(lambda: _chat(other, key) == 401, 10.0)
    assert _chat(issuer, key) == 401
    print(f"key usable at the second ingress after {spread:.2f} s; "
          f"revocation effective there after {revoked_in:.2f} s")
    assert revoked_in < 10.0
