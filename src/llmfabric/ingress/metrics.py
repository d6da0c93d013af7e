"""Prometheus metrics of one ingress, in its own CollectorRegistry (never the global one).

Label values come from clients (model names) and from the registry (node session ids), so
their number is bounded: a model the fabric does not know (`known_model`) is counted as
"other", and past MAX_MODEL_LABELS models or MAX_NODE_LABELS nodes new values are too.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from llmfabric.routing.candidates import Candidate

_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)


class _Hist:
    """One histogram child: bucket counts (not cumulative) and the sum."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(_LATENCY_BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(_LATENCY_BUCKETS, v)] += 1
        self.sum += v


_LE = [repr(float(b)) for b in _LATENCY_BUCKETS] + ["+Inf"]
OTHER = "other"
MAX_MODEL_LABELS = 256
MAX_NODE_LABELS = 1024
MAX_OWNER_LABELS = 256
MAX_FALLBACK_PAIRS = 256  # (from, to) model pairs; both labels are bounded model labels


class IngressMetrics:
    """Counters and histograms kept as plain ints/floats on the request path (one event loop
    per process, so no locks) and turned into Prometheus families when collected: about 5x
    cheaper per request than prometheus_client's children (a lock per update)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.requests: dict[tuple[str, str], int] = {}  # (model, status) -> count
        self.errors: dict[tuple[str, str], int] = {}  # (status, code) -> answered by us
        self.retries: dict[str, int] = {}  # model -> attempts retried on another candidate
        self.routed: dict[str, int] = {}  # node -> attempts routed to it
        self.failed_attempts: dict[str, int] = {}  # node -> attempts that failed
        self.e2e: dict[str, _Hist] = {}  # model -> end-to-end latency
        self.ttft: dict[str, _Hist] = {}  # model -> time to the first streamed byte
        self.tpot: dict[str, _Hist] = {}  # model -> mean time per output token of a stream
        self.tokens: dict[tuple[str, str, str], int] = {}  # (model, owner, kind) -> tokens
        self.fallbacks: dict[tuple[str, str], int] = {}  # (from, to) -> requests moved on
        self.queue_wait = _Hist()  # seconds admitted requests waited in the fair queue
        self.refusals: dict[str, int] = {}  # admission refusals by reason (tenancy/gate.py)
        self.hook_errors = 0  # trace hook calls that raised (the request was answered)
        self.key_check_errors = 0  # the front's early key checks whose store raised (401)
        self.queue_depth: Callable[[], int] | None = None  # requests waiting (fair queue)
        # The lean front's connection counts (open, refused at a cap, TLS handshakes that
        # never completed), read at scrape time; set by the front that serves this ingress.
        self.front_connections: Callable[[], tuple[int, int, int]] | None = None
        # The routable candidates (their gossiped load hints carry each engine's prefix-cache
        # hit rate), read at scrape time only.
        self.candidates: Callable[[], Sequence[Candidate]] | None = None
        # Counters another part keeps as plain ints (the OTLP exporter, the batch runner),
        # read at scrape time: name -> (help, read); `add_read_counter`.
        self.read_counters: dict[str, tuple[str, Callable[[], int]]] = {}
        self._owners: set[str] = {""}
        # Whether the fabric serves a model name (set by the ingress); None: any name counts.
        self.known_model: Callable[[str], bool] | None = None
        self._models: set[str] = {""}  # label values in use
        self._nodes: set[str] = set()
        self.registry.register(_Collector(self))

    def _model(self, model: str) -> str:
        if model in self._models:
            return model
        if len(self._models) >= MAX_MODEL_LABELS or (
                self.known_model is not None and not self.known_model(model)):
            return OTHER
        self._models.add(model)
        return model

    def _node(self, node: str) -> str:
        if node in self._nodes:
            return node
        if len(self._nodes) >= MAX_NODE_LABELS:
            return OTHER
        self._nodes.add(node)
        return node

    def observe_request(self, model: str, status: int, e2e_s: float) -> None:
        model = self._model(model)
        key = (model, str(status))
        r = self.requests
        r[key] = r.get(key, 0) + 1
        if status < 400:
            h = self.e2e.get(model)
            if h is None:
                h = self.e2e[model] = _Hist()
            h.observe(e2e_s)

    def observe_error(self, model: str, status: int, code: str) -> None:
        """A request the ingress answered with its own error (400/401/404/429/502/503...):
        counted in requests_total ("" model when refused before the body named one) and by
        its OpenAI error code in errors_total."""
        self.observe_request(model, status, 0.0)
        key = (str(status), code)
        e = self.errors
        e[key] = e.get(key, 0) + 1

    def observe_ttft(self, model: str, seconds: float) -> None:
        model = self._model(model)
        h = self.ttft.get(model)
        if h is None:
            h = self.ttft[model] = _Hist()
        h.observe(seconds)

    def _owner(self, owner: str) -> str:
        if owner in self._owners:
            return owner
        if len(self._owners) >= MAX_OWNER_LABELS:
            return OTHER
        self._owners.add(owner)
        return owner

    def observe_usage(self, model: str, owner: str, prompt: int, completion: int) -> None:
        """A finished request's tokens, by model and owner."""
        model, owner = self._model(model), self._owner(str(owner))
        t = self.tokens
        if prompt > 0:
            key = (model, owner, "prompt")
            t[key] = t.get(key, 0) + prompt
        if completion > 0:
            key = (model, owner, "completion")
            t[key] = t.get(key, 0) + completion

    def observe_tpot(self, model: str, stream_s: float, completion: int) -> None:
        """A stream's mean time per output token: `stream_s` (first byte to end) over the
        tokens after the first."""
        if completion > 1:
            model = self._model(model)
            h = self.tpot.get(model)
            if h is None:
                h = self.tpot[model] = _Hist()
            h.observe(stream_s / (completion - 1))

    def observe_queue_wait(self, seconds: float) -> None:
        self.queue_wait.observe(seconds)

    def observe_refusal(self, reason: str) -> None:
        self.refusals[reason] = self.refusals.get(reason, 0) + 1

    def observe_fallback(self, from_model: str, to_model: str) -> None:
        """A request moved on from one model of its `models` list to the next."""
        key = (self._model(from_model), self._model(to_model))
        f = self.fallbacks
        if key not in f and len(f) >= MAX_FALLBACK_PAIRS:
            key = (OTHER, OTHER)
        f[key] = f.get(key, 0) + 1

    def observe_routed(self, node: str) -> None:
        node = self._node(node)
        r = self.routed
        r[node] = r.get(node, 0) + 1

    def observe_failed_attempt(self, node: str, model: str, retried: bool) -> None:
        node, model = self._node(node), self._model(model)
        f = self.failed_attempts
        f[node] = f.get(node, 0) + 1
        if retried:
            self.retries[model] = self.retries.get(model, 0) + 1

    def add_read_counter(self, name: str, doc: str, read: Callable[[], int]) -> None:
        """Export a count another part keeps (`read` at each scrape) as the counter `name`
        (`llmfabric_ingress_..._total` on /metrics; give it without `_total`)."""
        if name in self.read_counters:
            raise ValueError(f"the counter {name} is exported already")
        self.read_counters[name] = (doc, read)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))

    def families(self) -> Iterator[Metric]:
        """The metrics as Prometheus families (what the registry collects)."""
        c = CounterMetricFamily("llmfabric_ingress_requests", "Requests by model and HTTP status",
                                labels=("model", "status"))
        for (model, status), n in sorted(self.requests.items()):
            c.add_metric((model, status), n)
        yield c
        c = CounterMetricFamily("llmfabric_ingress_errors",
                                "Errors the ingress answered itself, by HTTP status and code",
                                labels=("status", "code"))
        for (status, code), n in sorted(self.errors.items()):
            c.add_metric((status, code), n)
        yield c
        for name, doc, hists in (
            ("llmfabric_ingress_e2e_seconds", "End-to-end request latency", self.e2e),
            ("llmfabric_ingress_ttft_seconds", "Time to the first streamed byte", self.ttft),
            ("llmfabric_ingress_time_per_output_token_seconds",
             "Mean time per output token of each stream after its first byte (ITL)", self.tpot),
        ):
            h = HistogramMetricFamily(name, doc, labels=("model",))
            for model, hist in sorted(hists.items()):
                buckets, total = [], 0
                for le, n in zip(_LE, hist.counts, strict=True):
                    total += n
                    buckets.append((le, float(total)))
                h.add_metric((model,), buckets, hist.sum)
            yield h
        for name, doc, label, counts in (
            ("llmfabric_ingress_retries", "Attempts retried on another candidate", "model",
             self.retries),
            ("llmfabric_ingress_routed", "Attempts routed to each node", "node", self.routed),
            ("llmfabric_ingress_failed_attempts", "Attempts that failed, per node", "node",
             self.failed_attempts),
        ):
            c = CounterMetricFamily(name, doc, labels=(label,))
            for key, n in sorted(counts.items()):
                c.add_metric((key,), n)
            yield c
        c = CounterMetricFamily("llmfabric_ingress_model_fallbacks",
                                "Requests moved on to the next model of their `models` list, "
                                "by the model that failed and the one tried next",
                                labels=("from", "to"))
        for (src, dst), n in sorted(self.fallbacks.items()):
            c.add_metric((src, dst), n)
        yield c
        c = CounterMetricFamily("llmfabric_ingress_trace_hook_errors",
                                "Finished requests whose trace hook raised (demand meter, "
                                "--record-trace): answered, but not counted or recorded")
        c.add_metric((), self.hook_errors)
        yield c
        c = CounterMetricFamily("llmfabric_ingress_key_check_errors",
                                "API key checks of the lean front whose key store raised "
                                "(the request was refused with a 401)")
        c.add_metric((), self.key_check_errors)
        yield c
        for name, (doc, read) in sorted(self.read_counters.items()):
            c = CounterMetricFamily(name, doc)
            c.add_metric((), read())
            yield c
        yield from self._tenancy_families()

    def _tenancy_families(self) -> Iterator[Metric]:
        c = CounterMetricFamily("llmfabric_ingress_tokens", "Tokens by model, owner and kind "
                                "(prompt, completion)", labels=("model", "owner", "kind"))
        for (model, owner, kind), n in sorted(self.tokens.items()):
            c.add_metric((model, owner, kind), n)
        yield c
        c = CounterMetricFamily("llmfabric_ingress_admission_refusals",
                                "Requests refused before routing: budget_exceeded, "
                                "queue_full, queue_timeout", labels=("reason",))
        for reason, n in sorted(self.refusals.items()):
            c.add_metric((reason,), n)
        yield c
        h = HistogramMetricFamily("llmfabric_ingress_queue_seconds",
                                  "Time admitted requests waited in the fair queue")
        buckets, total = [], 0
        for le, n in zip(_LE, self.queue_wait.counts, strict=True):
            total += n
            buckets.append((le, float(total)))
        h.add_metric((), buckets, self.queue_wait.sum)
        yield h
        g = GaugeMetricFamily("llmfabric_ingress_queue_waiting",
                              "Requests waiting in the fair queue now")
        g.add_metric((), self.queue_depth() if self.queue_depth is not None else 0)
        yield g
        yield from self._cache_families()
        yield from self._front_families()

    def _front_families(self) -> Iterator[Metric]:
        """What the lean front's connection limits did (front/front_limits.py): clients holding
        connections, refused at a cap, or gone before their TLS handshake completed (a
        flood of silent connections shows here first)."""
        if self.front_connections is None:
            return
        open_now, refused, handshakes_failed = self.front_connections()
        g = GaugeMetricFamily("llmfabric_ingress_connections_open",
                              "Client connections the front holds now (HTTPS on asyncio's "
                              "loop: from TCP accept on)")
        g.add_metric((), open_now)
        yield g
        c = CounterMetricFamily("llmfabric_ingress_connections_refused",
                                "Client connections refused at the per-process or "
                                "per-client cap")
        c.add_metric((), refused)
        yield c
        c = CounterMetricFamily("llmfabric_ingress_tls_handshakes_failed",
                                "HTTPS connections that ended before their TLS handshake "
                                "completed: timed out, failed or closed (asyncio's loop)")
        c.add_metric((), handshakes_failed)
        yield c

    def _cache_families(self) -> Iterator[Metric]:
        """The cache hit estimate: each serving node's engine prefix-cache hit rate, as its
        load hint gossips it (rounded to 0.01, republished at most every 10 s), and the
        fabric's mean over nodes."""
        g = GaugeMetricFamily("llmfabric_ingress_node_prefix_cache_hit_ratio",
                              "Engine prefix-cache hit rate of each serving node (0..1, from "
                              "its gossiped load hint)", labels=("node",))
        rates: dict[str, float] = {}
        for c in self.candidates() if self.candidates is not None else ():
            rates.setdefault(c.session_id, c.load.prefix_hit_rate)
        for node, rate in sorted(rates.items())[:MAX_NODE_LABELS]:
            g.add_metric((node,), rate)
        yield g
        g = GaugeMetricFamily("llmfabric_ingress_prefix_cache_hit_ratio",
                              "Mean engine prefix-cache hit rate over serving nodes (0..1)")
        g.add_metric((), sum(rates.values()) / len(rates) if rates else 0.0)
        yield g


class _Collector(Collector):
    def __init__(self, metrics: IngressMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self.metrics.families()

    def describe(self) -> Iterator[Metric]:
        return iter(())


def metrics_handler(metrics: IngressMetrics) -> Any:
    """An aiohttp handler serving the metrics (mount it at /metrics)."""

    async def handler(_: web.Request) -> web.Response:
        resp = web.Response(body=metrics.render())
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    return handler
