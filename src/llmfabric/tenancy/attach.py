"""Turning on an ingress's multi-tenancy and trace export from its settings: budgets from
the accounts database (always, when the ingress has one: no budget set costs nothing; kept in
step with the database every `BUDGET_SYNC_S`, for what other processes set and spent), fair
queueing when `max_inflight` is set, OTLP export when the OTEL_* variables say so."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import Gauge

from llmfabric.accounts.budgets import BudgetBook, BudgetStore
from llmfabric.accounts.fairqueue import FairQueue
from llmfabric.accounts.store import AccountStore
from llmfabric.ingress.app import Ingress
from llmfabric.routing.filters import Ambiguous, eligible
from llmfabric.routing.request import RouteRequest
from llmfabric.telemetry.otlp import OtlpExporter, exporter_from_env
from llmfabric.tenancy.accounts_auth import AccountsAuth
from llmfabric.tenancy.gate import (
    Lookup,
    NameLookup,
    TenancyGate,
    advertised_context,
)

BUDGET_SYNC_S = 2.0


@dataclass(slots=True)
class TenancyParts:
    budgets: BudgetStore | None = None
    queue: FairQueue | None = None
    exporter: OtlpExporter | None = None
    budget_sync: asyncio.Task[None] | None = None

    async def aclose(self) -> None:
        if self.budget_sync is not None:
            self.budget_sync.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.budget_sync
            self.budget_sync = None
        if self.exporter is not None:
            await self.exporter.aclose()


async def attach_tenancy(
    ingress: Ingress, store: AccountStore | None, *, max_inflight: int | None = None,
    max_wait_s: float = 30.0, env: Mapping[str, str] | None = None,
) -> TenancyParts:
    parts = TenancyParts()
    if store is not None:
        parts.budgets = BudgetStore(store.backend, BudgetBook(time.time), store.ledger)
        await parts.budgets.load()
        parts.budget_sync = asyncio.create_task(
            parts.budgets.run_sync(asyncio.sleep, BUDGET_SYNC_S, store.failures),
            name="budget-sync")
        Gauge("llmfabric_ingress_budget_sync_age_seconds",
              "Seconds since this process's budgets were last in step with the accounts "
              f"database (synced every {BUDGET_SYNC_S:g} s)",
              registry=ingress.metrics.registry).set_function(parts.budgets.sync_age_s)
    if max_inflight is not None:
        parts.queue = FairQueue(max_inflight, max_wait_s=max_wait_s, now=time.monotonic)
    if parts.budgets is not None or parts.queue is not None:
        rate = ingress.auth.limiter if isinstance(ingress.auth, AccountsAuth) else None
        ingress.use_gate(TenancyGate(parts.budgets.book if parts.budgets else None,
                                     parts.queue, lookup=budget_lookup(ingress), rate=rate,
                                     on_refused=ingress.metrics.observe_refusal,
                                     on_queue_wait=ingress.metrics.observe_queue_wait))
        if parts.queue is not None:
            ingress.metrics.queue_depth = parts.queue.waiting
    if env is not None and ingress.tracer is not None:
        parts.exporter = exporter_from_env(env)
        ingress.tracer.exporter = parts.exporter
        if parts.exporter is not None:
            export_otlp_counts(ingress, parts.exporter)
    return parts


def budget_lookup(ingress: Ingress) -> Lookup:
    """The gate's `lookup` over the ingress's routing (TenancyGate): a name resolved once
    for its context and the ids it routes to."""

    def lookup(model: str, route: RouteRequest | None = None,
               allowed: frozenset[str] | None = None) -> NameLookup:
        """The name resolved as routing resolves it (pins, ids, aliases: a member listing
        the model's id as its alias has no say), cut to the key's `allowed` model ids (a
        model it may not use neither sizes nor prices its hold). Its context: that of the
        replicas the request's allowlist and QoS constraints leave (a client naming only the
        provider, or the `min_context`, of its largest replica is served there), 0 when
        none is known; its ids: the models it routes to (what a request is billed as).
        Nothing for an ambiguous name (refused with 409 next)."""
        resolved = ingress.resolve_name(model, route.providers if route else None)
        if isinstance(resolved, Ambiguous):
            return NameLookup(0, ())
        if allowed is not None:
            resolved = [c for c in resolved if c.model.id in allowed]
        return NameLookup(advertised_context(eligible(resolved, route) if route else resolved),
                          {c.model.id for c in resolved})

    return lookup


def export_otlp_counts(ingress: Ingress, exporter: OtlpExporter) -> None:
    """The exporter's counts on the ingress's /metrics (its failures were only logged, at
    the 1st, 2nd, 4th... failure: a collector down for days showed in no graph)."""
    m = ingress.metrics
    m.add_read_counter("llmfabric_ingress_otlp_exported_traces",
                       "Traces the OTLP exporter posted to its collector",
                       lambda: exporter.exported)
    m.add_read_counter("llmfabric_ingress_otlp_dropped_traces",
                       "Traces the OTLP exporter dropped (its queue full, or their post "
                       "failed)", lambda: exporter.dropped)
    m.add_read_counter("llmfabric_ingress_otlp_failed_posts",
                       "Posts to the OTLP collector that failed (each drops its traces)",
                       lambda: exporter.failed_posts)
