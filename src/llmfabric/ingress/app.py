"""The ingress's request core: OpenAI-compatible requests over routing + a Forwarder (the
HTTP servers that call it: llmfabric.front).

Hot path per request: bearer check (cached), one orjson parse of the body for what routing
needs (model, stream, metadata, prompt prefix only if the policy wants it), a policy pick, and
a byte relay of the upstream response. The body is re-serialized only when it must change
(fabric metadata removed, stream usage requested, a `models` fallback list cut: request_body.py;
the request then tries each listed model in turn, and a body without the field pays one dict
lookup for it).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from llmfabric.accounts.expiry import expired_message
from llmfabric.ingress.attempt import (
    Committed,
    NodeDown,
    Resumable,
    attempt_once,
    attempt_stream,
)
from llmfabric.ingress.config import IngressConfig, TraceEvent
from llmfabric.ingress.continuation import (
    RelayRecorder,
    continuation_wanted,
    continue_stream,
)
from llmfabric.ingress.errors import (
    Reply,
    UpstreamError,
    error_code,
    error_reply,
    rate_limited,
)
from llmfabric.ingress.metrics import IngressMetrics
from llmfabric.ingress.paths import METERED_BY_REQUEST
from llmfabric.ingress.pd_path import Handback, PDPath
from llmfabric.ingress.protocols import (
    Authenticator,
    BodyReader,
    CandidateSource,
    CompletionHold,
    Forwarder,
    Gate,
    PriceHold,
    Principal,
    StreamSink,
    UsageSink,
    bearer_of,
)
from llmfabric.ingress.request_body import (
    MAX_MODEL_CHARS,
    BadJson,
    InvalidModels,
    falls_back,
    load_object,
    requested_models,
)
from llmfabric.ingress.sources import merged_catalog
from llmfabric.ingress.tracing import Tracer, current_trace
from llmfabric.ingress.usage import (
    Usage,
)
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.errors import InvalidConstraintError, InvalidSessionIdError
from llmfabric.routing.filters import Ambiguous, resolve
from llmfabric.routing.model_access import (
    catalog_within,
    no_access,
    permitted,
    usable,
)
from llmfabric.routing.policies import make_policy
from llmfabric.routing.prefix import (
    SESSION_HEADER,
    prompt_prefix,
    routing_keys,
    session_header,
)
from llmfabric.routing.request import FABRIC_METADATA_KEYS, RouteRequest, route_request
from llmfabric.routing.router import NoRoute, NoRouteReason, Router
from llmfabric.routing.walltime import requested_tokens, sim_rate, walltime_filter
from llmfabric.untrusted import get_logger, log_due

# Where the ingress may add stream_options.include_usage (the OpenAI streaming routes).
_USAGE_INJECT_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
_perf = time.perf_counter
log = get_logger(__name__)


class Ingress:
    """Request handling state shared by the routes (llmfabric.front serves them over HTTP)."""

    def __init__(
        self,
        config: IngressConfig,
        source: CandidateSource,
        forwarder: Forwarder,
        auth: Authenticator | None = None,
        usage_sink: UsageSink | None = None,
        metrics: IngressMetrics | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if config.auth_enabled and auth is None:
            raise ValueError("auth_enabled needs an Authenticator (or auth_enabled=False: demo)")
        self.config = config
        self.source = source
        self.forwarder = forwarder
        self.auth = auth if config.auth_enabled else None
        # A sync look-up of verified keys, tried before authenticate().
        self._auth_cached: Callable[[str], Principal | None] | None = (
            self.auth.cached if self.auth is not None else None)
        self.usage_sink = usage_sink
        self.metrics = metrics if metrics is not None else IngressMetrics()
        self.metrics.known_model = source.is_known  # unknown names: one "other" label
        self.metrics.candidates = source.all_candidates  # (prefix-cache hit gauges)
        self.policy = make_policy(config.policy, rng)
        self.router = Router(self.policy)
        self._needs_blocks = getattr(self.policy, "needs_blocks", False) is True
        self._capture = usage_sink is not None or config.trace_hook is not None
        # A forwarder that enforces every Timeouts phase itself (RawHttpForwarder) saves the
        # asyncio.timeout contexts around each attempt.
        self._own_timeouts = forwarder.enforces_timeouts
        self._plain_requests: dict[tuple[str, bool], RouteRequest] = {}
        self._pins = dict(config.model_aliases)  # NAME -> model id, set by the operator
        self._retry_after = {"Retry-After": str(config.retry_after_s)}
        self._duration = sim_rate()  # request duration estimate for walltime routing
        self.pd = PDPath(self, Committed, rng)  # prefill/decode disaggregation (pd_path.py)
        self.tracer = (Tracer(config.keep_traces, rate_per_s=config.trace_rate_per_s)
                       if config.keep_traces > 0 else None)
        self.gate: Gate | None = None  # budgets + fair queueing (llmfabric.tenancy)
        # Models whose engines serve /v1/responses themselves (the catalog says so)
        self._native = frozenset(config.native_responses_models)

    def resolve_name(self, model: str, providers: frozenset[str] | None
                     ) -> Sequence[Candidate] | Ambiguous:
        """The candidates a request naming `model` may go to (routing/filters.py `resolve`):
        a name this ingress's operator pinned (--model-alias) is that model id's replicas;
        otherwise one model's candidates, or `Ambiguous` for an alias of several."""
        target = self._pins.get(model, model) if self._pins else model
        candidates = self.source.candidates(target)
        if target != model:
            return [c for c in candidates if c.model.id == target]
        if not candidates:
            return candidates
        return resolve(candidates, model, providers)

    async def models_reply(self, authorization: str) -> Reply:
        """GET /v1/models, transport-agnostic."""
        if self.auth is not None:
            who = await self.authenticate_header(authorization)
            if isinstance(who, Reply):
                return who
            if who.models is not None:  # a key with a model allowlist sees only those
                return Reply(200, orjson.dumps(catalog_within(self.catalog(), who.models)))
        return Reply(200, orjson.dumps(self.catalog()))

    def use_gate(self, gate: Gate | None) -> None:  # (usage is then always captured)
        self.gate, self._capture = gate, self._capture or gate is not None

    def catalog(self) -> dict[str, Any]:
        """The merged model catalog in OpenAI's list shape, plus providers/nodes/hardware."""
        return merged_catalog(self.source.all_candidates(), self._native, self._pins)

    # -- helpers -------------------------------------------------------------------------

    async def authenticate_header(self, header: str) -> Principal | Reply:
        """The principal of an Authorization header, or the 401 to answer (missing key,
        unknown or revoked key, or `expired_api_key` saying when). Auth must be on."""
        if self.auth is None:
            raise RuntimeError("authentication is switched off")
        token = bearer_of(header)
        if not token:
            return error_reply(
                401, "missing API key: send 'Authorization: Bearer <key>'", "invalid_api_key"
            )
        principal = await self.auth.authenticate(token)
        if principal is None:
            return self.key_refused(token)
        return principal

    def key_refused(self, token: str) -> Reply:
        """The 401 for a key `authenticate` refused: saying when, if it expired."""
        at = self.auth.expired_at(token) if self.auth is not None else None
        if at is not None:
            return error_reply(401, expired_message(at), "expired_api_key")
        return error_reply(
            401, "invalid or revoked API key; create one with `llmfabric keys create`",
            "invalid_api_key",
        )

    def _prefix(self, doc: Mapping[str, Any]) -> str:
        return prompt_prefix(doc, self.config.prefix_chars)

    # -- the request path ----------------------------------------------------------------

    async def serve(
        self, path: str, streamable: bool, authorization: str, providers: str | None,
        body_in: bytes | BodyReader, sink: StreamSink, session_id: str | None = None,
        *, principal: Principal | None = None,
    ) -> Reply | None:
        """One OpenAI POST, transport-agnostic: a complete `Reply`, or None when the
        response was streamed into `sink` (status 200). `session_id`: the X-Session-Id
        header as received (validated here). `principal`: a caller the ingress already
        knows (a batch line, run as the key that created its batch, which the caller
        re-checked): `authorization` is then not read, and rate limits, budgets and usage
        apply to it as to a bearer's request."""
        args = (path, streamable, authorization, providers, body_in, sink, session_id,
                principal)
        if (gate := self.gate) is None:
            return await self._serve(*args)
        try:  # (however it ends, the request's queue slot and budget hold are settled)
            return await self._serve(*args)
        finally:
            gate.settle()

    async def _serve(
        self, path: str, streamable: bool, authorization: str, providers: str | None,
        body_in: bytes | BodyReader, sink: StreamSink, session_id: str | None,
        as_principal: Principal | None,
    ) -> Reply | None:
        t0 = _perf()
        tr = current_trace()
        started = time.time() if self.config.trace_hook is not None else 0.0
        principal: Principal | None = None
        allowed: frozenset[str] | None = None  # the key's model allowlist (None: all)
        if self.auth is not None:
            cached = self._auth_cached  # (a known key: no coroutine)
            principal = as_principal if as_principal is not None else (
                cached(authorization[7:].strip()) if cached is not None
                and authorization[:7].lower() == "bearer " else None)
            if principal is None:
                who = await self.authenticate_header(authorization)
                if isinstance(who, Reply):
                    self.metrics.observe_error(
                        "", 401, error_code(who) or "invalid_api_key")
                    return who
                principal = who
            wait = self.auth.check_rate(principal)
            if wait is not None:
                self.metrics.observe_error("", 429, "rate_limit_exceeded")
                return rate_limited(wait)
            allowed = principal.models
        if tr is not None:
            tr.phase("auth", key_id=principal.id if principal is not None else None)
        body = body_in if isinstance(body_in, bytes) else await body_in()
        if isinstance(body, Reply):
            self.metrics.observe_error("", body.status, "request_too_large")
            return body
        try:
            doc = load_object(body)
        except BadJson as e:
            return self._refuse("", 400, str(e), e.code)
        model = doc.get("model")
        fallbacks: tuple[str, ...] = ()
        listed = "models" in doc  # model fallbacks (request_body.py), cut from the body
        if listed:
            try:
                model, fallbacks = requested_models(model, doc.pop("models"))
            except InvalidModels as e:
                return self._refuse("", 400, str(e), "invalid_models", "models")
            if isinstance(model, str):
                doc["model"] = model
        if not isinstance(model, str) or not model:
            return self._refuse("", 400, "'model' is required (a string)", "missing_model",
                                "model")
        if len(model) > MAX_MODEL_CHARS:  # (kept in traces, metrics and the route cache)
            return self._refuse("", 400, f"'model' is at most {MAX_MODEL_CHARS} characters",
                                "invalid_model", "model")
        stream_field = doc.get("stream")
        if stream_field is not None and not isinstance(stream_field, bool):
            # (an engine may read "true" or 1 as true and stream while the ingress, reading
            # no stream, would take the body path: no usage found, nothing billed)
            return self._refuse(model, 400, "'stream' must be a boolean", "invalid_stream",
                                "stream")
        if "kv_transfer_params" in doc:
            # vLLM's disaggregation handle: the fabric's two-phase path sets it (pd_path.py).
            # From a client it made an engine skip prefill and wait for a remote KV that
            # never comes, or hand out its own KV handle.
            return self._refuse(model, 400, "'kv_transfer_params' is set by the fabric's "
                                "prefill/decode path, never by clients",
                                "invalid_kv_transfer_params", "kv_transfer_params")
        stream = streamable and stream_field is True
        meta = doc.get("metadata")
        if meta is not None and not isinstance(meta, dict):
            return self._refuse(model, 400, "'metadata' must be an object", "invalid_metadata",
                                "metadata")
        header = providers
        prefix = self._prefix(doc) if self.policy.needs_prefix else ""
        try:  # Block keys and conversation key for the cache/session policies (prefix.py).
            sid = session_header(session_id)
        except InvalidSessionIdError as e:
            return self._refuse(model, 400, str(e), "invalid_session_id", SESSION_HEADER)
        blocks, session = routing_keys(doc, sid) if self._needs_blocks else ((), "")
        if meta or header is not None or prefix or blocks or session:
            try:
                rreq = route_request(model, providers_header=header, metadata=meta,
                                     prefix=prefix, stream=stream, blocks=blocks,
                                     session=session)
            except InvalidConstraintError as e:
                return self._refuse(model, 400, str(e), "invalid_constraint", "metadata")
        else:
            plain = self._plain_requests.get((model, stream))  # (frozen dataclass inits cost)
            if plain is None:
                if len(self._plain_requests) > 4096:
                    self._plain_requests.clear()
                plain = self._plain_requests[(model, stream)] = RouteRequest(model, stream=stream)
            rreq = plain
        if tr is not None:
            tr.attrs.update(model=model, stream=stream)
        held: PriceHold | None = None  # a spend hold: the models that may serve are bounded
        # an uncapped request's hold: a replica of a larger context gets it capped
        bound: CompletionHold | None = None
        if allowed is not None:  # before admission: what it may not use is not reserved for
            names = usable((model, *fallbacks), allowed,
                           lambda m: self.resolve_name(m, rreq.providers), self._pins)
            if not names:  # (named as the last refusal of the list was)
                last = fallbacks[-1] if fallbacks else model
                return self._refuse(last, 403, no_access(last), "model_not_found", "model")
            if names[0] != model:
                model, rreq, body = self._next_model(doc, rreq, names[0], "model_not_allowed")
            fallbacks = tuple(names[1:])
        if (gate := self.gate) is not None and not gate.admit_at_once(principal):
            if (refused := await gate.admit(principal, doc, path, fallbacks, rreq)) is not None:
                return self._refuse(model, *refused)
            held = gate.held_price()
            bound = gate.held_completion()

        recorder = (RelayRecorder() if stream and continuation_wanted(
            doc, path, self.config.continue_streams) else None)  # (before metadata is cut)
        modified = listed
        if meta and any(k in meta for k in FABRIC_METADATA_KEYS):
            rest = {k: v for k, v in meta.items() if k not in FABRIC_METADATA_KEYS}
            if rest:
                doc["metadata"] = rest
            else:
                del doc["metadata"]
            modified = True
        strip_usage = False
        so = doc.get("stream_options")
        # The client asked for a usage chunk: sent by the ingress if the engine sends none.
        want_chunk = bool(stream and isinstance(so, dict) and so.get("include_usage"))
        if (stream and self._capture and self.config.inject_stream_usage and not want_chunk
                and path in _USAGE_INJECT_PATHS):
            doc["stream_options"] = {**(so if isinstance(so, dict) else {}),
                                     "include_usage": True}
            strip_usage = modified = True
        if modified:
            body = orjson.dumps(doc)

        # One pass per model: `model`, then its fallbacks (`rank`: the next one's index) while
        # the one tried failed in a way another model can mend and nothing reached the client.
        # `attempts`: upstream attempts over every model tried (the trace hook's count).
        rank = attempts = 0
        while True:
            resolved = self.resolve_name(model, rreq.providers)
            if allowed is not None:  # only the key's models serve it (model_access.py)
                kept = permitted(resolved, allowed,
                                 self._pins.get(model, model) if self._pins else model)
                if kept is None:  # nothing it may use answers to the name: as if unknown
                    if rank < len(fallbacks):
                        model, rreq, body = self._next_model(doc, rreq, fallbacks[rank],
                                                             "model_not_allowed")
                        rank += 1
                        continue
                    return self._refuse(model, 403, no_access(model), "model_not_found",
                                        "model")
                resolved = kept
            if isinstance(resolved, Ambiguous):
                return self._refuse(model, 409, resolved.message(), "ambiguous_model", "model")
            candidates = resolved
            if any(c.alloc_end for c in candidates):  # nodes in time-limited jobs (Slurm)
                candidates = walltime_filter(candidates, time.time(), requested_tokens(doc),
                                             self._duration)
            if not candidates:
                target = self._pins.get(model, model) if self._pins else model
                known = self.source.is_known(target)
                if rank < len(fallbacks):
                    model, rreq, body = self._next_model(
                        doc, rreq, fallbacks[rank],
                        str(NoRouteReason.NO_CANDIDATES) if known else "model_not_found")
                    rank += 1
                    continue
                if not known:
                    return self._refuse(
                        model, 404, f"the model {model!r} does not exist on this fabric; "
                        "GET /v1/models lists the served models", "model_not_found", "model",
                    )
                return self._no_route(model, NoRoute(NoRouteReason.NO_CANDIDATES, 0, 0))
            if held is not None:  # (names resolve anew: a dearer model may have come up)
                within = held.within(candidates)
                if not within:  # as if no node served it (a new request reserves its price)
                    if rank < len(fallbacks):
                        model, rreq, body = self._next_model(doc, rreq, fallbacks[rank],
                                                             "priced_above_hold")
                        rank += 1
                        continue
                    return self._refuse(model, 503, held.refusal(model, candidates),
                                        str(NoRouteReason.NO_CANDIDATES),
                                        headers=self._retry_after)
                candidates = within

            pools = self.pd.pools(rreq, candidates) if path in _USAGE_INJECT_PATHS else None
            if pools is not None:  # nodes with prefill/decode roles: the two-phase request
                got = await self.pd.serve(pools, path, model, principal, doc, stream,
                                          strip_usage, want_chunk, sink, t0, started,
                                          final=rank == len(fallbacks), attempts=attempts,
                                          bound=bound)
                if not isinstance(got, Handback):
                    return got
                attempts = got.attempts
                if got.next_model:
                    model, rreq, body = self._next_model(doc, rreq, fallbacks[rank],
                                                         "upstream_failed")
                    rank += 1
                    continue

            tried: list[str] = []
            # Nodes an attempt left on suspicion alone (attempt.py `AbandonIfDown`): not
            # failed, so tried again as a last resort once every other candidate failed (a
            # suspicion can be false, as one still in flight when a partition heals).
            doubted: list[str] = []
            last_error = ""
            why = "upstream_failed"  # (why the next model is tried, when there is one)
            for attempt in range(1 + self.config.max_retries):
                decision = self.router.route(rreq, candidates, tried + doubted, attempt)
                if isinstance(decision, NoRoute) and doubted:
                    decision = self.router.route(rreq, candidates, tried, attempt)
                if isinstance(decision, NoRoute):
                    if attempt == 0:
                        if rank == len(fallbacks):
                            return self._no_route(model, decision)
                        why = str(decision.reason)
                    break
                cand = decision.candidate
                if tr is not None:
                    tr.phase("route", policy=self.config.policy, candidates=len(candidates))
                    tr.open_attempt(cand.session_id, model=model)
                # Asked by alias: the engine knows the model by its id.
                if bound is not None and bound.binds(cand):
                    send = orjson.dumps(bound.capped(doc, cand.model.engine_name(model)))
                else:
                    send = body if cand.model.id == model else orjson.dumps(
                        {**doc, "model": cand.model.engine_name(model)})  # (LoRA: adapter)
                tried.append(cand.session_id)
                attempts += 1
                self.metrics.observe_routed(cand.session_id)
                self.policy.on_request_start(cand)
                ok = ended = False
                try:
                    if stream:
                        resp, usage, ttft = await attempt_stream(
                            self, sink, cand, path, send, strip_usage, want_chunk, doc, model,
                            recorder)
                    else:
                        resp, usage, ttft = await attempt_once(self, cand, path, send, doc,
                                                                     model)
                    status = resp.status if resp is not None else 200
                    ok = status < 500
                except UpstreamError as e:
                    last_error = str(e)
                    if (isinstance(e, NodeDown) and not e.gone
                            and cand.session_id not in doubted):
                        doubted.append(cand.session_id)
                        tried.remove(cand.session_id)
                    if tr is not None:
                        tr.close_attempt(None, last_error)
                    self.metrics.observe_failed_attempt(
                        cand.session_id, model, retried=attempt < self.config.max_retries
                    )
                    continue
                except Committed as e:
                    self.metrics.observe_failed_attempt(cand.session_id, model, retried=False)
                    resp, usage, ttft = None, e.args[0], e.args[1]
                    status = 200
                except Resumable as e:
                    # The node failed mid-stream: end its attempt, continue on another node.
                    self.metrics.observe_failed_attempt(cand.session_id, model, retried=True)
                    ended = True
                    self.policy.on_request_end(cand, False)
                    assert recorder is not None
                    if tr is not None:  # (its continuations are attempts of their own)
                        tr.close_attempt(None, e.args[1])
                    before = len(tried)  # (each continuation joins `tried`)
                    usage, cand = await continue_stream(
                        self, sink, recorder, doc, rreq, candidates, tried, path, want_chunk,
                        cand, e.args[1], bound)
                    attempts += len(tried) - before
                    resp, ttft, status = None, e.args[0], 200
                finally:
                    if not ended:
                        self.policy.on_request_end(cand, ok)
                if tr is not None:
                    tr.close_attempt(status)
                if fallbacks and resp is not None and rank < len(fallbacks) \
                        and falls_back(status):
                    why = f"engine_{status}"  # (an engine's answer nothing was relayed of)
                    break
                self._finish(path, model, principal, cand, status, stream, attempts,
                             t0, started, ttft, usage, doc)
                return resp
            if rank < len(fallbacks):
                model, rreq, body = self._next_model(doc, rreq, fallbacks[rank], why)
                rank += 1
                continue
            self._trace(path, model, principal, None, 502, stream, attempts, t0, started,
                        None, None, doc)
            return self._refuse(
                model, 502, f"all {len(tried)} candidate node(s) for model {model!r} failed"
                f" (last error: {last_error}); retry later", "upstream_failed",
            )

    def _next_model(self, doc: dict[str, Any], rreq: RouteRequest, to: str, why: str
                    ) -> tuple[str, RouteRequest, bytes]:
        """The request moved on from `rreq.model` to the next model of its list: counted,
        traced, and its body (which names the model) made anew."""
        self.metrics.observe_fallback(rreq.model, to)
        if (tr := current_trace()) is not None:
            tr.phase("model_fallback", model=rreq.model, to=to, reason=why)
            tr.attrs["model"] = to
        doc["model"] = to
        return to, dataclasses.replace(rreq, model=to), orjson.dumps(doc)

    def _no_route(self, model: str, nr: NoRoute) -> Reply:
        return self._refuse(model, 503, nr.message(model), str(nr.reason),
                            headers=self._retry_after)

    def _refuse(self, model: str, status: int, message: str, code: str,
                param: str | None = None, headers: dict[str, str] | None = None) -> Reply:
        """An error the ingress answers itself, counted by status and code ("" model: refused
        before the body named one)."""
        self.metrics.observe_error(model, status, code)
        return error_reply(status, message, code, param, headers)

    def _finish(
        self, path: str, model: str, principal: Principal | None, cand: Candidate, status: int,
        stream: bool, attempts: int, t0: float, started: float, ttft: float | None,
        usage: Usage | None, doc: dict[str, Any],
    ) -> None:
        e2e = _perf() - t0
        self.metrics.observe_request(model, status, e2e)
        if path in METERED_BY_REQUEST and usage is not None and usage.estimated:
            usage = Usage(0, 0, True)  # no usage from the engine: metered by request
        # Billed as the model that ran it: the name asked may be an alias, a pin or a LoRA
        # adapter nobody priced (a spend budget charged an alias of a priced model $0).
        billed = cand.model.id
        if self.gate is not None:
            self.gate.used(usage, billed)
        if usage is not None:
            self.metrics.observe_usage(model, getattr(principal, "owner", ""), *usage[:2])
        if usage is not None and principal is not None and self.usage_sink is not None:
            self.usage_sink.record(principal.id, billed, usage[0], usage[1],
                                   estimated=usage.estimated)
        if self.config.trace_hook is not None:
            self._trace(path, model, principal, cand.session_id, status, stream, attempts, t0,
                        started, ttft, usage, doc)

    def _trace(
        self, path: str, model: str, principal: Principal | None, node: str | None,
        status: int, stream: bool, attempts: int, t0: float, started: float,
        ttft: float | None, usage: Usage | None, doc: dict[str, Any],
    ) -> None:
        hook = self.config.trace_hook
        if hook is None:
            return
        try:  # (a broken hook must never fail a request, nor go unnoticed)
            hook(TraceEvent(
                path=path, model=model, key_id=principal.id if principal else None, node=node,
                status=status, stream=stream, attempts=attempts, started_at=started,
                ttft_s=ttft, e2e_s=_perf() - t0,
                prompt_tokens=usage[0] if usage else None,
                completion_tokens=usage[1] if usage else None,
                request=doc,
                opted_out=principal is not None and not principal.record_trace,
            ))
        except Exception as e:
            self.metrics.hook_errors += 1
            n = self.metrics.hook_errors
            if log_due(n):  # (a hook broken on every request: a log line, not a flood)
                log.error("trace hook failed on a finished %s request (model %r, status %d): "
                          "%r; %d failure(s) so far (llmfabric_ingress_trace_hook_errors)",
                          path, model, status, e, n, exc_info=n == 1)
