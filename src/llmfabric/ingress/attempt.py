"""One attempt of the request core (`Ingress.serve`) on one candidate.

Streamed (`attempt_stream`): open the candidate's upstream, read its first chunk (a
retryable failure before then raises UpstreamError), then relay the stream into the
client's sink, scanning usage (and recording whole events when the stream may be
continued), and tell how it ended: `Committed` (bytes reached the client, no retry) or
`Resumable` (continuation.py may finish it on another node). Whole (`attempt_once`): one
non-streamed exchange, its usage and its time.

Abandoned (`AbandonIfDown`): an attempt still waiting on a node the membership now doubts.
`with AbandonIfDown(source, cand): ...` wraps the part of an attempt before any byte reached
the client (connect, headers, first chunk; a whole non-streamed exchange; a continuation's
attempt too). When the source's membership view marks the node suspected or gone meanwhile
(`CandidateSource.watch_down`), the waiting task is cancelled and the block raises
`NodeDown`, an `UpstreamError`: the request path counts the attempt as failed on that node
and retries another, exactly as after a timeout, without waiting out the connect and
first-byte timeouts (seconds, when a site is cut off and its packets are dropped).

Only that part: once bytes reached the client, suspicion does not cut the stream. A
suspicion can be false (a slow probe path, a partition on the prober's side), and a cut
mid-stream costs the relayed work and a continuation; a node that really died ends the
stream by itself (keepalive, idle timeout) and continuation.py finishes it elsewhere.
Costs nothing on a source with no membership (`watch_down` answers None: standalone
ingress); otherwise one watch registered and removed per attempt, no task created.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from types import TracebackType
from typing import TYPE_CHECKING, Any

import aiohttp

from llmfabric.ingress.errors import Reply, UpstreamError, error_body
from llmfabric.ingress.protocols import CandidateSource, StreamSink, Upstream
from llmfabric.ingress.tracing import current_trace
from llmfabric.ingress.usage import (
    StreamUsageScanner,
    Usage,
    estimate_completion_from_body,
    estimate_prompt_tokens,
    relayed_usage,
    usage_from_body,
)
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.liveness import GONE, Unwatch

if TYPE_CHECKING:  # (continuation.py imports this module: no runtime import back)
    from llmfabric.ingress.app import Ingress
    from llmfabric.ingress.continuation import RelayRecorder

# Upstream statuses worth another candidate (overloaded, failing or gone engines).
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_CLIENT_GONE = (ConnectionResetError, ConnectionError)
_perf = time.perf_counter


class Committed(Exception):
    """A stream failed after bytes reached the client (not retryable): args (usage, ttft)."""


class Resumable(Exception):
    """A stream failed after bytes reached the client; continuation may resume it
    (continuation.py). The sink is still open: args (ttft, why)."""


async def attempt_stream(
    ing: Ingress, sink: StreamSink, cand: Candidate, path: str, body: bytes, strip_usage: bool,
    want_chunk: bool, doc: dict[str, Any], model: str, recorder: RelayRecorder | None = None,
) -> tuple[Reply | None, Usage | None, float | None]:
    """`model`: the name the request asked for (X-Fabric-Model on the response)."""
    t = ing.config.timeouts
    t_send = _perf()
    opened: list[Upstream] = []
    try:
        # Until the first chunk nothing reached the client: a node the membership comes to
        # doubt meanwhile is dropped at once (NodeDown, retried elsewhere). Not after: the
        # relay below is never cut on suspicion alone (`AbandonIfDown` below says why).
        if ing._own_timeouts:
            with AbandonIfDown(ing.source, cand):
                got = await _open_stream(ing, cand, path, body, opened, model)
        else:
            async with asyncio.timeout(t.first_byte):
                with AbandonIfDown(ing.source, cand):
                    got = await _open_stream(ing, cand, path, body, opened, model)
        if isinstance(got, Reply):
            return got, None, None
        up, it, first = got
    except TimeoutError as e:
        for u in opened:
            await u.aclose()
        raise UpstreamError(
            f"node {cand.session_id} sent no byte within {t.first_byte} s"
        ) from e
    except (UpstreamError, aiohttp.ClientError, OSError) as e:
        for u in opened:
            await u.aclose()
        if isinstance(e, UpstreamError):
            raise
        raise UpstreamError(f"node {cand.session_id}: {e!r}") from e
    except BaseException:
        for u in opened:
            await u.aclose()
        raise
    ttft = _perf() - t_send
    ing.metrics.observe_ttft(cand.model.id, ttft)
    tr = current_trace()
    if tr is not None:
        tr.first_byte()

    # Committed: from here on bytes reach the client, so no retry is possible.
    # (also without a usage sink: a client that asked for usage gets its chunk)
    usage_scan = (StreamUsageScanner(strip_usage, want_chunk, ing.config.max_sse_line_bytes)
                  if ing._capture or want_chunk else None)
    scanner: StreamUsageScanner | RecordingScanner | None = usage_scan
    usage: Usage | None = None
    failed: BaseException | None = None
    gone = False
    if recorder is not None:  # (continuation: whole events only, recorded)
        scanner = RecordingScanner(usage_scan, recorder)
    try:
        await sink.start(up.content_type, cand.session_id, model)
        out = scanner.feed(first) if scanner is not None else first
        if out:
            await sink.write(out)
        relay = up.socket_relay()
        direct = sink.direct_writer() if relay is not None else None
        try:
            async with asyncio.timeout(t.total):
                if relay is not None and direct is not None:
                    # Bytes go from the node's socket callback straight to the client.
                    await it.aclose()  # (finalized now, not by the loop's GC hook)
                    write_now = direct.write_now
                    if scanner is not None:
                        feed = scanner.feed

                        def push(data: bytes) -> bool:
                            out = feed(data)
                            return write_now(out) if out else True

                        await relay(push, direct.wait_writable)
                    else:
                        await relay(write_now, direct.wait_writable)
                else:
                    async for data in it:
                        if scanner is not None:
                            data = scanner.feed(data)
                            if not data:
                                continue
                        await sink.write(data)
        except (aiohttp.ClientError, TimeoutError, UpstreamError) as e:
            failed = e
            msg = f"node {cand.session_id} failed mid-stream: {e!r}"
            if recorder is not None:  # the sink stays open for the continuation
                raise Resumable(ttft, msg) from e
            await sink.write(b"data: " + error_body(502, msg, "upstream_failed") + b"\n\n")
        if scanner is not None:
            rest = scanner.flush()
            usage, tail = scanner.finish(estimate_prompt_tokens(doc), cand.model.id,
                                         path.endswith("/chat/completions"))
            if rest or tail:
                await sink.write(rest + tail)
        await sink.end()
    except _CLIENT_GONE:
        gone = True  # the client went away; nothing to send
    finally:
        await up.aclose()
    if usage is None and scanner is not None:
        if scanner.usage is not None:
            usage = Usage(*scanner.usage, scanner.estimated)  # (client gone before the end)
        elif gone or failed is not None:  # bill what was relayed, marked estimated
            usage = Usage(*relayed_usage(len(body), scanner.events), True)
    if usage is not None:  # (time per output token: first byte to the stream's end)
        ing.metrics.observe_tpot(cand.model.id, _perf() - t_send - ttft, usage[1])
    if failed is not None:
        raise Committed(usage, ttft)
    return None, usage, ttft

async def _open_stream(
    ing: Ingress, cand: Candidate, path: str, body: bytes, opened: list[Upstream], model: str
) -> Reply | tuple[Upstream, AsyncGenerator[bytes, None], bytes]:
    """Open the upstream (appended to `opened` for cleanup) and read its first chunk; a
    complete Reply for a non-200 client error from the engine."""
    up = await ing.forwarder.open(cand, path, body, ing.config.timeouts)
    opened.append(up)
    if (tr := current_trace()) is not None:
        tr.upstream(up.hop)  # (the node's reported time, the relay passed)
    if up.status in RETRYABLE_STATUS:
        raise UpstreamError(f"node {cand.session_id} answered {up.status}")
    if up.status != 200:  # a client error from the engine: pass it through (capped as a
        data = await up.read_capped(ing.config.max_response_bytes)  # non-streamed answer)
        opened.clear()
        await up.aclose()
        return Reply(up.status, data, up.content_type, cand.session_id, model=model)
    it = up.chunks()
    try:
        first = await it.__anext__()
    except StopAsyncIteration:
        raise UpstreamError(f"node {cand.session_id} sent an empty stream") from None
    return up, it, first


async def attempt_once(
    ing: Ingress, cand: Candidate, path: str, body: bytes, doc: dict[str, Any], model: str
) -> tuple[Reply, Usage | None, float | None]:
    """One non-streamed exchange with `cand`; `model`: the name the request asked for
    (X-Fabric-Model on the reply)."""
    t = ing.config.timeouts
    t_send = _perf()
    # (no byte reaches the client before the whole reply: a node the membership comes to
    # doubt meanwhile is dropped at once: `AbandonIfDown`)
    if ing._own_timeouts:
        with AbandonIfDown(ing.source, cand):
            status, data, ctype = await _exchange_once(ing, cand, path, body)
    else:
        try:
            async with asyncio.timeout(t.total):
                with AbandonIfDown(ing.source, cand):
                    status, data, ctype = await _exchange_once(ing, cand, path, body)
        except TimeoutError as e:
            raise UpstreamError(
                f"node {cand.session_id} timed out after {t.total} s") from e
    resp = Reply(status, data, ctype, cand.session_id, model=model)
    usage = None
    if ing._capture and status == 200:
        got = usage_from_body(data)
        # No usage from the engine: counted here and marked estimated (usage.py).
        usage = Usage(*got) if got is not None else Usage(
            estimate_prompt_tokens(doc), estimate_completion_from_body(data), True)
    return resp, usage, _perf() - t_send


async def _exchange_once(
    ing: Ingress, cand: Candidate, path: str, body: bytes
) -> tuple[int, bytes, str]:
    up = await ing.forwarder.open(cand, path, body, ing.config.timeouts)
    if (tr := current_trace()) is not None:
        tr.upstream(up.hop)  # (the node's reported time, the relay passed)
    try:
        if up.status in RETRYABLE_STATUS:
            raise UpstreamError(f"node {cand.session_id} answered {up.status}")
        data = await up.read_capped(ing.config.max_response_bytes)
    finally:
        await up.aclose()
    return up.status, data, up.content_type


class RecordingScanner:
    """The stream usage scanner (or none) followed by a RelayRecorder: what the ingress relays
    while continuation is on (same interface as StreamUsageScanner)."""

    def __init__(self, inner: StreamUsageScanner | None, recorder: RelayRecorder) -> None:
        self.inner = inner
        self.recorder = recorder

    @property
    def usage(self) -> tuple[int, int] | None:
        return self.inner.usage if self.inner is not None else None

    @property
    def events(self) -> int:
        return self.inner.events if self.inner is not None else 0

    @property
    def estimated(self) -> bool:
        return self.inner.estimated if self.inner is not None else False

    def feed(self, data: bytes) -> bytes:
        if self.inner is not None:
            data = self.inner.feed(data)
        return self.recorder.feed(data) if data else b""

    def flush(self) -> bytes:
        rest = self.inner.flush() if self.inner is not None else b""
        out = self.recorder.feed(rest) if rest else b""
        return out + self.recorder.flush()

    def finish(self, prompt_estimate: int, model: str, chat: bool) -> tuple[Usage | None, bytes]:
        if self.inner is None:
            return None, b""
        return self.inner.finish(prompt_estimate, model, chat)


# ---- abandoning an attempt on a doubted node ------------------------------------------------

class NodeDown(UpstreamError):
    """The node became suspected (or left) while the attempt waited for its first byte.
    `gone`: it left or was evicted; otherwise it is only suspected, and may be fine (the
    request path tries it again as a last resort: app.py)."""

    def __init__(self, message: str, *, gone: bool) -> None:
        super().__init__(message)
        self.gone = gone


class AbandonIfDown:
    __slots__ = ("_cancelling", "_cand", "_fired", "_source", "_task", "_unwatch")

    def __init__(self, source: CandidateSource, cand: Candidate) -> None:
        self._source = source
        self._cand = cand
        self._unwatch: Unwatch | None = None
        self._task: asyncio.Task[object] | None = None
        self._fired = 0
        self._cancelling = 0

    def __enter__(self) -> None:
        self._unwatch = self._source.watch_down(self._cand, self._on_down)
        if self._unwatch is not None:
            self._task = asyncio.current_task()
            if self._task is None:  # (not in a task: nothing to cancel)
                self._unwatch()
                self._unwatch = None
            else:
                self._cancelling = self._task.cancelling()

    def _on_down(self, level: int) -> None:
        # Called from the task that merged the change (gossip), never from the waiting one:
        # the cancellation reaches the waiting task at its current await, inside the block.
        task = self._task
        if task is not None and not self._fired and not task.done():
            self._fired = level
            task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._unwatch is None:
            return
        self._unwatch()  # (no leak: the watch ends with the wait, however it ends)
        self._unwatch = None
        if not self._fired or self._task is None:
            return
        # Ours only: a cancellation from elsewhere too (client gone) stays a cancellation.
        if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            why = "left the fabric" if self._fired >= GONE else "became suspected"
            raise NodeDown(
                f"node {self._cand.session_id} {why} before its first byte; "
                "moving on without waiting for its timeouts",
                gone=self._fired >= GONE,
            ) from exc
