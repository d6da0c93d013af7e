"""Trust and QoS filters over candidates. Pure functions; they never widen the set."""

from __future__ import annotations

from collections.abc import Sequence

from llmfabric.routing.candidates import Candidate
from llmfabric.routing.request import RouteRequest
from llmfabric.sim.gpu_names import gpu_matches


def trust_filter(candidates: Sequence[Candidate], allow: frozenset[str] | None) -> list[Candidate]:
    """Keep only candidates whose (verified) provider id is in the allowlist (None: no
    restriction). A candidate matched by an alias that is another provider's model id is
    kept only when the allowlist names its provider (the caller asked for it)."""
    if allow is None:
        return [c for c in candidates if not c.alias_conflict]
    return [c for c in candidates if c.provider_id in allow]


def qos_filter(candidates: Sequence[Candidate], req: RouteRequest) -> list[Candidate]:
    """Apply `min_quant_bits`, `gpu` (sim.gpu_names: exact catalog name or family token, never a
    substring) and `min_context` constraints."""
    out = list(candidates)
    if req.min_quant_bits is not None:
        bits = req.min_quant_bits
        out = [c for c in out if c.model.quant_bits >= bits]
    if req.gpus:
        out = [c for c in out if gpu_matches(c.hardware.gpu_model, req.gpus)]
    if req.min_context is not None:
        ctx = req.min_context
        out = [c for c in out if c.model.max_context >= ctx]
    return out


def eligible(candidates: Sequence[Candidate], req: RouteRequest) -> list[Candidate]:
    """Trust first (the security boundary), then QoS."""
    kept = trust_filter(candidates, req.providers)
    if req.min_quant_bits is None and not req.gpus and req.min_context is None:
        return kept
    return qos_filter(kept, req)
