"""Budgets that hold across ingresses without a central database: each ingress publishes
what it spent, every ingress adds what the trusted others published.

An ingress with budgets publishes, in its own signed registry record (`NodeMeta.spend`), a
bounded item with its spending this period on each budget it counted against
(`BudgetBook.own_now`):
entries (tag, period id, amount), where the tag is sha256("scope\\0name")[:12], unsalted: no
secret travels, but anybody reading the registry who can guess a key id, owner or team name
(a dictionary) learns that budget's spending. Entries beyond the item's 2 KiB cap (the
smallest amounts) are not shared (`SpendPublisher.left_out`, a warning once). Each
ingress's `RemoteSpend` indexes the items of the trusted ingresses and `BudgetBook.reserve`
adds their sum for the budget's key and current period to what was spent and held here.

What is guaranteed: a request is admitted at one ingress only if what it spent and holds plus
what the trusted others had published fits the budget, so across the fabric at most
limit + (what the other ingresses spent in the last publication delay) is spent: the delay is
the publish interval (1 s) plus the gossip spread (about a second on a LAN) plus the rebuild
interval (0.5 s), for the budgets that fit the item. Every counter is monotone within its
period and the amounts are totals (not deltas), so a lost or reordered update costs nothing
once a later one arrives. A trusted peer's newest item still counts after its record is gone
(until its periods end): the others do not hand out again what it spent.

Definitions travel too: the item carries the publisher's own key and owner budgets (tag,
period, unit, limit; "d", which older receivers ignore; at most `MAX_LIMITS_BYTES`, the
smallest limits first), and a receiver applies them to the keys that publisher issued
(`RemoteSpend.budget_for(scope, name, issuer)`, `BudgetBook.adopt`) where it has no budget
of its own for the key or owner: a budget set at a key's issuer holds wherever the key is
used. Only the key's own issuer's definitions apply to it, so no other ingress sets its
limits. Owner names are shared among ingresses that trust each other, as for spending: two
issuers that both define a budget for one owner name should give it the same unit and period
(amounts of one name and period add up whoever spent them).

Trust: only records that carry the "ingress" role and whose verified identity is trusted
(the `--key-issuer` list: the same identities whose API keys this ingress accepts) count;
records are signed by their session key, so nobody publishes for another ingress. One item
per ingress (the newest by its issue time, over the sessions of that peer: a restarted
ingress does not count twice), and an item from our own peer is ignored (it is in `own`).
Items of untrusted ingresses and items that do not decode (oversized, too many entries,
negative or huge amounts, bad tags or periods) are ignored whole, counted and logged once per
peer. A hostile trusted ingress can only add to the sum, and the sum is clamped to the
budget's limit: it can exhaust a budget (overstate), never lower what the others spent
(understate). On a shared (Postgres) ledger nothing is shared this way (`share_spend`): the
ledger already holds every ingress's spending.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
from prometheus_client import CollectorRegistry, Gauge

from llmfabric.accounts.budgets import (
    MAX_BUDGET_TOKENS,
    PERIODS,
    UNITS,
    Budget,
    BudgetStore,
    period_of,
)
from llmfabric.registry.codec import MAX_SPEND as MAX_SPEND_ITEM_BYTES
from llmfabric.registry.records import Lifecycle, NodeRecord
from llmfabric.untrusted import get_logger

TAG_BYTES = 12
_VERSION = 1
_PERIOD = re.compile(r"\d{4}-\d{2}(-\d{2})?")  # a UTC month or day id (budgets.period_of)
_MAX_PERIOD_ID = 16  # bytes of a period id (ours: 7 or 10)

BudgetKey = tuple[str, str, str]  # (scope, name, period id)
# Budgets whose definitions travel: a receiver knows a request's key and owner, not the team
# the publisher put the owner in.
SHARED_SCOPES = ("key", "owner")
_MAX_REMEMBERED = 4096  # decoded items, counted signatures, warned peers (hostile churn)
log = get_logger(__name__)


class SpendError(ValueError):
    """A spend item is malformed or over its bounds (hostile or broken publisher)."""


def tag_of(scope: str, name: str) -> bytes:
    """The published stand-in for a budget's (scope, name)."""
    return hashlib.sha256(f"{scope}\0{name}".encode()).digest()[:TAG_BYTES]


@dataclass(frozen=True, slots=True)
class SpendItem:
    issued_at: float  # the publisher's wall clock
    entries: Mapping[tuple[bytes, str], int]  # (tag, period id) -> amount
    # The publisher's own key and owner budgets: tag -> (period, unit, limit) ("d" in the
    # item; older publishers send none, older receivers ignore it)
    limits: Mapping[bytes, tuple[str, str, int]] = field(default_factory=dict)


MAX_LIMITS_BYTES = 1024  # of the item's 2 KiB: budget definitions first, spending after


def encode_spend(own: Mapping[BudgetKey, int], issued_at: float,
                 budgets: Iterable[Budget] = ()) -> bytes:
    """The record's `spend` bytes for this ingress's spending (b"" when there is none): the
    largest amounts first, as many as fit `MAX_SPEND_ITEM_BYTES` (the budgets nearest their
    limit are the ones that need the others' spending most), after the definitions of its
    key and owner `budgets` (up to `MAX_LIMITS_BYTES`)."""
    return encode_spend_counted(own, issued_at, budgets)[0]


def encode_spend_counted(own: Mapping[BudgetKey, int], issued_at: float,
                         budgets: Iterable[Budget] = ()) -> tuple[bytes, int]:
    """`encode_spend` and how many entries and definitions did not fit (those budgets are
    not shared)."""
    ordered = sorted(((n, k) for k, n in own.items() if n > 0), key=lambda x: (-x[0], x[1]))
    defs = sorted((b.limit, b.scope, b.name, b.period, b.unit) for b in budgets
                   if b.scope in SHARED_SCOPES)  # (the smallest limits first)
    if not ordered and not defs:
        return b"", 0
    head = len(msgpack.packb({"v": _VERSION, "t": float(issued_at), "e": [], "d": []}))
    used = head + 4  # (each array's length header grows to 3 bytes past 15 entries)
    limits: list[list[Any]] = []
    for limit, scope, name, period, unit in defs:
        entry = [tag_of(scope, name), period, unit, min(limit, MAX_BUDGET_TOKENS)]
        size = len(msgpack.packb(entry, use_bin_type=True))
        if used - head + size > MAX_LIMITS_BYTES:
            break
        used += size
        limits.append(entry)
    entries: list[list[Any]] = []
    for n, (scope, name, pid) in ordered:
        entry = [tag_of(scope, name), pid, min(n, MAX_BUDGET_TOKENS)]
        size = len(msgpack.packb(entry, use_bin_type=True))
        if used + size > MAX_SPEND_ITEM_BYTES:
            break
        used += size
        entries.append(entry)
    doc: dict[str, Any] = {"v": _VERSION, "t": float(issued_at), "e": entries}
    if limits:
        doc["d"] = limits
    out = bytes(msgpack.packb(doc, use_bin_type=True))
    assert len(out) <= MAX_SPEND_ITEM_BYTES, len(out)
    return out, len(ordered) - len(entries) + len(defs) - len(limits)


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
        if not isinstance(pid, str) or len(pid) > _MAX_PERIOD_ID:
            raise SpendError("a spend period is a string")
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_BUDGET_TOKENS:
            raise SpendError(f"a spend amount is an integer in 0..{MAX_BUDGET_TOKENS}")
        if (tag, pid) in entries:
            raise SpendError("a spend item names a budget and period twice")
        if _PERIOD.fullmatch(pid):  # (a period a newer publisher knows: not ours to count)
            entries[(tag, pid)] = n
    return SpendItem(float(t), entries, _decode_limits(doc.get("d", [])))


def _decode_limits(raw: object) -> dict[bytes, tuple[str, str, int]]:
    if not isinstance(raw, list):
        raise SpendError("a spend item's budget definitions must be a list")
    limits: dict[bytes, tuple[str, str, int]] = {}
    for d in raw:
        if not (isinstance(d, list) and len(d) >= 4):  # (later fields: a newer publisher's)
            raise SpendError("a budget definition is [tag, period, unit, limit]")
        tag, period, unit, limit = d[:4]
        if not isinstance(tag, bytes) or len(tag) != TAG_BYTES:
            raise SpendError(f"a budget definition's tag has {TAG_BYTES} bytes")
        if not isinstance(period, str) or not isinstance(unit, str):
            raise SpendError("a budget definition's period and unit are strings")
        if (isinstance(limit, bool) or not isinstance(limit, int)
                or not 0 < limit <= MAX_BUDGET_TOKENS):
            raise SpendError(f"a budget limit is an integer in 1..{MAX_BUDGET_TOKENS}")
        if tag in limits:
            raise SpendError("a spend item defines a budget twice")
        # A period or unit of a newer publisher: skipped, so its spending still counts and
        # its other definitions still apply (this version cannot enforce that one).
        if period in PERIODS and unit in UNITS:
            limits[tag] = (period, unit, limit)
    return limits


class RemoteSpend:
    """(tag, period id) -> the sum of the trusted ingresses' published spending.

    Rebuilt when the replica changed (`version`), at most every `every_s` seconds (the scan
    of the fleet is off the request path between rebuilds); items are decoded once per
    distinct bytes. Each trusted peer's newest item is kept after its record is gone (it
    left, or aged out: what it spent this period still counts), at most `max_peers` peers
    (least recently updated dropped first), and dropped once none of its periods is current.
    `refused` counts items that did not decode, `untrusted` items from ingresses that are
    not trusted (both ignored; a warning once per peer)."""

    def __init__(
        self,
        records: Callable[[], Iterable[NodeRecord]],
        version: Callable[[], int],
        identify: Callable[[NodeRecord], str],
        self_peer: str,
        trusted: Iterable[str],
        *,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = 0.5,
        max_peers: int = 256,
    ) -> None:
        self._records = records
        self._version = version
        self._identify = identify
        self._self = self_peer
        self.trusted = frozenset(trusted)
        self._wall = wall
        self._clock = clock
        self._every_s = every_s
        self._max_peers = max_peers
        self._seen: int | None = None
        self._built_at = -math.inf
        self._sums: dict[tuple[bytes, str], int] = {}
        self._limits: dict[tuple[str, bytes], tuple[str, str, int]] = {}  # (issuer, tag)
        self._kept: OrderedDict[str, SpendItem] = OrderedDict()  # peer -> its newest item
        self._decoded: OrderedDict[bytes, SpendItem | None] = OrderedDict()  # None: refused
        self._ignored: set[bytes] = set()  # signatures of untrusted records already counted
        self._warned: set[str] = set()  # peers already logged
        self.refused = 0
        self.untrusted = 0

    def __call__(self, key: BudgetKey) -> int:
        self._refresh()
        scope, name, pid = key
        return self._sums.get((tag_of(scope, name), pid), 0)

    def budget_for(self, scope: str, name: str, issuer: str) -> Budget | None:
        """The budget trusted ingress `issuer` (an identity, as `identify` gives it: whose
        key the request carries) defined for (scope, name) in its newest item (key and
        owner scopes), or None. Only from records in the replica now and not LEFT: a budget
        the issuer removed, or an issuer that left, stops applying (what it spent still
        counts, as above)."""
        self._refresh()
        if not self._limits or scope not in SHARED_SCOPES:
            return None
        got = self._limits.get((issuer, tag_of(scope, name)))
        if got is None:
            return None
        period, unit, limit = got
        return Budget(scope, name, limit, period, unit)

    def _refresh(self) -> None:
        v = self._version()
        if v != self._seen and self._clock() - self._built_at >= self._every_s:
            self._seen = v
            self._built_at = self._clock()
            self._sums = self._build()

    @property
    def peers(self) -> int:
        """Trusted peers whose spending counts (live or gone)."""
        return len(self._kept)

    def _warn(self, peer: str, why: str) -> None:
        if peer not in self._warned:
            if len(self._warned) > _MAX_REMEMBERED:
                self._warned.clear()
            self._warned.add(peer)
            log.warning("spend item of ingress %s ignored: %s", peer[:16], why)

    def _decode(self, data: bytes, peer: str) -> SpendItem | None:
        if data in self._decoded:
            self._decoded.move_to_end(data)
            return self._decoded[data]
        try:
            item: SpendItem | None = decode_spend(data)
        except SpendError as exc:
            item = None
            self.refused += 1
            self._warn(peer, str(exc))
        self._decoded[data] = item
        if len(self._decoded) > _MAX_REMEMBERED:
            self._decoded.popitem(last=False)
        return item

    def _build(self) -> dict[tuple[bytes, str], int]:
        present: dict[str, tuple[str, SpendItem]] = {}  # peer -> (issuer, newest live item)
        for rec in self._records():
            if not rec.meta.spend or rec.peer_id == self._self or "ingress" not in rec.meta.roles:
                continue
            if self._identify(rec) not in self.trusted:
                if rec.signature not in self._ignored:
                    if len(self._ignored) > _MAX_REMEMBERED:  # (bounded: hostile churn)
                        self._ignored.clear()
                    self._ignored.add(rec.signature)
                    self.untrusted += 1
                    self._warn(rec.peer_id, "not a trusted ingress (--key-issuer)")
                continue
            item = self._decode(rec.meta.spend, rec.peer_id)
            if item is None:
                continue
            if rec.state is not Lifecycle.LEFT and (
                    rec.peer_id not in present
                    or item.issued_at > present[rec.peer_id][1].issued_at):
                present[rec.peer_id] = (self._identify(rec), item)
            have = self._kept.get(rec.peer_id)
            if have is None or item.issued_at > have.issued_at:
                self._kept[rec.peer_id] = item
                self._kept.move_to_end(rec.peer_id)
        while len(self._kept) > self._max_peers:
            self._kept.popitem(last=False)
        # Several ingresses can share an identity (a provider's certificate): their keys
        # are that issuer's, so are their budgets; the newest item wins where they differ.
        self._limits = {(who, tag): d
                        for who, item in sorted(present.values(), key=lambda p: p[1].issued_at)
                        for tag, d in item.limits.items()}
        now = self._wall()
        current = {period_of("day", now)[0], period_of("month", now)[0]}
        sums: dict[tuple[bytes, str], int] = {}
        for peer, item in list(self._kept.items()):
            live = [(k, n) for k, n in item.entries.items() if k[1] in current]
            if not live:  # its periods ended
                del self._kept[peer]
            for k, n in live:
                sums[k] = min(sums.get(k, 0) + n, MAX_BUDGET_TOKENS)
        return sums


class SpendPublisher:
    """The next `spend` item to publish, or None while the spending has not changed (an
    unchanged item is not republished: no record churn when nothing is spent). `left_out`:
    the entries the last item had no room for (`MAX_SPEND_ITEM_BYTES`; a warning once)."""

    def __init__(
        self, own: Callable[[], Mapping[BudgetKey, int]], wall: Callable[[], float],
        budgets: Callable[[], Iterable[Budget]] = tuple,
    ) -> None:
        self._own = own
        self._wall = wall
        self._budgets = budgets  # this ingress's own budgets, whose definitions travel
        self._last: tuple[dict[BudgetKey, int], frozenset[Budget]] | None = None
        self.left_out = 0
        self._warned = False

    def next(self) -> bytes | None:
        now = (dict(self._own()), frozenset(b for b in self._budgets()
                                             if b.scope in SHARED_SCOPES))
        if now == self._last:
            return None
        self._last = now
        data, self.left_out = encode_spend_counted(now[0], self._wall(), now[1])
        if self.left_out and not self._warned:
            self._warned = True
            log.warning(
                "%d budgets' definitions or spending do not fit the %d-byte spend item: the "
                "other ingresses do not see them (the strictest definitions and the largest "
                "amounts are published)",
                self.left_out,
                MAX_SPEND_ITEM_BYTES,
            )
        return data


def register_metrics(
    registry: CollectorRegistry, remote: RemoteSpend, publisher: SpendPublisher
) -> None:
    """Gauges for what budget sharing ignores, on the ingress's /metrics."""
    for name, doc, read in (
        ("refused", "Spend items of other ingresses that did not decode", lambda: remote.refused),
        ("untrusted", "Spend items of untrusted ingresses (ignored)", lambda: remote.untrusted),
        ("left_out", "Budgets not in our spend item (no room)", lambda: publisher.left_out),
        ("peers", "Trusted ingresses whose spending counts here", lambda: remote.peers),
    ):
        Gauge(f"llmfabric_spend_{name}", doc, registry=registry).set_function(read)


def share_spend(
    budgets: BudgetStore, remote: Callable[[], RemoteSpend]
) -> tuple[RemoteSpend, SpendPublisher] | None:
    """Install budget sharing on `budgets` (its book counts `remote()`); None on a shared
    (Postgres) ledger, which already holds every ingress's spending: counting the others'
    published spending too would count it twice."""
    if budgets.shared_ledger:
        return None
    book = budgets.book
    book.remote = shared = remote()
    book.adopt = shared.budget_for
    return shared, SpendPublisher(book.own_now, book.wall, lambda: book.budgets.values())
