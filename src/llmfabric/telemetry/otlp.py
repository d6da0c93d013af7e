"""OpenTelemetry export of request traces over OTLP/HTTP with JSON encoding (no dependency:
the OTLP JSON mapping is plain JSON over one POST per batch).

Off unless configured with the standard variables `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the
full URL) or `OTEL_EXPORTER_OTLP_ENDPOINT` (a base; "/v1/traces" is appended), plus optional
`OTEL_SERVICE_NAME` and `OTEL_EXPORTER_OTLP_HEADERS` ("k=v,k2=v2"). When off the tracer has
no exporter and nothing here runs. `submit` never blocks the request path: traces wait in a
bounded queue (the oldest are dropped and counted) for a background task that posts them in
batches; a collector that is down costs dropped traces, never requests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

import aiohttp
import orjson

from llmfabric.untrusted import get_logger, log_due

log = get_logger(__name__)
_KIND = {"ingress.request": 2, "attempt": 3}  # SERVER, CLIENT; others INTERNAL (1)


def _value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    return {"stringValue": "" if v is None else str(v)}


def to_otlp_spans(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The spans of one trace (`RequestTrace.to_json`) in OTLP JSON form."""
    base_ns = int(float(trace["started_at"]) * 1e9)
    out = []
    for s in trace["spans"]:
        attrs = s.get("attrs") or {}
        status = attrs.get("status")
        failed = bool(attrs.get("error")) or (isinstance(status, int) and status >= 500)
        out.append({
            "traceId": trace["trace_id"], "spanId": s["span_id"],
            "parentSpanId": s["parent_id"], "name": s["name"],
            "kind": _KIND.get(s["name"], 1),
            "startTimeUnixNano": str(base_ns + int(s["start_ms"] * 1e6)),
            "endTimeUnixNano": str(base_ns + int(s["end_ms"] * 1e6)),
            "attributes": [{"key": f"llmfabric.{k}", "value": _value(v)}
                           for k, v in sorted(attrs.items())],
            "status": {"code": 2 if failed else 0},
        })
    return out


def otlp_payload(traces: list[Mapping[str, Any]], service: str) -> bytes:
    spans = [s for t in traces for s in to_otlp_spans(t)]
    return orjson.dumps({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name",
                                     "value": {"stringValue": service}}]},
        "scopeSpans": [{"scope": {"name": "llmfabric.ingress"}, "spans": spans}],
    }]})


def parse_headers(spec: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in spec.split(","):
        k, sep, v = part.partition("=")
        if sep and k.strip():
            out[unquote(k.strip())] = unquote(v.strip())
    return out


class OtlpExporter:
    def __init__(self, url: str, *, service: str = "llmfabric-ingress",
                 headers: Mapping[str, str] | None = None, max_queue: int = 4096,
                 batch: int = 256, interval_s: float = 2.0, timeout_s: float = 10.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"OTLP endpoint must be an http(s) URL, not {url!r}")
        self.url = url
        self.service = service
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.batch = batch
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._queue: deque[Mapping[str, Any]] = deque(maxlen=max_queue)
        self.dropped = 0  # traces lost: queue overflow or a failed post
        self.exported = 0
        self.failed_posts = 0  # posts the collector failed (logged at the 1st, 2nd, 4th...)
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._session: aiohttp.ClientSession | None = None

    def submit(self, trace: Mapping[str, Any]) -> None:
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
        self._queue.append(trace)
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run())
        if len(self._queue) >= self.batch and self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Post everything queued, a batch at a time."""
        while self._queue:
            n = min(self.batch, len(self._queue))
            batch = [self._queue.popleft() for _ in range(n)]
            try:
                if self._session is None:
                    self._session = aiohttp.ClientSession()
                async with self._session.post(
                        self.url, data=otlp_payload(batch, self.service), headers=self.headers,
                        timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
                    if resp.status >= 300:
                        raise RuntimeError(f"collector answered {resp.status}")
                self.exported += n
            except Exception as exc:  # the collector is down: drop, never retry forever
                self.dropped += n
                self.failed_posts += 1
                if log_due(self.failed_posts):  # (a post per batch of requests: no flood)
                    log.warning("OTLP export to %s failed (%r); %d traces dropped, %d in all, "
                                "%d failed post(s) so far", self.url, exc, n, self.dropped,
                                self.failed_posts)
                return

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):  # (closing; flush logs and counts its own drops)
            await self.flush()
        if self._session is not None:
            await self._session.close()
            self._session = None


def exporter_from_env(env: Mapping[str, str]) -> OtlpExporter | None:
    """The exporter the OTEL_* variables configure, or None (the default: off)."""
    url = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if not url:
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        if not base:
            return None
        url = base.rstrip("/") + "/v1/traces"
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip() == "none":
        return None
    return OtlpExporter(url, service=env.get("OTEL_SERVICE_NAME", "llmfabric-ingress"),
                        headers=parse_headers(env.get("OTEL_EXPORTER_OTLP_HEADERS", "")))
