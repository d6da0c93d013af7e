"""What a node publishes about its prefix cache: an LRU of the prompt blocks it served.

Every node can feed it from the prompts it served (the blocks its engine's prefix cache most
likely still holds, most recent first); a node whose engine publishes KV-cache events uses
`HeldPrefixes` instead (held_prefixes.py: what the engine really holds). Both follow the
`PrefixSummary` protocol. `sketch()` is the bounded Bloom filter for the record
(registry/cache_sketch.py).

Traffic bound: the sketch is `SKETCH_BYTES` (512) and is republished at most once per
`interval_s` (default 10 s) and only when at least `min_change` of its keys are new, so it adds
at most ~52 B/s per busy node to each gossip peer and nothing while idle (an unchanged
sketch is never republished).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Protocol

import orjson

from llmfabric.registry.cache_sketch import SKETCH_BYTES, build_sketch
from llmfabric.routing.prefix import block_keys, prompt_text

DEFAULT_CAPACITY = 400  # keys: ~4% false positives in a 512-byte filter
DEFAULT_INTERVAL_S = 10.0


class PrefixSummary(Protocol):
    """What the node feeds with forwarded prompts and publishes as its record's sketch."""

    def observe(self, keys: Sequence[int], chars: int = 0) -> object | None: ...
    def finished(self, token: object | None) -> None: ...
    def due(self, now: float) -> bool: ...
    def published(self, now: float) -> bytes: ...
    def sketch(self) -> bytes: ...


class ServedPrefixes:
    def __init__(self, capacity: int = DEFAULT_CAPACITY, nbytes: int = SKETCH_BYTES,
                 interval_s: float = DEFAULT_INTERVAL_S, min_change: float = 0.05) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.nbytes = nbytes
        self.interval_s = interval_s
        self.min_change = min_change
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._new = 0  # keys added since the last publish
        self._published_at: float | None = None

    def observe(self, keys: Iterable[int], chars: int = 0) -> None:
        """A prompt with these block keys was served (its deepest blocks stay freshest;
        `chars`, the prompt's length, and `finished` matter only to HeldPrefixes)."""
        lru = self._lru
        for key in keys:
            if key in lru:
                lru.move_to_end(key)
            else:
                lru[key] = None
                self._new += 1
        while len(lru) > self.capacity:
            lru.popitem(last=False)

    def finished(self, token: object | None) -> None:
        pass

    def __len__(self) -> int:
        return len(self._lru)

    def sketch(self) -> bytes:
        return build_sketch(self._lru, self.nbytes)

    def due(self, now: float) -> bool:
        """Whether the sketch should be republished now."""
        if not self._new:
            return False
        if self._published_at is not None and now - self._published_at < self.interval_s:
            return False
        return self._new >= max(1, int(self.min_change * max(1, len(self._lru))))

    def published(self, now: float) -> bytes:
        """Take the sketch for publishing at `now` (resets the change count)."""
        self._published_at = now
        self._new = 0
        return self.sketch()


# Routes whose prompts fill the engine's prefix cache (forwarded paths end with one of them).
_PROMPT_PATHS = ("/chat/completions", "/completions", "/responses", "/messages")


def observe_prompt(served: PrefixSummary, path: str, body: bytes) -> object | None:
    """Record the prompt blocks of a request a node is about to serve (bodies that are not
    a JSON object with a prompt are skipped: the engine answers those itself); the token
    for `served.finished` once the engine answered."""
    if not path.endswith(_PROMPT_PATHS):
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(doc, dict):
        text = prompt_text(doc)
        return served.observe(block_keys(text), len(text.encode()))
    return None
