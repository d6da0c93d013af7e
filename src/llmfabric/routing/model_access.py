"""A key's model allowlist (`ApiKey.models`) applied where the ingress resolves names.

The allowlist holds model ids. A request may name an allowed model by its id, by an alias
or operator pin that routes to it, or by one of its LoRA adapters ("adapter" or
"id:adapter": the adapter runs on the allowed model, `candidate.model.id`); whatever the
name, only candidates whose model id is allowed serve it. A name with no such candidate is
refused as OpenAI refuses a model a project may not use (403, code `model_not_found`), the
same whether the name is unknown, served by other models only, or ambiguous among them: the
answer never tells a key which models it may not see. Keys without an allowlist never get
here (one None check per model tried).

`usable` applies it before admission (TenancyGate.admit): a request none of whose listed
names it may use is refused there, and the names it may not use are dropped from its list,
so no such name waits in the fair queue, is priced, or sizes (and names in a 429) the hold.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llmfabric.routing.candidates import Candidate
from llmfabric.routing.filters import Ambiguous


def permitted(resolved: Sequence[Candidate] | Ambiguous, allowed: frozenset[str],
              target: str) -> Sequence[Candidate] | Ambiguous | None:
    """What a key limited to `allowed` may reach of a name's resolution: its allowed
    candidates; an `Ambiguous` naming only the allowed ids (409), when several are; the
    empty list of an allowed model id `target` that no node serves now (404/503 as for any
    key); None when nothing it may use answers to the name (-> 403 `no_access`)."""
    if isinstance(resolved, Ambiguous):
        ids = tuple(i for i in resolved.ids if i in allowed)
        return Ambiguous(resolved.name, ids) if len(ids) > 1 else None
    if not resolved:
        return resolved if target in allowed else None
    kept = [c for c in resolved if c.model.id in allowed]
    if len(kept) == len(resolved):
        return resolved
    return kept or None


def usable(names: Sequence[str], allowed: frozenset[str],
           resolve: Callable[[str], Sequence[Candidate] | Ambiguous],
           pins: Mapping[str, str]) -> list[str]:
    """The `names` (a request's model, then its fallbacks) a key limited to `allowed` may
    be served by, in order: those `permitted` does not refuse (`resolve`: a name's
    resolution; `pins`: the operator's NAME -> model id)."""
    return [m for m in names if permitted(resolve(m), allowed, pins.get(m, m)) is not None]


def no_access(model: str) -> str:
    """The 403 message for a name the key may not use (it names no other model)."""
    return (f"this API key does not have access to model {model!r}; GET /v1/models lists "
            "the models it may use")


def catalog_within(catalog: dict[str, Any], allowed: frozenset[str]) -> dict[str, Any]:
    """The /v1/models catalog cut to the allowed model ids (`ingress.sources.merged_catalog`
    shape: one entry per model id, its aliases and adapters with it)."""
    return {**catalog, "data": [e for e in catalog["data"] if e.get("id") in allowed]}
