"""Bootstrap again by address when the node is cut off from the fabric.

At start-up a node dials its bootstrap addresses and learns the peer ids behind them (the
seeds). Those ids can go stale: a bootstrap host restarts with a new key, or the node spends
long enough in a partition that everybody it knew was evicted. Re-contacting stale ids never
helps, so `Rebootstrapper.run` watches the replica and, once the node has been *cut off* for
`rebootstrap_after_s`, dials the bootstrap addresses again (`redial`, the transport's
bootstrap with one round) and hands the answering peer ids to the agent as its new seeds.
While still cut off it retries after exponential backoff with full jitter (capped at
`rebootstrap_cap_s`), on the injected clock with the injected rng.

Cut off: no live member at all, or (when seeds are known) none of the seeds live, where
live = a session that is neither LEFT nor suspected. The second case also reconnects a
fabric whose bootstrap node restarted with a new key while the other nodes still know each
other (nobody would otherwise ever dial the new bootstrap node).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from llmfabric.clock import Clock
from llmfabric.gossip.agent import GossipAgent
from llmfabric.net.backoff import Backoff
from llmfabric.net.errors import NetError
from llmfabric.net.transport import PeerId
from llmfabric.untrusted import get_logger

log = get_logger(__name__)


def cut_off(agent: GossipAgent) -> bool:
    """True when no member is live, or none of the agent's seeds is."""
    live = agent.live_peers()
    seeds = set(agent.seeds)
    return not (live & seeds) if seeds else not live


class Rebootstrapper:
    def __init__(
        self,
        clock: Clock,
        agent: Callable[[], GossipAgent],
        redial: Callable[[], Awaitable[Sequence[PeerId]]],
        *,
        backoff: Backoff,
        after_s: float,
        check_interval_s: float,
    ) -> None:
        """`agent()` returns the current agent (a node replaces it after an eviction);
        `redial()` dials the bootstrap addresses once and returns the peer ids that answered
        (raising or returning none when none did)."""
        self._clock = clock
        self._agent = agent
        self._redial = redial
        self._backoff = backoff
        self._after = after_s
        self._check = check_interval_s
        self.attempts = 0

    async def run(self) -> None:
        since: float | None = None
        while True:
            await self._clock.sleep(self._check)
            agent = self._agent()
            if not cut_off(agent):
                since = None
                self._backoff.reset()
                continue
            now = self._clock.now()
            if since is None:
                since = now
            if now - since < self._after:
                continue
            await self._attempt(agent)
            await self._clock.sleep(self._backoff.next_delay())

    async def _attempt(self, agent: GossipAgent) -> None:
        self.attempts += 1
        agent.stats.rebootstraps += 1
        try:
            peers = [p for p in await self._redial() if p != agent.peer_id]
        except (NetError, OSError, TimeoutError) as exc:  # nothing answered
            log.info("cut off from the fabric; bootstrap addresses did not answer: %s", exc)
            return
        except Exception:  # a bug in the redial: visible, counted, and retried later
            agent.stats.loop_errors += 1
            log.exception("re-bootstrap attempt %d failed", self.attempts)
            return
        if peers:
            log.warning("cut off from the fabric; bootstrapped again, seeds now %s",
                        ", ".join(p[:12] for p in peers))
            self._agent().contact_seeds(peers)
