"""The Router: filters, exclusion of already-tried sessions, and the policy's pick, as data.

Suspected candidates are a fallback: the policy picks among the unsuspected eligible ones,
and among the suspected ones only when no unsuspected one is left (a suspicion is not an
eviction: the node is probably alive, and a brief wave of suspicions, such as the one a
partition's heal causes, should not fail requests; if it really is dead, the ingress's retry
moves on to the next candidate)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

from llmfabric.routing.candidates import Candidate
from llmfabric.routing.filters import eligible
from llmfabric.routing.policies import Policy
from llmfabric.routing.request import RouteRequest


class NoRouteReason(StrEnum):
    NO_CANDIDATES = "no_candidates"  # nobody serves the model right now
    FILTERED = "filtered"  # candidates exist but none passes the trust/QoS filters
    EXHAUSTED = "exhausted"  # every eligible candidate was already tried


@dataclass(frozen=True, slots=True)
class RouteDecision:
    candidate: Candidate
    policy: str
    eligible: int  # how many candidates the policy chose among
    attempt: int  # 0 for the first try, 1.. for retries


@dataclass(frozen=True, slots=True)
class NoRoute:
    reason: NoRouteReason
    candidates: int
    eligible: int

    def message(self, model: str) -> str:
        if self.reason is NoRouteReason.NO_CANDIDATES:
            return f"no node is serving model {model!r} right now; retry later"
        if self.reason is NoRouteReason.FILTERED:
            return (
                f"no node serving model {model!r} satisfies the trusted-provider allowlist "
                "and QoS constraints of this request; relax them or retry later (an "
                "allowlist names verified providers, as GET /v1/models lists them: on a "
                "network-secret fabric, peer ids)"
            )
        return f"every eligible node for model {model!r} failed; retry later"


class Router:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def route(
        self,
        request: RouteRequest,
        candidates: Sequence[Candidate],
        tried: Collection[str] = (),
        attempt: int = 0,
    ) -> RouteDecision | NoRoute:
        if not candidates:
            return NoRoute(NoRouteReason.NO_CANDIDATES, 0, 0)
        ok = eligible(candidates, request)
        if not ok:
            return NoRoute(NoRouteReason.FILTERED, len(candidates), 0)
        n_eligible = len(ok)
        if tried:
            ok = [c for c in ok if c.session_id not in tried]
            if not ok:
                return NoRoute(NoRouteReason.EXHAUSTED, len(candidates), n_eligible)
        fresh = [c for c in ok if not c.suspected]
        pool = fresh or ok
        return RouteDecision(self.policy.pick(pool, request), self.policy.name, len(pool),
                             attempt)
