"""Trust and QoS filters over candidates, and how a requested name resolves to one model.
Pure functions; they never widen the set."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class Ambiguous:
    """A requested name that several models answer to (by alias): refused, sent to none."""

    name: str
    ids: tuple[str, ...]  # the model ids it names, sorted

    def message(self) -> str:
        return (f"the name {self.name!r} is an alias of several models on this fabric "
                f"({', '.join(self.ids)}); ask for one of them by its id, or name the "
                "providers you trust in X-Fabric-Providers")


def resolve(candidates: Sequence[Candidate], name: str, allow: frozenset[str] | None
            ) -> Sequence[Candidate] | Ambiguous:
    """The candidates a request for `name` may go to: one model's, never a mix.

    Among the candidates the trust filter keeps (the caller's allowlist, or, without one,
    all but aliases squatting another provider's model id): a model id is itself (the
    candidates serving `name` as their id win over any listing it as an alias); an alias
    routes only when every such candidate lists it for the same model id. An alias listed
    for several ids is `Ambiguous` (denied, not split: a member listing an honest model's
    alias for its own model would otherwise take part of its requests). scheduler/observed.py
    counts demand by the same rule. No trusted candidate at all: the candidates as given
    (the Router reports them filtered)."""
    for c in candidates:
        if c.model.id != name:
            break
    else:
        return candidates  # (the common case: asked by id, nobody lists it as an alias)
    trusted = trust_filter(candidates, allow)
    if not trusted:
        return candidates
    by_id = [c for c in trusted if c.model.id == name]
    if by_id:
        return by_id
    ids = {c.model.id for c in trusted}
    if len(ids) > 1:
        return Ambiguous(name, tuple(sorted(ids)))
    return trusted


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
