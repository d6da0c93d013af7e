"""Bootstrap with exponential backoff and full jitter, on real sockets."""

import asyncio
import random
import re
import time

import pytest

from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.net import PeerUnreachable, TlsTransport, TransportConfig
from llmfabric.net.ports import free_port

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")


class RecordingClock:
    """Real time, but every backoff sleep is recorded and shortened to 10 ms."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await asyncio.sleep(min(seconds, 0.01))


def backoffs(clock: RecordingClock) -> list[float]:
    return [s for s in clock.sleeps if s not in (123.0, 124.0, 3600)]


def adm() -> PskAdmission:
    return PskAdmission("test", b"b" * 32)


async def test_bootstrap_backs_off_then_connects_when_the_peer_comes_up():
    clock = RecordingClock()
    port = free_port()
    # Distinctive timeouts so the backoff sleeps can be told from timeout timers.
    cfg = TransportConfig(
        host=None,
        backoff_base=1.0,
        backoff_cap=8.0,
        keepalive=3600,
        connect_timeout=123.0,
        handshake_timeout=124.0,
        idle_close_s=None,  # no idle-reaper timer among the recorded sleeps
    )
    node = TlsTransport(NodeKey.generate(), adm(), cfg, clock=clock, rng=random.Random(7))
    boot = TlsTransport(NodeKey.generate(), adm(), TransportConfig(port=port))
    async with node:
        task = asyncio.create_task(node.bootstrap([f"127.0.0.1:{port}"]))
        async with asyncio.timeout(10):
            while len(backoffs(clock)) < 5:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
        assert not task.done()
        async with boot:
            async with asyncio.timeout(10):
                peers = await task
            assert peers == [boot.local_id]
    retries = backoffs(clock)
    assert len(retries) >= 5
    for i, d in enumerate(retries):
        assert 0.0 <= d <= min(8.0, 1.0 * 2**i)
    # Full jitter: delays are not the deterministic ceilings.
    assert any(d < min(8.0, 2**i) * 0.99 for i, d in enumerate(retries))


async def test_bootstrap_gives_up_after_max_rounds_with_the_reasons():
    clock = RecordingClock()
    cfg = TransportConfig(host=None, connect_timeout=123.0, handshake_timeout=124.0)
    node = TlsTransport(NodeKey.generate(), adm(), cfg, clock=clock)
    async with node:
        with pytest.raises(PeerUnreachable, match=re.escape("127.0.0.1:1")):
            await node.bootstrap(["127.0.0.1:1"], max_rounds=3)
    assert len(backoffs(clock)) == 2
