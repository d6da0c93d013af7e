"""Candidate sources: a static list (standalone ingress, tests) and the registry replica;
`merged_catalog` turns candidates into the `GET /v1/models` list."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from llmfabric.ingress.paths import PASSTHROUGH_PATHS
from llmfabric.registry.provider import key_fingerprint_identity
from llmfabric.registry.records import NodeRecord
from llmfabric.routing.candidates import (
    Candidate,
    Identify,
    candidates_by_model,
    model_is_known,
)
from llmfabric.routing.liveness import OnDown, Unwatch

RecordsFn = Callable[[], Iterable[tuple[NodeRecord, bool]]]


class StaticCandidateSource:
    """A fixed set of candidates, indexed by model id and alias once (and again on
    `replace`: the standalone ingress updates a model's context as its engine reports it)."""

    def __init__(self, candidates: Iterable[Candidate]) -> None:
        self.replace(candidates)

    def replace(self, candidates: Iterable[Candidate]) -> None:
        """Serve `candidates` from now on (requests under way keep the one they chose)."""
        every = tuple(candidates)
        by_model: dict[str, list[Candidate]] = {}
        for c in every:
            for name in c.model.names():
                by_model.setdefault(name, []).append(c)
        self._all, self._by_model = every, by_model

    def candidates(self, model: str) -> Sequence[Candidate]:
        return self._by_model.get(model, ())

    def is_known(self, model: str) -> bool:
        return model in self._by_model

    def all_candidates(self) -> Sequence[Candidate]:
        return self._all

    def watch_down(self, cand: Candidate, on_down: OnDown) -> Unwatch | None:
        return None  # no membership: an attempt ends by its own timeouts


class RecordsCandidateSource:
    """Backed by a callable returning (record, suspected) pairs from the live replica.

    The index is rebuilt at most once per `version()` change when a version callable is given
    (e.g. the replica's merge counter); without one it is rebuilt on every lookup.
    Provider identities come from `identify` (registry.provider): by default the key
    fingerprint, never the record's free-text provider name.
    """

    def __init__(
        self, records: RecordsFn, version: Callable[[], int] | None = None,
        identify: Identify = key_fingerprint_identity,
    ) -> None:
        self._records = records
        self._version = version
        self._identify = identify
        self._seen: int | None = None
        self._index: dict[str, list[Candidate]] = {}

    def _fresh(self) -> dict[str, list[Candidate]]:
        if self._version is None:
            return candidates_by_model(self._records(), self._identify)
        v = self._version()
        if v != self._seen:
            self._index = candidates_by_model(self._records(), self._identify)
            self._seen = v
        return self._index

    def candidates(self, model: str) -> Sequence[Candidate]:
        return self._fresh().get(model, ())

    def is_known(self, model: str) -> bool:
        return model_is_known(model, self._records())

    def all_candidates(self) -> Sequence[Candidate]:
        seen: dict[tuple[str, str], Candidate] = {}
        for bucket in self._fresh().values():
            for c in bucket:
                seen.setdefault((c.session_id, c.model.id), c)
        return list(seen.values())

    def watch_down(self, cand: Candidate, on_down: OnDown) -> Unwatch | None:
        return None  # (polled records, no change events to watch)


def merged_catalog(candidates: Iterable[Candidate],
                   native_responses: frozenset[str] = frozenset(),
                   pins: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The merged model catalog in OpenAI's list shape, plus providers/nodes/hardware and
    `capabilities`: the APIs the ingress routes for the model (the engine still validates:
    an engine without embeddings answers that route 4xx) and how /v1/responses and
    /v1/messages are served ("native": passed through, "translated": over chat).

    A model's `aliases` are the names that route to it (routing/filters.py `resolve`): not
    an alias that is another listed model's id, nor one several models list (refused with
    409); a name the ingress's operator pinned (`pins`, NAME -> id) only under its id."""
    pins = pins or {}
    candidates = list(candidates)
    targets: dict[str, set[str]] = {}
    for c in candidates:
        for alias in c.model.aliases:
            targets.setdefault(alias, set()).add(c.model.id)
    ids = {c.model.id for c in candidates}
    routed = {a for a, t in targets.items() if len(t) == 1 and a not in ids and a not in pins}
    entries: dict[str, dict[str, Any]] = {}
    for c in candidates:
        e = entries.get(c.model.id)
        if e is None:
            e = entries[c.model.id] = {
                "id": c.model.id, "object": "model", "created": 0, "owned_by": "llmfabric",
                "aliases": set(), "providers": set(), "nodes": [], "gpus": set(),
                "quantizations": set(), "max_context": 0, "adapters": set(),
            }
        e["aliases"].update(a for a in c.model.aliases if a in routed)
        e["adapters"].update(c.model.adapters)
        e["providers"].add(c.provider_id)
        e["nodes"].append(c.session_id)
        e["gpus"].add(c.hardware.gpu_model)
        e["quantizations"].add(c.model.quantization)
        e["max_context"] = max(e["max_context"], c.model.max_context)
    for name, mid in pins.items():
        if mid in entries:
            entries[mid]["aliases"].add(name)
    data = []
    for mid in sorted(entries):
        e = entries[mid]
        for k in ("aliases", "providers", "gpus", "quantizations", "adapters"):
            e[k] = sorted(e[k])
        e["nodes"] = sorted(set(e["nodes"]))
        e["serving"] = len(e["nodes"])
        e["max_model_len"] = e["max_context"]  # (vLLM's name for it)
        native = "*" in native_responses or mid in native_responses
        e["capabilities"] = {
            "chat_completions": True, "completions": True, "embeddings": True,
            "responses": "native" if native else "translated", "messages": "translated",
            "passthrough": sorted(PASSTHROUGH_PATHS), "lora_adapters": bool(e["adapters"]),
        }
        data.append(e)
    return {"object": "list", "data": data}
