"""The link service (net/link_service.py) on two real TlsTransports on loopback: probes over
the peer protocol fill the table, peers' tables are collected, and hostile answers (a
malformed or oversized table, an oversized probe) are refused."""

from __future__ import annotations

import random

import orjson
import pytest

from llmfabric.clock import SystemClock
from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.net import HandlerResponse, NetError, PeerRequest, TlsTransport
from llmfabric.net.link_service import LINKS_PATH, MAX_PROBE_BYTES, LinkService

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")


def _transport() -> TlsTransport:
    return TlsTransport(NodeKey.generate(), PskAdmission("test", b"s" * 32))


def _service(t: TlsTransport, peers: list[str]) -> LinkService:
    svc = LinkService(t, SystemClock(), lambda: peers, interval_s=0, rng=random.Random(0))
    t.set_request_handler(svc.handle)
    return svc


async def test_probes_fill_the_table_and_the_fabric_view_collects_peer_tables() -> None:
    a, b = _transport(), _transport()
    async with a, b:
        await a.connect_bootstrap(b.listen_addr)
        sa = _service(a, [b.local_id])
        sb = _service(b, [a.local_id])
        est = await sa.prober.measure(b.local_id)
        assert est.peer == b.local_id and 0 < est.rtt_s < 5 and est.bytes_per_s > 1e5
        await sb.prober.measure(a.local_id)  # b measures a over the same connection
        view = await sa.fabric()
        assert view["self"] == a.local_id
        by_peer = {n["peer"]: n for n in view["nodes"]}
        assert [x["peer"] for x in by_peer[a.local_id]["links"]] == [b.local_id]
        assert [x["peer"] for x in by_peer[b.local_id]["links"]] == [a.local_id]


@pytest.mark.parametrize("answer", [
    orjson.dumps({"links": [{"peer": "x", "rtt_s": float("nan"), "bytes_per_s": 1e9}]}),
    orjson.dumps({"links": [{"peer": f"p{i}", "rtt_s": 0.001, "bytes_per_s": 1e9,
                             "samples": 1, "measured_at": 1.0} for i in range(40)]}),
    b"{" * 70_000,
    b"not json",
])
async def test_a_hostile_peer_table_becomes_an_error_entry(answer: bytes) -> None:
    a, b = _transport(), _transport()
    async with a, b:
        await a.connect_bootstrap(b.listen_addr)
        sa = _service(a, [b.local_id])

        async def liar(request: PeerRequest) -> HandlerResponse:
            assert request.path == LINKS_PATH
            return HandlerResponse(200, (("content-type", "application/json"),), answer)

        b.set_request_handler(liar)
        view = await sa.fabric()
        entry = next(n for n in view["nodes"] if n["peer"] == b.local_id)
        assert "error" in entry and "links" not in entry


async def test_an_oversized_probe_is_refused() -> None:
    a, b = _transport(), _transport()
    async with a, b:
        await a.connect_bootstrap(b.listen_addr)
        sa = _service(a, [b.local_id])
        _service(b, [a.local_id])
        with pytest.raises(NetError, match="413"):
            await sa.probe(b.local_id, MAX_PROBE_BYTES + 1)
        await sa.probe(b.local_id, MAX_PROBE_BYTES)  # the limit itself is fine


async def test_the_fabric_view_is_collected_once_per_ttl() -> None:
    a, b = _transport(), _transport()
    async with a, b:
        await a.connect_bootstrap(b.listen_addr)
        sa = _service(a, [b.local_id])
        asked = 0

        async def count(request: PeerRequest) -> HandlerResponse:
            nonlocal asked
            asked += 1
            return HandlerResponse(200, (), b'{"links": []}')

        b.set_request_handler(count)
        views = [await sa.fabric() for _ in range(5)]
        assert asked == 1 and all(v == views[0] for v in views)
