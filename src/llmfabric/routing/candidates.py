"""Routing candidates: the routable sessions for a model, built from the local replica only."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

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

    @staticmethod
    def from_record(record: NodeRecord, model: ServedModel, suspected: bool = False) -> Candidate:
        meta = record.meta
        return Candidate(
            session_id=record.session_id,
            peer_id=record.peer_id,
            provider_id=meta.provider_id,
            http_addr=meta.http_addr,
            relays=meta.relays,
            hardware=meta.hardware,
            model=model,
            load=meta.load,
            labels=meta.labels,
            suspected=suspected,
        )


def routable(record: NodeRecord, suspected: bool) -> bool:
    return record.state is Lifecycle.SERVING and not suspected


def candidates_for(
    model_name: str, records_with_suspicion: Iterable[tuple[NodeRecord, bool]]
) -> list[Candidate]:
    """Sessions that are SERVING, not suspected, and serve `model_name` (by id or alias)."""
    out: list[Candidate] = []
    for record, suspected in records_with_suspicion:
        if not routable(record, suspected):
            continue
        for served in record.meta.models:
            if served.answers_to(model_name):
                out.append(Candidate.from_record(record, served, suspected))
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
) -> dict[str, list[Candidate]]:
    """Every routable candidate indexed under its model id and each alias (one pass)."""
    index: dict[str, list[Candidate]] = {}
    for record, suspected in records_with_suspicion:
        if not routable(record, suspected):
            continue
        for served in record.meta.models:
            cand = Candidate.from_record(record, served, suspected)
            for name in served.names():
                bucket = index.setdefault(name, [])
                if not any(c.session_id == cand.session_id for c in bucket):
                    bucket.append(cand)
    return index
