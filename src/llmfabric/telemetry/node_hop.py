"""What an attempt's upstream says about the hop past the ingress: the node's own time and
the relay the request went through (`NodeHop`, the `Upstream.hop` member).

A node answering a traced request (one that carried a `traceparent`) sends
`X-Fabric-Node-Time`: milliseconds from the request's arrival at the node to the engine's
response headers. Nodes are not trusted, so the ingress only accepts a short, finite,
non-negative decimal (anything else is dropped) and the trace clamps it to the attempt's own
forward time (ingress/tracing.py), so a node can neither stretch nor move the waterfall.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

NODE_TIME_HEADER = "X-Fabric-Node-Time"
_MAX_VALUE_CHARS = 24


@dataclass(frozen=True, slots=True)
class NodeHop:
    node_ms: float | None = None  # the node's reported time (validated, not yet clamped)
    relay: str = ""  # the relay's peer id when the request went through one

    @property
    def via(self) -> str:
        return "relay" if self.relay else "direct"


NO_HOP = NodeHop()  # nothing reported, direct (or not known)


def parse_node_time(value: str | bytes | None) -> float | None:
    """The header's milliseconds, or None for a missing or invalid value."""
    if not value or len(value) > _MAX_VALUE_CHARS:
        return None
    try:
        ms = float(value)
    except ValueError:
        return None
    return ms if math.isfinite(ms) and ms >= 0.0 else None


def node_time_value(arrived: float, now: float | None = None) -> str:
    """The header value for a request that arrived at `arrived` (time.perf_counter)."""
    end = time.perf_counter() if now is None else now
    return f"{max(0.0, end - arrived) * 1000:.3f}"
