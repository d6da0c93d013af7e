"""Gossip, anti-entropy and SWIM parameters, with named presets: `local`, `lan`, `wan`.

- local: loopback tests and benchmarks (fast probes, 50 ms gossip ticks).
- lan: one site or cluster interconnect (SWIM/memberlist LAN-like timings, a bit faster).
- wan: nodes spread over sites and the Internet (slower probes, longer suspicion).

Idle cost per node is independent of cluster size: one probe (ping + ack, ~100 bytes) per
probe interval, plus one root-hash exchange (~60 bytes) per sync interval; digests and deltas
are only sent when roots differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from llmfabric.registry.guard import TrustConfig
from llmfabric.registry.replica import GcConfig


class GossipConfigError(ValueError):
    """A gossip/SWIM parameter is out of range; the message names it and the valid range."""


@dataclass(frozen=True, slots=True)
class GossipConfig:
    # dissemination (rumour mongering of fresh changes)
    gossip_interval_s: float = 0.2
    fanout: int = 3
    retransmit_mult: int = 3
    # Sends per node for a minor change (only load hints differ, same lifecycle/incarnation):
    # one eager push to the fanout, anti-entropy repairs the few nodes it misses.
    minor_transmits: int = 3
    piggyback_bytes: int = 1_200
    max_message_bytes: int = 60_000
    # anti-entropy (push-pull of root hash -> bucket hashes -> digests -> deltas)
    sync_interval_s: float = 2.0
    buckets: int = 32
    # SWIM + Lifeguard
    probe_interval_s: float = 1.0
    probe_timeout_s: float = 0.4
    indirect_probes: int = 3
    suspicion_mult: float = 4.0
    suspicion_max_mult: float = 6.0
    expected_confirmations: int = 3
    max_health: int = 8
    # registry GC and the owner's refresh
    gc: GcConfig = field(default_factory=GcConfig)
    # what the replica refuses from hostile members (eviction quorum, rate limits, caps)
    trust: TrustConfig = field(default_factory=TrustConfig)
    # Rumours queued at once; beyond it the most-sent (then oldest) are dropped: keys are
    # chosen by whoever signs facts, anti-entropy repairs what the queue drops.
    max_queued: int = 4096
    gc_interval_s: float = 60.0
    # Cut off from the fabric (no live member, or none of the bootstrap peers live) for this
    # long: dial the bootstrap addresses again (a bootstrap host may have restarted with a
    # new key), then retry after exponential backoff with full jitter up to the cap. The cap
    # also bounds the gaps between re-contacts of known seed peers while we know no member.
    rebootstrap_after_s: float = 5.0
    rebootstrap_cap_s: float = 60.0
    # Every reconnect interval, one peer whose session was evicted (it failed; it did not
    # leave) within the reconnect window and that has no live session gets a sync attempt:
    # after a partition longer than the suspicion timeout each side has evicted the other,
    # and nobody would ever contact the other side again (Serf's reconnect). Costs one dial
    # per interval per node when the peer is really dead.
    reconnect_interval_s: float = 15.0
    reconnect_window_s: float = 6 * 3600.0

    def __post_init__(self) -> None:
        for name in ("gossip_interval_s", "sync_interval_s", "probe_interval_s",
                     "probe_timeout_s", "gc_interval_s", "rebootstrap_after_s",
                     "rebootstrap_cap_s", "reconnect_interval_s", "reconnect_window_s"):
            if not getattr(self, name) > 0:
                raise GossipConfigError(f"{name} must be > 0")
        if self.probe_timeout_s >= self.probe_interval_s:
            raise GossipConfigError("probe_timeout_s must be < probe_interval_s")
        if self.fanout < 1 or self.indirect_probes < 0 or self.retransmit_mult < 1:
            raise GossipConfigError("fanout and retransmit_mult must be >= 1, "
                                    "indirect_probes >= 0")
        if self.max_queued < 16:
            raise GossipConfigError("max_queued must be >= 16")
        if self.max_message_bytes < 2_000:
            raise GossipConfigError("max_message_bytes must be >= 2000")

    def retransmit_limit(self, n: int) -> int:
        """How many times a fresh change is sent on: retransmit_mult * ceil(log10(n + 1))."""
        return self.retransmit_mult * max(1, math.ceil(math.log10(n + 1)))

    def suspicion_bounds(self, n: int) -> tuple[float, float]:
        """Lifeguard (min, max) suspicion timeout for a cluster of n members."""
        lo = self.suspicion_mult * max(1.0, math.log10(max(1, n))) * self.probe_interval_s
        return lo, lo * self.suspicion_max_mult

    def suspicion_timeout(self, n: int, confirmations: int) -> float:
        """Lifeguard: max - (max - min) * log(C + 1) / log(K + 1), C independent confirmations
        beyond the first suspicion (capped at K = expected_confirmations), never below min."""
        lo, hi = self.suspicion_bounds(n)
        k = max(1, self.expected_confirmations)
        c = min(max(0, confirmations - 1), k)
        return max(lo, hi - (hi - lo) * math.log(c + 1) / math.log(k + 1))

    def with_(self, **changes: Any) -> GossipConfig:
        return replace(self, **changes)


PRESETS: dict[str, GossipConfig] = {
    "local": GossipConfig(
        gossip_interval_s=0.05, fanout=3, sync_interval_s=1.0, probe_interval_s=0.5,
        probe_timeout_s=0.2, suspicion_mult=8.0, rebootstrap_after_s=2.0, rebootstrap_cap_s=10.0,
        reconnect_interval_s=2.0,
    ),
    "lan": GossipConfig(
        gossip_interval_s=0.1, fanout=3, sync_interval_s=2.0, probe_interval_s=0.6,
        probe_timeout_s=0.25, suspicion_mult=8.0,
    ),
    "wan": GossipConfig(
        gossip_interval_s=0.5, fanout=4, sync_interval_s=10.0, probe_interval_s=3.0,
        probe_timeout_s=1.5, suspicion_mult=6.0, rebootstrap_after_s=30.0,
        rebootstrap_cap_s=300.0, reconnect_interval_s=60.0,
    ),
}


def preset(name: str) -> GossipConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise GossipConfigError(
            f"unknown gossip preset {name!r}; choose one of {', '.join(sorted(PRESETS))}"
        ) from None
