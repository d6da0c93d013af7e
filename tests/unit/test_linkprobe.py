"""Link probing (net/linkprobe.py) on virtual time over an in-memory network of shaped links."""

from __future__ import annotations

import asyncio
import logging
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
    fit_link,
    parse_link_table,
)
from llmfabric.testing.fake_clock import FakeClock


class ShapedLinks:
    """An in-memory network: each (src, dst) link has an RTT and a bandwidth; a probe of n
    bytes takes rtt + n / bandwidth on the fake clock. Missing links are unreachable."""

    def __init__(
        self,
        clock: FakeClock,
        src: str,
        links: dict[str, tuple[float, float]],
        stalls: dict[int, float] | None = None,
    ):
        self.clock, self.src, self.links = clock, src, links
        self.sent: list[tuple[str, int, float]] = []
        self.stalls = stalls or {}  # request index -> extra delay (a stalled host, a queue)

    async def probe(self, peer: str, n: int) -> None:
        if peer not in self.links:
            await self.clock.sleep(1.0)
            raise ConnectionError(f"{peer} unreachable")
        rtt, bw = self.links[peer]
        stall = self.stalls.get(len(self.sent), 0.0)
        self.sent.append((peer, n, self.clock.now()))
        await self.clock.sleep(rtt + n / bw + stall)


def _prober(clock: FakeClock, net: ShapedLinks, peers: list[str], **kw: object) -> LinkProber:
    return LinkProber(
        clock,
        net.probe,
        lambda: list(peers),
        LinkTable(),
        rng=random.Random(1),
        **kw,  # type: ignore[arg-type]
    )


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


async def _probe_once(
    net: ShapedLinks, clock: FakeClock, peer: str, **kw: object
) -> tuple[float, float]:
    prober = _prober(clock, net, [peer], **kw)
    task = asyncio.ensure_future(prober.round())
    await clock.advance(10)
    assert await task == 1
    est = prober.table.get(peer)
    assert est is not None
    return est.rtt_s, est.bytes_per_s


# A 1 MB/s link (the e2e test's tc rate) with a 1 ms RTT: its true times, for the defaults.
RTT, BW, SMALL, LARGE = 0.001, 1e6, 256, 80 * 1024


@pytest.mark.parametrize("stalled", [0, 2, 4])  # the first, second or third small request
async def test_a_stalled_small_request_does_not_inflate_the_throughput(stalled: int) -> None:
    clock = FakeClock()
    # 50 ms of stall on one small request: a loaded host's scheduler, a queue. One timed
    # pair would read (LARGE - SMALL) / (LARGE / BW - 0.05): ~2.6 MB/s on a 1 MB/s link.
    net = ShapedLinks(clock, "a", {"b": (RTT, BW)}, stalls={stalled: 0.050})
    rtt, bw = await _probe_once(net, clock, "b")
    single = (LARGE - SMALL) / ((RTT + LARGE / BW) - (RTT + SMALL / BW + 0.050))
    assert single > 2 * BW  # what the earlier single-pair fit would have published
    assert bw == pytest.approx(BW, rel=0.01)
    assert rtt == pytest.approx(RTT + SMALL / BW)
    assert [n for _, n, _ in net.sent] == [SMALL, LARGE] * 3


@pytest.mark.parametrize("pause_s", [0.5, 0.0])
async def test_the_pairs_of_a_probe_are_spaced_by_jittered_pauses(pause_s: float) -> None:
    # Spaced pairs: one burst of cross traffic on the link (the peer's own probe of us, whose
    # answers queue behind it) cannot hold up every small request of the probe.
    clock = FakeClock()
    net = ShapedLinks(clock, "a", {"b": (RTT, BW)})
    await _probe_once(net, clock, "b", pause_s=pause_s)
    starts = [t for _, _, t in net.sent]
    ends = [t + RTT + n / BW for _, n, t in net.sent]
    gaps = [starts[i] - ends[i - 1] for i in range(2, len(starts), 2)]  # large -> next small
    assert len(gaps) == 2
    assert all(0.5 * pause_s <= g <= 1.5 * pause_s for g in gaps)
    assert pause_s == 0 or gaps[0] != pytest.approx(gaps[1])  # jittered


async def test_a_stalled_large_request_does_not_deflate_the_throughput() -> None:
    clock = FakeClock()
    net = ShapedLinks(clock, "a", {"b": (RTT, BW)}, stalls={1: 0.200, 4: 0.010})
    rtt, bw = await _probe_once(net, clock, "b")
    assert bw == pytest.approx(BW, rel=0.01)  # one pair alone reads ~0.3 MB/s
    assert rtt == pytest.approx(RTT + SMALL / BW)  # the stalled small (#4) is not the min


async def test_a_link_too_fast_to_resolve_counts_the_whole_large_time() -> None:
    clock = FakeClock()
    # Every small request stalls more than a large one takes: the minima are degenerate,
    # and the estimate is the lower bound (LARGE - SMALL) / t_large, as before.
    net = ShapedLinks(clock, "a", {"b": (RTT, 1e9)}, stalls={0: 0.01, 2: 0.01, 4: 0.01})
    rtt, bw = await _probe_once(net, clock, "b")
    assert rtt == pytest.approx(RTT + SMALL / 1e9 + 0.01)
    assert bw == pytest.approx((LARGE - SMALL) / (RTT + LARGE / 1e9))


def test_fit_link_refuses_what_it_cannot_fit() -> None:
    for small, large, sb, lb in (
        ([], [1.0], 1, 2),
        ([1.0], [], 1, 2),
        ([1.0], [2.0], 2, 2),
        ([1.0], [2.0], 0, 2),
    ):
        with pytest.raises(ValueError):
            fit_link(small, large, sb, lb)
    probe = ShapedLinks(FakeClock(), "a", {}).probe
    for bad in ({"repeats": 0}, {"pause_s": -1.0}, {"pause_s": math.nan}):
        with pytest.raises(ValueError, match="repeats >= 1, pause_s >= 0"):
            LinkProber(FakeClock(), probe, list, LinkTable(), **bad)  # type: ignore[arg-type]


_spikes = st.floats(0.0, 10.0, allow_nan=False)


@given(rtt=st.floats(1e-6, 1.0), bw=st.floats(1e3, 1e10), repeats=st.integers(1, 6), data=st.data())
def test_delay_spikes_on_all_but_one_request_of_each_size_change_nothing(
    rtt: float, bw: float, repeats: int, data: st.DataObject
) -> None:
    """Stalls only add delay: with one undisturbed request of each size among the repeats,
    the fit is the link's, however large the other requests' stalls (and wherever the
    clean ones fall: a majority of the pairs may be disturbed)."""
    clean_small, clean_large = (data.draw(st.integers(0, repeats - 1)) for _ in range(2))
    small = [
        rtt + SMALL / bw + (0 if i == clean_small else data.draw(_spikes)) for i in range(repeats)
    ]
    large = [
        rtt + LARGE / bw + (0 if i == clean_large else data.draw(_spikes)) for i in range(repeats)
    ]
    got_rtt, got_bw = fit_link(small, large, SMALL, LARGE)
    assert got_rtt == pytest.approx(rtt + SMALL / bw)
    assert got_bw == pytest.approx(bw, rel=1e-6)


@given(st.lists(st.tuples(st.floats(0.0, 60.0), st.floats(0.0, 60.0)), min_size=1, max_size=8))
def test_the_fit_is_finite_positive_and_ignores_the_order_of_pairs(
    pairs: list[tuple[float, float]],
) -> None:
    small, large = [p[0] for p in pairs], [p[1] for p in pairs]
    rtt, bw = fit_link(small, large, SMALL, LARGE)
    assert rtt == min(small) and math.isfinite(bw) and bw > 0
    # Never below the lower bound of counting the fastest large request's whole time.
    assert bw >= (LARGE - SMALL) / max(min(large), 1e-9) * (1 - 1e-12)
    assert fit_link(small[::-1], large[::-1], SMALL, LARGE) == (rtt, bw)


async def test_rounds_are_bounded_and_visit_the_least_recently_probed_first() -> None:
    clock = FakeClock()
    peers = [f"p{i}" for i in range(10)]
    net = ShapedLinks(clock, "a", {p: (0.001, 1e8) for p in peers})
    prober = _prober(clock, net, peers, interval_s=10, peers_per_round=3)
    for _ in range(4):
        task = asyncio.ensure_future(prober.round())
        await clock.advance(10)
        assert await task == 3
    # Each probe is `repeats` small/large pairs to one peer: one entry per probe.
    probed = [p for p, n, _ in net.sent if n == prober.large_bytes][:: prober.repeats]
    assert len(net.sent) == 12 * 2 * prober.repeats
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
    # At most peers_per_round x repeats x (small + large) per round, rounds >= 0.75 x
    # interval apart.
    bound = 4 * 3 * (prober.small_bytes + prober.large_bytes) * (3600 / (0.75 * 60) + 1)
    assert 0 < sent <= bound
    assert sent / 3600 < 20_000  # ~16.4 KB/s by default


async def test_an_unreachable_peer_is_counted_and_tried_again() -> None:
    clock = FakeClock()
    net = ShapedLinks(clock, "a", {"b": (0.001, 1e8)})
    prober = _prober(clock, net, ["b", "gone"], interval_s=5)
    task = asyncio.ensure_future(prober.run(first_delay_s=1))
    await clock.advance(30)
    task.cancel()
    assert prober.failures >= 2
    assert prober.table.get("gone") is None and prober.table.get("b") is not None


async def test_failed_probes_and_rounds_are_logged_at_the_1st_2nd_4th_failure(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    net = ShapedLinks(clock, "a", {"b": (0.001, 1e8)})
    prober = _prober(clock, net, ["b", "gone"], interval_s=5)
    with caplog.at_level(logging.WARNING, logger="llmfabric.net.linkprobe"):
        for _ in range(5):
            task = asyncio.ensure_future(prober.round())
            await clock.advance(5)
            await task
        failed = [r for r in caplog.records if "link probe of gone" in r.getMessage()]
        assert prober.failures == 5 and len(failed) == 3  # the 1st, 2nd and 4th
        assert "ConnectionError('gone unreachable')" in failed[0].getMessage()
        assert not failed[0].exc_info  # (an unreachable peer: no traceback)
        # A bug in a round (here: the peer list) is logged with its traceback; probing goes on.
        calls = 0

        def flaky() -> list[str]:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise KeyError("peer list bug")
            return ["b"]

        prober = _prober(clock, net, [], interval_s=5)
        prober.peers = flaky
        task = asyncio.ensure_future(prober.run(first_delay_s=1))
        await clock.advance(20)
        task.cancel()
    assert prober.errors["round"] == 1 and prober.probes >= 1
    [bug] = [r for r in caplog.records if "link probe round failed" in r.getMessage()]
    assert bug.exc_info is not None


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


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        {"links": "x"},
        {"links": [1]},
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
    ],
)
def test_hostile_tables_are_refused(bad: object) -> None:
    with pytest.raises(LinkTableError):
        parse_link_table(bad)


@given(st.lists(st.tuples(st.floats(0, 60), st.floats(1e3, 1e13)), min_size=1, max_size=50))
def test_estimates_stay_within_the_extremes_of_their_samples(
    samples: list[tuple[float, float]],
) -> None:
    table = LinkTable(alpha=0.3)
    for rtt, bw in samples:
        est = table.update("p", rtt, bw, 0.0)
    rtts, bws = [s[0] for s in samples], [s[1] for s in samples]
    assert min(rtts) - 1e-12 <= est.rtt_s <= max(rtts) + 1e-12
    assert min(bws) * (1 - 1e-9) <= est.bytes_per_s <= max(bws) * (1 + 1e-9)
    assert math.isfinite(est.rtt_s) and parse_link_table(table.to_json()) == [est]


class _StalledTables:
    """A transport whose peer "evil" answers the table request's head, then never its body
    (h2 PINGs still acked: nothing else notices); the others answer at once."""

    def __init__(self) -> None:
        from llmfabric.identity import NodeKey

        self.key = NodeKey.generate()

    async def request(self, peer: str, method: str, path: str, headers: object = (),
                      body: bytes = b"", *,
                      timeout: float = 30.0) -> object:  # noqa: ASYNC109
        from llmfabric.net.messages import BodyStream, PeerResponse

        stream = BodyStream(ack=lambda _n: None, on_abort=lambda: None)
        if peer == "evil":
            stream.push((b'{"links": [', 11))
        else:
            doc = b'{"peer": "%b", "links": []}' % peer.encode()
            stream.push((doc, len(doc)))
            stream.push(None)
        return PeerResponse(200, (), stream, peer_id=peer)


@pytest.mark.hostile
async def test_a_peer_that_never_finishes_its_table_does_not_hold_the_fabric_view() -> None:
    """The fetch's timeout covered only the response head: one member stalled
    /v1/fabric/links for good (the view's lock stayed held, and every later call queued)."""
    from llmfabric.net.link_service import FETCH_TIMEOUT_S, LinkService

    clock = FakeClock()
    svc = LinkService(_StalledTables(), clock,  # type: ignore[arg-type]
                      lambda: ["honest-1", "honest-2", "evil"])
    view = asyncio.ensure_future(svc.fabric())
    await clock.advance(FETCH_TIMEOUT_S + 1)
    for _ in range(20):
        await asyncio.sleep(0)
    assert view.done() and not svc._collecting.locked()
    nodes = {n["peer"]: n for n in view.result()["nodes"][1:]}
    assert "links" in nodes["honest-1"] and "links" in nodes["honest-2"]
    assert "within" in nodes["evil"]["error"]
