"""Keep an owner's record inside the body limit every replica enforces (`codec.MAX_BODY_BYTES`).

Each bounded item of a record fits on its own, but together they need not: an issuer
ingress that also serves a model, on a certificate network, with budgets, can hold 8 KiB of
key grants, a 2 KiB spend item, a 4 KiB certificate and 32 demand entries (~18 KiB). A
replica refuses a whole record over the limit, so the node would vanish from the fabric.
`fit_meta` sheds the optional items instead, least needed first, each only as far as needed:
the prefix-cache sketch (a routing hint), the demand entries (the controller's input), the
spend item (other ingresses then see less of this one's spending), the key grants (as
many as fit; the rest wait for a smaller record) and the PD plan. What cannot be shed (identity,
addresses, models, certificate) is the operator's to shrink: `RecordTooLarge`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from llmfabric.registry.errors import RegistryError
from llmfabric.registry.records import NodeMeta


class RecordTooLarge(RegistryError):
    """Even without its optional items the record is over the body limit."""


def fit_meta(meta: NodeMeta, size: Callable[[NodeMeta], int], limit: int
             ) -> tuple[NodeMeta, tuple[str, ...]]:
    """`meta` itself when `size(meta) <= limit`, else a copy with optional items shed (least
    needed first, halving lists) and the names of what was shed."""
    if size(meta) <= limit:
        return meta, ()
    shed: list[str] = []

    def fits(m: NodeMeta) -> bool:
        return size(m) <= limit

    for name in ("prefix_cache", "demand", "spend", "keys", "pd_plan"):
        value = getattr(meta, name)
        if not value:
            continue
        shed.append(name)
        if isinstance(value, tuple):  # halve until it fits, then grow back by halves
            keep = _largest_prefix(meta, name, value, fits)
            meta = _with(meta, name, value[:keep])
        else:
            meta = _with(meta, name, b"")
        if fits(meta):
            return meta, tuple(shed)
    raise RecordTooLarge(
        f"the node's record is {size(meta)} bytes without its optional items, over the "
        f"{limit}-byte limit every replica enforces: shorten its labels, model names or "
        "membership certificate")


def _largest_prefix(meta: NodeMeta, name: str, value: tuple[object, ...],
                    fits: Callable[[NodeMeta], bool]) -> int:
    """The longest prefix of the list `name` with which the record fits (0 if none does)."""
    lo, hi = 0, len(value) - 1  # value[:len] did not fit (checked by the caller)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(_with(meta, name, value[:mid])):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _with(meta: NodeMeta, name: str, value: Any) -> NodeMeta:
    changes: dict[str, Any] = {name: value}
    return dataclasses.replace(meta, **changes)
