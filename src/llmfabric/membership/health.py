"""Lifeguard's local health multiplier (LHM).

A node that misses acks, has to refute suspicions of itself, or whose own probe timer fires
late is probably the slow one (CPU starved, congested link). Its score rises (to `max_score`)
and it stretches its own probe interval and ack timeout by (score + 1), so it stops accusing
healthy peers; successful probes bring the score back down.
"""

from __future__ import annotations


class LocalHealth:
    def __init__(self, max_score: int = 8) -> None:
        self.max_score = max_score
        self.score = 0

    def good(self) -> None:
        self.score = max(0, self.score - 1)

    def bad(self) -> None:
        self.score = min(self.max_score, self.score + 1)

    def scale(self, seconds: float) -> float:
        return seconds * (self.score + 1)
