"""Mid-stream continuation through a relay, with real processes on loopback.

Two sites that cannot dial each other and a public relay (the seed): the ingress and a
provider join through the relay and each advertise a peer address nobody answers on (their
dial-back fails, so each keeps an outbound connection to the relay and publishes it). No
connection ever links that provider with the ingress, so every request to it goes through
the relay (a provider that could dial the ingress would be reached over its own outbound
connection). A second provider joins through the ingress and is reached directly.
The official openai SDK streams through the ingress; the relayed node is SIGKILLed while it
streams. The client's one stream goes on from the direct node and ends with exactly the text
of an uninterrupted run of the deterministic simulated engine, under one id, with no error,
usage counting both parts; the trace shows the first attempt went via the relay. The same
holds when the relay itself is killed mid-stream (a second relayed provider, then the relay).

The ingress routes by conversation (`--policy session`): the first attempt goes to the ring
owner of the request's `X-Session-Id` among the candidates, so the test picks a session key
the relayed node owns (cheap one-token probes; the same key always maps to the same node)
and its stream starts there every time. A continuation excludes the tried node, so the
direct node, which no allowlist or filter excludes, is the next on the ring.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from llmfabric.engines import text
from llmfabric.launch.local import EngineSpec, LocalFabric, NodeProcess
from llmfabric.testing.poll import wait_for_value

from ._sdk_clients import tracked

pytestmark = pytest.mark.slow

MODEL = "llama-3.1-8b"
TOKENS = 100
# The relayed (killed) providers run at ~64 ms a token: the kill after 10 pieces comes long
# before their stream could end, however late the loaded client reads; the direct node
# (the continuation's) at full speed.
RELAYED_SPEED = 0.25
CUT = re.compile(r"a stream cut after (\d+) tokens continued on node (\S+)")


@dataclass(slots=True)
class Fab:
    fab: LocalFabric
    relay: NodeProcess
    direct: NodeProcess


def _relayed_node(fab: LocalFabric, relay: NodeProcess, name: str) -> NodeProcess:
    """A provider that joins through the relay and cannot be dialled (its record names the
    relay before this returns)."""
    node = fab.add_node(
        EngineSpec(MODEL, "H100-SXM", provider=name, speed=RELAYED_SPEED),
        name,
        "--public-addr",
        "127.0.0.1:1",
        bootstrap=relay,
    )
    assert fab.ingress is not None
    deadline = time.monotonic() + 90
    while True:
        with contextlib.suppress(OSError, ValueError):
            nodes = {n["provider_id"]: n for n in fab.ingress.get_json("/v1/fabric/nodes")["nodes"]}
            me = nodes.get(name, {})
            if me.get("state") == "SERVING" and me.get("relays") and nodes["fabric"]["relays"]:
                return node
        assert time.monotonic() < deadline, fab.tail(node)
        time.sleep(0.3)


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fab]:
    with LocalFabric(tmp_path_factory.mktemp("relay-continuation")) as fab:
        relay = fab.add_bare_node("relay", "--relay", "--tier", "stable")  # the seed
        fab.wait_http(relay)
        fab.start_ingress(
            "--bootstrap",
            relay.peer_addr,
            "--public-addr",
            "127.0.0.1:1",
            "--policy",
            "session",
            relay=False,
        )
        direct = fab.add_node(EngineSpec(MODEL, "H100-SXM", provider="direct", speed=1.0), "direct")
        fab.wait_serving({MODEL: 1}, timeout=120)
        yield Fab(fab, relay, direct)


def _get(fab: LocalFabric, path: str) -> dict[str, object]:
    assert fab.ingress is not None
    req = urllib.request.Request(
        fab.ingress.http_url + path, headers={"Authorization": f"Bearer {fab.admin_key()}"}
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        out: dict[str, object] = json.loads(r.read())
        return out


def _session_owned_by(client: openai.OpenAI, victim_sid: str) -> str:
    """An `X-Session-Id` whose requests the session policy routes to `victim_sid` first.

    One-token probes of fixed keys: the ring owner of a key is fixed while the candidates
    are, so the stream sent with the key found starts on the victim."""
    for i in range(64):
        key = f"relay-continuation-{i}"
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "probe"}],
            max_tokens=1,
            extra_headers={"X-Session-Id": key},
        )
        if raw.headers.get("x-fabric-node") == victim_sid:
            return key
    pytest.fail(f"no session key of 64 maps to the relayed node {victim_sid}")


def _cut_stream(f: Fab, victim: NodeProcess, kill: NodeProcess, prompt: str) -> None:
    """Stream `prompt` from `victim` (a relayed provider), SIGKILL `kill` after 10 pieces,
    and check what the client got and what the trace says."""
    fab = f.fab
    assert fab.ingress is not None
    client = tracked(openai.OpenAI(
        base_url=fab.ingress.http_url + "/v1", api_key=fab.admin_key(), max_retries=0, timeout=60
    ))
    victim_sid = victim.get_json("/v1/fabric/self")["session_id"]
    relay_peer = f.relay.get_json("/v1/fabric/self")["peer_id"]
    session = _session_owned_by(client, victim_sid)
    cuts_before = len(CUT.findall(fab.ingress.log_path.read_text()))
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
        extra_headers={"X-Session-Id": session},
    )
    assert raw.headers.get("x-fabric-node") == victim_sid  # pinned by the session key
    pieces: list[str] = []
    ids: set[str] = set()
    usage = None
    finish = None
    arrivals: list[float] = []  # after the kill
    for chunk in raw.parse():
        if arrivals or not kill.alive():
            arrivals.append(time.monotonic())
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices:
            if chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            finish = chunk.choices[0].finish_reason or finish
        if len(pieces) == 10 and kill.alive():
            kill.kill_hard()  # dies mid-stream
            arrivals.append(time.monotonic())
    assert not kill.alive()
    # The cut's added latency: the longest wait between two chunks after the kill (the
    # client drains what it had buffered first) over the median one.
    gaps = sorted(b - a for a, b in itertools.pairwise(arrivals))
    print(
        f"\nkilled {kill.name} mid-stream: the client waited "
        f"{(gaps[-1] - gaps[len(gaps) // 2]) * 1000:.0f} ms more than between two chunks"
    )
    whole = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=TOKENS,
        extra_body={"ignore_eos": True},
    )
    got = "".join(pieces)
    assert got == whole.choices[0].message.content
    assert len(got.split()) == TOKENS and finish == "length" and len(ids) == 1
    assert usage is not None and whole.usage is not None
    assert usage.completion_tokens == TOKENS
    # The ingress logs the cut: after how many tokens (fewer than the whole), continued where.
    direct_sid = f.direct.get_json("/v1/fabric/self")["session_id"]
    cuts = CUT.findall(fab.ingress.log_path.read_text())[cuts_before:]
    assert len(cuts) == 1, cuts
    relayed, node = int(cuts[0][0]), cuts[0][1]
    assert 10 <= relayed < TOKENS and node == direct_sid, cuts
    print(f"the stream was cut after {relayed} of {TOKENS} tokens (session key {session!r})")
    # Prompt usage: the continuation's prompt less the relayed tokens. The sim counts a
    # message as chars / 4 + 4 and its answer one word a token, so the added assistant
    # message (the relayed words) costs its chars / 4 + 4 less the `relayed` tokens.
    said = " ".join(got.split()[:relayed])
    extra = text.count_tokens(said) + text.CHAT_MESSAGE_OVERHEAD - relayed
    assert usage.prompt_tokens == whole.usage.prompt_tokens + extra, (relayed, said)
    # The trace: the first attempt went to the relayed node via the relay and broke off
    # mid-stream; the continuation went to the direct node.
    trace_id = raw.headers["x-fabric-trace"]

    def the_trace() -> list[dict[str, Any]]:
        data = _get(fab, "/v1/fabric/traces?limit=50")["data"]
        assert isinstance(data, list)
        return [t for t in data if t["trace_id"] == trace_id]

    # (kept when the stream's handler returns, after its last byte went out)
    [trace] = wait_for_value(the_trace, 30.0, f"the trace {trace_id} at the ingress")
    attempts = sorted(
        (sp for sp in trace["spans"] if sp["name"] == "attempt"), key=lambda sp: sp["start_ms"]
    )
    first, last = attempts[0], attempts[-1]
    assert first["attrs"]["node"] == victim_sid
    assert first["attrs"]["via"] == "relay" and first["attrs"]["relay"] == relay_peer
    assert "failed mid-stream" in first["attrs"]["error"]
    assert last["attrs"]["node"] == direct_sid
    assert last["attrs"]["continuation"] is True and last["attrs"]["status"] == 200
    assert last["attrs"].get("via", "direct") != "relay"


def test_a_relayed_stream_survives_its_node_being_killed(fabric: Fab) -> None:
    nated = _relayed_node(fabric.fab, fabric.relay, "nated")
    _cut_stream(fabric, nated, nated, "tell me a long story about otters crossing a river")


def test_a_relayed_stream_survives_its_relay_being_killed(fabric: Fab) -> None:
    """Last in the module: it leaves the fabric without its relay."""
    nated = _relayed_node(fabric.fab, fabric.relay, "nated2")
    _cut_stream(fabric, nated, fabric.relay, "a long story about herons, please")
