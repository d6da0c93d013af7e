"""The hop past the ingress in its traces, through the real request core and the real peer
forwarder (the transport stands in): the node's X-Fabric-Node-Time becomes a `node` span
under the attempt's `forward` (dropped when invalid), and a response that came through a
relay marks its attempt `via=relay`; without a tracer nothing of it is read."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from llmfabric.forward.peer import PeerForwarder, peer_hop
from llmfabric.ingress import IngressConfig, StaticCandidateSource
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.tracing import traced
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate
from llmfabric.telemetry.node_hop import NodeHop
from llmfabric.testing.sinks import NoSink

pytestmark = pytest.mark.unit

ANSWER = orjson.dumps({"choices": [{"index": 0, "message": {"role": "assistant",
                                                            "content": "hi"}}]})


@dataclass
class Resp:
    headers: Sequence[tuple[str, str]]
    via: str | None
    status: int = 200

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        yield ANSWER

    async def aclose(self) -> None:
        return None


@dataclass
class Transport:
    node_time: str | None
    via: str | None
    seen: list[dict[str, str]] = field(default_factory=list)

    async def request(self, peer_id: str, method: str, path: str,
                      headers: Sequence[tuple[str, str]], body: bytes, *,
                      timeout: float = 30.0) -> Resp:  # noqa: ASYNC109
        self.seen.append(dict(headers))
        h = [("content-type", "application/json")]
        if self.node_time is not None:
            h.append(("x-fabric-node-time", self.node_time))
        return Resp(h, self.via)


def _ingress(transport: Transport, keep_traces: int = 10) -> Ingress:
    cand = Candidate("node-r", "peer-r", "p", "", ("relay-1",), Hardware("H100", 1),
                     ServedModel("m"), LoadHints())
    return Ingress(IngressConfig(auth_enabled=False, keep_traces=keep_traces),
                   StaticCandidateSource([cand]), PeerForwarder(transport))


async def _one(ing: Ingress) -> dict[str, Any]:
    sink = NoSink()
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    reply = await traced(ing.tracer, None, sink, lambda: ing.serve(
        "/v1/chat/completions", True, "", None, body, sink))
    assert reply is not None and reply.status == 200
    assert ing.tracer is not None
    [trace] = ing.tracer.recent(1)
    return {s["name"]: s for s in trace["spans"]}


async def test_a_relayed_attempt_carries_via_and_the_nodes_span() -> None:
    t = Transport(node_time="0.5", via="relay-1")
    spans = await _one(_ingress(t))
    assert "traceparent" in t.seen[0]  # (a traced request: the node answers with its time)
    assert spans["attempt"]["attrs"]["via"] == "relay"
    assert spans["attempt"]["attrs"]["relay"] == "relay-1"
    node, fwd = spans["node"], spans["forward"]
    assert node["parent_id"] == fwd["span_id"] and node["attrs"]["reported_ms"] == 0.5
    assert fwd["start_ms"] <= node["start_ms"] <= node["end_ms"] <= fwd["end_ms"]


@pytest.mark.parametrize("bad", ["-3", "nan", "1e999", "12ms", "9" * 30])
async def test_an_invalid_node_time_leaves_no_node_span(bad: str) -> None:
    spans = await _one(_ingress(Transport(node_time=bad, via=None)))
    assert "node" not in spans and "via" not in spans["attempt"]["attrs"]


async def test_direct_peer_responses_are_not_marked() -> None:
    t = Transport(node_time="1.25", via=None)
    assert peer_hop(await t.request("p", "POST", "/", (), b"")) == NodeHop(1.25, "")
    up = await PeerForwarder(t).open(
        Candidate("n", "peer", "p", "", (), Hardware("H100", 1), ServedModel("m"), LoadHints()),
        "/v1/chat/completions", b"{}", Timeouts())
    assert up.hop == NodeHop(1.25, "") and up.hop.via == "direct"
