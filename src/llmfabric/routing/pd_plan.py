"""The PD routing plan as a registry item (ThunderServe's SetRouting across hosts).

The PD controller publishes its latest plan (`PDPlanTable`: X over prefill sessions, Y over
decode sessions, the plan id) in its OWN node record (`NodeMeta.pd_plan`), so the plan is
signed by the controller's node key like every record and gossiped to the whole fabric; no
ingress has to be dialled. An ingress installs a plan only from the records of its trusted
controllers (the peer ids given with `--controller`; with none it trusts no plan), so another
member cannot steer its routing. Plans are per model; of several trusted plans for a model
the newest wins (issue time, then plan id), and one issued later than the receiver's clock
plus `MAX_PLAN_SKEW_S` is ignored. A controller that leaves (LEFT) takes its plan with it.

The item is a msgpack map, at most `MAX_PLAN_ITEM_BYTES` (the record body limit is 16 KiB);
`decode_plan` validates it fully (shapes, finite non-negative weights, bounded ids) and a
malformed item is ignored, never installed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

import msgpack

from llmfabric.registry.records import Lifecycle, NodeRecord
from llmfabric.routing.pd import PDPlanTable, PlanError

MAX_PLAN_ITEM_BYTES = 8 * 1024
MAX_PLAN_SKEW_S = 300.0  # a plan issued later than the receiver's clock plus this is ignored
_VERSION = 1
_MAX_MODEL_CHARS = 200
_MAX_SESSION_CHARS = 128


@dataclass(frozen=True, slots=True)
class PlanItem:
    """A plan for one model as the controller issued it (`issued_at`: its wall clock)."""

    model: str
    issued_at: float
    table: PDPlanTable

    def order_key(self) -> tuple[float, str]:
        return (self.issued_at, self.table.plan_id)


def encode_plan(item: PlanItem) -> bytes:
    """The record's `pd_plan` bytes; PlanError if the plan does not fit the item budget."""
    t = item.table
    doc = {"v": _VERSION, "m": item.model, "t": float(item.issued_at), "id": t.plan_id,
           "pre": list(t.prefill), "dec": list(t.decode), "x": [float(v) for v in t.x],
           "y": [[float(v) for v in row] for row in t.y]}
    out = bytes(msgpack.packb(doc, use_bin_type=True))
    if len(out) > MAX_PLAN_ITEM_BYTES:
        raise PlanError(f"the plan item takes {len(out)} bytes; at most "
                        f"{MAX_PLAN_ITEM_BYTES} fit in a record (fewer replicas per plan)")
    return out


def _strs(v: Any, name: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(
            isinstance(s, str) and 0 < len(s) <= _MAX_SESSION_CHARS for s in v):
        raise PlanError(f"{name} must be a list of session ids (1-{_MAX_SESSION_CHARS} "
                        "characters)")
    return tuple(v)


def _floats(v: Any, name: str) -> tuple[float, ...]:
    if not isinstance(v, list) or not all(
            isinstance(w, int | float) and not isinstance(w, bool) for w in v):
        raise PlanError(f"{name} must be a list of numbers")
    return tuple(float(w) for w in v)


def decode_plan(data: bytes) -> PlanItem:
    """Parse and validate a `pd_plan` item (hostile input); PlanError says what is wrong."""
    if not isinstance(data, bytes) or not 0 < len(data) <= MAX_PLAN_ITEM_BYTES:
        raise PlanError(f"a plan item must have 1-{MAX_PLAN_ITEM_BYTES} bytes")
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=True)  # (size checked above)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise PlanError(f"the plan item is not msgpack: {exc}") from None
    if not isinstance(doc, dict) or doc.get("v") != _VERSION:
        raise PlanError(f"a plan item is a map of version {_VERSION}")
    model, issued, plan_id = doc.get("m"), doc.get("t"), doc.get("id")
    if not isinstance(model, str) or not 0 < len(model) <= _MAX_MODEL_CHARS:
        raise PlanError("the plan's model must be a model id")
    if not isinstance(issued, float | int) or isinstance(issued, bool) or not math.isfinite(
            issued) or issued < 0:
        raise PlanError("the plan's issue time must be a finite number")
    if not isinstance(plan_id, str):
        raise PlanError("plan_id must be a string")
    y = doc.get("y")
    if not isinstance(y, list):
        raise PlanError("y must be a list of rows")
    table = PDPlanTable(plan_id, _strs(doc.get("pre"), "pre"), _strs(doc.get("dec"), "dec"),
                        _floats(doc.get("x"), "x"),
                        tuple(_floats(row, "a row of y") for row in y))
    return PlanItem(model, float(issued), table)


def newest_plans(records: Iterable[NodeRecord], controllers: Collection[str],
                 not_after: float = math.inf) -> dict[str, PlanItem]:
    """Model -> the newest valid plan for it among the records of `controllers` (peer ids);
    an item issued after `not_after` (the receiver's clock plus slack) is ignored: one issued
    at 1e300 would win forever."""
    best: dict[str, PlanItem] = {}
    for rec in records:
        if not rec.meta.pd_plan or rec.state is Lifecycle.LEFT or rec.peer_id not in controllers:
            continue
        try:
            item = decode_plan(rec.meta.pd_plan)
        except PlanError:
            continue  # a malformed item is ignored, not installed
        if item.issued_at > not_after:
            continue
        cur = best.get(item.model)
        if cur is None or item.order_key() > cur.order_key():
            best[item.model] = item
    return best


class PlanFeed:
    """The newest trusted plan of a model, recomputed only when the replica changed
    (`version`). Plans are per model: a controller's plan for one model never routes
    another."""

    def __init__(self, records: Callable[[], Iterable[NodeRecord]], version: Callable[[], int],
                 controllers: Iterable[str], wall: Callable[[], float] = time.time) -> None:
        self._records, self._version, self._wall = records, version, wall
        self.controllers = frozenset(controllers)
        self._seen: int | None = None
        self._plans: dict[str, PlanItem] = {}

    def __call__(self, models: Collection[str]) -> PDPlanTable | None:
        """The newest plan for any of `models` (the names a request's model goes by)."""
        if not self.controllers:
            return None
        v = self._version()
        if v != self._seen:
            self._plans = newest_plans(self._records(), self.controllers,
                                       self._wall() + MAX_PLAN_SKEW_S)
            self._seen = v
        items = [self._plans[m] for m in models if m in self._plans]
        return max(items, key=PlanItem.order_key).table if items else None
