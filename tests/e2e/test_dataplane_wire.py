"""Wire-level evidence for the encrypted data plane, in network namespaces (names `front*`).

    [ing] 10.203.1.2 ----+                      +---- 10.203.3.2 [dprv] provider "direct"
       ingress           |                      |        (published HTTP address: direct path)
                   10.203.1.1 [rtr] 10.203.3.1
    [rly] 10.203.2.2 ----+ 10.203.2.1  192.168.203.1 ---- 192.168.203.2 [nprv] provider
       relay                      MASQUERADE, no inbound         "nated" (relay path)

A raw AF_PACKET capture on every link of the two providers and of the relay records all the
bytes between the ingress and the providers while the ingress serves a chat request to each
(one direct over pinned HTTPS, one sealed through the relay). Neither prompt appears in any
captured byte, while a capture on the ingress's loopback (the client's own plain HTTP
request) does show its prompt: the capture method sees cleartext where there is some. Then a
member replays an authorized forwarded request against the direct provider: refused.
"""

from __future__ import annotations

import json
import pathlib
import secrets
import struct
import subprocess
import sys
import time
from typing import Any

import pytest

from ._netns import NetLab, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.hostile]

CLI = [sys.executable, "-m", "llmfabric.cli.main"]
RELAY_PEER = "10.203.2.2:7946"
INGRESS_HTTP = "10.203.1.2:8080"
NETNS_PREFIX = "front"

# Captures every frame on a device into argv[1] (length-prefixed); argv[1] exists once the
# socket is bound (capturing). Once argv[3] exists it reads what the kernel still holds for it
# and exits, so nothing sent before the stop is lost to a capture the machine left behind.
_CAPTURE = """
import os, socket, struct, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(3))
s.bind((sys.argv[2], 0))
s.settimeout(0.2)
out = open(sys.argv[1] + ".part", "wb")
os.rename(sys.argv[1] + ".part", sys.argv[1])
def keep(frame):
    out.write(struct.pack(">I", len(frame)) + frame)
while not os.path.exists(sys.argv[3]):
    try:
        keep(s.recv(65535))
    except socket.timeout:
        pass
s.setblocking(False)
while True:
    try:
        keep(s.recv(65535))
    except BlockingIOError:
        break
out.close()
"""

_CLIENT = """
import json, sys, urllib.request, urllib.error
url, body, key, providers = sys.argv[1:5]
headers = {"Content-Type": "application/json", "Authorization": "Bearer " + key}
if providers:
    headers["X-Fabric-Providers"] = providers
req = urllib.request.Request(url, data=body.encode() or None, headers=headers)
if not body:
    req = urllib.request.Request(url, headers=headers)
try:
    with urllib.request.urlopen(req, timeout=30) as r:
        print(json.dumps({"status": r.status, "body": json.loads(r.read())}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": e.read().decode()}))
except OSError as e:
    print(json.dumps({"status": 0, "body": str(e)}))
"""

# A member of the fabric (its own key, the network secret) that gets a data-plane session
# with the provider, sends one authorized request, then sends the very same bytes again.
_REPLAY = """
import asyncio, json, ssl, sys, time
import aiohttp
from llmfabric.dataplane.authz import AUTH_HEADER, authorize
from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.forward.secure import DataPlaneSessions
from llmfabric.net import TlsTransport, TransportConfig

async def main(secret, peer_addr, host):
    key = NodeKey.generate()
    t = TlsTransport(key, PskAdmission("default", secret.encode()), TransportConfig(host=None))
    async with t:
        peer = await t.connect_bootstrap(peer_addr)
        s = await DataPlaneSessions(key, t).get(peer, 10)
        path = "/v1/fabric/forward/v1/chat/completions"
        body = json.dumps({"model": "qwen3-1.7b", "max_tokens": 2,
                           "messages": [{"role": "user", "content": "replay me"}]}).encode()
        header, _ = authorize(s, path.encode(), body, time.time())
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        out = []
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.post(f"https://{host}:{s.https_port}{path}", data=body,
                                     headers={AUTH_HEADER: header.decode(),
                                              "Content-Type": "application/json"},
                                     ssl=ctx) as r:
                    out.append([r.status, await r.text()])
        print(json.dumps({"https_port": s.https_port, "results": out}))

asyncio.run(main(*sys.argv[1:4]))
"""


def _tcp_payload_to(capture: bytes, port: int) -> int:
    """Bytes of TCP payload sent to `port` in a capture of length-prefixed Ethernet frames."""
    total, i = 0, 0
    while i + 4 <= len(capture):
        (n,) = struct.unpack_from(">I", capture, i)
        frame = capture[i + 4 : i + 4 + n]
        i += 4 + n
        if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 6:
            continue
        ihl = (frame[14] & 0x0F) * 4
        ip_len = struct.unpack_from(">H", frame, 16)[0]
        tcp = frame[14 + ihl :]
        if len(tcp) < 20 or struct.unpack_from(">H", tcp, 2)[0] != port:
            continue
        total += ip_len - ihl - (tcp[12] >> 4) * 4
    return total


def _call(lab: NetLab, ns: str, url: str, key: str, body: str = "",
          providers: str = "") -> dict[str, Any]:
    out = lab.run(ns, sys.executable, "-c", _CLIENT, url, body, key, providers, check=False,
                  timeout=60)
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def test_prompts_never_cross_the_wire_in_cleartext_and_replays_are_refused(
    netlab: NetLab, tmp_path: pathlib.Path
) -> None:
    ing, rtr, rly = netlab.ns("ing"), netlab.ns("rtr"), netlab.ns("rly")
    dprv, nprv = netlab.ns("dprv"), netlab.ns("nprv")
    netlab.link(ing, "10.203.1.2/24", rtr, "10.203.1.1/24")
    rly_if, _ = netlab.link(rly, "10.203.2.2/24", rtr, "10.203.2.1/24")
    dprv_if, _ = netlab.link(dprv, "10.203.3.2/24", rtr, "10.203.3.1/24")
    r_nat, nprv_if = netlab.link(rtr, "192.168.203.1/24", nprv, "192.168.203.2/24")
    for ns, gw in ((ing, "10.203.1.1"), (rly, "10.203.2.1"), (dprv, "10.203.3.1"),
                   (nprv, "192.168.203.1")):
        netlab.run(ns, "ip", "route", "add", "default", "via", gw)
    netlab.run(rtr, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    netlab.run(rtr, "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "192.168.203.0/24",
               "!", "-o", r_nat, "-j", "MASQUERADE")
    netlab.run(rtr, "iptables", "-A", "FORWARD", "!", "-i", r_nat, "-o", r_nat, "-m",
               "conntrack", "--ctstate", "NEW", "-j", "DROP")

    secret = secrets.token_urlsafe(24)
    common = ["--network-secret", secret, "--preset", "local"]
    engine = [*CLI, "engine", "sim", "--model", "qwen3-1.7b", "--gpu", "L40S", "--port",
              "18001", "--speed", "20"]
    netlab.popen(rly, [*CLI, "start", "--home", str(tmp_path / "relay"), "--listen", RELAY_PEER,
                       "--http-listen", "10.203.2.2:8090", "--relay", *common],
                 str(tmp_path / "relay.log"))
    netlab.popen(ing, [*CLI, "start", "--home", str(tmp_path / "ingress"), "--listen",
                       "10.203.1.2:7946", "--http-listen", INGRESS_HTTP, "--ingress",
                       "--bootstrap", RELAY_PEER, *common], str(tmp_path / "ingress.log"))
    netlab.popen(dprv, [*CLI, "start", "--home", str(tmp_path / "dprv"), "--listen",
                        "10.203.3.2:7946", "--http-listen", "10.203.3.2:8090", "--bootstrap",
                        RELAY_PEER, "--provider", "direct", *common, "--process", *engine],
                 str(tmp_path / "dprv.log"))
    netlab.popen(nprv, [*CLI, "start", "--home", str(tmp_path / "nprv"), "--listen",
                        "192.168.203.2:7946", "--http-listen", "127.0.0.1:8090", "--bootstrap",
                        RELAY_PEER, "--provider", "nated", *common, "--process", *engine],
                 str(tmp_path / "nprv.log"))

    base = f"http://{INGRESS_HTTP}"
    key = ""
    nodes: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (len(nodes) == 2 and nodes["nated"]["relays"]):
        time.sleep(0.5)
        key_file = tmp_path / "ingress" / "admin.key"
        if not key_file.exists():
            continue
        key = key_file.read_text().strip()
        got = _call(netlab, ing, base + "/v1/fabric/nodes", key)
        if got["status"] == 200:
            nodes = {n["provider_id"]: n for n in got["body"]["nodes"]
                     if n["state"] == "SERVING" and n["provider_id"] in ("direct", "nated")}
    logs = {p.name: p.read_text()[-2000:] for p in tmp_path.glob("*.log")}
    assert len(nodes) == 2, logs
    assert nodes["direct"]["http_addr"] and not nodes["direct"]["relays"]
    assert nodes["nated"]["relays"] and not nodes["nated"]["peer_addrs"]

    captures: list[tuple[pathlib.Path, subprocess.Popen[str]]] = []
    stop = tmp_path / "captures.stop"
    for ns, dev in ((dprv, dprv_if), (nprv, nprv_if), (rly, rly_if), (ing, "lo")):
        out = tmp_path / f"{ns}-{dev}.bin"
        captures.append((out, netlab.popen(
            ns, [sys.executable, "-c", _CAPTURE, str(out), dev, str(stop)],
            str(tmp_path / f"cap-{dev}.log"))))
    # every capture is bound before the requests go out (not a fixed 1 s: python's start)
    wait_for("the captures bound", lambda: all(out.exists() for out, _ in captures), 30,
             tmp_path)
    time.sleep(1.0)  # (some background traffic too: each link's capture holds > 2000 bytes)
    prompts = {}
    for provider in ("direct", "nated"):
        prompt = f"PROMPT-{provider}-{secrets.token_hex(8)}"
        prompts[provider] = prompt
        body = json.dumps({"model": "qwen3-1.7b", "max_tokens": 4,
                           "messages": [{"role": "user", "content": prompt}]})
        # the allowlist names verified identities (on a PSK network: the key fingerprint)
        reply = _call(netlab, ing, base + "/v1/chat/completions", key, body,
                         nodes[provider]["verified_provider"])
        assert reply["status"] == 200, (reply, logs)
    time.sleep(1.0)
    stop.write_text("")  # each capture drains what it was sent, then exits
    for out, proc in captures:
        assert proc.wait(timeout=30) == 0, (out.name, logs)

    wire = {out.name: out.read_bytes() for out, _ in captures}
    provider_side = {name: data for name, data in wire.items() if not name.endswith("-lo.bin")}
    print(f"\ncaptured bytes: { {k: len(v) for k, v in wire.items()} }")
    assert all(len(data) > 2000 for data in provider_side.values()), {
        k: len(v) for k, v in wire.items()}
    for name, data in provider_side.items():
        for prompt in prompts.values():
            assert prompt.encode() not in data, f"{prompt} in cleartext on {name}"
    # The direct provider's request went over its data-plane HTTPS port (not the sealed peer
    # path): TCP segments with payload to that port were captured on its link.
    replay = netlab.run(ing, sys.executable, "-c", _REPLAY, secret, "10.203.3.2:7946",
                        "10.203.3.2", check=False, timeout=60)
    doc = json.loads(replay.strip().splitlines()[-1])
    assert _tcp_payload_to(provider_side[f"{dprv}-{dprv_if}.bin"], doc["https_port"]) > 0
    loopback = next(data for name, data in wire.items() if name.endswith("-lo.bin"))
    assert all(p.encode() in loopback for p in prompts.values()), "the capture sees nothing"

    results = doc["results"]  # (the member's request, then the same bytes again)
    assert results[0][0] == 200, results
    assert results[1][0] == 401 and "replayed" in results[1][1], results
