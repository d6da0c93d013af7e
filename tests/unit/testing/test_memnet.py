"""The in-memory network: delivery, loss, duplication, delay, partitions, kill, determinism."""

from __future__ import annotations

import logging

import pytest

from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.memnet import MemNet


def _wire(net: MemNet, *names: str) -> dict[str, list[tuple[str, bytes, float]]]:
    got: dict[str, list[tuple[str, bytes, float]]] = {n: [] for n in names}
    for n in names:
        net.transport(n).set_handler(
            lambda src, data, n=n: got[n].append((src, data, net.clock.now())))
    return got


async def test_delivery_with_delay() -> None:
    clock = FakeClock()
    net = MemNet(clock, delay=0.5)
    got = _wire(net, "a", "b")
    net.transport("a").send("b", b"hi")
    await clock.advance(0.4)
    assert got["b"] == []
    await clock.advance(0.2)
    assert got["b"] == [("a", b"hi", 0.5)]
    await net.aclose()


async def test_loss_and_duplication_rates_and_determinism() -> None:
    async def run(seed: int) -> tuple[int, list[bytes]]:
        clock = FakeClock()
        net = MemNet(clock, seed=seed, loss=0.3, duplicate=0.2, delay=(0.0, 0.01), reorder=0.5)
        got = _wire(net, "a", "b")
        for i in range(1000):
            net.transport("a").send("b", str(i).encode())
        await clock.advance(1.0)
        await net.aclose()
        return len(got["b"]), [d for _, d, _ in got["b"]]

    n1, order1 = await run(3)
    n2, order2 = await run(3)
    assert (n1, order1) == (n2, order2)  # same seed, same run
    assert 700 < n1 < 1000  # ~70% survive, ~20% of those doubled
    assert order1 != sorted(order1, key=int)  # reordered


async def test_partition_kill_and_heal() -> None:
    clock = FakeClock()
    net = MemNet(clock)
    got = _wire(net, "a", "b", "c")
    net.partition(["a", "b"], ["c"])
    net.transport("a").send("b", b"1")
    net.transport("a").send("c", b"2")
    await clock.advance(0.01)
    assert [d for _, d, _ in got["b"]] == [b"1"] and got["c"] == []
    net.heal()
    net.kill("b")
    net.transport("a").send("b", b"3")
    net.transport("a").send("c", b"4")
    await clock.advance(0.01)
    assert [d for _, d, _ in got["b"]] == [b"1"] and [d for _, d, _ in got["c"]] == [b"4"]
    net.revive("b")
    net.transport("c").send("b", b"5")
    await clock.advance(0.01)
    assert [d for _, d, _ in got["b"]] == [b"1", b"5"]
    await net.aclose()


async def test_link_delay_adds_a_per_link_latency() -> None:
    clock = FakeClock()
    far = {("a", "c"), ("c", "a")}
    net = MemNet(clock, delay=0.001, link_delay=lambda s, d: 0.03 if (s, d) in far else 0.0)
    got = _wire(net, "a", "b", "c")
    net.transport("a").send("b", b"near")
    net.transport("a").send("c", b"far")
    await clock.advance(0.02)
    assert [d for _, d, _ in got["b"]] == [b"near"] and got["c"] == []
    await clock.advance(0.02)
    assert got["c"] == [("a", b"far", 0.031)]
    await net.aclose()


async def test_a_failing_handler_is_counted_and_logged_without_a_flood(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    net = MemNet(clock, delay=0.01)
    got: list[bytes] = []

    def handler(src: str, payload: bytes) -> None:
        got.append(payload)
        raise ValueError("handler bug")

    net.transport("b").set_handler(handler)
    net.transport("a")
    with caplog.at_level(logging.ERROR, logger="llmfabric.testing.memnet"):
        for i in range(5):
            net.transport("a").send("b", str(i).encode())
        await clock.advance(1.0)
    assert len(got) == 5 and net.handler_errors == 5  # every message still delivered
    logged = [r for r in caplog.records if "handler of b failed" in r.getMessage()]
    assert len(logged) == 3 and "ValueError('handler bug')" in logged[0].getMessage()
    assert logged[0].exc_info and not logged[1].exc_info
    await net.aclose()
