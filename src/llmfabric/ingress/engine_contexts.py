"""The context each static backend's engine serves with (the standalone ingress).

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
from collections.abc import Mapping

from llmfabric.agent.facts import engine_context
from llmfabric.agent.probe import EngineProbe, ProbeError
from llmfabric.clock import Clock, SystemClock, with_timeout
from llmfabric.ingress.sources import StaticCandidateSource
from llmfabric.routing.candidates import Candidate
from llmfabric.untrusted import get_logger

log = get_logger(__name__)

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
