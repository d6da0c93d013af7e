"""The two-phase request of prefill/decode disaggregation (ThunderServe; COMPANIONS.md §1.6).

As vLLM's disaggregated proxy does: (1) the prefill call, not streamed, with `max_tokens=1`
and `kv_transfer_params = {"do_remote_decode": true}`, on a prefill node; its answer carries
the KV handle in `kv_transfer_params`; (2) the client's own request plus that handle on a
decode node, whose answer (streamed or not) is relayed to the client unchanged by the
ingress's ordinary attempt code. Each phase retries on another node of its side (a failed,
refusing or vanished node); a decode node lost before its first byte costs only a retry (any
decode node can pull the KV the handle names), one lost mid-stream ends the stream with an
error event as in the colocated path. Prefill that finds no working node hands the request
back to the colocated path (a `Handback`), where every role serves plain requests; so does a
prefill answered 4xx, and so does a decode that refuses the prefill's handle with a 4xx (the
request may be at fault, or the node, or a handle a hostile prefill node poisoned: the
colocated path answers its own 4xx if the request is). A request with another model still
to try (request_body.py) gets a `Handback` to its next model instead of the 502 of failed
decode nodes or an engine's 429/5xx. A handback carries the request's upstream attempts so
far, this path's included; each attempt of either phase is an `attempt` span of the trace
(attr `phase`). Who may take a phase: routing/pd.py.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from llmfabric.ingress.attempt import RETRYABLE_STATUS, attempt_once, attempt_stream
from llmfabric.ingress.errors import Reply, UpstreamError
from llmfabric.ingress.protocols import CompletionHold, Principal, StreamSink
from llmfabric.ingress.request_body import falls_back
from llmfabric.ingress.tracing import current_trace
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.filters import eligible
from llmfabric.routing.pd import PDRouter, PDSplit, split
from llmfabric.routing.request import RouteRequest

if TYPE_CHECKING:
    from llmfabric.ingress.app import Ingress


@dataclass(frozen=True, slots=True)
class Handback:
    """The two-phase path did not answer. `next_model` False: no prefill node worked (or a
    phase refused with a 4xx): route the request colocated. True: not the request's last
    model (request_body.py), and every decode node failed or the engine answered 429/5xx: the
    ingress moves on to its next model (nothing was counted or sent). `attempts`: the
    request's upstream attempts so far, this path's included."""

    next_model: bool
    attempts: int


_perf = time.perf_counter


def prefill_body(doc: dict[str, Any], model: str) -> bytes:
    """The prefill call: one token, not streamed, asking for a remote decode."""
    out = {k: v for k, v in doc.items()
           if k not in ("stream", "stream_options", "max_completion_tokens")}
    out.update(model=model, max_tokens=1, stream=False,
               kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False})
    return orjson.dumps(out)


MAX_HANDLE_BYTES = 64 * 1024  # vLLM's NIXL handle lists a long prompt's KV block ids


def handle_of(reply: Reply) -> dict[str, Any] | None:
    """The KV handle in a prefill answer (None: the engine did not prefill for a remote
    decode, so it cannot take part). The prefill node is a member like any other: its handle
    goes on to the decode engine only as a flat object (strings, numbers, booleans, lists
    of those) of at most MAX_HANDLE_BYTES; the decode engine validates the fields it reads."""
    try:
        doc = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        return None
    params = doc.get("kv_transfer_params") if isinstance(doc, dict) else None
    if not isinstance(params, dict) or params.get("do_remote_prefill") is not True:
        return None
    if not all(_flat(v) for v in params.values()):
        return None
    if len(orjson.dumps(params)) > MAX_HANDLE_BYTES:
        return None
    return params


_SCALARS = (str, int, float, bool, type(None))


def _flat(v: Any) -> bool:
    return isinstance(v, _SCALARS) or (isinstance(v, list)
                                       and all(isinstance(x, _SCALARS) for x in v))


class PDPath:
    """Runs two-phase requests for an Ingress (its attempt, metrics and trace code)."""

    def __init__(self, ingress: Ingress, committed: type[Exception],
                 rng: random.Random | None = None) -> None:
        self.ing = ingress
        self.committed = committed  # the ingress's "failed after bytes reached the client"
        self.router = PDRouter(rng)
        self.requests = 0
        self.prefill_retries = 0
        self.decode_retries = 0
        self.fallbacks = 0

    def pools(self, rreq: RouteRequest, candidates: Sequence[Candidate]) -> PDSplit | None:
        """The prefill/decode pools among the request's eligible candidates, if any."""
        if not any(c.model.role != "both" for c in candidates):
            return None  # the common case: nobody disaggregates this model
        names = {rreq.model, *(c.model.id for c in candidates)}
        return split(eligible(candidates, rreq), self.router.current(names))

    async def serve(
        self, pools: PDSplit, path: str, model: str, principal: Principal | None,
        doc: dict[str, Any], stream: bool, strip_usage: bool, want_chunk: bool,
        sink: StreamSink, t0: float, started: float, final: bool = True, attempts: int = 0,
        bound: CompletionHold | None = None,
    ) -> Reply | Handback | None:
        """A Reply, None (streamed), or a `Handback` (to the colocated path; unless `final`,
        to the next model). `attempts`: the request's upstream attempts before this path;
        `bound`: an uncapped request's completion hold (a decode node of a larger context
        gets the request capped)."""
        ing = self.ing
        tr = current_trace()
        retries = ing.config.max_retries
        self.requests += 1
        tried: list[str] = []
        handle: dict[str, Any] | None = None
        pre: Candidate | None = None
        for _ in range(1 + retries):
            pre = self.router.pick_prefill(pools, tried)
            if pre is None:
                break
            tried.append(pre.session_id)
            ing.metrics.observe_routed(pre.session_id)
            body = prefill_body(doc, pre.model.engine_name(model))
            if tr is not None:
                tr.open_attempt(pre.session_id, model=model, phase="prefill")
            try:
                reply, _, _ = await attempt_once(ing, pre, path, body, doc, model)
            except UpstreamError as e:
                self.prefill_retries += 1
                ing.metrics.observe_failed_attempt(pre.session_id, model, retried=True)
                if tr is not None:
                    tr.close_attempt(None, str(e))
                continue
            if tr is not None:
                tr.close_attempt(reply.status)
            if reply.status != 200:
                # A 4xx: the request may be at fault, or the node (a member that claims the
                # prefill role and refuses everything would fail every request for the
                # model): the colocated path serves it, or answers its own 4xx.
                ing.metrics.observe_failed_attempt(pre.session_id, model, retried=True)
                break
            handle = handle_of(reply)
            if handle is not None:
                break
            self.prefill_retries += 1
        attempts += len(tried)
        if handle is None or pre is None:
            self.fallbacks += 1
            return Handback(False, attempts)

        decode_doc = {**doc, "kv_transfer_params": handle}
        last_error = ""
        d_tried: list[str] = []
        for attempt in range(1 + retries):
            cand = self.router.pick_decode(pools, pre.session_id, d_tried)
            if cand is None:
                if not d_tried:  # no decode node left at all: serve it colocated
                    self.fallbacks += 1
                    return Handback(False, attempts)
                break
            d_tried.append(cand.session_id)
            attempts += 1
            name = cand.model.engine_name(model)
            send = orjson.dumps(bound.capped(decode_doc, name) if bound is not None
                                and bound.binds(cand) else {**decode_doc, "model": name})
            ing.metrics.observe_routed(cand.session_id)
            ing.policy.on_request_start(cand)
            if tr is not None:
                tr.open_attempt(cand.session_id, model=model, phase="decode")
            ok = False
            try:
                if stream:
                    resp, usage, ttft = await attempt_stream(
                        ing, sink, cand, path, send, strip_usage, want_chunk, doc, model)
                else:
                    resp, usage, ttft = await attempt_once(ing, cand, path, send, doc, model)
                status = resp.status if resp is not None else 200
                ok = status < 500
            except UpstreamError as e:
                last_error = str(e)
                self.decode_retries += 1
                ing.metrics.observe_failed_attempt(cand.session_id, model,
                                                   retried=attempt < retries)
                if tr is not None:
                    tr.close_attempt(None, last_error)
                continue
            except self.committed as e:
                ing.metrics.observe_failed_attempt(cand.session_id, model, retried=False)
                resp, usage, ttft = None, e.args[0], e.args[1]
                status = 200
            finally:
                ing.policy.on_request_end(cand, ok)
            if tr is not None:
                tr.close_attempt(status)
            if resp is not None and 400 <= status < 500 and status not in RETRYABLE_STATUS:
                # The decode node refused the handle: the prefill node may have poisoned it
                # (a member like any other), or the request is at fault. It counts against
                # the prefill node; the colocated path serves it, or answers its own 4xx.
                ing.metrics.observe_failed_attempt(pre.session_id, model, retried=True)
                self.fallbacks += 1
                return Handback(False, attempts)
            if not final and resp is not None and falls_back(status):
                return Handback(True, attempts)
            ing._finish(path, model, principal, cand, status, stream, attempts, t0, started,
                        ttft, usage, doc)
            return resp
        if not final:
            return Handback(True, attempts)
        ing._trace(path, model, principal, None, 502, stream, attempts, t0, started, None,
                   None, doc)
        return ing._refuse(
            model, 502, f"the prefill on node {pre.session_id} worked but all "
            f"{len(d_tried)} decode node(s) for model {model!r} failed (last error: "
            f"{last_error or 'none left'}); retry later", "upstream_failed")

    def stats(self) -> dict[str, int]:
        return {"requests": self.requests, "prefill_retries": self.prefill_retries,
                "decode_retries": self.decode_retries, "fallbacks": self.fallbacks}
