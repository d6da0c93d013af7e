"""Exponential backoff with full jitter (AWS architecture blog): delay_n = U(0, min(cap, base*2^n)).

Pure: the caller injects the rng and sleeps on its own clock.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    base: float = 0.5
    cap: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def ceiling(self) -> float:
        """Upper bound of the next delay."""
        return min(self.cap, self.base * (2.0 ** min(self.attempt, 62)))

    def next_delay(self) -> float:
        delay = self.rng.uniform(0.0, self.ceiling())
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0
