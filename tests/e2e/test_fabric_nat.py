"""The whole fabric across a NAT: a provider node with outbound-only connectivity joins an
ingress + relay node, publishes its model, and the ingress serves OpenAI requests from it
through the relay (the ingress cannot dial the node).

    [pub] 10.202.1.2 --- 10.202.1.1 [router] 192.168.202.1 --- 192.168.202.2 [priv]
    ingress + bootstrap + relay      MASQUERADE                 llmfabric start --process sim
"""

from __future__ import annotations

import json
import pathlib
import secrets
import sys
import time
from typing import Any

import pytest

from ._netns import NetLab

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "llmfabric.cli.main"]
INGRESS_PEER = "10.202.1.2:7946"
INGRESS_HTTP = "10.202.1.2:8080"

_CLIENT = """
import json, sys, urllib.request, urllib.error
url, body, key = sys.argv[1], sys.argv[2], sys.argv[3]
headers = {"Content-Type": "application/json"}
if key:
    headers["Authorization"] = "Bearer " + key
req = urllib.request.Request(url, data=body.encode() or None, headers=headers)
try:
    with urllib.request.urlopen(req, timeout=20) as r:
        print(json.dumps({"status": r.status, "node": r.headers.get("X-Fabric-Node"),
                          "body": json.loads(r.read())}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "node": None, "body": e.read().decode()}))
except OSError as e:
    print(json.dumps({"status": 0, "node": None, "body": str(e)}))
"""


def _call(netlab: Any, ns: str, url: str, body: str = "", key: str = "") -> dict[str, Any]:
    out = netlab.run(ns, sys.executable, "-c", _CLIENT, url, body, key, check=False, timeout=40)
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _admin(tmp_path: pathlib.Path) -> str:
    """The ingress's admin key (its fleet views need a key), "" before it exists."""
    f = tmp_path / "ingress" / "admin.key"
    return f.read_text().strip() if f.exists() else ""


def _build_nat(netlab: NetLab) -> tuple[str, str]:
    pub, router, priv = netlab.ns("pub"), netlab.ns("rtr"), netlab.ns("prv")
    _, r_pub = netlab.link(pub, "10.202.1.2/24", router, "10.202.1.1/24")
    r_priv, _ = netlab.link(router, "192.168.202.1/24", priv, "192.168.202.2/24")
    netlab.run(priv, "ip", "route", "add", "default", "via", "192.168.202.1")
    netlab.nat(router, "192.168.202.0/24", r_pub, r_priv)
    return pub, priv


def test_ingress_serves_a_nated_provider_through_the_relay(
    netlab: Any, tmp_path: pathlib.Path
) -> None:
    pub, priv = _build_nat(netlab)
    secret = secrets.token_urlsafe(24)
    common = ["--network-secret", secret, "--preset", "local"]
    netlab.popen(pub, [*CLI, "start", "--home", str(tmp_path / "ingress"), "--listen",
                       INGRESS_PEER, "--http-listen", INGRESS_HTTP, "--ingress", "--relay",
                       *common], str(tmp_path / "ingress.log"))
    netlab.popen(priv, [*CLI, "start", "--home", str(tmp_path / "prov"), "--listen",
                        "192.168.202.2:7946", "--http-listen", "127.0.0.1:8090",
                        "--bootstrap", INGRESS_PEER, "--provider", "behind-nat", *common,
                        "--process", *CLI, "engine", "sim", "--model", "qwen3-1.7b",
                        "--gpu", "L40S", "--port", "18001", "--speed", "20"],
                 str(tmp_path / "prov.log"))

    base = f"http://{INGRESS_HTTP}"
    node: dict[str, Any] | None = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        nodes = _call(netlab, pub, base + "/v1/fabric/nodes", "", _admin(tmp_path))
        if nodes["status"] == 200:
            for n in nodes["body"]["nodes"]:
                if n["provider_id"] == "behind-nat" and n["state"] == "SERVING" and n["relays"]:
                    node = n
        if node is not None:
            break
        time.sleep(0.5)
    logs = {p.name: p.read_text()[-3000:] for p in tmp_path.glob("*.log")}
    assert node is not None, logs
    assert node["peer_addrs"] == []  # it advertises no direct address: relay only

    body = json.dumps({"model": "qwen3-1.7b", "max_tokens": 5,
                       "messages": [{"role": "user", "content": "hello across the NAT"}]})
    admin_key = (tmp_path / "ingress" / "admin.key").read_text().strip()
    reply = _call(netlab, pub, base + "/v1/chat/completions", body, admin_key)
    assert reply["status"] == 200, (reply, logs)
    assert reply["node"] == node["session_id"]
    assert reply["body"]["usage"]["completion_tokens"] == 5

    # The node really is unreachable directly from the public side.
    direct = _call(netlab, pub, "http://192.168.202.2:8090/healthz")
    assert direct["status"] == 0


def test_a_node_with_the_wrong_secret_never_joins(netlab: Any, tmp_path: pathlib.Path) -> None:
    pub, priv = _build_nat(netlab)
    netlab.popen(pub, [*CLI, "start", "--home", str(tmp_path / "ingress"), "--listen",
                       INGRESS_PEER, "--http-listen", INGRESS_HTTP, "--ingress", "--relay",
                       "--network-secret", secrets.token_urlsafe(24),
                       "--preset", "local"], str(tmp_path / "ingress.log"))
    intruder_log = tmp_path / "intruder.log"
    netlab.popen(priv, [*CLI, "start", "--home", str(tmp_path / "intruder"), "--listen",
                        "192.168.202.2:7946", "--bootstrap", INGRESS_PEER, "--provider",
                        "intruder", "--network-secret", secrets.token_urlsafe(24),
                        "--preset", "local", "-v"], str(intruder_log))
    base = f"http://{INGRESS_HTTP}"

    def refused() -> list[str]:
        """The ingress's refused-handshake counters ([] before it answers)."""
        out = netlab.run(pub, sys.executable, "-c", "import urllib.request,sys;"
                         f"print(urllib.request.urlopen('{base}/metrics').read().decode())",
                         check=False)
        return [line for line in out.splitlines()
                if line.startswith("llmfabric_net_handshakes_refused")]

    # Watch the fleet view until the ingress has refused the intruder's handshake (both
    # processes start at once: on a loaded machine that may take a while, not a fixed 10 s),
    # then 5 s more while the intruder keeps retrying: it is never listed.
    deadline, settle_until = time.monotonic() + 60, float("inf")
    answered, counters = 0, []
    while time.monotonic() < min(deadline, settle_until):
        nodes = _call(netlab, pub, base + "/v1/fabric/nodes", "", _admin(tmp_path))
        if nodes["status"] == 200:
            answered += 1
            assert all(n["provider_id"] != "intruder" for n in nodes["body"]["nodes"])
        if settle_until == float("inf"):
            counters = refused()
            if any(float(line.rsplit(" ", 1)[1]) > 0 for line in counters):
                settle_until = time.monotonic() + 5
        time.sleep(0.5)
    assert answered  # the view was really read (it needs the admin key)
    assert settle_until < float("inf"), (counters, intruder_log.read_text()[-3000:])
