"""Request routing: candidates from the local replica, trust/QoS filters, policies, retries.

Pure core: no sockets, no clocks. Files:
- candidates.py: `Candidate` and `candidates_for(model, records_with_suspicion, identify)`
  (SERVING, id or alias matches, suspected ones flagged as a fallback; `provider_id` is the
  verified identity from `identify`, aliases squatting another provider's model id are
  flagged), `candidates_by_model`, `model_is_known`.
- index.py: `CandidateIndex`, the routing index (model id/alias -> candidates sorted by session
  id) updated per session change in O(names of that session); equals `candidates_by_model`.
- replica_source.py: `ReplicaCandidateSource`, a candidate source that follows a live replica's
  change listener (no rebuild per change; one build per replica followed); `watch_down`.
- liveness.py: `DownWatches`, per-session watches fired once when a session becomes suspected
  or gone (the ingress drops an attempt still waiting on it), `level_of(entry)`.
- request.py: `RouteRequest` (model, allowlist, QoS, prompt prefix) and `route_request(...)`
  parsing `X-Fabric-Providers` and the body's `metadata`.
- model_access.py: a key's model allowlist (`ApiKey.models`) applied where names resolve:
  `permitted` (the allowed candidates of a name, aliases and adapters by their model id),
  `usable` (the names of a request's list it may use), `no_access` (the 403),
  `catalog_within` (GET /v1/models cut to the allowed ids).
- filters.py: `trust_filter` (never admits a provider outside the allowlist, nor a flagged
  alias unless the allowlist names its provider), `resolve` (a name routes to one model's
  candidates: an id is itself, an alias of several models is `Ambiguous`, refused),
  `qos_filter`, `eligible`; GPU names compare
  through sim.gpu_names (`gpu_matches`: the same catalog GPU or its family token, never a
  substring).
- policies.py: the `Policy` Protocol and `POLICIES` (random, round_robin, weighted,
  least_outstanding, prefix_affinity, prefix_bounded, session, cache_aware);
  `make_policy(name, rng)`.
- prefix.py: `block_keys` (chain hashes of prompt blocks), `prompt_text`, `session_key`,
  `session_header` (the validated X-Session-Id: header > metadata.session_id > user),
  `bounded_limit`, and the prefix_bounded / session / cache_aware policies (bounded loads;
  `explain` gives a `PrefixPick`); cache_aware reads the records' prefix-cache sketches.
- cache_summary.py: `ServedPrefixes`, a node's LRU of the prefix blocks it served, published as
  its record's sketch when it moved enough (bounded bytes per second); `PrefixSummary`.
- held_prefixes.py: `HeldPrefixes`, the sketch of the prompt blocks the engine really holds,
  from its KV-cache events (engine block -> prompt key mapping learned from forwarded prompts).
- kv_events.py: `decode_message`, the bounded decoder of vLLM's KV-cache events (BlockStored,
  BlockRemoved, AllBlocksCleared over ZMQ, msgpack); `KvEventError` for hostile input.
- walltime.py: `walltime_filter` (prefer nodes whose allocation outlasts the request, from
  max_tokens and the simulator's per-token time), `requested_tokens`, `sim_rate`, `fixed_rate`.
- pd.py: prefill/decode disaggregation (ThunderServe): `split(candidates, plan)` into
  prefill / decode pools (a trusted plan's sessions; without one, a fleet whose live nodes
  are all disaggregated; None: no live pair, route as usual),
  `PDPlanTable` (the planner's X/Y over sessions, validated), `PDRouter.pick_prefill` /
  `pick_decode` (plan weights renormalised over live, untried nodes).
- pd_plan.py: the PD routing plan as a registry item (`NodeMeta.pd_plan` of the controller's
  own signed record): `encode_plan` / `decode_plan` (bounded, validated), `newest_plans`
  and `PlanFeed` (per model, the newest plan of the trusted `--controller` peers, for
  `PDRouter.set_feed`).
- router.py: `Router.route(request, candidates, tried, attempt) -> RouteDecision | NoRoute`;
  unsuspected candidates first, suspected ones only when no unsuspected one is eligible.
- errors.py: `RoutingError`, `UnknownPolicyError`, `InvalidConstraintError`.
"""

from llmfabric.routing.candidates import (
    Candidate,
    candidates_by_model,
    candidates_for,
    model_is_known,
)
from llmfabric.routing.errors import InvalidConstraintError, RoutingError, UnknownPolicyError
from llmfabric.routing.filters import Ambiguous, eligible, qos_filter, resolve, trust_filter
from llmfabric.routing.policies import DEFAULT_POLICY, POLICIES, Policy, make_policy
from llmfabric.routing.request import RouteRequest, route_request
from llmfabric.routing.router import NoRoute, NoRouteReason, RouteDecision, Router

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "Ambiguous",
    "Candidate",
    "InvalidConstraintError",
    "NoRoute",
    "NoRouteReason",
    "Policy",
    "RouteDecision",
    "RouteRequest",
    "Router",
    "RoutingError",
    "UnknownPolicyError",
    "candidates_by_model",
    "candidates_for",
    "eligible",
    "make_policy",
    "model_is_known",
    "qos_filter",
    "resolve",
    "route_request",
    "trust_filter",
]
