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

import functools
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from llmfabric.routing.candidates import Candidate

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


@functools.lru_cache(maxsize=512)
def _sim_token_s(model: str, gpu: str, gpus: int) -> float | None:
    try:
        from llmfabric.sim import decode_step_time

        tp = max(t for t in (1, 2, 4, 8) if t <= max(1, gpus))
        return float(decode_step_time(model, gpu, tp, 32, 2048))
    except Exception:  # unknown model or GPU (or a shape the simulator cannot price)
        return None


def sim_rate(fallback: DurationEstimate | None = None, overhead_s: float = 5.0,
             safety: float = 2.0) -> DurationEstimate:
    """Per-token time from the simulator (times `safety`), else `fallback`."""
    other = fallback or fixed_rate(overhead_s=overhead_s)

    def estimate(candidate: Candidate, tokens: int) -> float:
        hw = candidate.hardware
        step = _sim_token_s(candidate.model.id, hw.gpu_model, hw.gpu_count)
        if step is None:
            return other(candidate, tokens)
        return overhead_s + safety * step * tokens
    return estimate


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
