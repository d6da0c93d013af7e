"""Budgets across ingresses: the spend item each ingress publishes in its signed record, whom
a receiver counts, and the protocol on a fake clock with an in-memory network of signed
records (real signing, encoding and verification; only the transport is a queue)."""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from llmfabric.accounts.budgets import (
    MAX_BUDGET_TOKENS,
    Budget,
    BudgetBook,
    BudgetStore,
    OverBudget,
)
from llmfabric.accounts.db import PostgresBackend, SQLiteBackend
from llmfabric.accounts.spend_share import (
    MAX_SPEND_ITEM_BYTES,
    TAG_BYTES,
    RemoteSpend,
    SpendError,
    SpendPublisher,
    decode_spend,
    encode_spend,
    register_metrics,
    share_spend,
    tag_of,
)
from llmfabric.identity.keys import NodeKey
from llmfabric.registry.codec import verify_record
from llmfabric.registry.errors import InvalidRecord
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import Lifecycle, NodeMeta, NodeRecord

T0 = 1_790_000_000.0 + 3600.0  # an hour into a UTC day
DAY = "2026-09-21"
KEY = "k" + "1" * 15


def test_an_item_carries_hashed_names_and_decodes_to_what_was_spent() -> None:
    own = {
        ("key", KEY, DAY): 120,
        ("owner", "alice", "2026-09"): 5000,
        ("team", "research", DAY): 0,
    }
    data = encode_spend(own, T0)
    assert KEY.encode() not in data and b"alice" not in data and b"research" not in data
    item = decode_spend(data)
    assert item.issued_at == T0
    assert dict(item.entries) == {
        (tag_of("key", KEY), DAY): 120,
        (tag_of("owner", "alice"), "2026-09"): 5000,
    }
    assert encode_spend({}, T0) == b""
    assert tag_of("key", "x") != tag_of("owner", "x")  # the scope is part of the tag


def test_an_item_keeps_the_largest_spenders_within_its_byte_cap() -> None:
    own = {("key", f"k{i:015x}", DAY): 1000 + i for i in range(500)}
    data = encode_spend(own, T0)
    assert len(data) <= MAX_SPEND_ITEM_BYTES
    kept = decode_spend(data).entries
    assert 40 <= len(kept) < 500
    print(
        f"\n{len(kept)} entries in {len(data)} bytes "
        f"({(len(data) - 20) / len(kept):.1f} bytes per entry)"
    )
    assert {n for n in kept.values()} == {1000 + i for i in range(500 - len(kept), 500)}


def _packed(doc: object) -> bytes:
    return bytes(msgpack.packb(doc, use_bin_type=True))


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "bytes"),
        (b"\x00" * (MAX_SPEND_ITEM_BYTES + 1), "bytes"),
        (b"\xc1garbage", "msgpack"),
        (_packed({"v": 2, "t": T0, "e": []}), "version"),
        (_packed({"v": 1, "t": -1.0, "e": []}), "time"),
        (_packed({"v": 1, "t": math.inf, "e": []}), "time"),
        (_packed({"v": 1, "t": T0, "e": {}}), "list"),
        (_packed({"v": 1, "t": T0, "e": [[b"x" * TAG_BYTES, DAY]]}), "tag, period, amount"),
        (_packed({"v": 1, "t": T0, "e": [[b"x" * 4, DAY, 1]]}), "tag has"),
        (_packed({"v": 1, "t": T0, "e": [["x" * TAG_BYTES, DAY, 1]]}), "tag has"),
        (_packed({"v": 1, "t": T0, "e": [[b"x" * TAG_BYTES, 20261201, 1]]}), "period"),
        (_packed({"v": 1, "t": T0, "e": [[b"x" * TAG_BYTES, "2026-12-01" * 2, 1]]}), "period"),
        (_packed({"v": 1, "t": T0, "e": [[b"x" * TAG_BYTES, DAY, -5]]}), "amount"),
        (_packed({"v": 1, "t": T0, "e": [[b"x" * TAG_BYTES, DAY, True]]}), "amount"),
        (_packed({"v": 1, "t": T0, "e": [[b"x" * TAG_BYTES, DAY, 1.5]]}), "amount"),
        (
            _packed({"v": 1, "t": T0, "e": [[b"x" * TAG_BYTES, DAY, MAX_BUDGET_TOKENS + 1]]}),
            "amount",
        ),
        (_packed({"v": 1, "t": T0, "e": [[b"x" * TAG_BYTES, DAY, 1]] * 2}), "twice"),
    ],
)
def test_malformed_or_oversized_items_are_refused(data: bytes, why: str) -> None:
    with pytest.raises(SpendError, match=why):
        decode_spend(data)


def _record(
    key: NodeKey, spend: bytes, roles: tuple[str, ...] = ("ingress",), session_id: str | None = None
) -> NodeRecord:
    own = RecordOwner(key, NodeMeta(roles=roles, spend=spend), wall=T0, session_id=session_id)
    return own.set_state(Lifecycle.SERVING, wall=T0).record


@pytest.mark.hostile
def test_a_record_with_an_oversized_spend_item_is_refused_by_the_registry() -> None:
    key = NodeKey.generate()
    own = RecordOwner(key, NodeMeta(roles=("ingress",), spend=b"\x00" * 4000), wall=T0)
    signed = own.current
    with pytest.raises(InvalidRecord, match="spend"):
        verify_record(signed.body, signed.signature)
    ok = RecordOwner(
        key, NodeMeta(roles=("ingress",), spend=encode_spend({("key", KEY, DAY): 7}, T0)), wall=T0
    ).current
    assert verify_record(ok.body, ok.signature).record.meta.spend  # (and a good one passes)


@pytest.mark.hostile
def test_only_other_verified_ingresses_count_once_each_newest_item_first() -> None:
    me, other, member, stranger = (NodeKey.generate() for _ in range(4))
    k = ("key", KEY, DAY)
    item = encode_spend({k: 100}, T0)
    records = [
        _record(me, encode_spend({k: 999}, T0)),  # ours: counted in `own`, not again
        _record(other, encode_spend({k: 40}, T0 - 10)),  # an older session of `other`
        _record(other, item),  # its newest: this one counts, not both
        _record(member, encode_spend({k: 500}, T0), roles=("relay",)),  # not an ingress
        _record(stranger, encode_spend({k: 700}, T0)),  # no verified identity
        _record(NodeKey.generate(), b"\x92garbage"),  # refused whole
    ]
    remote = RemoteSpend(
        lambda: records,
        lambda: 0,
        lambda r: "" if r.peer_id == stranger.peer_id else r.peer_id,
        me.peer_id,
        {other.peer_id, member.peer_id, records[-1].peer_id},  # (the stranger is unverified)
        wall=lambda: T0,
    )
    assert remote(k) == 100
    assert remote(("key", KEY, "2026-09-22")) == 0  # another period
    assert remote(("owner", KEY, DAY)) == 0  # another scope
    assert remote.refused == 1


@pytest.mark.hostile
def test_a_hostile_ingress_can_exhaust_a_budget_but_never_lower_the_others() -> None:
    me, honest, hostile = (NodeKey.generate() for _ in range(3))
    k = ("key", KEY, DAY)
    records = [
        _record(honest, encode_spend({k: 60}, T0)),
        _record(hostile, encode_spend({k: 0}, T0)),
    ]  # "nothing was spent"
    version = [0]
    book = BudgetBook(lambda: T0)
    book.set(Budget("key", KEY, 100, "day"))
    book.remote = RemoteSpend(
        lambda: records,
        lambda: version[0],
        lambda r: r.peer_id,
        me.peer_id,
        {honest.peer_id, hostile.peer_id},  # (trusted, yet hostile)
        wall=lambda: T0,
        every_s=0.0,
    )
    assert book.others(k, 100) == 60  # the honest ingress's spending still counts
    assert isinstance(book.reserve(KEY, "alice", 41), OverBudget)
    records[1] = _record(hostile, encode_spend({k: MAX_BUDGET_TOKENS}, T0))
    version[0] += 1
    assert book.others(k, 100) == 100  # clamped to the limit
    refused = book.reserve(KEY, "alice", 1)
    assert isinstance(refused, OverBudget) and refused.spent == 100
    assert book.status()[0]["elsewhere"] == 100


def test_the_publisher_republishes_only_when_the_spending_changed() -> None:
    book = BudgetBook(lambda: T0)
    book.set(Budget("key", KEY, 100, "day"))
    pub = SpendPublisher(book.own_now, book.wall)
    assert pub.next() == b""  # (nothing spent yet: an empty item, once)
    assert pub.next() is None
    hold = book.reserve(KEY, "alice", 10)
    assert not isinstance(hold, OverBudget)
    book.settle(hold, 7)
    first = pub.next()
    assert first is not None and dict(decode_spend(first).entries) == {(tag_of("key", KEY), DAY): 7}
    assert pub.next() is None
    book.charge("key", KEY, DAY, 50)  # (another ingress's, via a shared ledger: not ours)
    assert pub.next() is None


# ---- the protocol on a fake clock ---------------------------------------------------------


REBUILD_S = 0.5  # RemoteSpend's rebuild interval


class Net:
    """Signed record bodies in flight for `delay` seconds, then merged into one replica."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.flying: list[tuple[float, bytes, bytes]] = []
        self.replica: dict[str, NodeRecord] = {}
        self.version = 0

    def send(self, now: float, body: bytes, signature: bytes) -> None:
        self.flying.append((now + self.delay, body, signature))

    def deliver(self, now: float) -> None:
        due = [f for f in self.flying if f[0] <= now]
        self.flying = [f for f in self.flying if f[0] > now]
        for _, body, sig in due:
            rec = verify_record(body, sig).record  # what a replica checks
            have = self.replica.get(rec.session_id)
            if have is None or rec.order_key() > have.order_key():
                self.replica[rec.session_id] = rec
                self.version += 1


class Ingress:
    def __init__(self, net: Net, clock: list[float], limit: int, share: bool) -> None:
        self.key = NodeKey.generate()
        self.net = net
        self.book = BudgetBook(lambda: clock[0])
        self.book.set(Budget("key", KEY, limit, "day"))
        if share:
            self.book.remote = RemoteSpend(
                lambda: list(net.replica.values()),
                lambda: net.version,
                lambda r: "fleet ingress",  # (every ingress trusts every other)
                self.key.peer_id,
                {"fleet ingress"},
                wall=lambda: clock[0],
                clock=lambda: clock[0],
                every_s=REBUILD_S,
            )
        self.owner = RecordOwner(self.key, NodeMeta(roles=("ingress",)), wall=clock[0])
        self.publisher = SpendPublisher(self.book.own_now, self.book.wall)
        self.admitted = 0

    def publish(self, now: float) -> None:
        item = self.publisher.next()
        if item is not None:
            meta = NodeMeta(roles=("ingress",), spend=item)
            signed = self.owner.update_meta(meta, wall=now)
            self.net.send(now, signed.body, signed.signature)

    def request(self, cost: int) -> None:
        hold = self.book.reserve(KEY, "alice", cost)
        if not isinstance(hold, OverBudget):
            self.book.settle(hold, cost)
            self.admitted += 1


def run(
    n: int, ingresses: int, gap: float, publish_s: float, gossip_s: float, share: bool = True
) -> tuple[int, int]:
    """Requests of 10 tokens against a budget of `n` requests, sent round-robin to the
    ingresses every `gap` seconds; (admitted in total, the bound's slack)."""
    clock = [T0]
    net = Net(gossip_s)
    ins = [Ingress(net, clock, 10 * n, share) for _ in range(ingresses)]
    step = 0.01
    t, next_pub, next_req, i = 0.0, publish_s, 0.0, 0
    while t < (n * 3 + 10) * gap + 5:
        clock[0] = T0 + t
        net.deliver(clock[0])
        if t >= next_pub - 1e-9:
            for ing in ins:
                ing.publish(clock[0])
            next_pub += publish_s
        if t >= next_req - 1e-9:
            ins[i % ingresses].request(10)
            i += 1
            next_req += gap
        t = round(t + step, 6)
    # At the last admission, only the other ingresses' admissions of the last
    # publish + gossip seconds were unseen there.
    delay = publish_s + gossip_s + REBUILD_S
    others_per_s = (ingresses - 1) / (ingresses * gap)
    return sum(x.admitted for x in ins), math.floor(delay * others_per_s) + ingresses - 1


def test_two_ingresses_alternating_admit_at_most_the_budget_plus_the_publication_delay() -> None:
    total, slack = run(n=50, ingresses=2, gap=0.2, publish_s=1.0, gossip_s=0.5)
    assert 50 <= total <= 50 + slack
    print(
        f"\nbudget 50 requests, 2 ingresses alternating every 0.2 s, publish 1 s + gossip "
        f"0.5 s + rebuild {REBUILD_S} s: {total} admitted (bound {50 + slack})"
    )
    alone, _ = run(n=50, ingresses=2, gap=0.2, publish_s=1.0, gossip_s=0.5, share=False)
    assert alone == 100  # without sharing, each ingress hands out the whole budget


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 40),
    ingresses=st.integers(2, 4),
    gap=st.sampled_from([0.05, 0.1, 0.3, 1.0, 3.0]),
    publish_s=st.sampled_from([0.5, 1.0, 2.0]),
    gossip_s=st.sampled_from([0.0, 0.2, 1.0]),
)
def test_the_overspend_is_bounded_by_the_publication_delay(
    n: int, ingresses: int, gap: float, publish_s: float, gossip_s: float
) -> None:
    total, slack = run(n, ingresses, gap, publish_s, gossip_s)
    assert n <= total <= n + slack


# ---- trust, departures, what is ignored, rebuild cost ---------------------------------------


def _remote(
    records: list[NodeRecord], me: NodeKey, trusted: set[str], clock: list[float], **kw: Any
) -> RemoteSpend:
    return RemoteSpend(
        lambda: records,
        lambda: len(records) + int(clock[0] * 100),  # (changes on every tick: a busy replica)
        lambda r: r.peer_id,
        me.peer_id,
        trusted,
        wall=lambda: clock[0],
        clock=lambda: clock[0],
        **kw,
    )


@pytest.mark.hostile
def test_an_untrusted_ingress_publishing_the_maximum_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    me, trusted, member = (NodeKey.generate() for _ in range(3))
    k = ("key", KEY, DAY)
    clock = [T0]
    records = [_record(trusted, encode_spend({k: 30}, T0))]
    book = BudgetBook(lambda: clock[0])
    book.set(Budget("key", KEY, 100, "day"))
    book.remote = remote = _remote(records, me, {trusted.peer_id}, clock)
    assert book.others(k, 100) == 30
    # any admitted member can start with --ingress and sign its own record
    for i in range(3):
        records.append(_record(member, encode_spend({k: MAX_BUDGET_TOKENS}, T0 + i)))
        clock[0] += 1
        assert book.others(k, 100) == 30
    assert not isinstance(book.reserve(KEY, "alice", 70), OverBudget)
    assert remote.untrusted == 3 and remote.refused == 0
    warned = [r for r in caplog.records if "not a trusted ingress" in r.getMessage()]
    assert len(warned) == 1  # once per peer, not per item


def test_a_peer_that_left_still_counts_until_its_period_ends() -> None:
    me, peer = NodeKey.generate(), NodeKey.generate()
    k = ("key", KEY, DAY)
    clock = [T0]
    records = [_record(peer, encode_spend({k: 60, ("owner", "bob", "2026-09"): 9}, T0))]
    remote = _remote(records, me, {peer.peer_id}, clock)
    assert remote(k) == 60
    records.clear()  # it left (or its record aged out)
    clock[0] += 1
    assert remote(k) == 60 and remote.peers == 1
    clock[0] = T0 + 86400  # the next day: its day entry is over, its month entry is not
    assert remote(("key", KEY, "2026-09-22")) == 0
    assert remote(("owner", "bob", "2026-09")) == 9 and remote.peers == 1
    clock[0] = T0 + 40 * 86400  # the next month: nothing of it is current
    assert remote(("owner", "bob", "2026-09")) == 0 and remote.peers == 0


def test_gone_peers_are_kept_up_to_a_cap_least_recently_updated_first() -> None:
    me = NodeKey.generate()
    k = ("key", KEY, DAY)
    clock = [T0]
    peers = [NodeKey.generate() for _ in range(5)]
    records: list[NodeRecord] = []
    remote = _remote(records, me, {p.peer_id for p in peers}, clock, max_peers=3)
    for p in peers:
        records[:] = [_record(p, encode_spend({k: 1}, T0))]  # one at a time, then gone
        clock[0] += 1
        remote(k)
    records.clear()
    clock[0] += 1
    assert remote(k) == 3 and remote.peers == 3


def test_the_replica_is_scanned_at_most_every_rebuild_interval() -> None:
    me, peer = NodeKey.generate(), NodeKey.generate()
    k = ("key", KEY, DAY)
    clock = [T0]
    records = [_record(peer, encode_spend({k: 5}, T0))]
    scans = [0]

    def scan() -> list[NodeRecord]:
        scans[0] += 1
        return records

    version = [0]
    remote = RemoteSpend(
        scan,
        lambda: version[0],
        lambda r: r.peer_id,
        me.peer_id,
        {peer.peer_id},
        wall=lambda: clock[0],
        clock=lambda: clock[0],
    )
    for _ in range(100):  # every gossip change, many requests in the same 0.1 s
        version[0] += 1
        clock[0] += 0.001
        assert remote(k) == 5
    assert scans[0] == 1
    clock[0] += 0.5
    assert remote(k) == 5 and scans[0] == 2
    assert remote(k) == 5 and scans[0] == 2  # (nothing changed since)


@pytest.mark.hostile
def test_refused_items_are_counted_and_logged_once_per_peer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    me, peer = NodeKey.generate(), NodeKey.generate()
    clock = [T0]
    records = [_record(peer, b"\x92garbage")]
    remote = _remote(records, me, {peer.peer_id}, clock)
    for i in range(3):
        records.append(_record(peer, _packed({"v": 1, "t": T0 + i, "e": [[b"x", DAY, 1]]})))
        clock[0] += 1
        assert remote(("key", KEY, DAY)) == 0
    assert remote.refused == 4
    assert len([r for r in caplog.records if "ignored" in r.getMessage()]) == 1


def test_entries_beyond_the_item_cap_are_counted_logged_and_exported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    book = BudgetBook(lambda: T0)
    for i in range(300):
        book.set(Budget("key", f"k{i:015x}", 10**6, "day"))
        book.charge("key", f"k{i:015x}", DAY, 1000 + i, own=True)
    pub = SpendPublisher(book.own_now, book.wall)
    data = pub.next()
    assert data is not None
    assert pub.left_out == 300 - len(decode_spend(data).entries) > 0
    assert len([r for r in caplog.records if "do not fit" in r.getMessage()]) == 1
    registry = CollectorRegistry()
    remote = _remote([], NodeKey.generate(), set(), [T0])
    remote.refused, remote.untrusted = 2, 5
    register_metrics(registry, remote, pub)
    assert registry.get_sample_value("llmfabric_spend_left_out") == pub.left_out
    assert registry.get_sample_value("llmfabric_spend_refused") == 2
    assert registry.get_sample_value("llmfabric_spend_untrusted") == 5


async def test_a_shared_postgres_ledger_does_not_count_published_spending(
    tmp_path: pathlib.Path,
) -> None:
    def remote() -> RemoteSpend:
        return _remote([], NodeKey.generate(), set(), [T0])

    pg = BudgetStore(PostgresBackend("postgresql://ledger.invalid/x", None), BudgetBook(time.time))
    assert share_spend(pg, remote) is None and pg.book.remote is None  # (it holds it all)
    sqlite = await SQLiteBackend.open(str(tmp_path / "a.db"))
    private = BudgetStore(sqlite, BudgetBook(time.time))
    shared = share_spend(private, remote)
    assert shared is not None and private.book.remote is shared[0]
    await sqlite.aclose()


# --- budget definitions travel with the item (an issuer's budgets hold where its keys go) ---


def test_an_item_carries_the_key_and_owner_budgets_of_its_publisher() -> None:
    budgets = [Budget("key", KEY, 500, "day"), Budget("owner", "alice", 9000, "month", "usd"),
               Budget("team", "nlp", 100, "day")]  # (a team does not travel: see SHARED_SCOPES)
    data = encode_spend({}, T0, budgets)  # published with no spending yet
    assert data and b"alice" not in data and KEY.encode() not in data
    item = decode_spend(data)
    assert dict(item.limits) == {tag_of("key", KEY): ("day", "tokens", 500),
                                 tag_of("owner", "alice"): ("month", "usd", 9000)}
    assert item.entries == {}
    doc = msgpack.unpackb(data)
    assert doc["v"] == 1 and "e" in doc  # what an older receiver reads; it ignores "d"
    assert decode_spend(encode_spend({("key", KEY, DAY): 5}, T0)).limits == {}


def test_definitions_take_at_most_half_the_item_and_the_strictest_go_first() -> None:
    budgets = [Budget("owner", f"owner-{i:04d}", 1000 + i, "day") for i in range(300)]
    own = {("owner", f"owner-{i:04d}", DAY): 10 + i for i in range(300)}
    data = encode_spend(own, T0, budgets)
    assert len(data) <= MAX_SPEND_ITEM_BYTES
    item = decode_spend(data)
    assert 20 <= len(item.limits) < 300 and len(item.entries) >= 20
    assert {d[2] for d in item.limits.values()} == set(range(1000, 1000 + len(item.limits)))
    pub = SpendPublisher(lambda: own, lambda: T0, lambda: budgets)
    got = pub.next()
    assert got == data and pub.left_out == 600 - len(item.limits) - len(item.entries)
    assert pub.next() is None  # unchanged: not republished


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("defs", "why"),
    [
        ({}, "definitions must be a list"),
        ([[b"x" * TAG_BYTES, "day", "tokens"]], "tag, period, unit, limit"),
        ([[b"x" * 4, "day", "tokens", 5]], "tag has"),
        ([[b"x" * TAG_BYTES, 7, "tokens", 5]], "period and unit are strings"),
        ([[b"x" * TAG_BYTES, "day", None, 5]], "period and unit are strings"),
        ([[b"x" * TAG_BYTES, "day", "tokens", 0]], "limit"),
        ([[b"x" * TAG_BYTES, "day", "tokens", -5]], "limit"),
        ([[b"x" * TAG_BYTES, "day", "tokens", True]], "limit"),
        ([[b"x" * TAG_BYTES, "day", "tokens", MAX_BUDGET_TOKENS + 1]], "limit"),
        ([[b"x" * TAG_BYTES, "day", "tokens", 5], [b"x" * TAG_BYTES, "month", "usd", 9]],
         "twice"),
    ],
)
def test_malformed_definitions_refuse_the_whole_item(defs: object, why: str) -> None:
    with pytest.raises(SpendError, match=why):
        decode_spend(_packed({"v": 1, "t": T0, "e": [], "d": defs}))


def test_a_newer_publishers_periods_and_units_are_skipped_not_the_item() -> None:
    """A newer version might add a "week" period or a "eur" unit: this one cannot enforce
    those budgets, but must still count the publisher's day and month spending and apply
    its other definitions (refusing the whole item would let those budgets overspend)."""
    tag_a, tag_b, tag_c = (bytes([i]) * TAG_BYTES for i in (1, 2, 3))
    item = decode_spend(_packed({"v": 1, "t": T0, "e": [
        [tag_a, DAY, 40], [tag_b, "2026-W48", 7], [tag_c, "2026-12", 9]], "d": [
        [tag_a, "week", "tokens", 5], [tag_b, "day", "eur", 5], [tag_c, "day", "tokens", 50]]}))
    assert item.entries == {(tag_a, DAY): 40, (tag_c, "2026-12"): 9}
    assert item.limits == {tag_c: ("day", "tokens", 50)}


@pytest.mark.hostile
def test_a_keys_budgets_come_from_its_own_issuer_only_its_newest_live_item() -> None:
    me, a, b, stranger = (NodeKey.generate() for _ in range(4))
    records = [
        # a's earlier item (an older session): its stricter budget was since raised
        _record(a, encode_spend({}, T0 - 60, [Budget("owner", "alice", 10, "day")])),
        _record(a, encode_spend({}, T0, [Budget("owner", "alice", 500, "day")])),
        # another trusted ingress's "alice" is its own owner of that name: no say over a's
        _record(b, encode_spend({}, T0, [Budget("owner", "alice", 1, "day"),
                                         Budget("key", KEY, 40, "day", "usd")])),
        _record(stranger, encode_spend({}, T0, [Budget("owner", "alice", 1, "day")])),
    ]
    clock = [T0]
    remote = _remote(records, me, {a.peer_id, b.peer_id}, clock)
    assert remote.budget_for("owner", "alice", a.peer_id) == Budget("owner", "alice", 500, "day")
    assert remote.budget_for("key", KEY, b.peer_id) == Budget("key", KEY, 40, "day", "usd")
    assert remote.budget_for("key", KEY, a.peer_id) is None
    assert remote.budget_for("owner", "alice", stranger.peer_id) is None  # not trusted
    assert remote.budget_for("team", "alice", a.peer_id) is None
    left = _record(a, encode_spend({}, T0 + 5, [Budget("owner", "alice", 2, "day")]))
    records.append(dataclasses.replace(left, state=Lifecycle.LEFT))
    del records[1]  # a's live session gone; its LEFT and its older items do not apply
    clock[0] += 1  # (the index is rebuilt at most every 0.5 s)
    assert remote.budget_for("owner", "alice", a.peer_id) == Budget("owner", "alice", 10, "day")
    del records[0]
    clock[0] += 1
    assert remote.budget_for("owner", "alice", a.peer_id) is None


def test_an_issuers_budget_holds_for_its_keys_at_an_ingress_that_has_none_of_its_own() -> None:
    """Ingress B trusts issuer A. A's owner budget of 100 tokens a day applies at B to A's
    keys (not to B's own keys of an owner of the same name): B counts A's published
    spending and its own, and publishes its own for A to count. A budget B sets itself for
    that owner wins over A's, and keeps what A's keys spent here."""
    me, a = NodeKey.generate(), NodeKey.generate()
    clock = [T0]
    records = [_record(a, encode_spend({("owner", "alice", DAY): 60}, T0,
                                       [Budget("owner", "alice", 100, "day")]))]
    book = BudgetBook(lambda: clock[0])
    book.ledger_batch = lambda: 1  # (as behind a BudgetStore: syncs below)
    book.remote = remote = _remote(records, me, {a.peer_id}, clock)
    book.adopt = remote.budget_for
    issuer = a.peer_id
    assert book.applies(KEY, "alice", issuer) and not book.applies(KEY, "alice")
    assert not book.applies(KEY, "bob", issuer)
    assert isinstance(book.reserve(KEY, "alice", 50, issuer=issuer), OverBudget)  # 60 + 50
    hold = book.reserve(KEY, "alice", 30, issuer=issuer)
    assert not isinstance(hold, OverBudget)
    book.settle(hold, 30)
    assert book.own_now() == {("owner", "alice", DAY): 30}  # published for A to count
    [row] = book.status_for(KEY, "alice", issuer)
    assert row["issuer_defined"] is True and row["spent"] == 30 and row["elsewhere"] == 60
    book.adopt_ledger({}, written=1)  # a sync: B's own spending on A's budget is kept
    assert isinstance(book.reserve(KEY, "alice", 20, issuer=issuer), OverBudget)
    book.set(Budget("owner", "alice", 1000, "day"))  # B's own budget for alice wins...
    book.adopt_ledger({("owner", "alice", DAY): 0}, written=1)  # (B's ledger: none of its own)
    assert book.spent[("owner", "alice", DAY)] == 30  # ...and still counts A's keys' 30
    assert not isinstance(book.reserve(KEY, "alice", 20, issuer=issuer), OverBudget)
    # A removes its budget: B forgets it at its next sync
    records[0] = _record(a, encode_spend({("owner", "alice", DAY): 60}, T0 + 1))
    clock[0] += 1
    del book.budgets[("owner", "alice")]
    book.adopt_ledger({}, written=1)
    assert book.adopted == {} and not book.applies(KEY, "alice", issuer)


def test_the_issuer_counts_what_its_keys_spent_under_its_budget_elsewhere() -> None:
    """The other half: B publishes its spending on A's budget under A's tag, and A adds it
    when it admits (A's own budget, A's own key)."""
    a, b = NodeKey.generate(), NodeKey.generate()
    at_b = BudgetBook(lambda: T0)
    at_b.adopted[("owner", "alice", a.peer_id)] = Budget("owner", "alice", 100, "day")
    at_b.own[("owner", "alice", DAY)] = 70
    records = [_record(b, encode_spend(at_b.own_now(), T0))]
    at_a = BudgetBook(lambda: T0)
    at_a.set(Budget("owner", "alice", 100, "day"))
    at_a.remote = _remote(records, a, {b.peer_id}, [T0])
    assert isinstance(at_a.reserve(KEY, "alice", 40), OverBudget)  # 70 elsewhere + 40
    assert not isinstance(at_a.reserve(KEY, "alice", 30), OverBudget)


def test_ingresses_sharing_an_identity_pool_their_definitions() -> None:
    """On a certificate network an identity is a provider, which may run several ingresses:
    the keys of each are that provider's, and so are the budgets of each."""
    me, x1, x2 = (NodeKey.generate() for _ in range(3))
    records = [_record(x1, encode_spend({}, T0, [Budget("key", KEY, 10, "day")])),
               _record(x2, encode_spend({}, T0 + 1, [Budget("owner", "alice", 20, "day")]))]
    remote = RemoteSpend(lambda: records, lambda: 1, lambda r: "provider-p", me.peer_id,
                         {"provider-p"}, wall=lambda: T0, clock=lambda: T0)
    assert remote.budget_for("key", KEY, "provider-p") == Budget("key", KEY, 10, "day")
    assert remote.budget_for("owner", "alice", "provider-p") == Budget("owner", "alice", 20,
                                                                       "day")


def test_an_adopted_owner_budget_starts_from_what_foreign_keys_spent_not_stale_spending(
) -> None:
    """A local owner budget deleted this period leaves its ledger spending in the book; the
    issuer's budget for that owner, adopted afterwards, counts only what the issuer's keys
    spent here."""
    me, a = NodeKey.generate(), NodeKey.generate()
    records = [_record(a, encode_spend({}, T0, [Budget("owner", "bob", 100, "day")]))]
    book = BudgetBook(lambda: T0)
    book.ledger_batch = lambda: 1
    book.set(Budget("owner", "bob", 1000, "day"))
    book.adopt_ledger({("owner", "bob", DAY): 900}, written=0)  # our own keys spent 900
    del book.budgets[("owner", "bob")]
    book.remote = remote = _remote(records, me, {a.peer_id}, [T0])
    book.adopt = remote.budget_for
    book.adopt_ledger({}, written=0)  # a sync after the deletion
    hold = book.reserve(KEY, "bob", 50, issuer=a.peer_id)
    assert not isinstance(hold, OverBudget)  # 900 were not this budget's
    book.settle(hold, 50)
    book.adopt_ledger({}, written=0)
    assert book.spent[("owner", "bob", DAY)] == 50


def test_spending_on_an_issuers_budget_is_still_published_after_its_definition_changes(
) -> None:
    """B served 90 tokens on issuer A's owner budget of 100. A raises the limit to 110: at
    B's next sync the old definition is dropped and the new one adopted afresh, but B must
    keep publishing its 90, or A would count nothing from B and admit 110 more."""
    me, a = NodeKey.generate(), NodeKey.generate()
    clock = [T0]
    records = [_record(a, encode_spend({}, T0, [Budget("owner", "alice", 100, "day")]))]
    book = BudgetBook(lambda: clock[0])
    book.ledger_batch = lambda: 1
    book.remote = remote = _remote(records, me, {a.peer_id}, clock)
    book.adopt = remote.budget_for
    hold = book.reserve(KEY, "alice", 90, issuer=a.peer_id)
    assert not isinstance(hold, OverBudget)
    book.settle(hold, 90)
    records[0] = _record(a, encode_spend({}, T0 + 1, [Budget("owner", "alice", 110, "day")]))
    clock[0] += 1
    book.adopt_ledger({}, written=1)
    assert ("owner", "alice", a.peer_id) not in book.adopted  # the old definition went
    assert book.own_now() == {("owner", "alice", DAY): 90}
    # ...and A, holding the raised budget, counts those 90 when it admits its key
    at_a = BudgetBook(lambda: clock[0])
    at_a.set(Budget("owner", "alice", 110, "day"))
    at_a.remote = _remote([_record(me, encode_spend(book.own_now(), clock[0]))], a,
                          {me.peer_id}, clock)
    assert isinstance(at_a.reserve(KEY, "alice", 30), OverBudget)
    assert not isinstance(at_a.reserve(KEY, "alice", 20), OverBudget)
