"""Walltime-aware routing: do not start a request on a node whose allocation ends first.

A node in a Slurm job publishes when its allocation ends (`alloc_end`) and how long before it
it drains (`drain_lead_s`, registry NodeMeta). A request expected to run past
`alloc_end - drain_lead_s` would be cut by the drain, so it goes to a node that outlasts it.
The expected duration comes from the request's max_tokens (`max_completion_tokens`, else
`max_tokens`, else DEFAULT_TOKENS) times a per-token time: the simulator's decode step for
the candidate's model and GPU when it knows both (batch 32: a busy engine), else
`fixed_rate`'s conservative 50 ms a token; plus a fixed overhead for queueing and prefill.
The filter is a preference: when no candidate outlasts the request, all stay eligible (a
request that may be cut beats a certain 503). Pure: `now` is passed in.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from llmfabric.routing.candidates import Candidate
from llmfabric.untrusted import get_logger

log = get_logger(__name__)

DEFAULT_TOKENS = 1024  # a request without max_tokens: assume this many completion tokens
MAX_TOKENS_CAP = 1 << 20


class DurationEstimate(Protocol):
    def __call__(self, candidate: Candidate, tokens: int) -> float:
        """Seconds `candidate` is expected to need for a request of `tokens` output tokens."""
        ...


def requested_tokens(doc: Mapping[str, Any]) -> int:
    """Output tokens a request body asks for at most (bounded; default DEFAULT_TOKENS)."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = doc.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(value, MAX_TOKENS_CAP)
    return DEFAULT_TOKENS


def fixed_rate(per_token_s: float = 0.05, overhead_s: float = 5.0) -> DurationEstimate:
    def estimate(candidate: Candidate, tokens: int) -> float:
        return overhead_s + tokens * per_token_s
    return estimate


def _sim_token_s(model: str, gpu: str, gpus: int) -> float | None:
    from llmfabric.sim import decode_step_time
    from llmfabric.sim.errors import SimError

    try:
        tp = max(t for t in (1, 2, 4, 8) if t <= max(1, gpus))
        return float(decode_step_time(model, gpu, tp, 32, 2048))
    except SimError:  # unknown model or GPU, or a shape the simulator cannot price
        return None
    except Exception:  # a bug (in a worker thread, where nobody would see it): the fallback
        log.exception("the simulator failed to price %r on %d x %r", model, gpus, gpu)
        return None


_Key = tuple[str, str, int]


class SimRate:
    """Per-token time from the simulator (times `safety`), else `fallback`.

    The first estimate of a (model, GPU, GPU count) costs the simulator's import and a cost
    table (~0.5 s cold, ~30 ms warm): with `background` it is computed in a worker thread
    while the fallback answers, so the ingress's event loop never waits for it."""

    def __init__(self, fallback: DurationEstimate | None = None, overhead_s: float = 5.0,
                 safety: float = 2.0, *, background: bool = True) -> None:
        self.fallback = fallback or fixed_rate(overhead_s=overhead_s)
        self.overhead_s = overhead_s
        self.safety = safety
        self.background = background
        self.known: dict[_Key, float | None] = {}
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def _fill(self, key: _Key) -> None:
        self.known[key] = _sim_token_s(*key)

    def step_s(self, key: _Key) -> float | None:
        if key in self.known:
            return self.known[key]
        if not self.background:
            self._fill(key)
            return self.known[key]
        if len(self.known) < 4096:  # bounded: a hostile fabric cannot grow it without end
            self.known[key] = None  # the fallback answers until the worker has the value
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, "walltime-sim")
            self._pool.submit(self._fill, key)
        return None

    def __call__(self, candidate: Candidate, tokens: int) -> float:
        hw = candidate.hardware
        step = self.step_s((candidate.model.id, hw.gpu_model, hw.gpu_count))
        if step is None:
            return self.fallback(candidate, tokens)
        return self.overhead_s + self.safety * step * tokens


def sim_rate(fallback: DurationEstimate | None = None, overhead_s: float = 5.0,
             safety: float = 2.0, *, background: bool = True) -> SimRate:
    return SimRate(fallback, overhead_s, safety, background=background)


def outlasts(candidate: Candidate, now: float, expected_s: float) -> bool:
    """True when the request can finish before the candidate starts to drain."""
    if candidate.alloc_end <= 0:
        return True
    return now + expected_s <= candidate.alloc_end - candidate.drain_lead_s


def walltime_filter(candidates: Sequence[Candidate], now: float, tokens: int,
                    estimate: DurationEstimate) -> list[Candidate]:
    """Candidates that outlast the request; all of them when none does."""
    kept = [c for c in candidates if outlasts(c, now, estimate(c, tokens))]
    return kept or list(candidates)
