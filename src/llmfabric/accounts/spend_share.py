"""Budgets that hold across ingresses without a central database: each ingress publishes
what it spent, every ingress adds what the others published.

An ingress with budgets publishes, in its own signed registry record (`NodeMeta.spend`), a
bounded item with its spending this period on each budget it has (`BudgetBook.own_now`):
entries (tag, period id, amount), where the tag is sha256("scope\\0name")[:12], so neither
key ids, owner nor team names travel (let alone secrets). Each ingress's `RemoteSpend`
indexes the items of the other ingresses' records and `BudgetBook.reserve` adds their sum for
the budget's key and current period to what was spent and held here.

What is guaranteed: a request is admitted at one ingress only if what it spent and holds plus
what the others had published fits the budget, so across the fabric at most
limit + (what the other ingresses spent in the last publication delay) is spent: the delay is
the publish interval (1 s) plus the gossip spread (about a second on a LAN). Every counter is
monotone within its period and the amounts are totals (not deltas), so a lost or reordered
update costs nothing once a later one arrives.

Trust: only records that carry the "ingress" role and a verified identity count (on
certificate networks an operator-signed membership certificate; records are signed by their
session key, so nobody publishes for another ingress), one item per ingress (the newest by its
issue time, over the sessions of that peer: a restarted ingress does not count twice), and
an item from our own peer is ignored (it is in `own`). An item that does not decode
(oversized, too many entries, negative or huge amounts, bad tags or periods) is refused
whole. A hostile ingress can only add to the sum, and the sum is clamped to the budget's
limit: it can exhaust a budget (overstate), never lower what the others spent (understate).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from llmfabric.accounts.budgets import MAX_BUDGET_TOKENS
from llmfabric.registry.codec import MAX_SPEND as MAX_SPEND_ITEM_BYTES
from llmfabric.registry.records import NodeRecord

TAG_BYTES = 12
_VERSION = 1
_PERIOD = re.compile(r"\d{4}-\d{2}(-\d{2})?")  # a UTC month or day id (budgets.period_of)

BudgetKey = tuple[str, str, str]  # (scope, name, period id)


class SpendError(ValueError):
    """A spend item is malformed or over its bounds (hostile or broken publisher)."""


def tag_of(scope: str, name: str) -> bytes:
    """The published stand-in for a budget's (scope, name)."""
    return hashlib.sha256(f"{scope}\0{name}".encode()).digest()[:TAG_BYTES]


@dataclass(frozen=True, slots=True)
class SpendItem:
    issued_at: float  # the publisher's wall clock
    entries: Mapping[tuple[bytes, str], int]  # (tag, period id) -> amount


def encode_spend(own: Mapping[BudgetKey, int], issued_at: float) -> bytes:
    """The record's `spend` bytes for this ingress's spending (b"" when there is none): the
    largest amounts first, as many as fit `MAX_SPEND_ITEM_BYTES` (the budgets nearest their
    limit are the ones that need the others' spending most)."""
    ordered = sorted(((n, k) for k, n in own.items() if n > 0), key=lambda x: (-x[0], x[1]))
    if not ordered:
        return b""
    entries: list[list[Any]] = []
    head = len(msgpack.packb({"v": _VERSION, "t": float(issued_at), "e": []}))
    used = head + 2  # (the entry array's length header grows to 3 bytes past 15 entries)
    for n, (scope, name, pid) in ordered:
        entry = [tag_of(scope, name), pid, min(n, MAX_BUDGET_TOKENS)]
        size = len(msgpack.packb(entry, use_bin_type=True))
        if used + size > MAX_SPEND_ITEM_BYTES:
            break
        used += size
        entries.append(entry)
    out = bytes(
        msgpack.packb({"v": _VERSION, "t": float(issued_at), "e": entries}, use_bin_type=True)
    )
    assert len(out) <= MAX_SPEND_ITEM_BYTES, len(out)
    return out


def decode_spend(data: bytes) -> SpendItem:
    """Parse and validate a `spend` item (hostile input); SpendError says what is wrong."""
    if not isinstance(data, bytes) or not 0 < len(data) <= MAX_SPEND_ITEM_BYTES:
        raise SpendError(f"a spend item must have 1-{MAX_SPEND_ITEM_BYTES} bytes")
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=True)  # (size checked above)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise SpendError(f"a spend item is msgpack: {type(exc).__name__}") from None
    if not isinstance(doc, dict) or doc.get("v") != _VERSION:
        raise SpendError(f"a spend item is a map of version {_VERSION}")
    t, raw = doc.get("t"), doc.get("e")
    if (
        isinstance(t, bool)
        or not isinstance(t, int | float)
        or not (math.isfinite(t) and 0 <= t < 1e12)
    ):
        raise SpendError("a spend item's issue time must be a time")
    if not isinstance(raw, list):
        raise SpendError("a spend item's entries must be a list")
    entries: dict[tuple[bytes, str], int] = {}
    for e in raw:
        if not (isinstance(e, list) and len(e) == 3):
            raise SpendError("a spend entry is [tag, period, amount]")
        tag, pid, n = e
        if not isinstance(tag, bytes) or len(tag) != TAG_BYTES:
            raise SpendError(f"a spend tag has {TAG_BYTES} bytes")
        if not isinstance(pid, str) or not _PERIOD.fullmatch(pid):
            raise SpendError("a spend period is a UTC day (YYYY-MM-DD) or month (YYYY-MM)")
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_BUDGET_TOKENS:
            raise SpendError(f"a spend amount is an integer in 0..{MAX_BUDGET_TOKENS}")
        if (tag, pid) in entries:
            raise SpendError("a spend item names a budget and period twice")
        entries[(tag, pid)] = n
    return SpendItem(float(t), entries)


class RemoteSpend:
    """(tag, period id) -> the sum of the other ingresses' published spending, rebuilt when
    the replica changes (`version`); `refused` counts items that did not decode."""

    def __init__(
        self,
        records: Callable[[], Iterable[NodeRecord]],
        version: Callable[[], int],
        identify: Callable[[NodeRecord], str],
        self_peer: str,
    ) -> None:
        self._records = records
        self._version = version
        self._identify = identify
        self._self = self_peer
        self._seen: int | None = None
        self._sums: dict[tuple[bytes, str], int] = {}
        self._bad: set[bytes] = set()  # signatures of records whose item was refused
        self.refused = 0

    def __call__(self, key: BudgetKey) -> int:
        v = self._version()
        if v != self._seen:
            self._sums = self._build()
            self._seen = v
        scope, name, pid = key
        return self._sums.get((tag_of(scope, name), pid), 0)

    def _build(self) -> dict[tuple[bytes, str], int]:
        latest: dict[str, SpendItem] = {}  # publishing peer -> its newest item
        for rec in self._records():
            if (
                not rec.meta.spend
                or rec.peer_id == self._self
                or "ingress" not in rec.meta.roles
                or not self._identify(rec)
            ):
                continue
            try:
                item = decode_spend(rec.meta.spend)
            except SpendError:
                if rec.signature not in self._bad:
                    if len(self._bad) > 4096:  # (bounded: hostile records churn)
                        self._bad.clear()
                    self._bad.add(rec.signature)
                    self.refused += 1
                continue
            have = latest.get(rec.peer_id)
            if have is None or item.issued_at > have.issued_at:
                latest[rec.peer_id] = item
        sums: dict[tuple[bytes, str], int] = {}
        for item in latest.values():
            for k, n in item.entries.items():
                sums[k] = min(sums.get(k, 0) + n, MAX_BUDGET_TOKENS)
        return sums


class SpendPublisher:
    """The next `spend` item to publish, or None while the spending has not changed (an
    unchanged item is not republished: no record churn when nothing is spent)."""

    def __init__(
        self, own: Callable[[], Mapping[BudgetKey, int]], wall: Callable[[], float]
    ) -> None:
        self._own = own
        self._wall = wall
        self._last: dict[BudgetKey, int] | None = None

    def next(self) -> bytes | None:
        now = dict(self._own())
        if now == self._last:
            return None
        self._last = now
        return encode_spend(now, self._wall())
