"""The node's engine: supervision (agent/), the proxy that serves forwarded requests, and the
subscription to the engine's KV-cache events.

Forwarded inference requests reach the engine two ways, both on the encrypted data plane
(node/serve/dataplane_server.py checks their authorization first): sealed over the peer network
(through relays too), and over the node's pinned-certificate HTTPS listener (the fast direct
path). Both count in-flight requests so SIGTERM can drain them, and both refuse new work
(503, retried elsewhere by the ingress) once draining started.

Engines listen on loopback: only the node (its authenticated data plane) talks to them. An
engine command that binds elsewhere (`--host 0.0.0.0`, a LAN address) is refused unless the
operator allows it (`--allow-engine-public-bind`): an engine port reachable from the network
would bypass API keys, accounting and the fabric's encryption. vLLM binds every interface
when no `--host` is given, so the node adds `--host 127.0.0.1` to vLLM commands without one
(sglang, llama.cpp and `llmfabric engine sim` default to loopback).

KV-cache events (`KvEventsLink`, `kv_events_for`; vLLM `--kv-events-config`): when the engine
publishes events (the flag in its command, or the node's own `--kv-events-config` for an
engine whose command does not show it), the node's prefix-cache sketch is `HeldPrefixes`
(routing/held_prefixes.py): the prompt blocks the engine holds, fed by the forwarded prompts
and by these events. Otherwise it stays `ServedPrefixes` (what the node served), unchanged.
The socket is opened before the engine starts (a publisher that connects finds it bound).
Every message is decoded under bounds (routing/kv_events.py: at most `MAX_PAYLOAD_BYTES`,
also enforced by the socket's maximum message size, and a bounded receive queue); a message
that cannot be used is counted by reason and dropped, a gap in the sequence numbers is
counted, and nothing a publisher sends can stop the loop or the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from llmfabric.agent import EngineInfo, EngineSupervisor, InflightTracker, SupervisorConfig
from llmfabric.agent.command import engine_kind
from llmfabric.agent.kv_events_config import (
    KvEventsConfigError,
    KvEventsEndpoint,
    from_argv,
    parse,
)
from llmfabric.agent.tokenize import EngineTokenizer
from llmfabric.clock import Clock
from llmfabric.forward.engine_proxy import Around, EngineProxy
from llmfabric.forward.stream_usage import StreamUsageCounter
from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.errors import UpstreamError, error_body
from llmfabric.ingress.errors import error_response as http_error
from llmfabric.ingress.paths import FORWARD_PREFIX
from llmfabric.ingress.protocols import Upstream
from llmfabric.net import HandlerResponse, PeerRequest
from llmfabric.net.httpaddr import is_loopback
from llmfabric.node.config import NodeConfig
from llmfabric.registry.records import ServedModel
from llmfabric.routing.cache_summary import PrefixSummary, ServedPrefixes, observe_prompt
from llmfabric.routing.held_prefixes import HeldPrefixes
from llmfabric.routing.kv_events import MAX_PAYLOAD_BYTES, KvEventError, decode_message
from llmfabric.telemetry.node_hop import NODE_TIME_HEADER, node_time_value
from llmfabric.telemetry.otlp import exporter_from_env
from llmfabric.untrusted import get_logger, log_due

log = get_logger(__name__)
_JSON = (("content-type", "application/json"),)


class EngineBindError(ValueError):
    """The engine command binds a non-loopback address and that was not allowed."""


def _host(argv: Sequence[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--host" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--host="):
            return arg.split("=", 1)[1]
    return None


def loopback_engine_command(argv: Sequence[str], *, allow_public: bool = False
                            ) -> tuple[str, ...]:
    """`argv`, bound to loopback; EngineBindError for a public bind not allowed."""
    args = tuple(argv)
    host = _host(args)
    if host is None:
        if engine_kind(args) == "vllm" and not allow_public:
            return (*args, "--host", "127.0.0.1")
        return args
    if not allow_public and not is_loopback(host.strip("[]")):
        raise EngineBindError(
            f"the engine command binds {host!r}, which is not a loopback address: anyone who "
            "can reach it would bypass API keys and the fabric's encryption. Bind it to "
            "127.0.0.1 (--host 127.0.0.1), or start the node with --allow-engine-public-bind "
            "if that is really wanted")
    return args


def with_aliases(
    models: tuple[ServedModel, ...], aliases: Mapping[str, str]
) -> tuple[ServedModel, ...]:
    """The served models with each ALIAS added to the MODEL it names (`--alias ALIAS=MODEL`).

    An alias naming a model the engine does not serve, or equal to another served model's
    id, is skipped with an error in the log (the node still serves its models)."""
    ids = {m.id for m in models}
    extra: dict[str, list[str]] = {}
    for alias, model in aliases.items():
        if model not in ids:
            log.error("--alias %s=%s: the engine serves no model %r (it serves %s); alias "
                      "ignored", alias, model, model, ", ".join(sorted(ids)) or "none")
        elif alias in ids:
            log.error("--alias %s=%s: %r is already a served model id; alias ignored",
                      alias, model, alias)
        else:
            extra.setdefault(model, []).append(alias)
    return tuple(
        dataclasses.replace(m, aliases=tuple(dict.fromkeys((*m.aliases, *extra[m.id]))))
        if m.id in extra else m
        for m in models
    )


def error_response(status: int, message: str, code: str) -> HandlerResponse:
    """An OpenAI-shaped error for the peer protocol (same body as the HTTP routes send)."""
    return HandlerResponse(status, _JSON, error_body(status, message, code))


class ClosingStream:
    """A response body: `chunks`, then (at their end, on an error, or at `aclose()`,
    whichever comes first, once) `close()` awaited. Unlike an async generator's `finally`,
    `aclose()` cleans up even when the body was never iterated: the caller may reset the
    stream before its first byte, and what the body holds (the engine connection and the
    in-flight count, which a drain waits on) must not stay behind."""

    def __init__(self, chunks: AsyncIterator[bytes], close: Callable[[], Awaitable[None]]
                 ) -> None:
        self._chunks = chunks
        self._close: Callable[[], Awaitable[None]] | None = close

    def __aiter__(self) -> ClosingStream:
        return self

    async def __anext__(self) -> bytes:
        if self._close is None:
            raise StopAsyncIteration
        try:
            return await self._chunks.__anext__()
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        close, self._close = self._close, None
        if close is not None:
            await close()


def engine_stream(upstream: Upstream, done: Callable[[], None]) -> ClosingStream:
    """A forwarded request's response body: the engine's chunks, then the engine connection
    closed and `done` called."""
    chunks = upstream.chunks()

    async def close() -> None:
        try:
            await chunks.aclose()
            await upstream.aclose()
        finally:
            done()

    return ClosingStream(chunks, close)


class EngineLink:
    def __init__(
        self,
        config: NodeConfig,
        clock: Clock,
        inflight: InflightTracker,
        *,
        env: dict[str, str] | None = None,
    ) -> None:
        self.config = config
        self.inflight = inflight
        logs = config.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.supervisor = EngineSupervisor(
            SupervisorConfig(
                command=config.process,
                log_path=logs / "engine.log",
                engine_url=config.engine_url,
                ready_timeout_s=config.ready_timeout_s,
                health_interval_s=config.health_interval_s,
                failures_to_down=config.health_failures,
                env=env,
                engine_kind=config.engine_kind,
                model_ids=tuple(config.model_ids),
            ),
            clock=clock,
        )
        self.proxy: EngineProxy | None = None
        self.usage_counter: StreamUsageCounter | None = None
        # Published as the record's prefix_cache: what the engine holds when it reports
        # KV-cache events (KvEventsLink, below), else what this node served.
        self.kv_events = kv_events_for(config.process, config.kv_events_config, clock.now)
        self.served_prefixes: PrefixSummary = (
            self.kv_events.held if self.kv_events is not None else ServedPrefixes())

    async def start(self) -> EngineInfo:
        if self.kv_events is not None:
            try:  # (before the engine: a publisher that connects finds it bound)
                self.kv_events.open()
            except Exception as exc:  # (pyzmq missing, endpoint in use): served prompts
                log.error("cannot follow the engine's KV-cache events on %s: %s; the prefix "
                          "sketch follows the served prompts", self.kv_events.endpoint, exc)
                self.kv_events = None
                self.served_prefixes = ServedPrefixes()
        info = await self.supervisor.start()
        if self.config.aliases:
            info = dataclasses.replace(
                info, models=with_aliases(info.models, self.config.aliases))
        c = self.config  # (the operator's timeouts bound the engine side too)
        self.proxy = EngineProxy(
            info.base_url, max_body_bytes=c.max_body_bytes,
            timeouts=Timeouts(c.connect_timeout_s, c.first_byte_timeout_s, c.idle_timeout_s,
                              c.total_timeout_s),
            around=self._usage_counter(info.base_url))
        self.proxy.exporter = exporter_from_env(os.environ)  # node spans: OTEL_* (otlp.py)
        return info

    def _usage_counter(self, base_url: str) -> Around | None:
        """For engines that send no usage in streams: the node counts (forward/stream_usage.py)."""
        kind = self.supervisor.command.adapter
        if not kind.counts_stream_usage:
            return None
        tokenizer = None
        if kind.tokenize_path is not None:
            tokenizer = EngineTokenizer(kind, base_url, lambda: self._session())
        self.usage_counter = StreamUsageCounter(kind, tokenizer, self.supervisor.command.argv)
        return self.usage_counter.open

    def _session(self) -> aiohttp.ClientSession:
        assert self.proxy is not None  # (tokenize calls come after start)
        return self.proxy.session()

    async def handle_http(self, request: web.Request) -> web.StreamResponse:
        if self.proxy is None or not self.inflight.accepting:
            return http_error(503, "this node is not serving", "node_not_serving")
        self.inflight.begin()
        seen = None
        try:
            seen = observe_prompt(self.served_prefixes, request.path, await request.read())
            return await self.proxy.handle(request)
        finally:
            self.served_prefixes.finished(seen)
            self.inflight.end()

    async def handle_peer_request(self, request: PeerRequest) -> HandlerResponse:
        if not request.path.startswith(FORWARD_PREFIX + "/v1/"):
            return error_response(404, f"{request.path} is not served to peers", "not_found")
        if self.proxy is None or not self.inflight.accepting:
            return error_response(503, "this node is not serving", "node_not_serving")
        return await self.serve_body(request.path, await request.read(),
                                     request.header("traceparent"))

    async def serve_body(self, path: str, body: bytes, traceparent: str | None = None
                         ) -> HandlerResponse:
        """A forwarded request whose body was read (and authorized) already (a traced one
        answers with this node's time, node_hop.py)."""
        arrived = time.perf_counter()
        if not path.startswith(FORWARD_PREFIX + "/v1/"):
            return error_response(404, f"{path} is not served to peers", "not_found")
        if self.proxy is None or not self.inflight.accepting:
            return error_response(503, "this node is not serving", "node_not_serving")
        if len(body) > self.config.max_body_bytes:
            return error_response(400, "request body too large", "request_too_large")
        self.inflight.begin()
        seen = observe_prompt(self.served_prefixes, path, body)
        try:
            upstream = await self.proxy.open(path.removeprefix(FORWARD_PREFIX), body,
                                             traceparent)
        except BaseException as exc:  # (a caller's reset cancels this: CancelledError)
            self.served_prefixes.finished(seen)
            self.inflight.end()
            if isinstance(exc, UpstreamError):
                return error_response(502, str(exc), "engine_unreachable")
            raise

        def done() -> None:
            self.served_prefixes.finished(seen)  # (HeldPrefixes: its run came by now)
            self.inflight.end()

        headers: tuple[tuple[str, str], ...] = (("content-type", upstream.content_type),)
        if traceparent is not None:
            headers += ((NODE_TIME_HEADER.lower(), node_time_value(arrived)),)
        return HandlerResponse(upstream.status, headers, engine_stream(upstream, done))

    def local_view(self) -> dict[str, object]:
        """What only this node knows about its engine (`/v1/fabric/self` "engine_process")."""
        sup = self.supervisor
        return {"pid": sup.pid, "kind": sup.command.kind, "base_url": sup.command.base_url,
                "state": sup.state.value, "exit_code": sup.exit_code,
                "log": str(sup.config.log_path),
                "kv_events": self.kv_events.view() if self.kv_events is not None else None}

    async def aclose(self, stop_timeout_s: float | None = None) -> None:
        """Stop the engine: SIGTERM, SIGKILL after `stop_timeout_s` (default and cap:
        `engine_stop_timeout_s`; requests were drained before, and a longer grace would risk
        Slurm's SIGKILL of the whole node)."""
        limit = self.config.engine_stop_timeout_s
        await self.supervisor.stop(limit if stop_timeout_s is None else min(stop_timeout_s, limit))
        if self.kv_events is not None:
            await self.kv_events.aclose()
        if self.proxy is not None:
            await self.proxy.aclose()


# ---- the engine's KV-cache events -------------------------------------------------------
RCV_HWM = 10_000  # messages queued in the socket before the publisher's drop


class KvEventsLink:
    def __init__(self, endpoint: KvEventsEndpoint, held: HeldPrefixes) -> None:
        self.endpoint = endpoint
        self.held = held
        self.received = 0
        self.applied = 0
        self.gaps = 0
        self.dropped: Counter[str] = Counter()  # reason -> messages
        self._last_seq: int | None = None
        self._ctx: Any = None
        self._sock: Any = None
        self._task: asyncio.Task[None] | None = None

    def open(self) -> None:
        """Open the socket (bind or connect, the publisher's opposite) and start receiving."""
        import zmq  # (only nodes whose engine publishes events load pyzmq)
        import zmq.asyncio

        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, RCV_HWM)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_PAYLOAD_BYTES + 1024)  # the peer is cut past it
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, self.endpoint.topic.encode())
        where = self.endpoint.subscriber_endpoint
        if not self.endpoint.publisher_binds and not _loopback_endpoint(where):
            # We would bind: anyone who reaches that address could publish forged events
            # (and attract traffic with a sketch the engine does not hold).
            sock.close()
            self._ctx.term()
            raise KvEventsConfigError(
                f"the engine's KV-cache events would make the node bind {where}, which is not "
                "a loopback address; use tcp://127.0.0.1:PORT (or a wildcard, which the engine "
                "binds)")
        if self.endpoint.publisher_binds:
            sock.connect(where)
        else:
            sock.bind(where)
        self._sock = sock
        self._task = asyncio.get_running_loop().create_task(self._receive())
        log.info(
            "following the engine's KV-cache events on %s (topic %r)", where, self.endpoint.topic
        )

    async def _receive(self) -> None:
        while True:
            try:
                frames = await self._sock.recv_multipart(copy=True)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a closed socket or a ZMQ error: counted, go on
                self.dropped["socket"] += 1
                if self.dropped["socket"] <= 3 or self.dropped["socket"] % 600 == 0:
                    log.warning("receiving KV-cache events failed (%d times): %s",
                                self.dropped["socket"], exc)
                await asyncio.sleep(1.0)
                continue
            self.handle(frames)
            # recv returns at once while messages are queued: without a yield, a flood of
            # events starved gossip, health checks and the data plane (6.6 s gaps)
            await asyncio.sleep(0)

    def handle(self, frames: list[bytes]) -> None:
        """Decode and apply one message (anything wrong: counted and dropped)."""
        self.received += 1
        try:
            batch = decode_message(frames, self.endpoint.topic.encode())
        except KvEventError as exc:
            self.dropped["malformed"] += 1
            if self.dropped["malformed"] <= 3:  # (a hostile stream must not flood the log)
                log.warning("dropped a KV-cache event message: %s", exc)
            return
        if self._last_seq is not None and batch.seq != self._last_seq + 1:
            self.gaps += 1  # missed messages: the held set may be stale until evictions
        self._last_seq = batch.seq
        try:
            self.held.apply(batch)
        except Exception as exc:  # a bug in the tracker must not stop the events
            self.dropped["apply"] += 1
            n = self.dropped["apply"]
            if log_due(n):  # (it would fail again on each of the engine's many messages)
                log.error("applying KV-cache events (batch seq %d) failed: %r; %d message(s) "
                          "dropped so far", batch.seq, exc, n, exc_info=n == 1)
            return
        self.applied += 1

    def view(self) -> dict[str, object]:
        """For the node's local view (`/v1/fabric/self`)."""
        s = self.held.stats
        return {
            "endpoint": self.endpoint.subscriber_endpoint,
            "received": self.received,
            "applied": self.applied,
            "gaps": self.gaps,
            "dropped": dict(self.dropped),
            "held_keys": len(self.held),
            "blocks_stored": s.stored,
            "blocks_removed": s.removed,
            "unclaimed_runs": s.unclaimed,
        }

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None


def kv_events_for(
    process: tuple[str, ...], configured: str | None, now: Callable[[], float]
) -> KvEventsLink | None:
    """The subscription for an engine that publishes events (its command's flag first, then
    the node's `kv_events_config`), or None: the sketch stays what the node served. A flag
    in the engine command that cannot be read is logged and ignored (the engine will say
    more)."""
    try:
        endpoint = from_argv(process) if process else None
    except KvEventsConfigError as exc:
        log.warning(
            "the engine command's KV-events flag is not usable (%s): the prefix "
            "sketch follows the served prompts",
            exc,
        )
        endpoint = None
    if endpoint is None and configured:
        endpoint = parse(configured)
    return KvEventsLink(endpoint, HeldPrefixes(now)) if endpoint is not None else None


def _loopback_endpoint(endpoint: str) -> bool:
    """ipc:// and inproc:// are local; tcp:// only on a loopback host."""
    if not endpoint.startswith("tcp://"):
        return True
    return is_loopback(endpoint[len("tcp://"):].rsplit(":", 1)[0])
