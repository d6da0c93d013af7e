"""The simulated engine: an OpenAI-compatible aiohttp server that stands in for vLLM.

Routes (as vLLM's OpenAI server): GET /health, GET /v1/models (with max_model_len and the
prefill/decode `role`), POST /v1/chat/completions, /v1/completions (both with SSE streaming,
and vLLM's disaggregated `kv_transfer_params`: pd_role.py), /v1/embeddings; plus POST
/sim/control (faults.py), GET /sim/stats and GET/POST /sim/role (the role flip). Tokens come
out at the pace of the timing model (timing.py) under continuous batching (batcher.py),
divided by `speed`. Prefix caching (on by default): the prompt's leading 16-token blocks
found in an LRU of the model's KV capacity are not prefilled again (with `kv_events_endpoint`
the LRU's stores and evictions are published as vLLM's KV-cache events, engines/kv_publisher.py,
for the node's held-prefix sketch); `/sim/stats` counts hit
and queried prompt tokens, and GET /metrics gives them (and the running requests) under vLLM's
names. A completions prompt that ends with the engine's own answer to an earlier prompt (a
stream continued on another node) goes on with the rest of that answer (text.continued_prompt).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from llmfabric.clock import Clock, SystemClock
from llmfabric.engines import protocol as p
from llmfabric.engines import text
from llmfabric.engines.batcher import Batcher
from llmfabric.engines.dp import DataParallel
from llmfabric.engines.faults import FaultState, crash
from llmfabric.engines.http_edge import (
    ChunkStream,
    M,
    error_response,
    json_response,
    listen,
    read_object,
    read_served_request,
)
from llmfabric.engines.kv_publisher import KvEventPublisher, cache_events
from llmfabric.engines.pd_role import (
    HandleReused,
    KVLink,
    PDRequestError,
    PDRole,
    parse_handoff,
    phase_of,
    prompt_digest,
)
from llmfabric.engines.timing import model_max_context, timing_for
from llmfabric.sim.errors import SpecError
from llmfabric.sim.memory import max_kv_tokens
from llmfabric.sim.prefix_cache import BlockLRU

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class SimEngineConfig:
    models: tuple[str, ...]
    gpu: str = "H100-SXM"
    tp: int = 1
    dp: int = 1  # data-parallel replicas behind the one API (engines/dp.py)
    host: str = "127.0.0.1"
    port: int = 8000
    speed: float = 1.0
    slow: float = 1.0
    max_model_len: int | None = None  # default: the model's context from llmfabric.sim, or 4096
    embedding_dims: int = 384
    startup_delay_s: float = 0.0
    crash_after_requests: int = 0
    hang_after_requests: int = 0
    fail_after_requests: int = 0
    fail_status: int = 500
    exit_after_s: float = 0.0  # crash after this long (0: never)
    log_line: str = ""
    log_after_s: float = 0.0
    ignore_sigterm: bool = False
    prefix_cache: bool = True  # automatic prefix caching, as vLLM V1 by default
    kv_blocks: int | None = None  # the prefix cache's capacity; None: the model's KV capacity
    # KV-cache events in vLLM's format (engines/kv_publisher.py): the ZMQ endpoint and topic
    kv_events_endpoint: str | None = None
    kv_events_topic: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    # Flying Serving (engines/flying_dp.py): DP batchers that bind into TP batchers
    flying: bool = False
    widths: tuple[int, ...] = (1, 2)
    switch_policy: str | None = None  # a SWITCH_POLICIES name; None: only POST /dtp_switch
    # ThunderServe roles (pd_role.py): prefill / decode / both, KV bits on the wire, KV link
    role: str = "both"
    kv_bits: int | None = None
    kv_link: KVLink = field(default_factory=KVLink)


def kv_capacity_blocks(gpu: str, model: str, tp: int) -> int:
    """The engine's KV capacity in 16-token blocks (the simulator's memory plan), or 4,096
    blocks for a model or GPU the simulator does not know."""
    try:
        return max(1, max_kv_tokens(model, gpu, tp) // text.BLOCK_TOKENS)
    except (SpecError, KeyError, ValueError):
        return 4096


class SimEngine:
    def __init__(self, config: SimEngineConfig, clock: Clock | None = None) -> None:
        if not config.models:
            raise ValueError("the simulated engine needs at least one model")
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.batchers: dict[str, Batcher | DataParallel] = {
            m: DataParallel([Batcher(timing_for(config.gpu, m, config.tp), self.clock,
                                     config.speed) for _ in range(config.dp)])
            if config.dp > 1 else Batcher(timing_for(config.gpu, m, config.tp), self.clock,
                                          config.speed)
            for m in config.models
        }
        if config.flying:
            self.batchers = {m: self._flying(m) for m in config.models}
        for b in self.batchers.values():
            b.slow = config.slow
        self.max_len = {m: config.max_model_len or model_max_context(m) for m in config.models}
        self.faults = FaultState(
            crash_after_requests=config.crash_after_requests,
            hang_after_requests=config.hang_after_requests,
            fail_after_requests=config.fail_after_requests,
            fail_after_status=config.fail_status,
        )
        self.created = p.now_s()
        self.completed = 0
        # Prefix caching (sim/prefix_cache.py): an LRU over 16-token blocks holding the
        # engine's KV capacity; a hit skips those tokens' prefill.
        self.prefix_caches = ({m: BlockLRU(config.kv_blocks or kv_capacity_blocks(
            config.gpu, m, config.tp)) for m in config.models} if config.prefix_cache else {})
        self.kv_events = (KvEventPublisher(config.kv_events_endpoint, config.kv_events_topic)
                          if config.kv_events_endpoint and config.prefix_cache else None)
        self.prefix_hits = self.prefix_queries = 0  # tokens, as vLLM's counters
        self.pd = PDRole(config.role, self.clock, config.kv_link, config.kv_bits)

    # -- app ----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._faults_mw], client_max_size=16 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_post("/sim/control", self.control)
        app.router.add_get("/sim/stats", self.stats)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/sim/role", self.get_role)
        app.router.add_post("/sim/role", self.set_role)
        if self.config.flying:
            app.router.add_get("/dtp_status", self.dtp_status)
            app.router.add_post("/dtp_switch", self.dtp_switch)
        return app

    # -- Flying Serving -------------------------------------------------------------------

    def _flying(self, model: str) -> Any:
        from llmfabric.engines.flying_dp import FlyingDataParallel
        from llmfabric.sim.switching import make_policy

        cfg = self.config
        policy = make_policy(cfg.switch_policy) if cfg.switch_policy else None
        return FlyingDataParallel(
            lambda w: Batcher(timing_for(cfg.gpu, model, cfg.tp * w), self.clock, cfg.speed),
            cfg.dp, cfg.widths, policy, self.clock)

    async def dtp_status(self, _: web.Request) -> web.Response:
        return json_response(
            {m: b.status() for m, b in self.batchers.items()  # type: ignore[union-attr]
             } if len(self.batchers) > 1 else
            next(iter(self.batchers.values())).status())  # type: ignore[union-attr]

    async def dtp_switch(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
            width = int(body["width"])
            method = {"soft-preempt": "soft", "hard-preempt": "hard"}.get(
                str(body.get("method", "sequential")), str(body.get("method", "sequential")))
            if method not in ("sequential", "soft", "hard"):
                raise ValueError(f"unknown method {method!r}")
            for b in self.batchers.values():
                b.switch(width, method)  # type: ignore[union-attr]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return error_response(400, f"bad /dtp_switch body: {exc}")
        return await self.dtp_status(request)

    @web.middleware
    async def _faults_mw(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/sim/"):
            return await handler(request)
        await self.faults.wait_while_hung()
        health = request.path in ("/health", "/v1/models")
        if self.faults.fail_status and (not health or self.faults.fail_health):
            return error_response(self.faults.fail_status, "simulated engine failure",
                                  type_="server_error", code="simulated_failure")
        return await handler(request)

    # -- routes -------------------------------------------------------------------------

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, _: web.Request) -> web.Response:
        data = [
            {
                "id": m,
                "object": "model",
                "created": self.created,
                "owned_by": "llmfabric-sim",
                "root": m,
                "parent": None,
                "max_model_len": self.max_len[m],
                "role": self.pd.role,
            }
            for m in self.config.models
        ]
        return json_response({"object": "list", "data": data})

    async def stats(self, _: web.Request) -> web.Response:
        return json_response({
            "requests": self.faults.requests,
            "completed": self.completed,
            "active": {m: b.active for m, b in self.batchers.items()},
            "hung": self.faults.hung,
            "fail_status": self.faults.fail_status,
            "prefix_cache_hits": self.prefix_hits,  # prompt tokens served from the cache
            "prefix_cache_queries": self.prefix_queries,
            "pd": self.pd.stats(),
        })

    async def metrics(self, _: web.Request) -> web.Response:
        """vLLM's metric names, so the node reads load and prefix-cache hits as from vLLM."""
        running = sum(b.active for b in self.batchers.values())
        body = (f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {running}\n"
                "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"
                "# TYPE vllm:prefix_cache_queries counter\n"
                f"vllm:prefix_cache_queries_total {self.prefix_queries}\n"
                "# TYPE vllm:prefix_cache_hits counter\n"
                f"vllm:prefix_cache_hits_total {self.prefix_hits}\n")
        return web.Response(text=body, content_type="text/plain")

    async def get_role(self, _: web.Request) -> web.Response:
        return json_response(self.pd.stats())

    async def set_role(self, request: web.Request) -> web.Response:
        """Flip the role (lightweight rescheduling): a routing change, nothing reloads."""
        try:
            body = orjson.loads(await request.read())
            self.pd.set_role(str(body["role"]) if isinstance(body, dict) else "")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return error_response(400, "bad /sim/role body (want {\"role\": \"prefill\""
                                  f"|\"decode\"|\"both\"}}): {exc}")
        return json_response(self.pd.stats())

    async def control(self, request: web.Request) -> web.Response:
        body = await read_object(request, "control body")
        if isinstance(body, web.Response):
            return body
        action = body.get("action")
        if action == "crash":
            code = int(body.get("code", 3))
            asyncio.get_running_loop().call_later(0.02, crash, code, "control request")
        elif action == "hang":
            self.faults.hang()
            for b in self.batchers.values():
                b.pause()
        elif action == "slow":
            factor = body.get("factor")
            if not isinstance(factor, int | float) or factor <= 0:
                return error_response(400, "slow needs a positive 'factor'")
            for b in self.batchers.values():
                b.slow = float(factor)
        elif action == "fail":
            status = body.get("status", 500)
            if not isinstance(status, int) or not 400 <= status <= 599:
                return error_response(400, "fail needs an HTTP error 'status' (400-599)")
            self.faults.fail_status = status
            self.faults.fail_health = bool(body.get("health", False))
        elif action == "log":
            print(str(body.get("line", "")), flush=True)
        elif action == "reset":
            self.faults.resume()
            self.faults.fail_status = 0
            self.faults.fail_health = False
            for b in self.batchers.values():
                b.resume()
                b.slow = 1.0
        else:
            return error_response(400, "action must be one of crash, hang, slow, fail, log, reset")
        return json_response({"ok": True, "action": action})

    async def _body(self, request: web.Request, model_cls: type[M]) -> M | web.Response:
        # (a chat message takes CHAT_MESSAGE_OVERHEAD tokens and one or more for its text)
        return await read_served_request(request, model_cls, self.batchers,
                                         max(self.max_len.values()),
                                         text.CHAT_MESSAGE_OVERHEAD + 1)

    def _plan(self, model: str, prompt_tokens: int, limit: int | None, ignore_eos: bool,
              seed: int, offset: int = 0) -> tuple[int, str] | web.Response:
        max_len = self.max_len[model]
        if prompt_tokens >= max_len:
            return error_response(400, f"This model's maximum context length is {max_len} tokens. "
                                  f"However, you requested {prompt_tokens} tokens in the prompt.",
                                  code="context_length_exceeded", param="messages")
        room = max_len - prompt_tokens
        if limit is not None and limit > room:
            return error_response(400, f"This model's maximum context length is {max_len} tokens. "
                                  f"However, you requested {prompt_tokens + limit} tokens "
                                  f"({prompt_tokens} in the prompt, {limit} for the completion).",
                                  code="context_length_exceeded", param="max_tokens")
        natural = max(1, text.natural_length(seed) - offset)  # (a continuation: what is left)
        if limit is None:
            return min(natural, room), "stop" if natural <= room else "length"
        if ignore_eos or limit <= natural:
            return limit, "length"
        return natural, "stop"

    async def chat(self, request: web.Request) -> web.StreamResponse:
        req = await self._body(request, p.ChatRequest)
        if isinstance(req, web.Response):
            return req
        msgs = req.messages
        offset = 0
        if req.continue_final_message and len(msgs) > 1 and msgs[-1].role == "assistant":
            # Continue the answer to the earlier messages from the token after the prefix:
            # the same text an uninterrupted run would have produced (one word per token).
            offset = len(msgs[-1].text().split())
            msgs = msgs[:-1]
        prompt_text = "\n".join(f"{m.role}: {m.text()}" for m in msgs)
        prompt_tokens = sum(text.count_tokens(m.text()) + text.CHAT_MESSAGE_OVERHEAD
                            for m in req.messages)
        whole = prompt_text if msgs is req.messages else "\n".join(
            f"{m.role}: {m.text()}" for m in req.messages)
        return await self._generate(request, req, "chat", prompt_text, prompt_tokens, req.limit,
                                    offset, whole)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        req = await self._body(request, p.CompletionRequest)
        if isinstance(req, web.Response):
            return req
        prompt = req.prompt
        if isinstance(prompt, str):
            prompt_text, prompt_tokens = prompt, text.count_tokens(prompt)
        elif prompt and all(isinstance(x, int) for x in prompt):
            prompt_text, prompt_tokens = str(prompt), len(prompt)
        elif len(prompt) == 1 and isinstance(prompt[0], str | list):
            item = prompt[0]
            prompt_text = item if isinstance(item, str) else str(item)
            prompt_tokens = text.count_tokens(item) if isinstance(item, str) else len(item)
        else:
            return error_response(400, "the simulated engine takes one prompt per request",
                                  code="invalid_value", param="prompt")
        offset = 0
        whole = prompt_text
        if isinstance(prompt, str) or isinstance(prompt[0], str):
            # A prompt ending with this engine's own answer to an earlier prompt (a stream
            # continued elsewhere) goes on with the rest of that answer, as an LM would.
            prompt_text, offset = text.continued_prompt(prompt_text)
            if offset:
                prompt_tokens = text.count_tokens(prompt_text) + offset
        return await self._generate(request, req, "text", prompt_text, prompt_tokens, req.limit,
                                    offset, whole)

    async def _generate(self, request: web.Request, req: p.ChatRequest | p.CompletionRequest,
                        kind: str, prompt_text: str, prompt_tokens: int, limit: int | None,
                        offset: int = 0, whole: str | None = None) -> web.StreamResponse:
        """`whole`: the prompt as sent (`prompt_text` less a continued answer), which a KV
        handle is bound to."""
        seed = text.seed_of(prompt_text)
        plan = self._plan(req.model, prompt_tokens, limit, req.ignore_eos, seed, offset)
        if isinstance(plan, web.Response):
            return plan
        n_tokens, finish = plan
        try:
            phase = phase_of(req.model_extra)
            digest = prompt_digest(kind, prompt_text if whole is None else whole) \
                if phase is not None else ""
            handoff = parse_handoff(req.model_extra or {}, prompt_tokens, req.model, digest,
                                    self.clock.wall()) if phase == "decode" else None
        except PDRequestError as exc:
            return error_response(400, str(exc), code="invalid_value", param="kv_transfer_params")
        refused = self.pd.refusal(phase) if phase is not None else None
        if refused is not None:  # retryable: the ingress takes this phase elsewhere
            return error_response(503, refused, type_="server_error", code="wrong_role")
        self.faults.count_request()
        await self.faults.wait_while_hung()
        if self.faults.fail_status:
            return error_response(self.faults.fail_status, "simulated engine failure",
                                  type_="server_error", code="simulated_failure")
        if handoff is not None:
            try:  # single use: checked and recorded with no await since (see PDRole.take)
                self.pd.take(handoff)
            except HandleReused as exc:
                return error_response(409, str(exc), code="kv_handle_reused",
                                      param="kv_transfer_params")
        rid = p.new_id("chatcmpl" if kind == "chat" else "cmpl")
        created = p.now_s()
        cached = self._cached_tokens(req.model, prompt_text, prompt_tokens)
        if handoff is not None:  # the KV arrives instead of being computed here
            await self.pd.receive(handoff)
        tokens = self.batchers[req.model].generate(prompt_tokens, n_tokens, cached,
                                                   prefilled=handoff is not None)
        if phase == "prefill":
            parts = [text.token_text(seed, i + offset) async for i in tokens]
            self.completed += 1
            build = p.chat_completion if kind == "chat" else p.text_completion
            reply = build(rid, created, req.model, "".join(parts), finish, prompt_tokens,
                          len(parts))
            reply["kv_transfer_params"] = self.pd.handle(req.model, prompt_tokens, digest)
            return json_response(reply)
        if req.stream:
            return await self._stream(request, req, kind, rid, created, seed, tokens,
                                      prompt_tokens, n_tokens, finish, offset)
        parts = [text.token_text(seed, i + offset) async for i in tokens]
        self.completed += 1
        build = p.chat_completion if kind == "chat" else p.text_completion
        return json_response(build(rid, created, req.model, "".join(parts), finish,
                                   prompt_tokens, len(parts)))

    def _cached_tokens(self, model: str, prompt_text: str, prompt_tokens: int) -> int:
        """Prompt tokens the prefix cache holds (then the prompt's blocks become recent)."""
        lru = self.prefix_caches.get(model)
        if lru is None:
            return 0
        ids = text.block_ids(prompt_text)
        held = [b in lru for b in ids] if self.kv_events is not None else []
        hit = min(prompt_tokens - 1, lru.match(ids) * text.BLOCK_TOKENS)
        evicted = lru.insert(ids)
        if self.kv_events is not None:
            self.kv_events.publish(cache_events(prompt_text, ids, held, evicted))
        self.prefix_hits += max(0, hit)
        self.prefix_queries += prompt_tokens
        return max(0, hit)

    async def _stream(self, request: web.Request, req: p.ChatRequest | p.CompletionRequest,
                      kind: str, rid: str, created: int, seed: int, tokens: AsyncIterator[int],
                      prompt_tokens: int, n_tokens: int, finish: str, offset: int = 0
                      ) -> web.StreamResponse:
        stream = await ChunkStream.open(request, req, kind, rid, created)
        sent = 0
        try:
            await stream.begin()
            async for i in tokens:
                sent += 1
                await stream.piece(text.token_text(seed, i + offset))
            await stream.end(finish, prompt_tokens, sent)
        except (ConnectionResetError, asyncio.CancelledError):
            with contextlib.suppress(Exception):  # (the client is gone: its error is raised)
                await tokens.aclose()  # type: ignore[attr-defined]
            raise
        self.completed += 1
        return stream.resp

    async def embeddings(self, request: web.Request) -> web.Response:
        req = await self._body(request, p.EmbeddingRequest)
        if isinstance(req, web.Response):
            return req
        inp = req.input
        items: list[str]
        if isinstance(inp, str):
            items = [inp]
        elif inp and all(isinstance(x, int) for x in inp):
            items = [str(inp)]
        else:
            items = [x if isinstance(x, str) else str(x) for x in inp]
        if not items or any(x == "" for x in items):
            return error_response(400, "input must be a non-empty string or list", param="input")
        self.faults.count_request()
        dims = req.dimensions or self.config.embedding_dims
        prompt_tokens = sum(text.count_tokens(x) for x in items)
        await self.clock.sleep(self.batchers[req.model]._scaled(0.005 + 1e-5 * prompt_tokens))
        data = [p.embedding_item(i, text.embedding(x, dims), req.encoding_format)
                for i, x in enumerate(items)]
        self.completed += 1
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
        return json_response({"object": "list", "data": data, "model": req.model, "usage": usage})


async def serve(config: SimEngineConfig, ready: asyncio.Event | None = None) -> None:
    """Run the engine until SIGTERM/SIGINT (or until cancelled)."""
    engine = SimEngine(config)
    print(f"INFO: llmfabric sim engine: models {', '.join(config.models)} on "
          f"{config.gpu} x{config.tp}, speed x{config.speed}", flush=True)
    if config.startup_delay_s > 0:
        print(f"INFO: loading model weights ({config.startup_delay_s:.1f}s)", flush=True)
        await asyncio.sleep(config.startup_delay_s)
    runner = await listen(engine.app(), config.host, config.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if not config.ignore_sigterm:
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    else:
        loop.add_signal_handler(signal.SIGTERM, lambda: print("INFO: ignoring SIGTERM",
                                                              flush=True))
    loop.add_signal_handler(signal.SIGINT, stop.set)
    timers: list[asyncio.TimerHandle] = []
    if config.exit_after_s > 0:
        timers.append(loop.call_later(config.exit_after_s, crash, 3, "exit-after"))
    if config.log_line:
        timers.append(loop.call_later(config.log_after_s, lambda: print(config.log_line,
                                                                        flush=True)))
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
        print("INFO: Shutting down", flush=True)
    finally:
        for t in timers:
            t.cancel()
        await runner.cleanup()
        for b in engine.batchers.values():
            await b.aclose()
        if engine.kv_events is not None:
            engine.kv_events.close()
