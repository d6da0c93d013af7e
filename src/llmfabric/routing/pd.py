"""Prefill/decode pairs for one request (ThunderServe orchestration; COMPANIONS.md §1.8).

Nodes advertise a role per served model in their records (`ServedModel.role`: prefill,
decode or both). A role is the node's own claim, so who may take a phase is decided thus:

- With a routing plan (`PDPlanTable`, from a trusted controller: the planner's X over
  prefill replicas and Y[i] over decode replicas for requests prefilled on i, keyed by
  session id), the pools are the sessions the plan names on each side (whose roles allow the
  side). A member that merely claims a role takes no phase. Weights of suspected, already
  tried or unknown replicas are dropped and the rest renormalised, so losing a node shifts
  its share to the others (uniform when none of a side's weight is left).
- Without a plan, the fleet splits only when every live candidate is disaggregated (pure
  prefill or decode, no "both" node: a fleet deployed for PD), with uniform weights. A member
  that claims "prefill" among colocated nodes would otherwise have taken the prefill of every
  request for the model (seeing every prompt); now such a fleet is routed as usual.

When the pools hold no live pair the request is routed as usual (colocated: every role also
serves plain requests).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from llmfabric.registry.records import ModelRole
from llmfabric.routing.candidates import Candidate
from llmfabric.scheduler.decisions import SetRouting

MAX_PLAN_REPLICAS = 1024
_MAX_ID_CHARS = 128


class PlanError(ValueError):
    """A malformed routing plan (wrong shapes, negative or non-finite weights, too big)."""


@dataclass(frozen=True, slots=True)
class PDPlanTable:
    """A routing plan over sessions: x[i] for prefill session i, y[i][j] for decode j."""

    plan_id: str
    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    x: tuple[float, ...]
    y: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        m, n = len(self.prefill), len(self.decode)
        if not 0 < len(self.plan_id) <= _MAX_ID_CHARS:
            raise PlanError(f"plan_id must have 1-{_MAX_ID_CHARS} characters")
        if not (0 < m <= MAX_PLAN_REPLICAS and 0 < n <= MAX_PLAN_REPLICAS):
            raise PlanError(f"a plan needs 1-{MAX_PLAN_REPLICAS} prefill and decode replicas")
        if len(set(self.prefill)) != m or len(set(self.decode)) != n:
            raise PlanError("a session appears twice on one side of the plan")
        if len(self.x) != m or len(self.y) != m or any(len(row) != n for row in self.y):
            raise PlanError(f"x must have {m} weights and y must be {m} x {n}")
        for w in (*self.x, *(v for row in self.y for v in row)):
            if not (math.isfinite(w) and w >= 0):
                raise PlanError("plan weights must be finite and >= 0")

    @staticmethod
    def from_routing(decision: SetRouting) -> PDPlanTable:
        """The controller's SetRouting (replica weights plus the sessions they enter through)
        as a table; replicas entered through the same session add up."""
        if not decision.prefill_sessions or not decision.decode_sessions:
            raise PlanError("this SetRouting names no sessions (the controller had no binding)")
        if len(decision.prefill_sessions) != len(decision.x) or any(
                len(row) != len(decision.decode_sessions) for row in decision.y):
            raise PlanError("SetRouting's sessions do not match its X/Y shapes")
        pre = tuple(dict.fromkeys(s for s in decision.prefill_sessions if s))
        dec = tuple(dict.fromkeys(s for s in decision.decode_sessions if s))
        if not pre or not dec:
            raise PlanError("SetRouting names no live session on one side")
        x = [0.0] * len(pre)
        y = [[0.0] * len(dec) for _ in pre]
        for i, (ps, xi) in enumerate(zip(decision.prefill_sessions, decision.x, strict=True)):
            if not ps:
                continue
            a = pre.index(ps)
            x[a] += xi
            for j, ds in enumerate(decision.decode_sessions):
                if ds:
                    y[a][dec.index(ds)] += decision.y[i][j] * xi
        rows = tuple(tuple(v / s if (s := sum(row)) > 0 else 0.0 for v in row) for row in y)
        return PDPlanTable(decision.plan_id or "plan", pre, dec, tuple(x), rows)

    def prefill_weight(self, session_id: str) -> float:
        try:
            return self.x[self.prefill.index(session_id)]
        except ValueError:
            return 0.0

    def decode_weight(self, prefill_session: str, session_id: str) -> float:
        try:
            row = self.y[self.prefill.index(prefill_session)]
            return row[self.decode.index(session_id)]
        except ValueError:
            return 0.0


@dataclass(frozen=True, slots=True)
class PDSplit:
    """The request's two pools, and the plan they were split under (its weights pick)."""

    prefill: tuple[Candidate, ...]
    decode: tuple[Candidate, ...]
    plan: PDPlanTable | None = None


def split(candidates: Iterable[Candidate], plan: PDPlanTable | None = None) -> PDSplit | None:
    """The prefill/decode pools of a model's candidates under `plan` (the module doc), or
    None when no live pair exists."""
    cands = list(candidates)
    if plan is not None:
        named_pre, named_dec = set(plan.prefill), set(plan.decode)
        pre = [c for c in cands if c.session_id in named_pre and c.model.role != ModelRole.DECODE]
        dec = [c for c in cands if c.session_id in named_dec
               and c.model.role != ModelRole.PREFILL]
    else:
        if any(c.model.role == ModelRole.BOTH and not c.suspected for c in cands):
            return None  # colocated nodes are live: no split on claims alone
        pre = [c for c in cands if c.model.role == ModelRole.PREFILL]
        dec = [c for c in cands if c.model.role == ModelRole.DECODE]
    if not (any(not c.suspected for c in pre) and any(not c.suspected for c in dec)):
        return None  # one side has nobody: every role serves plain requests
    return PDSplit(tuple(pre), tuple(dec), plan)


def _weighted(cands: Sequence[Candidate], weights: Sequence[float], rng: random.Random
              ) -> Candidate:
    total = sum(weights)
    if total <= 0:
        return cands[rng.randrange(len(cands))]
    r = rng.random() * total
    for c, w in zip(cands, weights, strict=True):
        r -= w
        if r < 0 and w > 0:
            return c
    return next(c for c, w in zip(reversed(cands), reversed(weights), strict=True) if w > 0)


def _open(pool: Iterable[Candidate], tried: Iterable[str]) -> list[Candidate]:
    seen = set(tried)
    return [c for c in pool if not c.suspected and c.session_id not in seen]


class PDRouter:
    """Picks the prefill node, then the decode node, of one request (seeded rng). The plan is
    the one set in-process (`set_plan`), or else what the feed reads from the registry (the
    controller's signed plan item, routing/pd_plan.py)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random()
        self.plan: PDPlanTable | None = None
        self.feed: Callable[[Collection[str]], PDPlanTable | None] | None = None

    def set_plan(self, plan: PDPlanTable | None) -> None:
        self.plan = plan

    def set_feed(self, feed: Callable[[Collection[str]], PDPlanTable | None] | None) -> None:
        self.feed = feed

    def current(self, models: Collection[str] = ()) -> PDPlanTable | None:
        """The plan set in-process, else the feed's plan for any of `models` (the names the
        request's model goes by)."""
        if self.plan is not None or self.feed is None:
            return self.plan
        return self.feed(models)

    def _plan_of(self, pools: PDSplit) -> PDPlanTable | None:
        return pools.plan if pools.plan is not None else self.plan

    def pick_prefill(self, pools: PDSplit, tried: Iterable[str] = ()) -> Candidate | None:
        cands = _open(pools.prefill, tried)
        if not cands:
            return None
        plan = self._plan_of(pools)
        weights = [plan.prefill_weight(c.session_id) if plan else 1.0 for c in cands]
        return _weighted(cands, weights, self.rng)

    def pick_decode(self, pools: PDSplit, prefill_session: str, tried: Iterable[str] = ()
                    ) -> Candidate | None:
        cands = _open(pools.decode, tried)
        if not cands:
            return None
        plan = self._plan_of(pools)
        weights = [plan.decode_weight(prefill_session, c.session_id) if plan else 1.0
                   for c in cands]
        return _weighted(cands, weights, self.rng)
