"""The read-only node HTTP surface: /healthz, /metrics and /v1/fabric/* (docs/http-api.md),
and the JSON views of the replica it answers with (`node_view`, `model_views`,
`provider_views` over the `ObservedRecord`s a `ReplicaReader` gives).

Every route here only reads the local replica; none can modify the registry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from llmfabric.ingress.errors import error_response
from llmfabric.registry.cache_sketch import sketch_fill
from llmfabric.registry.records import Lifecycle, NodeRecord


@dataclass(frozen=True, slots=True)
class ObservedRecord:
    """A record as this replica sees it: plus local suspicion and when we last heard of it."""

    record: NodeRecord
    suspected: bool
    last_seen: float
    # The provider identity routing allowlists match (registry.provider): the certificate's
    # provider, or the key fingerprint (peer id) on PSK networks; "" if unverifiable.
    verified_provider: str = ""


def node_view(obs: ObservedRecord) -> dict[str, Any]:
    rec, meta = obs.record, obs.record.meta
    return {
        "session_id": rec.session_id,
        "peer_id": rec.peer_id,
        "provider_id": meta.provider_id,  # claimed (free text): shown, never trusted
        "verified_provider": obs.verified_provider,
        "state": rec.state.name,
        "suspected": obs.suspected,
        "incarnation": rec.incarnation,
        "version": rec.version,
        "updated_at": rec.updated_at,
        "last_seen": obs.last_seen,
        "hardware": asdict(meta.hardware),
        "engine": meta.engine,
        "models": [
            {
                "id": m.id,
                "aliases": list(m.aliases),
                "quantization": m.quantization,
                "quant_bits": m.quant_bits,
                "max_context": m.max_context,
                "role": str(m.role),
            }
            for m in meta.models
        ],
        "load": asdict(meta.load),
        # The gossiped prefix-cache sketch (registry/cache_sketch.py): size and bits set.
        "prefix_cache": {"bytes": len(meta.prefix_cache),
                         "fill": round(sketch_fill(meta.prefix_cache), 4)},
        "labels": dict(meta.labels),
        "tier": meta.tier,
        "roles": list(meta.roles),
        "demand": [asdict(d) for d in meta.demand],
        "alloc_end": meta.alloc_end,
        "drain_lead_s": meta.drain_lead_s,
        "http_addr": meta.http_addr,
        "peer_addrs": list(meta.peer_addrs),
        "relays": list(meta.relays),
    }


def _routable(obs: ObservedRecord) -> bool:
    return obs.record.state is Lifecycle.SERVING and not obs.suspected


def model_views(observed: Iterable[ObservedRecord]) -> list[dict[str, Any]]:
    """One entry per model id over nodes that are not LEFT; `serving` counts routable nodes,
    `demand_rps` the requests/s the live ingress nodes observe for it."""
    observed = list(observed)
    models: dict[str, dict[str, Any]] = {}
    for obs in observed:
        rec = obs.record
        if rec.state is Lifecycle.LEFT:
            continue
        for m in rec.meta.models:
            entry = models.setdefault(
                m.id,
                {"id": m.id, "aliases": set(), "serving": 0, "nodes": [], "providers": set(),
                 "unverified_providers": set(), "gpus": set(), "quantizations": set(),
                 "max_context": 0},
            )
            entry["aliases"].update(m.aliases)
            entry["nodes"].append(rec.session_id)
            entry["providers"].add(rec.meta.provider_id)
            if obs.verified_provider != rec.meta.provider_id:  # (a name is a node's claim)
                entry["unverified_providers"].add(rec.meta.provider_id)
            entry["gpus"].add(rec.meta.hardware.gpu_model)
            entry["quantizations"].add(m.quantization)
            entry["max_context"] = max(entry["max_context"], m.max_context)
            if _routable(obs):
                entry["serving"] += 1
    for model_id, rate in _demand_by_model(observed, models).items():
        models[model_id]["demand_rps"] = round(rate, 3)
    out = []
    for entry in sorted(models.values(), key=lambda e: e["id"]):
        entry.setdefault("demand_rps", 0.0)
        for key in ("aliases", "providers", "unverified_providers", "gpus", "quantizations"):
            entry[key] = sorted(entry[key])
        entry["nodes"] = sorted(entry["nodes"])
        out.append(entry)
    return out


def _demand_by_model(observed: Iterable[ObservedRecord], models: dict[str, dict[str, Any]]
                     ) -> dict[str, float]:
    """Requests/s the live ingress nodes observe per catalog model (aliases folded in, as
    routing resolves them: an alias several models list counts for none)."""
    targets: dict[str, set[str]] = {}
    for mid, e in models.items():
        for alias in e["aliases"]:
            targets.setdefault(alias, set()).add(mid)
    canonical = {alias: next(iter(t)) for alias, t in targets.items() if len(t) == 1}
    canonical.update({mid: mid for mid in models})
    rates: dict[str, float] = {}
    for obs in observed:
        if obs.record.state >= Lifecycle.DOWN:
            continue
        for d in obs.record.meta.demand:
            model_id = canonical.get(d.model)
            if model_id is not None:
                rates[model_id] = rates.get(model_id, 0.0) + d.rate
    return rates


def provider_views(observed: Iterable[ObservedRecord]) -> list[dict[str, Any]]:
    providers: dict[str, dict[str, Any]] = {}
    for obs in observed:
        rec = obs.record
        if rec.state is Lifecycle.LEFT:
            continue
        entry = providers.setdefault(
            rec.meta.provider_id,
            {"id": rec.meta.provider_id, "nodes": 0, "models": set(), "gpus": set(),
             "verified": set()},
        )
        entry["nodes"] += 1
        if obs.verified_provider:  # what X-Fabric-Providers must name to reach these nodes
            entry["verified"].add(obs.verified_provider)
        entry["models"].update(m.id for m in rec.meta.models)
        entry["gpus"].add(rec.meta.hardware.gpu_model)
    return [
        {**e, "models": sorted(e["models"]), "gpus": sorted(e["gpus"]),
         "verified": sorted(e["verified"])}
        for e in sorted(providers.values(), key=lambda e: e["id"])
    ]


class ReplicaReader(Protocol):
    @property
    def session_id(self) -> str: ...

    def observed(self) -> list[ObservedRecord]: ...

    def raw_records(self) -> list[dict[str, Any]]: ...


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


# Answers whether the bearer token (None: no Authorization header) may read the fleet views.
FleetAuth = Callable[[str | None], Awaitable[bool]]


def add_node_routes(
    app: web.Application,
    replica: ReplicaReader,
    metrics: list[CollectorRegistry],
    refresh_metrics: Callable[[], None] | None = None,
    local_view: Callable[[], dict[str, Any]] | None = None,
    fleet_auth: FleetAuth | None = None,
    links: Callable[[], Awaitable[dict[str, Any]]] | None = None,
) -> None:
    """The read-only node API (GET only: any other method gets 405). With `fleet_auth` (an
    ingress with API keys, unless `--public-fleet-info`) the fleet views need a valid key
    (one without a model allowlist: node/daemon.py)."""
    def self_view() -> dict[str, Any] | None:
        for obs in replica.observed():
            if obs.record.session_id == replica.session_id:
                view = node_view(obs)
                if local_view is not None:  # facts only this node has (the engine's pid)
                    view.update(local_view())
                return view
        return None

    async def healthz(_: web.Request) -> web.Response:
        me = self_view()
        state = me["state"] if me else "STARTING"
        return json_response({"status": "ok", "session_id": replica.session_id, "state": state})

    async def get_self(_: web.Request) -> web.Response:
        me = self_view()
        if me is None:
            return error_response(503, "this node has not published its record yet",
                                  "not_published")
        return json_response(me)

    async def nodes(_: web.Request) -> web.Response:
        return json_response({"nodes": [node_view(o) for o in replica.observed()]})

    async def models(_: web.Request) -> web.Response:
        return json_response({"models": model_views(replica.observed())})

    async def providers(_: web.Request) -> web.Response:
        return json_response({"providers": provider_views(replica.observed())})

    async def records(_: web.Request) -> web.Response:
        return json_response({"records": replica.raw_records()})

    async def prometheus(_: web.Request) -> web.Response:
        if refresh_metrics is not None:
            refresh_metrics()
        resp = web.Response(body=b"".join(generate_latest(r) for r in metrics))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    def guarded(handler: Callable[[web.Request], Awaitable[web.Response]]
                ) -> Callable[[web.Request], Awaitable[web.Response]]:
        if fleet_auth is None:
            return handler

        async def check(request: web.Request) -> web.Response:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            ok = scheme.lower() == "bearer" and bool(token.strip())
            if not (ok and await fleet_auth(token.strip())):
                resp = error_response(401, "the fleet views of an ingress need an API key "
                                      "('Authorization: Bearer lf-...') without a model "
                                      "allowlist, unless the operator started it with "
                                      "--public-fleet-info", "invalid_api_key")
                resp.headers["WWW-Authenticate"] = "Bearer"
                return resp
            return await handler(request)

        return check

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", prometheus)
    app.router.add_get("/v1/fabric/self", guarded(get_self))
    app.router.add_get("/v1/fabric/nodes", guarded(nodes))
    app.router.add_get("/v1/fabric/models", guarded(models))
    app.router.add_get("/v1/fabric/providers", guarded(providers))
    app.router.add_get("/v1/fabric/records", guarded(records))
    if links is not None:  # the measured link matrix (net/link_service.py)
        async def get_links(_: web.Request) -> web.Response:
            return json_response(await links())

        app.router.add_get("/v1/fabric/links", guarded(get_links))

