"""An ingress that vanishes mid-stream without closing (no FIN, no RST): the provider's own
TCP keepalive / TCP_USER_TIMEOUT on the direct path's accepted connection notices it, closes
the connection and the engine request, instead of generating the rest of the stream into a
half-open connection it would hold for many minutes.

    [ing] 10.209.1.1 ---------------- 10.209.1.2 [prov]
    ingress node, the client          provider node, its engine (sim) on loopback

The client streams a long, slow chat completion (~600 tokens at ~0.2 s each: minutes); once
it has the first pieces the test checks the provider holds the direct connection (its data
plane port, 8443) and the engine runs the request, then DROPs every packet to and from the
provider in the ingress's namespace (the ingress's host vanished, as the provider sees it).
With the provider's keepalive idle 2 s, interval 1 s, count 2 (dead after 4 s of silence; the
provider's config file, the same keys as the ingress's), the provider must have closed the
connection and the engine must have stopped the request within 3 x 4 s of the cut. Before,
the provider kept streaming into the dead connection (TCP retransmits for ~15 min) and the
engine generated the whole answer. Namespaces are named `ding<tag><role>` (removed at the end).
"""

from __future__ import annotations

import json
import pathlib
import secrets
import sys
import time

import pytest

from ._netns import DEAD_AFTER_S, NetLab, keepalive_config, start_stream

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLI = [sys.executable, "-m", "llmfabric.cli.main"]
MODEL = "llama-3.1-8b"
ING, PROV = "10.209.1.1", "10.209.1.2"
INGRESS_HTTP = f"{ING}:8080"
DATAPLANE_PORT = 8443
ENGINE_PORT = 18001
TOKENS = 600
SPEED = 0.08  # ~0.2 s a token: the stream would last minutes

NETNS_PREFIX = "ding"  # (the `netlab` fixture's namespace names)

# Streams one chat completion; after the first 2 pieces it writes the `first` file, then
# reads on until the stream ends or fails (after the cut: it fails, or its timeout ends it).
_CLIENT = """
import pathlib, sys, openai
base, key, out, model, tokens = sys.argv[1:6]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=60)
stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "tell me a long story"}],
    max_tokens=int(tokens), stream=True, extra_body={"ignore_eos": True})
pieces = 0
try:
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces += 1
            if pieces == 2:
                pathlib.Path(out + ".first").write_text("")
except Exception as exc:
    print("stream ended:", repr(exc)[:300])
"""

_GET = """
import sys, urllib.request
req = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + sys.argv[2]})
try:
    with urllib.request.urlopen(req, timeout=10) as r:
        print(r.read().decode())
except Exception as e:
    print("error:", repr(e))
"""


def _get(lab: NetLab, ns: str, url: str, key: str = "") -> str:
    return lab.run(ns, sys.executable, "-c", _GET, url, key, check=False, timeout=30)


def _serving(lab: NetLab, ns: str, key: str) -> bool:
    """The ingress lists the provider SERVING, with an HTTP address (the direct path)."""
    out = _get(lab, ns, f"http://{INGRESS_HTTP}/v1/fabric/nodes", key)
    try:
        nodes = json.loads(out).get("nodes", [])
    except ValueError:
        return False
    return any(n["state"] == "SERVING" and n["http_addr"] for n in nodes)


def _direct_connections(lab: NetLab, prov: str) -> int:
    """Established connections the provider accepted on its data plane port."""
    out = lab.run(prov, "ss", "-Htn", "state", "established", f"( sport = :{DATAPLANE_PORT} )")
    return len([line for line in out.splitlines() if line.strip()])


def _engine_running(lab: NetLab, prov: str) -> int | None:
    """The engine's running requests (vLLM's gauge on the sim's /metrics), None if unread."""
    out = _get(lab, prov, f"http://127.0.0.1:{ENGINE_PORT}/metrics")
    for line in out.splitlines():
        if line.startswith("vllm:num_requests_running "):
            return int(float(line.split()[1]))
    return None


def test_a_provider_whose_ingress_vanishes_closes_the_stream_within_the_keepalive_bound(
    netlab: NetLab, tmp_path: pathlib.Path
) -> None:
    lab = netlab
    ing, prov = lab.ns("ing"), lab.ns("prov")
    lab.link(ing, f"{ING}/24", prov, f"{PROV}/24")

    config = keepalive_config(tmp_path / "keepalive.yaml")
    common = ["--network-secret", secrets.token_urlsafe(24), "--preset", "local"]
    home = tmp_path / "ingress"
    lab.popen(
        ing,
        [
            *CLI,
            "start",
            "--home",
            str(home),
            "--listen",
            f"{ING}:7946",
            "--http-listen",
            INGRESS_HTTP,
            "--ingress",
            "--idle-timeout",
            "120",
            *common,
        ],
        str(tmp_path / "ingress.log"),
    )
    lab.popen(
        prov,
        [
            *CLI,
            "start",
            "--config",
            str(config),
            "--home",
            str(tmp_path / "prov"),
            "--listen",
            f"{PROV}:7946",
            "--http-listen",
            f"{PROV}:8090",
            "--dataplane-port",
            str(DATAPLANE_PORT),
            "--bootstrap",
            f"{ING}:7946",
            "--provider",
            "prov",
            *common,
            "--process",
            *CLI,
            "engine",
            "sim",
            "--model",
            MODEL,
            "--gpu",
            "H100-SXM",
            "--port",
            str(ENGINE_PORT),
            "--speed",
            str(SPEED),
        ],
        str(tmp_path / "prov.log"),
    )

    def logs() -> dict[str, str]:
        return {p.name: p.read_text()[-3000:] for p in tmp_path.glob("*.log")}

    key = ""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.5)
        key_file = home / "admin.key"
        if key_file.exists():
            key = key_file.read_text().strip()
            if _serving(lab, ing, key):
                break
    else:
        raise AssertionError(f"the provider is not serving with a direct address: {logs()}")

    _, first = start_stream(lab, ing, _CLIENT, f"http://{INGRESS_HTTP}/v1", key,
                            tmp_path / "stream", MODEL, TOKENS, tmp_path / "client.log")
    assert first.exists(), logs()
    # Mid-stream: the provider holds the ingress's direct connection, the engine generates.
    assert _direct_connections(lab, prov) >= 1, logs()
    assert _engine_running(lab, prov) == 1, logs()

    # The ingress's host vanishes for the provider: nothing from it or to it passes any more.
    rules = [f"iptables -I INPUT -s {PROV} -j DROP", f"iptables -I OUTPUT -d {PROV} -j DROP"]
    lab.run(ing, "sh", "-ec", " && ".join(rules))
    cut = time.monotonic()

    bound = 3 * DEAD_AFTER_S
    closed_after = stopped_after = None
    while time.monotonic() - cut < bound and (closed_after is None or stopped_after is None):
        if closed_after is None and _direct_connections(lab, prov) == 0:
            closed_after = time.monotonic() - cut
        if stopped_after is None and _engine_running(lab, prov) == 0:
            stopped_after = time.monotonic() - cut
        time.sleep(0.25)
    assert closed_after is not None, (
        f"the provider still holds the dead ingress's connection {bound} s after the cut",
        logs(),
    )
    assert stopped_after is not None, (
        f"the engine still generates for the dead ingress {bound} s after the cut",
        logs(),
    )
    print(
        f"the provider closed the dead ingress's connection {closed_after:.2f} s and its "
        f"engine stopped the request {stopped_after:.2f} s after the cut (keepalive: dead "
        f"after {DEAD_AFTER_S} s)"
    )
