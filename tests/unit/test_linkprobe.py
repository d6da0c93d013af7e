"""Link probing (net/linkprobe.py) on virtual time over an in-memory network of shaped links."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.net.linkprobe import (
    MAX_LINKS,
    LinkProber,
    LinkTable,
    LinkTableError,
    parse_link_table,
)
from llmfabric.testing.fake_clock import FakeClock


class ShapedLinks:
    """An in-memory network: each (src, dst) link has an RTT and a bandwidth; a probe of n
    bytes takes rtt + n / bandwidth on the fake clock. Missing links are unreachable."""

    def __init__(self, clock: FakeClock, src: str, links: dict[str, tuple[float, float]]):
        self.clock, self.src, self.links = clock, src, links
        self.sent: list[tuple[str, int, float]] = []

    async def probe(self, peer: str, n: int) -> None:
        if peer not in self.links:
            await self.clock.sleep(1.0)
            raise ConnectionError(f"{peer} unreachable")
        rtt, bw = self.links[peer]
        self.sent.append((peer, n, self.clock.now()))
        await self.clock.sleep(rtt + n / bw)


def _prober(clock: FakeClock, net: ShapedLinks, peers: list[str], **kw: object) -> LinkProber:
    return LinkProber(clock, net.probe, lambda: list(peers), LinkTable(),
                      rng=random.Random(1), **kw)  # type: ignore[arg-type]


async def test_a_probe_recovers_the_links_rtt_and_bandwidth() -> None:
    clock = FakeClock()
    net = ShapedLinks(clock, "a", {"b": (0.010, 12.5e6), "c": (0.0002, 1.25e9)})
    prober = _prober(clock, net, ["b", "c"], small_bytes=256, large_bytes=256 * 1024)
    task = asyncio.ensure_future(prober.round())
    await clock.advance(5)
    assert await task == 2
    b, c = prober.table.get("b"), prober.table.get("c")
    assert b is not None and c is not None
    # The small request's time is the RTT plus its own 256 B of serialization.
    assert b.rtt_s == pytest.approx(0.010 + 256 / 12.5e6)
    assert b.bytes_per_s == pytest.approx(12.5e6)
    assert c.bytes_per_s == pytest.approx(1.25e9)
    assert c.rtt_s < b.rtt_s


async def test_rounds_are_bounded_and_visit_the_least_recently_probed_first() -> None:
    clock = FakeClock()
    peers = [f"p{i}" for i in range(10)]
    net = ShapedLinks(clock, "a", {p: (0.001, 1e8) for p in peers})
    prober = _prober(clock, net, peers, interval_s=10, peers_per_round=3)
    for _ in range(4):
        task = asyncio.ensure_future(prober.round())
        await clock.advance(10)
        assert await task == 3
    probed = [p for p, n, _ in net.sent if n == prober.large_bytes]
    assert len(probed) == 12
    assert len(set(probed[:9])) == 9  # no peer twice before every other one was probed
    assert set(probed) == set(peers)  # everyone within ceil(10 / 3) rounds
    assert probed[9] not in probed[:9]  # the last unprobed peer goes first in round 4
    assert len(prober.table) == 10


async def test_the_probing_rate_is_bounded() -> None:
    clock = FakeClock()
    peers = [f"p{i}" for i in range(50)]
    net = ShapedLinks(clock, "a", {p: (0.0001, 1e9) for p in peers})
    prober = _prober(clock, net, peers, interval_s=60, peers_per_round=4)
    task = asyncio.ensure_future(prober.run())
    await clock.advance(3600)
    task.cancel()
    sent = sum(n for _, n, _ in net.sent)
    # At most peers_per_round x (small + large) per round, rounds >= 0.75 x interval apart.
    bound = 4 * (prober.small_bytes + prober.large_bytes) * (3600 / (0.75 * 60) + 1)
    assert 0 < sent <= bound
    assert sent / 3600 < 25_000  # ~17 KB/s by default


async def test_an_unreachable_peer_is_counted_and_tried_again() -> None:
    clock = FakeClock()
    net = ShapedLinks(clock, "a", {"b": (0.001, 1e8)})
    prober = _prober(clock, net, ["b", "gone"], interval_s=5)
    task = asyncio.ensure_future(prober.run(first_delay_s=1))
    await clock.advance(30)
    task.cancel()
    assert prober.failures >= 2
    assert prober.table.get("gone") is None and prober.table.get("b") is not None


def test_the_table_smooths_and_stays_bounded() -> None:
    table = LinkTable(max_entries=3, alpha=0.5)
    table.update("a", 0.010, 1e6, 1.0)
    est = table.update("a", 0.020, 3e6, 2.0)
    assert (est.rtt_s, est.bytes_per_s, est.samples) == (pytest.approx(0.015), 2e6, 2)
    for p in ("b", "c", "d"):
        table.update(p, 0.001, 1e9, 3.0)
    assert [e.peer for e in table.entries()] == ["b", "c", "d"]  # "a" measured longest ago
    table.forget(["c"])
    assert [e.peer for e in table.entries()] == ["c"]


def test_a_table_round_trips() -> None:
    table = LinkTable()
    for i in range(MAX_LINKS + 5):
        table.update(f"peer-{i}", 0.001 * (i + 1), 1e6 * (i + 1), 1_700_000_000.0)
    parsed = parse_link_table(table.to_json())
    assert parsed == table.entries() and len(parsed) == MAX_LINKS


GOOD = {"peer": "abc", "rtt_s": 0.001, "bytes_per_s": 1e9, "samples": 3, "measured_at": 1.0}


@pytest.mark.parametrize("bad", [
    None, [], {"links": "x"}, {"links": [1]},
    {"links": [{**GOOD, "rtt_s": float("nan")}]},
    {"links": [{**GOOD, "rtt_s": -1}]},
    {"links": [{**GOOD, "rtt_s": 1e9}]},
    {"links": [{**GOOD, "bytes_per_s": float("inf")}]},
    {"links": [{**GOOD, "bytes_per_s": 0}]},
    {"links": [{**GOOD, "bytes_per_s": True}]},
    {"links": [{**GOOD, "bytes_per_s": "1e9"}]},
    {"links": [{**GOOD, "samples": 0}]},
    {"links": [{**GOOD, "samples": 1.5}]},
    {"links": [{**GOOD, "peer": "../etc"}]},
    {"links": [{**GOOD, "peer": "x" * 500}]},
    {"links": [GOOD, GOOD]},
    {"links": [{**GOOD, "peer": f"p{i}"} for i in range(MAX_LINKS + 1)]},
])
def test_hostile_tables_are_refused(bad: object) -> None:
    with pytest.raises(LinkTableError):
        parse_link_table(bad)


@given(st.lists(st.tuples(st.floats(0, 60), st.floats(1e3, 1e13)), min_size=1, max_size=50))
def test_estimates_stay_within_the_extremes_of_their_samples(
        samples: list[tuple[float, float]]) -> None:
    table = LinkTable(alpha=0.3)
    for rtt, bw in samples:
        est = table.update("p", rtt, bw, 0.0)
    rtts, bws = [s[0] for s in samples], [s[1] for s in samples]
    assert min(rtts) - 1e-12 <= est.rtt_s <= max(rtts) + 1e-12
    assert min(bws) * (1 - 1e-9) <= est.bytes_per_s <= max(bws) * (1 + 1e-9)
    assert math.isfinite(est.rtt_s) and parse_link_table(table.to_json()) == [est]
