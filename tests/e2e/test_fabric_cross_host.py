"""Direct forwarding across hosts: an ingress in one namespace serves, through the official
openai SDK, providers in another namespace that it can dial (a routed link, no NAT).

    [ing] 10.203.1.2 --- 10.203.1.1 [rtr] 10.203.2.1 --- 10.203.2.2 [prv]
    ingress + bootstrap                 ip_forward          three providers (sim engines)

- `wild`: HTTP API bound to 0.0.0.0: publishes 10.203.2.2:<http port> (the host of its peer
  address) and is served over the direct HTTP path. Before the fix it published
  127.0.0.1:<port>, so the ingress dialled its own loopback and every request failed.
- `loop`: the default loopback HTTP listen: publishes no HTTP address (its peer address is
  not loopback), so the ingress uses the authenticated peer path.
- `wrong`: an explicit `public_http_addr` that refuses connections: the ingress falls back to
  the peer path when the direct connection cannot be opened.
"""

from __future__ import annotations

import json
import pathlib
import secrets
import sys
import time
from typing import Any

import pytest

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "llmfabric.cli.main"]
INGRESS_PEER = "10.203.1.2:7946"
INGRESS_HTTP = "10.203.1.2:8080"
PROVIDER_IP = "10.203.2.2"
MODEL = "qwen3-1.7b"

_GET = """
import json, sys, urllib.request
try:
    key = sys.argv[2] if len(sys.argv) > 2 else ""
    req = urllib.request.Request(sys.argv[1],
                                 headers={"Authorization": "Bearer " + key} if key else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        print(json.dumps({"status": r.status, "body": json.loads(r.read())}))
except Exception as e:
    print(json.dumps({"status": 0, "body": repr(e)}))
"""

_SDK = """
import json, sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0, timeout=30)
out = {}
for provider in sys.argv[4:]:
    raw = client.chat.completions.with_raw_response.create(
        model=sys.argv[3], max_tokens=4,
        messages=[{"role": "user", "content": "hello from another host"}],
        extra_headers={"X-Fabric-Providers": provider})
    reply = raw.parse()
    out[provider] = {"node": raw.headers.get("x-fabric-node"),
                     "tokens": reply.usage.completion_tokens,
                     "text": reply.choices[0].message.content}
print(json.dumps(out))
"""


def _routed(netlab: Any) -> tuple[str, str]:
    ing, router, prv = netlab.ns("ing"), netlab.ns("rtr"), netlab.ns("prv")
    netlab.link(ing, "10.203.1.2/24", router, "10.203.1.1/24")
    netlab.link(router, "10.203.2.1/24", prv, f"{PROVIDER_IP}/24")
    netlab.run(ing, "ip", "route", "add", "default", "via", "10.203.1.1")
    netlab.run(prv, "ip", "route", "add", "default", "via", "10.203.2.1")
    netlab.run(router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    return ing, prv


def _get(netlab: Any, ns: str, url: str, key: str = "") -> dict[str, Any]:
    out = netlab.run(ns, sys.executable, "-c", _GET, url, key, check=False, timeout=30)
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def test_the_ingress_reaches_providers_on_another_host(
    netlab: Any, tmp_path: pathlib.Path
) -> None:
    ing, prv = _routed(netlab)
    common = ["--network-secret", secrets.token_urlsafe(24), "--preset", "local"]
    netlab.popen(ing, [*CLI, "start", "--home", str(tmp_path / "ingress"), "--listen",
                       INGRESS_PEER, "--http-listen", INGRESS_HTTP, "--ingress", *common],
                 str(tmp_path / "ingress.log"))
    wrong_cfg = tmp_path / "wrong.yaml"
    wrong_cfg.write_text(f"public_http_addr: {PROVIDER_IP}:1\n")  # nothing listens there
    providers = {
        "wild": ["--http-listen", "0.0.0.0:8091"],
        "loop": [],  # the default: 127.0.0.1:8090
        "wrong": ["--http-listen", "127.0.0.1:8092", "--config", str(wrong_cfg)],
    }
    for i, (name, extra) in enumerate(providers.items()):
        netlab.popen(prv, [*CLI, "start", "--home", str(tmp_path / name), "--listen",
                           f"{PROVIDER_IP}:{7950 + i}", "--bootstrap", INGRESS_PEER,
                           "--provider", name, *extra, *common, "--process", *CLI, "engine",
                           "sim", "--model", MODEL, "--gpu", "L40S", "--port", str(18010 + i),
                           "--speed", "20"], str(tmp_path / f"{name}.log"))

    base = f"http://{INGRESS_HTTP}"
    seen: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(seen) < len(providers):
        key_file = tmp_path / "ingress" / "admin.key"  # the fleet views need a key
        key = key_file.read_text().strip() if key_file.exists() else ""
        nodes = _get(netlab, ing, base + "/v1/fabric/nodes", key)
        if nodes["status"] == 200:
            seen = {n["provider_id"]: n for n in nodes["body"]["nodes"]
                    if n["provider_id"] in providers and n["state"] == "SERVING"}
        time.sleep(0.5)

    def logs() -> dict[str, str]:
        return {p.name: p.read_text()[-3000:] for p in tmp_path.glob("*.log")}

    assert set(seen) == set(providers), logs()
    assert seen["wild"]["http_addr"] == f"{PROVIDER_IP}:8091"
    assert seen["loop"]["http_addr"] == ""  # loopback HTTP on a non-loopback fabric: none
    assert seen["wrong"]["http_addr"] == f"{PROVIDER_IP}:1"
    assert all(not n["relays"] and n["peer_addrs"] for n in seen.values())
    # The published direct address really is reachable from the ingress's host.
    assert _get(netlab, ing, f"http://{PROVIDER_IP}:8091/healthz")["status"] == 200

    admin_key = (tmp_path / "ingress" / "admin.key").read_text().strip()
    # X-Fabric-Providers names keys on a PSK network (the peer id), not --provider names.
    keys = {name: seen[name]["peer_id"] for name in providers}
    out = netlab.run(ing, sys.executable, "-c", _SDK, base + "/v1", admin_key, MODEL,
                     *keys.values(), check=False, timeout=120)
    try:
        by_key = json.loads(out.strip().splitlines()[-1])
        replies = {name: by_key[key] for name, key in keys.items()}
    except (ValueError, IndexError, KeyError):
        raise AssertionError((out, logs())) from None
    for name in providers:
        assert replies[name]["node"] == seen[name]["session_id"], (name, replies, logs())
        assert replies[name]["tokens"] == 4
