import asyncio
import itertools
import random

import pytest

from llmfabric.net.backoff import Backoff
from llmfabric.net.bootstrap import run_bootstrap
from llmfabric.net.errors import PeerUnreachable
from llmfabric.testing.fake_clock import FakeClock


async def test_retries_with_jittered_backoff_on_virtual_time_until_a_peer_answers():
    clock = FakeClock()
    up_at = 20.0  # virtual seconds
    attempts: list[float] = []

    async def connect(addr: str) -> str:
        attempts.append(clock.now())
        if clock.now() < up_at:
            raise PeerUnreachable(f"{addr} refused")
        return "zPeer"

    backoff = Backoff(base=0.5, cap=4.0, rng=random.Random(3))
    task = asyncio.create_task(run_bootstrap(connect, ["a:1", "b:2"], clock, backoff))
    assert await clock.run_until(task.done, within=120, step=0.25)
    assert task.result() == ["zPeer", "zPeer"]
    rounds = sorted(set(attempts))
    gaps = [b - a for a, b in itertools.pairwise(rounds)]
    for i, gap in enumerate(gaps):
        # Each wait is U(0, min(cap, base * 2^i)), seen through the 0.25 s stepping.
        assert gap <= min(4.0, 0.5 * 2**i) + 0.25
    assert rounds[-1] >= up_at
    assert backoff.attempt == 0  # reset after success


async def test_gives_up_after_max_rounds_naming_every_address():
    clock = FakeClock()

    async def connect(addr: str) -> str:
        raise PeerUnreachable("refused")

    task = asyncio.create_task(
        run_bootstrap(connect, ["a:1", "b:2"], clock, Backoff(rng=random.Random(1)), max_rounds=3)
    )
    await clock.run_until(task.done, within=600, step=1.0)
    with pytest.raises(PeerUnreachable, match="a:1: refused; b:2: refused"):
        task.result()


async def test_no_addresses_is_an_error():
    with pytest.raises(PeerUnreachable, match="no bootstrap addresses"):
        await run_bootstrap(lambda a: asyncio.sleep(0, "x"), [], FakeClock(), Backoff())


async def test_a_failed_join_is_a_warning_once_per_distinct_reason(
        caplog: pytest.LogCaptureFixture) -> None:
    """At the default level (warnings) a node whose bootstrap refused it (another admission
    kind, a wrong secret) or was down printed nothing while it retried for ever."""
    import logging

    clock = FakeClock()
    reasons = iter(["refused"] * 3 + ["admission mismatch"] * 2)

    async def connect(addr: str) -> str:
        reason = next(reasons, None)
        if reason is None:
            return "zPeer"
        raise PeerUnreachable(reason)

    caplog.set_level(logging.INFO, logger="llmfabric.net.bootstrap")
    task = asyncio.create_task(
        run_bootstrap(connect, ["a:1"], clock, Backoff(base=0.1, cap=0.5, rng=random.Random(2))))
    assert await clock.run_until(task.done, within=60, step=0.1)
    assert task.result() == ["zPeer"]
    records = [r for r in caplog.records if "no bootstrap peer reachable" in r.getMessage()]
    assert [r.levelno for r in records] == [logging.WARNING, logging.INFO, logging.INFO,
                                            logging.WARNING, logging.INFO]
    assert "a:1: admission mismatch" in records[3].getMessage()
