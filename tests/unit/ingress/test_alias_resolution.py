"""A requested name routes to one model's replicas: an id is itself, an alias only when every
model that lists it is the same one. A member listing an honest model's alias (or id) for its
own model gets none of the requests that name it: an alias of several models is refused (409,
listing the ids), unless the ingress's operator pinned it (`--model-alias NAME=ID`) or the
caller's allowlist leaves one model."""

from __future__ import annotations

import orjson
import pytest

from llmfabric.ingress import IngressConfig
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.sources import RecordsCandidateSource
from llmfabric.node.serve.http_api import ObservedRecord, model_views
from llmfabric.registry.records import (
    Hardware,
    Lifecycle,
    ModelDemand,
    NodeMeta,
    NodeRecord,
    ServedModel,
)
from llmfabric.routing import Ambiguous, RouteRequest, resolve, route_request
from llmfabric.routing.candidates import candidates_by_model
from llmfabric.scheduler.observed import observed_workload

from ._fakes import OkUpstream

pytestmark = pytest.mark.hostile

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def _rec(sid: str, peer: str, model: ServedModel) -> NodeRecord:
    meta = NodeMeta(provider_id=peer, http_addr="127.0.0.1:1",
                    hardware=Hardware("H100-SXM", 1), models=(model,))
    return NodeRecord(sid, peer, b"k", Lifecycle.SERVING, 0, 1, 0.0, meta)


HONEST = [_rec(f"h{i}", "honest", ServedModel(LLAMA, aliases=("llama",))) for i in range(3)]
# lists the honest model's alias, and its id, for its own model
HOSTILE = _rec("x", "mallory", ServedModel("mallory-7b", aliases=("llama", LLAMA)))


class _Recorder:
    enforces_timeouts = False

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, object]]] = []

    async def open(self, candidate: object, path: str, body: bytes, timeouts: object
                   ) -> OkUpstream:
        self.sent.append((candidate.session_id, orjson.loads(body)))  # type: ignore[attr-defined]
        return OkUpstream()

    async def aclose(self) -> None:
        return None


def _ingress(records: list[NodeRecord], **config: object) -> tuple[Ingress, _Recorder]:
    fwd = _Recorder()
    src = RecordsCandidateSource(lambda: [(r, False) for r in records])
    return Ingress(IngressConfig(auth_enabled=False, **config), src, fwd), fwd  # type: ignore[arg-type]


async def _ask(ing: Ingress, model: str, providers: str | None = None) -> tuple[int, bytes]:
    body = orjson.dumps({"model": model, "prompt": "hi"})
    reply = await ing.serve("/v1/completions", False, "", providers, body, None)  # type: ignore[arg-type]
    assert reply is not None
    return reply.status, reply.body


async def test_an_alias_two_models_list_is_refused_and_reaches_neither() -> None:
    """Routing sent requests for 'llama' to replicas of both models (the hostile one took a
    share of the honest model's traffic). Now: 409 naming both ids; nothing is sent."""
    ing, fwd = _ingress([*HONEST, HOSTILE])
    for _ in range(20):
        status, body = await _ask(ing, "llama")
        assert status == 409
        err = orjson.loads(body)["error"]
        assert err["code"] == "ambiguous_model" and err["param"] == "model"
        assert LLAMA in err["message"] and "mallory-7b" in err["message"]
    assert fwd.sent == []
    # by id: the honest replicas only (the hostile alias equal to the id never counts)
    for _ in range(20):
        assert (await _ask(ing, LLAMA))[0] == 200
    assert {sid for sid, _ in fwd.sent} <= {"h0", "h1", "h2"} and len(fwd.sent) == 20
    # the hostile model by its own id still routes to it
    fwd.sent.clear()
    assert (await _ask(ing, "mallory-7b"))[0] == 200 and [s for s, _ in fwd.sent] == ["x"]


async def test_an_allowlist_naming_both_providers_still_sends_an_id_to_its_model() -> None:
    """With an allowlist naming both providers, a request by the honest id went to the
    hostile member too (its alias was flagged, and the allowlist kept it)."""
    ing, fwd = _ingress([*HONEST, HOSTILE])
    for _ in range(20):
        assert (await _ask(ing, LLAMA, "honest,mallory"))[0] == 200
    assert {sid for sid, _ in fwd.sent} <= {"h0", "h1", "h2"}
    # the caller's allowlist can leave one model for the alias: it routes
    fwd.sent.clear()
    assert (await _ask(ing, "llama", "honest"))[0] == 200
    assert (await _ask(ing, "llama", "mallory"))[0] == 200  # (the caller asked for it)
    assert fwd.sent[0][0] in {"h0", "h1", "h2"} and fwd.sent[1][0] == "x"
    assert (await _ask(ing, "llama", "honest,mallory"))[0] == 409


async def test_an_operator_pin_wins_and_the_engine_gets_the_id() -> None:
    ing, fwd = _ingress([*HONEST, HOSTILE], model_aliases=(("llama", LLAMA),))
    for _ in range(20):
        assert (await _ask(ing, "llama"))[0] == 200
    assert {sid for sid, _ in fwd.sent} <= {"h0", "h1", "h2"}
    assert {body["model"] for _, body in fwd.sent} == {LLAMA}
    # a pin to a model nobody serves: 404 as for any unknown model
    ing2, _ = _ingress([*HONEST, HOSTILE], model_aliases=(("llama", "nobody"),))
    assert (await _ask(ing2, "llama"))[0] == 404


def test_the_catalog_lists_only_names_that_route_to_the_model() -> None:
    ing, _ = _ingress([*HONEST, HOSTILE])
    data = {e["id"]: e for e in ing.catalog()["data"]}
    assert data[LLAMA]["aliases"] == [] and data["mallory-7b"]["aliases"] == []
    pinned, _ = _ingress([*HONEST, HOSTILE], model_aliases=(("llama", LLAMA),))
    data = {e["id"]: e for e in pinned.catalog()["data"]}
    assert data[LLAMA]["aliases"] == ["llama"] and data["mallory-7b"]["aliases"] == []
    alone, _ = _ingress(HONEST)  # nobody else lists it: an ordinary alias
    assert alone.catalog()["data"][0]["aliases"] == ["llama"]


def test_routing_and_the_demand_views_resolve_names_alike() -> None:
    """The fleet controller (scheduler/observed.py) and the fleet view count an ambiguous
    alias's demand for no model, as routing refuses it."""
    ingress = NodeRecord("i", "ing", b"k", Lifecycle.SERVING, 0, 1, 0.0,
                         NodeMeta(roles=("ingress",), demand=(ModelDemand("llama", 50, 10, 5),)))
    records = [*HONEST, HOSTILE, ingress]
    wl, notes = observed_workload(records)
    assert wl.loads == () and "llama" in notes[0]
    views = {v["id"]: v for v in model_views([ObservedRecord(r, False, 1.0) for r in records])}
    assert views[LLAMA]["demand_rps"] == 0.0 and views["mallory-7b"]["demand_rps"] == 0.0
    index = candidates_by_model([(r, False) for r in records])
    assert isinstance(resolve(index["llama"], "llama", None), Ambiguous)
    req = route_request("llama")
    assert req.providers is None
    only = candidates_by_model([(r, False) for r in HONEST])
    assert resolve(only["llama"], "llama", None) == only["llama"]


async def test_the_budget_reservation_reads_the_context_of_the_model_the_name_resolves_to(
) -> None:
    """A request without max_tokens reserves its model's context; that context was the
    largest any candidate for the name advertised, aliases included. A member listing the
    honest model's id as its alias, with a context of 1e8, had every such request refused
    for its budget; a pinned name no member lists reserved 512 (context unknown)."""
    from dataclasses import replace

    from llmfabric.tenancy.attach import attach_tenancy

    honest = [replace(r, meta=replace(r.meta, models=(
        ServedModel(LLAMA, aliases=("llama",), max_context=8192),))) for r in HONEST]
    squatter = replace(HOSTILE, meta=replace(HOSTILE.meta, models=(
        ServedModel("mallory-7b", aliases=("llama", LLAMA), max_context=10**8),)))
    inflater = _rec("y", "mallory", ServedModel(LLAMA, max_context=10**8))
    ing, _ = _ingress([*honest, squatter, inflater], model_aliases=(("chat", LLAMA),))
    parts = await attach_tenancy(ing, None, max_inflight=4)
    assert ing.gate is not None and ing.gate.lookup is not None
    lookup = ing.gate.lookup

    def context_of(model: str, route: RouteRequest | None = None) -> int:
        return lookup(model, route).context

    assert context_of(LLAMA) == 8192  # (the squatter has no say; the inflater is outvoted)
    assert context_of("chat") == 8192  # pinned by the operator
    assert context_of("llama") == 0  # ambiguous: refused with 409 next
    assert context_of("nobody-serves-this") == 0
    # the replicas the request's own filters leave: an allowlist naming only the inflater's
    # provider, or a min_context only it meets, reaches it alone (and holds its context)
    assert context_of(LLAMA, route_request(LLAMA, providers_header="mallory")) == 10**8
    assert context_of(LLAMA, route_request(LLAMA, metadata={"min_context": 10**7})) == 10**8
    assert context_of(LLAMA, route_request(LLAMA, metadata={"min_context": 10**9})) == 0
    if parts.budget_sync is not None:
        parts.budget_sync.cancel()
