"""`llmfabric engine torch`: the reference engine behind an OpenAI-compatible aiohttp server.

Routes: GET /health, /v1/models, /metrics (Prometheus text: running, waiting, KV usage, width,
switches), /dtp_status; POST /v1/chat/completions, /v1/completions (SSE streaming with
`stream_options.include_usage`; completions take `echo` and `logprobs` for teacher-forced
log-likelihoods), /dtp_switch {"width": w, "method": "sequential"|"soft-preempt"|
"hard-preempt"}. Decoding is greedy unless `temperature` >= 1e-5 (seeded by `seed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from llmfabric.engines import protocol as p
from llmfabric.engines.http_edge import (
    ChunkStream,
    M,
    error_response,
    json_response,
    listen,
    read_object,
    read_served_request,
)
from llmfabric.engines.torchref.config import ByteTokenizer, StreamDecoder
from llmfabric.engines.torchref.engine import EngineOptions, FlyingEngine
from llmfabric.engines.torchref.scheduler import Event, Request
from llmfabric.scheduler.switching import METHODS, Method

MAX_SEED = 2**64 - 1
RETRY_AFTER_S = 1  # Retry-After of a 503 for a full waiting queue
MIN_MESSAGE_TOKENS = len("<tool>\n")  # the shortest chat message (ByteTokenizer.chat_prompt)

METHOD_NAMES: dict[str, Method] = {"sequential": "sequential", "soft-preempt": "soft",
                                   "hard-preempt": "hard", **{m: m for m in METHODS}}


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str | None = None  # served model id (default: the config's name)


class TorchServer:
    def __init__(self, engine: FlyingEngine, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
        self.model = config.model_name or engine.options.config.name
        self.tok = ByteTokenizer()
        self.created = p.now_s()
        self.completed = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=4 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/dtp_status", self.dtp_status)
        app.router.add_post("/dtp_switch", self.dtp_switch)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        return app

    # -- plain routes -------------------------------------------------------------------

    async def health(self, _: web.Request) -> web.Response:
        ok = self.engine.failure is None and all(pr.poll() is None for pr in self.engine.procs)
        return web.Response(status=200 if ok else 503)

    async def models(self, _: web.Request) -> web.Response:
        return json_response({"object": "list", "data": [{
            "id": self.model, "object": "model", "created": self.created,
            "owned_by": "llmfabric-torchref", "root": self.model, "parent": None,
            "max_model_len": self.engine.options.config.max_model_len}]})

    async def dtp_status(self, _: web.Request) -> web.Response:
        return json_response(self.engine.status())

    async def metrics(self, _: web.Request) -> web.Response:
        st = self.engine.status()
        lines = [
            "# TYPE llmfabric_torchref_requests_running gauge",
            f"llmfabric_torchref_requests_running {st['running']}",
            "# TYPE llmfabric_torchref_requests_waiting gauge",
            f"llmfabric_torchref_requests_waiting {st['waiting']}",
            "# TYPE llmfabric_torchref_requests_paused gauge",
            f"llmfabric_torchref_requests_paused {st['paused']}",
            "# TYPE llmfabric_torchref_width gauge",
            f"llmfabric_torchref_width {st['width']}",
            "# TYPE llmfabric_torchref_switches_total counter",
            f"llmfabric_torchref_switches_total {st['switches']}",
            "# TYPE llmfabric_torchref_kv_usage_ratio gauge",
        ]
        for e in st["engines"]:
            kv = e["kv_pool"]
            used = 1.0 - kv["free_blocks"] / kv["total_blocks"]
            lines.append(f'llmfabric_torchref_kv_usage_ratio{{engine="{e["rank"]}"}} {used:.6f}')
        # vLLM's names, so tools that read vLLM's /metrics read ours
        used_all = [1.0 - e["kv_pool"]["free_blocks"] / e["kv_pool"]["total_blocks"]
                    for e in st["engines"]]
        lines += [
            f'vllm:num_requests_running{{model_name="{self.model}"}} {st["running"]}',
            f'vllm:num_requests_waiting{{model_name="{self.model}"}} {st["waiting"]}',
            f'vllm:gpu_cache_usage_perc{{model_name="{self.model}"}} '
            f"{sum(used_all) / max(1, len(used_all)):.6f}",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def dtp_switch(self, request: web.Request) -> web.Response:
        body = await read_object(request, "body")
        if isinstance(body, web.Response):
            return body
        width = body.get("width")
        method = METHOD_NAMES.get(str(body.get("method", self.engine.options.method)))
        if not isinstance(width, int) or isinstance(width, bool) or \
                width not in self.engine.widths:
            return error_response(400, f"width must be one of {list(self.engine.widths)}",
                                  param="width")
        if method is None:
            return error_response(400, "method must be sequential, soft-preempt or hard-preempt",
                                  param="method")
        self.engine.post(lambda: self.engine.sched.switch_to(width, method))
        return json_response({"ok": True, "width": width, "method": method})

    # -- generation ---------------------------------------------------------------------

    async def _body(self, request: web.Request, cls: type[M]) -> M | web.Response:
        # (a chat message is at least "<tool>\n": 7 byte tokens)
        return await read_served_request(request, cls, (self.model,),
                                         self.engine.options.config.max_model_len,
                                         MIN_MESSAGE_TOKENS)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        req = await self._body(request, p.ChatRequest)
        if isinstance(req, web.Response):
            return req
        prompt = self.tok.chat_prompt([(m.role, m.text()) for m in req.messages])
        return await self._generate(request, req, "chat", prompt, req.limit, False)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        req = await self._body(request, p.CompletionRequest)
        if isinstance(req, web.Response):
            return req
        raw = req.prompt
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str | list):
            raw = raw[0]
        if isinstance(raw, str):
            prompt = self.tok.encode(raw)
        elif isinstance(raw, list) and raw and all(
                isinstance(x, int) and 0 <= x < self.engine.options.config.vocab_size
                for x in raw):
            prompt = [int(x) for x in raw]  # type: ignore[arg-type]
        else:
            return error_response(400, "prompt must be one string or one list of token ids",
                                  code="invalid_value", param="prompt")
        return await self._generate(request, req, "text", prompt, req.limit,
                                    bool(getattr(req, "echo", False)))

    async def _generate(self, request: web.Request, req: p.ChatRequest | p.CompletionRequest,
                        kind: str, prompt: list[int], limit: int | None, echo: bool
                        ) -> web.StreamResponse:
        max_len = self.engine.options.config.max_model_len
        max_tokens = limit if limit is not None else max(1, max_len - len(prompt))
        extra = req.model_extra or {}
        temperature = extra.get("temperature")
        seed = extra.get("seed")
        priority = extra.get("priority", 0)
        # (bool is an int in Python; JSON's true is not a number)
        if temperature is not None and (not isinstance(temperature, int | float)
                                        or isinstance(temperature, bool)
                                        or not 0 <= temperature <= 2):
            return error_response(400, "temperature must be in [0, 2]", code="invalid_value",
                                  param="temperature")
        # a negative seed raised in numpy's seeding on the scheduler's thread: a 500
        # engine_failure (orjson reads integers past 2**64 - 1 as floats: refused here too)
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)
                                 or not 0 <= seed <= MAX_SEED):
            return error_response(400, f"seed must be an integer in [0, {MAX_SEED}]",
                                  code="invalid_value", param="seed")
        if not isinstance(priority, int) or isinstance(priority, bool):
            return error_response(400, "priority must be an integer", code="invalid_value",
                                  param="priority")
        # a client's priority is the operator's to grant (EngineOptions.max_priority)
        priority = min(priority, self.engine.options.max_priority)
        try:
            self.engine.sched.check(len(prompt), max_tokens)
        except ValueError as exc:
            return error_response(400, str(exc), code="context_length_exceeded",
                                  param="messages" if kind == "chat" else "prompt")
        limit_waiting = self.engine.options.max_waiting
        if self.engine.sched.backlog() >= limit_waiting:
            # (the ingress takes a 503 as a failed attempt and tries another node)
            return error_response(
                503, f"the engine is overloaded: {limit_waiting} requests are waiting; "
                "retry later", type_="server_error", code="engine_overloaded",
                headers={"Retry-After": str(RETRY_AFTER_S)})
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        def sink(ev: Event) -> None:  # called on the scheduler's thread
            with contextlib.suppress(RuntimeError):  # the event loop is closing
                loop.call_soon_threadsafe(events.put_nowait, ev)

        r = Request(prompt, max_tokens, sink=sink, temperature=float(temperature or 0.0),
                    seed=seed, ignore_eos=req.ignore_eos, priority=priority,
                    prompt_logprobs=echo and extra.get("logprobs") is not None)
        sched = self.engine.sched

        def admit() -> None:
            try:
                sched.add(r)
            except ValueError as exc:  # checked above; the scheduler stays the authority
                sink(("error", str(exc)))

        self.engine.post(admit)
        if self.engine.failure is not None:
            return error_response(503, "engine failed", code="engine_failure", type_="server_error")
        rid = p.new_id("chatcmpl" if kind == "chat" else "cmpl")
        created = p.now_s()
        if req.stream:
            return await self._stream(request, req, kind, rid, created, r, events)
        dec = StreamDecoder()
        parts: list[str] = []
        try:
            async for piece, finish in self._pieces(events, dec):
                if finish is not None:
                    break
                parts.append(piece)
        except RuntimeError as exc:
            return error_response(500, str(exc), code="engine_failure", type_="server_error")
        except asyncio.CancelledError:
            self.engine.post(lambda: sched.cancel(r))
            raise
        self.completed += 1
        text = "".join(parts)
        usage_out = len(r.output)
        if kind == "chat":
            return json_response(p.chat_completion(rid, created, req.model, text,
                                                   r.finish or "stop", len(prompt), usage_out))
        body = p.text_completion(rid, created, req.model, text, r.finish or "stop",
                                 len(prompt), usage_out)
        if echo:
            body["choices"][0]["text"] = self.tok.decode(prompt) + text
            if r.token_logprobs is not None:
                body["choices"][0]["logprobs"] = {
                    "tokens": [self.tok.decode([t]) for t in prompt],
                    "token_logprobs": [None, *r.token_logprobs],
                    "text_offset": None, "top_logprobs": None}
        return json_response(body)

    async def _pieces(self, events: asyncio.Queue[Event], dec: StreamDecoder
                      ) -> AsyncIterator[tuple[str, str | None]]:
        while True:
            ev = await events.get()
            if ev[0] == "token":
                piece = dec.piece(int(ev[1]))
                if piece:
                    yield piece, None
            elif ev[0] == "done":
                tail = dec.flush()
                if tail:
                    yield tail, None
                yield "", str(ev[1])
                return
            else:
                raise RuntimeError(str(ev[1]))

    async def _stream(self, request: web.Request, req: p.ChatRequest | p.CompletionRequest,
                      kind: str, rid: str, created: int, r: Request,
                      events: asyncio.Queue[Event]) -> web.StreamResponse:
        stream = await ChunkStream.open(request, req, kind, rid, created)
        try:
            await stream.begin()
            finish = "stop"
            try:
                async for piece, fin in self._pieces(events, StreamDecoder()):
                    if fin is not None:
                        finish = fin
                        break
                    await stream.piece(piece)
            except RuntimeError as exc:
                await stream.send(p.error_body(str(exc), "server_error", "engine_failure"))
                await stream.resp.write_eof()
                return stream.resp
            await stream.end(finish, len(r.prompt), len(r.output))
        except (ConnectionResetError, asyncio.CancelledError):
            sched = self.engine.sched
            self.engine.post(lambda: sched.cancel(r))
            raise
        self.completed += 1
        return stream.resp


async def serve(options: EngineOptions, config: ServerConfig) -> int:
    """Start the engines, then serve until SIGTERM/SIGINT (exit status 0) or until an engine
    process dies (status 1: fail-stop, as a crashed vLLM would, so the node agent sees it)."""
    loop = asyncio.get_running_loop()
    engine = FlyingEngine(options)
    print(f"INFO: llmfabric torch engine: {options.config.name} "
          f"({options.config.params():,} parameters), {options.dp} engines, widths "
          f"{list(engine.widths)}, starting", flush=True)
    await loop.run_in_executor(None, engine.start)
    engine.start_loop()
    server = TorchServer(engine, config)
    runner = await listen(server.app(), config.host, config.port)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    status = 0

    async def watch() -> None:
        nonlocal status
        while not stop.is_set():
            dead = [r for r, pr in enumerate(engine.procs) if pr.poll() is not None]
            if dead or engine.failure is not None:
                print(f"ERROR: engine failure ({engine.failure or f'engine {dead[0]} exited'})"
                      "; shutting down", flush=True)
                status = 1
                stop.set()
            await asyncio.sleep(0.5)

    watcher = asyncio.create_task(watch())
    try:
        await stop.wait()
        print("INFO: Shutting down", flush=True)
    finally:
        watcher.cancel()
        with contextlib.suppress(Exception):  # (shutting down: the engine still gets closed)
            await runner.cleanup()
        await loop.run_in_executor(None, engine.close)
    return status
