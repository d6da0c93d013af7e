"""Routing candidates: the routable sessions for a model, built from the local replica only.

`provider_id` of a candidate is the identity an `identify(record)` callable vouches for
(registry.provider: the certificate's provider, or the key fingerprint on PSK networks);
`claimed_provider` is the free-text name the record states, for display only. A candidate
listed under an alias that is another provider's model id is flagged (`alias_conflict`):
the trust filter drops it unless the request's allowlist names its provider.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from llmfabric.registry.cache_sketch import usable_sketch
from llmfabric.registry.records import (
    Hardware,
    Lifecycle,
    LoadHints,
    NodeRecord,
    ServedModel,
)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One session that can take a request for one model (the ServedModel it matched)."""

    session_id: str
    peer_id: str
    provider_id: str
    http_addr: str
    relays: tuple[str, ...]
    hardware: Hardware
    model: ServedModel
    load: LoadHints
    labels: tuple[tuple[str, str], ...] = ()
    suspected: bool = False
    alloc_end: float = 0.0  # walltime (routing/walltime.py); 0: unbounded
    drain_lead_s: float = 0.0
    claimed_provider: str = ""  # what the record says (unverified, display only)
    alias_conflict: bool = False  # matched by an alias that is another provider's model id
    prefix_cache: bytes = b""  # the record's prefix-cache sketch, b"" if none or over-full

    @staticmethod
    def from_record(
        record: NodeRecord, model: ServedModel, suspected: bool = False,
        provider_id: str | None = None,
    ) -> Candidate:
        meta = record.meta
        return Candidate(
            session_id=record.session_id,
            peer_id=record.peer_id,
            provider_id=meta.provider_id if provider_id is None else provider_id,
            http_addr=meta.http_addr,
            relays=meta.relays,
            hardware=meta.hardware,
            model=model,
            load=meta.load,
            labels=meta.labels,
            suspected=suspected,
            alloc_end=meta.alloc_end,
            drain_lead_s=meta.drain_lead_s,
            claimed_provider=meta.provider_id,
            prefix_cache=usable_sketch(meta.prefix_cache) if meta.prefix_cache else b"",
        )


Identify = Callable[[NodeRecord], str]


def claimed_provider(record: NodeRecord) -> str:
    """The record's own provider name: only for records an operator typed in (static
    backends) or tests; registry records go through registry.provider."""
    return record.meta.provider_id


def _model_owners(
    records: list[tuple[NodeRecord, bool]], identify: Identify
) -> dict[str, set[str]]:
    """Model id -> verified providers serving it under that id (non-LEFT records)."""
    owners: dict[str, set[str]] = {}
    for record, _ in records:
        if record.state is Lifecycle.LEFT:
            continue
        who = identify(record)
        for m in record.meta.models:
            owners.setdefault(m.id, set()).add(who)
    return owners


def _conflicted(name: str, served: ServedModel, who: str, owners: dict[str, set[str]]) -> bool:
    return name != served.id and bool(owners.get(name, set()) - {who})


def routable(record: NodeRecord, suspected: bool) -> bool:
    """A preferred candidate: SERVING and not suspected."""
    return record.state is Lifecycle.SERVING and not suspected


def listed(record: NodeRecord) -> bool:
    """A candidate at all: SERVING, suspected or not. A suspected candidate (flagged) is only
    a fallback: the Router prefers unsuspected ones and routes to suspected ones only when
    every eligible candidate is suspected (a wave of suspicions, e.g. a partition's heal,
    would otherwise fail requests that the suspected node may well serve)."""
    return record.state is Lifecycle.SERVING


def candidates_for(
    model_name: str, records_with_suspicion: Iterable[tuple[NodeRecord, bool]],
    identify: Identify = claimed_provider,
) -> list[Candidate]:
    """Sessions that are SERVING and serve `model_name` (by id or alias); suspected ones are
    flagged (`Candidate.suspected`), for the Router's fallback."""
    records = list(records_with_suspicion)
    owners = _model_owners(records, identify)
    out: list[Candidate] = []
    for record, suspected in records:
        if not listed(record):
            continue
        for served in record.meta.models:
            if served.answers_to(model_name):
                who = identify(record)
                c = Candidate.from_record(record, served, suspected, who)
                if _conflicted(model_name, served, who, owners):
                    c = dataclasses.replace(c, alias_conflict=True)
                out.append(c)
                break
    return out


def model_is_known(
    model_name: str, records_with_suspicion: Iterable[tuple[NodeRecord, bool]]
) -> bool:
    """True if any session that has not LEFT announces `model_name` (even if not routable)."""
    for record, _ in records_with_suspicion:
        if record.state is Lifecycle.LEFT:
            continue
        if any(m.answers_to(model_name) for m in record.meta.models):
            return True
    return False


def candidates_by_model(
    records_with_suspicion: Iterable[tuple[NodeRecord, bool]],
    identify: Identify = claimed_provider,
) -> dict[str, list[Candidate]]:
    """Every listed candidate (SERVING; suspected ones flagged) under its model id and each
    alias."""
    records = list(records_with_suspicion)
    owners = _model_owners(records, identify)
    index: dict[str, list[Candidate]] = {}
    for record, suspected in records:
        if not listed(record):
            continue
        who = identify(record)
        claimed: set[str] = set()  # a session appears once per name (its first model's)
        for served in record.meta.models:
            cand = Candidate.from_record(record, served, suspected, who)
            for name in served.names():
                if name not in claimed:
                    claimed.add(name)
                    flagged = _conflicted(name, served, who, owners)
                    index.setdefault(name, []).append(
                        dataclasses.replace(cand, alias_conflict=True) if flagged else cand)
    return index
