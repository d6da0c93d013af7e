"""Candidate sources: a static list (standalone ingress, tests) and the registry replica;
`merged_catalog` turns candidates into the `GET /v1/models` list; `EngineContexts` keeps the
static list's contexts as its engines report them.

The context each static backend's engine serves with (`EngineContexts`, the standalone ingress).

A `--backend` names a model and an address, not its context: the ingress asks each engine
(agent/facts.py `engine_context`: vLLM's, SGLang's and the sim engine's /v1/models
`max_model_len`, llama-server's /props) at start, bounded by `ASK_TIMEOUT_S`, and keeps the
default (`ServedModel.max_context`) for one that is down or says nothing, with one log line.
The context matters: GET /v1/models shows it, and the tenancy gate reserves a request's whole
context on a budget when the request sets no max_tokens.

Then every `REFRESH_S` it asks again the engines that reported a context (one restarted with
another --max-model-len) and those that did not answer (one started after the ingress), never
one that answered without a context: llama-cpp-python serves /v1/models under its model lock,
so a poll would cut its streams short, and its answer would not change.

An operator can state a model's context (`stated`: `llmfabric ingress --max-context
MODEL=TOKENS`): that context is advertised whatever the engine says, for an engine that
reports none (llama-cpp-python, a proxy) and for one whose report is wrong. The engines are
still asked, so that a stated context the engine contradicts is logged as a warning (at start,
and when its report changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from llmfabric.agent.facts import engine_context
from llmfabric.agent.probe import EngineProbe, ProbeError
from llmfabric.clock import Clock, SystemClock, with_timeout
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
from llmfabric.untrusted import get_logger

RecordsFn = Callable[[], Iterable[tuple[NodeRecord, bool]]]
log = get_logger(__name__)


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


# ---- the static backends' contexts, as their engines report them ----------------------------

ASK_TIMEOUT_S = 5.0  # one engine's whole answer (/v1/models, then /props)
REFRESH_S = 60.0


class EngineContexts:
    """Keeps `source`'s candidates' contexts as their engines report them; `stated`: model
    id -> context the operator stated, which wins over the engine's."""

    def __init__(self, source: StaticCandidateSource, probe: EngineProbe,
                 forward_prefix: str = "", timeout_s: float = ASK_TIMEOUT_S,
                 clock: Clock | None = None, stated: Mapping[str, int] | None = None) -> None:
        self.source = source
        self._probe = probe
        self._prefix = forward_prefix
        self._timeout_s = timeout_s
        self._clock: Clock = clock or SystemClock()
        self._stated = dict(stated or {})
        self._configured: tuple[Candidate, ...] = tuple(
            _with_context(c, self._stated[c.model.id]) if c.model.id in self._stated else c
            for c in source.all_candidates())
        self._reported: dict[int, int] = {}  # candidate index -> context its engine reported
        self._silent: set[int] = set()  # answered without a context: not asked again
        self._refresh: asyncio.Task[None] | None = None

    async def ask(self, announce: bool = True) -> None:
        """Ask every engine not known to be silent; apply what they report. `announce`: log
        a line for each engine that is down or says nothing (once, at start)."""
        todo = [i for i in range(len(self._configured)) if i not in self._silent]
        answers = await asyncio.gather(*(self._ask_one(self._configured[i]) for i in todo))
        for i, (context, why_not) in zip(todo, answers, strict=True):
            cand = self._configured[i]
            stated = cand.model.id in self._stated
            if context is not None:
                if announce or self._reported.get(i) != context:
                    self._log_reported(cand, context, stated)
                self._reported[i] = context
                continue
            if why_not is None:  # answered without a context
                self._silent.add(i)
                self._reported.pop(i, None)
            if announce:
                log.log(logging.INFO if stated and why_not is None else logging.WARNING,
                        "backend %s at %s %s: advertising %s of %d tokens",
                        cand.model.id, cand.http_addr, why_not or "does not report its context",
                        "the --max-context" if stated else "the default context",
                        cand.model.max_context)
        self.source.replace(self.candidates())

    def candidates(self) -> list[Candidate]:
        """The configured candidates with the contexts their engines reported (a stated
        context stays)."""
        out = []
        for i, cand in enumerate(self._configured):
            context = None if cand.model.id in self._stated else self._reported.get(i)
            out.append(cand if context is None else _with_context(cand, context))
        return out

    @staticmethod
    def _log_reported(cand: Candidate, context: int, stated: bool) -> None:
        if not stated or context == cand.model.max_context:
            log.info("backend %s at %s: context %d tokens (its engine's)",
                     cand.model.id, cand.http_addr, context)
            return
        log.warning("backend %s at %s: its engine reports a context of %d tokens, its "
                    "--max-context says %d: advertising %d", cand.model.id, cand.http_addr,
                    context, cand.model.max_context, cand.model.max_context)

    def start(self, period_s: float = REFRESH_S) -> None:
        """Ask again every `period_s` seconds, until `aclose`."""
        if self._refresh is None:
            self._refresh = asyncio.create_task(self._run(period_s))

    async def aclose(self) -> None:
        task, self._refresh = self._refresh, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, period_s: float) -> None:
        while True:
            await self._clock.sleep(period_s)
            try:
                await self.ask(announce=False)
            except Exception:  # (a bug here must not end the refresh silently)
                log.exception("asking the backends' engines for their contexts failed")

    async def _ask_one(self, cand: Candidate) -> tuple[int | None, str | None]:
        """(context, None); (None, None): answered without one; (None, why): no answer."""
        base_url = f"http://{cand.http_addr}{self._prefix}"
        try:
            return await with_timeout(self._clock, engine_context(
                self._probe, base_url, cand.model.id, self._timeout_s), self._timeout_s), None
        except TimeoutError:
            return None, f"did not answer in {self._timeout_s:g} s"
        except ProbeError as exc:
            return None, f"did not answer ({exc})"


def _with_context(cand: Candidate, context: int) -> Candidate:
    return dataclasses.replace(cand, model=dataclasses.replace(cand.model, max_context=context))
