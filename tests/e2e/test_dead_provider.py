"""A provider that vanishes mid-stream without closing (no FIN, no RST): the direct path's TCP
keepalive notices it, and the stream continues on the other provider, long before the
ingress's idle timeout (120 s) would have ended the wait.

    [pa] 10.208.1.2 ---- 10.208.1.1 [ing] 10.208.2.1 ---- 10.208.2.2 [pb]
    provider (sim)         ingress, routes between        provider (sim)
                           the two links; the client

The client reads the stream's first pieces; the test then DROPs every packet to and from
the provider that serves it (iptables in the ingress's namespace: the host vanished) and
the client times the rest. The stream is long and slow (~80 tokens at ~0.2 s each) so that
the DROP lands mid-stream even on a loaded machine, and the test checks it did: the
request's trace has two attempts, the victim's broken off mid-stream and a continuation on
the other provider, and the ingress logs the cut after fewer tokens than the whole stream.
With keepalive idle 2 s, interval 1 s, count 2 (dead after 4 s of silence) the stream must
end complete (finish_reason `length`, every token counted), the client never waiting more
than 3 x 4 s for a chunk after the cut. Without dead-peer detection it would wait out the
120 s idle timeout. Namespaces are named `dead<tag><role>` (removed at the end).
"""

from __future__ import annotations

import json
import pathlib
import re
import secrets
import sys
import time
from typing import Any

import pytest

from ._netns import DEAD_AFTER_S, NetLab, keepalive_config, start_stream

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLI = [sys.executable, "-m", "llmfabric.cli.main"]
MODEL = "llama-3.1-8b"
ING = {"a": "10.208.1.1", "b": "10.208.2.1"}
PROV = {"a": "10.208.1.2", "b": "10.208.2.2"}
INGRESS_HTTP = f"{ING['a']}:8080"
TOKENS = 80
SPEED = 0.08  # ~0.2 s a token: ~16 s of stream, the cut comes within its first seconds

# Streams one chat completion; after the first 2 pieces it says so (`first` file: serving
# node and trace id) and waits for the `cut` file, then reads the rest, timing every chunk
# from the cut.
_CLIENT = """
import json, pathlib, sys, time, openai
base, key, out, model, tokens = sys.argv[1:6]
first, cut = pathlib.Path(out + ".first"), pathlib.Path(out + ".cut")
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=60)
raw = client.chat.completions.with_raw_response.create(
    model=model, messages=[{"role": "user", "content": "tell me a story"}],
    max_tokens=int(tokens), stream=True, stream_options={"include_usage": True},
    extra_body={"ignore_eos": True})
pieces, finish, usage, error, arrivals = [], None, None, None, []
try:
    for chunk in raw.parse():
        if arrivals:
            arrivals.append(time.monotonic())
        if chunk.choices:
            if chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage.completion_tokens
        if not arrivals and len(pieces) >= 2:
            tmp = pathlib.Path(out + ".tmp")  # (renamed: the test never reads half of it)
            tmp.write_text(json.dumps({"node": raw.headers.get("x-fabric-node") or "",
                                       "trace": raw.headers.get("x-fabric-trace") or ""}))
            tmp.rename(first)
            while not cut.exists():
                time.sleep(0.01)
            arrivals.append(time.monotonic())
except Exception as exc:  # (e.g. the client's own 60 s read timeout)
    error = repr(exc)[:300]
gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
pathlib.Path(out).write_text(json.dumps({
    "pieces": len(pieces), "finish": finish, "usage": usage, "error": error,
    "after_cut_s": time.monotonic() - arrivals[0] if arrivals else None,
    "max_gap_s": max(gaps) if gaps else None}))
"""

_GET = """
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + sys.argv[2]})
try:
    with urllib.request.urlopen(req, timeout=10) as r:
        print(json.dumps(json.loads(r.read())))
except Exception as e:
    print(json.dumps({"error": repr(e)}))
"""


NETNS_PREFIX = "dead"  # (the `netlab` fixture's namespace names)


@pytest.fixture
def lab(netlab: NetLab) -> NetLab:
    return netlab


def _get(lab: NetLab, ns: str, key: str, path: str) -> dict[str, Any]:
    """GET the ingress's `path` from inside `ns` ({"error": ...} when it fails)."""
    out = lab.run(
        ns,
        sys.executable,
        "-c",
        _GET,
        f"http://{INGRESS_HTTP}{path}",
        key,
        check=False,
        timeout=30,
    )
    doc: dict[str, Any] = json.loads(out.strip().splitlines()[-1] if out.strip() else "{}")
    return doc


def _nodes(lab: NetLab, ns: str, key: str) -> dict[str, dict[str, Any]]:
    """{provider_id: node} of the SERVING providers the ingress lists."""
    return {
        n["provider_id"]: n
        for n in _get(lab, ns, key, "/v1/fabric/nodes").get("nodes", [])
        if n["state"] == "SERVING" and n["provider_id"] in ("pa", "pb")
    }


def _attempts(lab: NetLab, ns: str, key: str, trace_id: str) -> list[dict[str, Any]]:
    """The `attempt` spans of the trace `trace_id`, in start order (waits for the trace)."""
    deadline = time.monotonic() + 30  # (kept once the stream's handler returned)
    while True:
        doc = _get(lab, ns, key, "/v1/fabric/traces?limit=50")
        traces = [t for t in doc.get("data", []) if t["trace_id"] == trace_id]
        if traces or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert traces, doc
    spans = [sp for sp in traces[0]["spans"] if sp["name"] == "attempt"]
    return sorted(spans, key=lambda sp: sp["start_ms"])


def test_a_stream_whose_provider_vanishes_continues_within_the_keepalive_bound(
    lab: NetLab, tmp_path: pathlib.Path
) -> None:
    ing, ns_a, ns_b = lab.ns("ing"), lab.ns("a"), lab.ns("b")
    lab.link(ns_a, f"{PROV['a']}/24", ing, f"{ING['a']}/24")
    lab.link(ns_b, f"{PROV['b']}/24", ing, f"{ING['b']}/24")
    for side, ns in (("a", ns_a), ("b", ns_b)):
        lab.run(ns, "ip", "route", "add", "default", "via", ING[side])
    lab.run(ing, "sysctl", "-qw", "net.ipv4.ip_forward=1")

    config = keepalive_config(tmp_path / "ingress.yaml")
    common = ["--network-secret", secrets.token_urlsafe(24), "--preset", "local"]
    home = tmp_path / "ingress"
    lab.popen(
        ing,
        [
            *CLI,
            "start",
            "--config",
            str(config),
            "--home",
            str(home),
            "--listen",
            f"{ING['a']}:7946",
            "--http-listen",
            INGRESS_HTTP,
            "--ingress",
            "--idle-timeout",
            "120",
            "--connect-timeout",
            "2",
            *common,
        ],
        str(tmp_path / "ingress.log"),
    )
    for side, ns in (("a", ns_a), ("b", ns_b)):
        lab.popen(
            ns,
            [
                *CLI,
                "start",
                "--home",
                str(tmp_path / f"p{side}"),
                "--listen",
                f"{PROV[side]}:7946",
                "--http-listen",
                f"{PROV[side]}:8090",
                "--bootstrap",
                f"{ING['a']}:7946",
                "--provider",
                f"p{side}",
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
                "18001",
                "--speed",
                str(SPEED),
            ],
            str(tmp_path / f"p{side}.log"),
        )

    key, nodes = "", {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(nodes) < 2:
        time.sleep(0.5)
        key_file = home / "admin.key"
        if key_file.exists():
            key = key_file.read_text().strip()
            nodes = _nodes(lab, ing, key)
    logs = {p.name: p.read_text()[-3000:] for p in tmp_path.glob("*.log")}
    assert len(nodes) == 2, logs
    assert all(n["http_addr"] for n in nodes.values()), nodes  # the direct path, not relays

    out = tmp_path / "stream.json"
    client, first = start_stream(lab, ing, _CLIENT, f"http://{INGRESS_HTTP}/v1", key, out,
                                 MODEL, TOKENS, tmp_path / "client.log")
    assert first.exists(), (tmp_path / "client.log").read_text()[-3000:]
    started = json.loads(first.read_text())
    [victim] = [n for n in nodes.values() if n["session_id"] == started["node"]]
    [other] = [n for n in nodes.values() if n is not victim]
    ip = victim["http_addr"].rpartition(":")[0]
    # The provider's host vanishes: nothing from it or to it passes any more, no FIN, no RST
    # (one namespace entry for the four rules: the cut comes quickly even on a loaded host).
    rules = [
        f"iptables -I {chain} {flag} {ip} -j DROP"
        for chain, flag in (("INPUT", "-s"), ("OUTPUT", "-d"), ("FORWARD", "-s"), ("FORWARD", "-d"))
    ]
    lab.run(ing, "sh", "-ec", " && ".join(rules))
    pathlib.Path(str(out) + ".cut").write_text("")

    client.wait(timeout=120)
    logs = {p.name: p.read_text()[-3000:] for p in tmp_path.glob("*.log")}
    assert out.exists(), logs
    result = json.loads(out.read_text())
    assert result["error"] is None, (result, logs)
    # Every token arrived (the rest from the other provider: the victim's packets are
    # dropped) and the stream ended normally, counted in full.
    assert result["finish"] == "length", (result, logs)
    assert result["usage"] == TOKENS, (result, logs)
    assert result["pieces"] >= TOKENS - 1, (result, logs)

    # The DROP landed mid-stream and the stream really was continued: the trace has the
    # victim's attempt, broken off mid-stream, then a continuation on the other provider...
    attempts = _attempts(lab, ing, key, started["trace"])
    assert len(attempts) >= 2, (attempts, logs)
    assert attempts[0]["attrs"]["node"] == victim["session_id"], attempts
    assert "failed mid-stream" in attempts[0]["attrs"].get("error", ""), attempts
    assert attempts[-1]["attrs"]["node"] == other["session_id"], attempts
    assert attempts[-1]["attrs"].get("continuation") is True, attempts
    assert attempts[-1]["attrs"]["status"] == 200, attempts
    # ... and the ingress cut the victim's part after fewer tokens than the whole stream.
    cuts = re.findall(
        r"a stream cut after (\d+) tokens continued on node (\S+)",
        (tmp_path / "ingress.log").read_text(),
    )
    assert len(cuts) == 1, (cuts, logs)
    relayed, node = int(cuts[0][0]), cuts[0][1]
    assert node == other["session_id"], cuts
    assert 2 <= relayed < TOKENS, cuts

    # The wait it caused is bounded by the keepalive settings, not by the 120 s idle timeout:
    # no chunk after the cut came more than 3 x (dead after) after the one before it.
    assert result["max_gap_s"] < 3 * DEAD_AFTER_S, (result, logs)
    print(
        f"victim {victim['provider_id']}: cut after {relayed} of {TOKENS} tokens, the client "
        f"waited at most {result['max_gap_s']:.2f} s for a chunk after the cut, the stream "
        f"ended {result['after_cut_s']:.2f} s after it (keepalive: dead after {DEAD_AFTER_S} s)"
    )
