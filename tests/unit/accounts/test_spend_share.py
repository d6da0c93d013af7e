"""Budgets across ingresses: the spend item each ingress publishes in its signed record, whom
a receiver counts, and the protocol on a fake clock with an in-memory network of signed
records (real signing, encoding and verification; only the transport is a queue)."""

from __future__ import annotations

import math

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.accounts.budgets import MAX_BUDGET_TOKENS, Budget, BudgetBook, OverBudget
from llmfabric.accounts.spend_share import (
    MAX_SPEND_ITEM_BYTES,
    TAG_BYTES,
    RemoteSpend,
    SpendError,
    SpendPublisher,
    decode_spend,
    encode_spend,
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
        (_packed({"v": 1, "t": T0, "e": [[b"x" * TAG_BYTES, "yesterday", 1]]}), "period"),
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
    book.remote = RemoteSpend(lambda: records, lambda: version[0], lambda r: r.peer_id, me.peer_id)
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
                lambda r: r.peer_id,
                self.key.peer_id,
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
    delay = publish_s + gossip_s
    others_per_s = (ingresses - 1) / (ingresses * gap)
    return sum(x.admitted for x in ins), math.floor(delay * others_per_s) + ingresses - 1


def test_two_ingresses_alternating_admit_at_most_the_budget_plus_the_publication_delay() -> None:
    total, slack = run(n=50, ingresses=2, gap=0.2, publish_s=1.0, gossip_s=0.5)
    assert 50 <= total <= 50 + slack
    print(
        f"\nbudget 50 requests, 2 ingresses alternating every 0.2 s, publish 1 s + gossip "
        f"0.5 s: {total} admitted (bound {50 + slack})"
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
