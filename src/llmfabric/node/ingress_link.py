"""The ingress role of a node: OpenAI routes over the live replica, accounts, dashboard.

One HTTP interface, two servers behind it: the node's HTTP port is the lean front
(front/fast_front.py), which answers the OpenAI routes itself and hands every other
connection (dashboard, fleet API, accounts, /metrics, /healthz) to the node's aiohttp app
(`serve_http`). The aiohttp app mounts the OpenAI routes too, over the same `Ingress.serve`
core, for requests that come later on a connection it was handed. `--api-listen` adds a
front of its own port with the OpenAI routes only. With `batch_dir` the node's app also
serves OpenAI's Batch API (llmfabric.batch), its runner sending lines through the same core.

With `--record-trace` the ingress keeps its own anonymized trace (`IngressTraceHook`: finished
requests -> traces.TraceRecorder rows). Only counts, sampling parameters and salted,
irreversible hashes of 16-token input buckets are written (docs/traces.md); never prompt or
completion text. Keys created with record_trace=False opt out.
"""

from __future__ import annotations

import os
import pathlib
import random
import secrets
from collections.abc import Mapping, Sequence
from ssl import SSLContext
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from llmfabric.accounts.bootstrap import ensure_admin_key
from llmfabric.accounts.grants import RemoteGrants, grants_of
from llmfabric.accounts.http import add_account_routes
from llmfabric.accounts.ratelimit import RateLimiter
from llmfabric.accounts.spend_share import (
    RemoteSpend,
    SpendPublisher,
    register_metrics,
    share_spend,
)
from llmfabric.accounts.store import AccountStore
from llmfabric.accounts.tenancy_http import add_tenancy_routes
from llmfabric.apis.openapi import OPENAPI_BODY
from llmfabric.batch import BatchService
from llmfabric.batch.limits import limits_of
from llmfabric.clock import Clock, SystemClock
from llmfabric.dashboard.routes import add_dashboard_routes
from llmfabric.forward import ChoosingForwarder, RawHttpForwarder
from llmfabric.forward.secure import (
    DataPlaneSessions,
    PinnedHttpsForwarder,
    SealedPeerForwarder,
)
from llmfabric.front import add_ingress_routes
from llmfabric.front.fast_front import FallbackFactory, FastFront
from llmfabric.front.front_limits import FrontLimits
from llmfabric.front.host_check import HostGuard
from llmfabric.identity import NodeKey
from llmfabric.ingress import FORWARD_PREFIX, Ingress, IngressConfig
from llmfabric.ingress.config import Timeouts, TraceEvent
from llmfabric.ingress.protocols import Forwarder
from llmfabric.net import TlsTransport
from llmfabric.net.handshake import client_ssl_context
from llmfabric.node.config import NodeConfig, parse_hostport
from llmfabric.node.serve.replica_reader import AgentReplicaReader
from llmfabric.registry.provider import key_fingerprint_identity
from llmfabric.registry.records import KeyGrant
from llmfabric.routing.candidates import Identify
from llmfabric.routing.pd_plan import PlanFeed
from llmfabric.routing.replica_source import ReplicaCandidateSource
from llmfabric.telemetry.demand import DemandMeter
from llmfabric.tenancy.accounts_auth import AccountsAuth
from llmfabric.tenancy.attach import TenancyParts, attach_tenancy
from llmfabric.traces import TraceRecorder


class IngressLink:
    def __init__(
        self,
        ingress: Ingress,
        store: AccountStore | None,
        forwarder: Forwarder,
        dashboard: bool,
        demand: DemandMeter,
    ) -> None:
        self.ingress = ingress
        self.demand = demand
        self.store = store
        self.forwarder = forwarder
        self.dashboard = dashboard
        self.admin_key: str | None = None
        self.trace_hook: IngressTraceHook | None = None
        self.tenancy = TenancyParts()  # budgets, fair queue, OTLP exporter (tenancy/attach.py)
        self.fronts: list[FastFront] = []
        self.api_addr = ""
        self.spend: SpendPublisher | None = None  # budgets across ingresses (spend_share.py)
        self.batch: BatchService | None = None  # OpenAI's Batch API (--batch-dir)

    @classmethod
    async def create(
        cls,
        config: NodeConfig,
        reader: AgentReplicaReader,
        transport: TlsTransport,
        rng: random.Random,
        clock: Clock | None = None,
        *,
        key: NodeKey,
        identify: Identify = key_fingerprint_identity,
    ) -> IngressLink:
        store: AccountStore | None = None
        auth: AccountsAuth | None = None
        admin_key: str | None = None
        if config.auth:
            store = await AccountStore.open(config.db or str(config.home / "accounts.db"))
            auth = AccountsAuth(store, RateLimiter(SystemClock()))
            key_file = config.admin_key_file or config.home / "admin.key"
            _, admin_key = await ensure_admin_key(store, key_file)
        # The data plane: direct = HTTPS pinned to the provider's node key, else sealed over
        # the peer network (relays); each request authorized with a per-pair session key.
        sessions = DataPlaneSessions(key, transport)
        forwarder = ChoosingForwarder(
            PinnedHttpsForwarder(sessions, RawHttpForwarder(FORWARD_PREFIX,
                                                            ssl=client_ssl_context())),
            SealedPeerForwarder(sessions, transport))
        trace_hook: IngressTraceHook | None = None
        if config.record_trace is not None:
            salt = load_or_create_salt(config.home / "trace.salt")
            trace_hook = IngressTraceHook(TraceRecorder(config.record_trace, salt))
        demand = DemandMeter(clock or SystemClock())
        pins = dict(config.model_aliases)

        def on_finished(event: TraceEvent) -> None:
            # Demand counts every generation request a provider could have served; client
            # errors (4xx) are not load.
            if event.path in TRACED_PATHS and not 400 <= event.status < 500:
                # (a pinned name counts for the model it is pinned to, as it was routed)
                demand.record(pins.get(event.model, event.model), event.prompt_tokens,
                              event.completion_tokens)
            if trace_hook is not None:
                trace_hook(event)

        ingress = Ingress(
            IngressConfig(
                node_id="ingress",
                policy=config.policy,
                max_retries=config.max_retries,
                max_body_bytes=config.max_body_bytes,
                auth_enabled=config.auth,
                timeouts=Timeouts(config.connect_timeout_s, config.first_byte_timeout_s,
                                  config.idle_timeout_s, config.total_timeout_s,
                                  config.keepalive_idle_s, config.keepalive_interval_s,
                                  config.keepalive_count),
                trace_hook=on_finished,
                model_aliases=tuple(sorted(pins.items())),
            ),
            ReplicaCandidateSource(reader.replica, identify),
            forwarder,
            auth,
            auth,
            rng=rng,
        )
        if store is not None and config.key_issuers:
            store.remote = RemoteGrants(
                lambda: [r for r, _ in reader.records_with_suspicion()], reader.version,
                identify, config.key_issuers).lookup
        if config.controllers:  # PD routing plans signed by these controllers (pd_plan.py)
            ingress.pd.router.set_feed(PlanFeed(
                lambda: [r for r, _ in reader.records_with_suspicion()], reader.version,
                config.controllers))
        link = cls(ingress, store, forwarder, config.dashboard, demand)
        link.tenancy = await attach_tenancy(
            ingress, store, max_inflight=config.max_inflight,
            max_wait_s=config.fair_queue_max_wait_s, env=os.environ)
        if link.tenancy.budgets is not None:  # budgets count the trusted ingresses' spending
            shared = share_spend(link.tenancy.budgets, lambda: RemoteSpend(
                lambda: [r for r, _ in reader.records_with_suspicion()], reader.version,
                identify, key.peer_id, config.key_issuers))
            if shared is not None:
                register_metrics(ingress.metrics.registry, *shared)
                link.spend = shared[1]
        link.trace_hook = trace_hook
        link.admin_key = admin_key
        if config.batch_dir is not None:  # (its routes: mount; its runner starts now)
            link.batch = BatchService(ingress, config.batch_dir, limits=limits_of(config),
                principals=store.active_key if store is not None else None,
                retention_s=config.batch_retention_s)
            link.batch.start()
        return link

    def key_grants(self) -> tuple[KeyGrant, ...]:
        """The grants this ingress publishes for its keys (accounts.grants)."""
        return grants_of(self.store.cached_keys()) if self.store is not None else ()

    @property
    def metrics_registry(self) -> CollectorRegistry:
        return self.ingress.metrics.registry

    @property
    def openapi_body(self) -> bytes:
        """The /openapi.json every front of this ingress serves (with the Batch API's routes
        when it has them)."""
        return self.batch.openapi_body if self.batch is not None else OPENAPI_BODY

    def mount(self, app: web.Application) -> None:
        add_ingress_routes(app, self.ingress, self.openapi_body)
        if self.batch is not None:
            self.batch.add_routes(app)
        if self.store is not None:
            add_account_routes(app, self.store)
            add_tenancy_routes(app, self.store, self.tenancy.budgets)
        if self.dashboard:
            add_dashboard_routes(app)

    async def serve_http(self, fallback: FallbackFactory, host: str, port: int,
                         ssl: SSLContext | None = None, limits: FrontLimits | None = None,
                         hosts: HostGuard | None = None) -> int:
        """The node's HTTP port: the lean front for the OpenAI routes, every other path
        handed to `fallback` (the node app's `AppRunner.server`); returns the bound port.
        `hosts`: the Host names answered (host_check.py)."""
        front = FastFront(self.ingress, serve_metrics=False, limits=limits, fallback=fallback,
                          hosts=hosts, openapi_body=self.openapi_body)
        self.fronts.append(front)
        return await front.start(host, port, ssl=ssl)

    async def start_front(self, listen: str, ssl: SSLContext | None = None,
                          limits: FrontLimits | None = None, hosts: HostGuard | None = None
                          ) -> None:
        """The same request core on a lean front of its own port, OpenAI routes only (HTTPS
        with `ssl`)."""
        host, port = parse_hostport(listen, default_host="127.0.0.1")
        front = FastFront(self.ingress, serve_metrics=False, limits=limits, hosts=hosts,
                          openapi_body=self.openapi_body)
        self.fronts.append(front)
        bound = await front.start(host, port, ssl=ssl)
        self.api_addr = f"{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{bound}"

    async def aclose(self) -> None:
        for front in self.fronts:
            await front.aclose()
        if self.batch is not None:
            await self.batch.aclose()
        if self.trace_hook is not None:
            self.trace_hook.close()
        await self.tenancy.aclose()
        await self.forwarder.aclose()
        if self.store is not None:
            await self.store.aclose()


# ---- the ingress's own anonymized trace ------------------------------------------------------
TRACED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


def load_or_create_salt(path: pathlib.Path) -> bytes:
    """A per-ingress secret salt (0600): hashes stay comparable across restarts."""
    if path.exists():
        return bytes.fromhex(path.read_text().strip())
    salt = secrets.token_bytes(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(salt.hex())
    return salt


class IngressTraceHook:
    def __init__(self, recorder: TraceRecorder) -> None:
        self.recorder = recorder

    def __call__(self, event: TraceEvent) -> None:
        if event.opted_out or event.path not in TRACED_PATHS or event.node is None:
            return
        doc: Mapping[str, Any] = event.request or {}
        messages = doc.get("messages")
        prompt = doc.get("prompt")
        self.recorder.record(
            event.model,
            messages=messages if isinstance(messages, list) else None,
            prompt=prompt if isinstance(prompt, str) or _str_list(prompt) else None,
            input_tokens=event.prompt_tokens,
            output_tokens=event.completion_tokens or 0,
            sampling_params=doc,
            latency_s=event.e2e_s,
            timestamp=event.started_at,
        )

    def close(self) -> None:
        self.recorder.close()


def _str_list(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str) and all(
        isinstance(v, str) for v in value
    )
