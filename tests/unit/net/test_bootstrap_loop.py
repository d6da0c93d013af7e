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
