"""What SWIM and Lifeguard read of the configuration, as structural protocols.

gossip.config.GossipConfig (one layer up) satisfies both; membership never imports it, so the
layer order of docs/architecture.md holds (membership below gossip).
"""

from __future__ import annotations

from typing import Protocol


class ProbeParams(Protocol):
    @property
    def probe_interval_s(self) -> float: ...
    @property
    def probe_timeout_s(self) -> float: ...
    @property
    def indirect_probes(self) -> int: ...
    @property
    def max_health(self) -> int: ...


class SuspicionParams(Protocol):
    def suspicion_timeout(self, n: int, confirmations: int) -> float:
        """Lifeguard's suspicion timeout for n members and this many confirmations."""
        ...
