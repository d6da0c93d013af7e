"""FairShare (net/fair_share.py): room first come, first served; when full, a party holding
two fewer than the largest takes the largest party's least recently used holder; its
bookkeeping (the largest count, LRU order) checked against a brute-force model over random
operations; `relay_party` groups sources by /24 and /48, and certified members by name."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from llmfabric.net.fair_share import FairShare, relay_party
from llmfabric.net.source_slots import source_of


def test_room_then_fair_share_eviction_of_the_least_recently_used() -> None:
    fs = FairShare(4)
    assert [fs.admit(f"x{k}", "X") for k in range(3)] == [(True, None)] * 3
    assert fs.admit("y0", "Y") == (True, None)
    fs.touch("x0")
    assert fs.admit("y1", "Y") == (True, "x1")  # Y 1, X 3: X's LRU (x0 was used)
    assert fs.admit("y2", "Y") == (False, None)  # Y 2, X 2: one more would only swap
    assert fs.admit("z0", "Z") == (True, "x2")
    assert fs.admit("x0", "X") == (True, None)  # held already
    assert fs.admit("w0", "W") == (True, "y0")  # Y holds the most now
    assert fs.admit("v0", "V") == (False, None)  # every party holds one
    assert (len(fs), fs.largest, fs.evicted) == (4, 1, 3)
    fs.remove("x0")
    fs.remove("x0")  # (twice: nothing)
    assert fs.largest == 1 and "x0" not in fs and fs.admit("v0", "V") == (True, None)


def test_no_cap_takes_everyone() -> None:
    fs = FairShare(None)
    assert all(fs.admit(f"h{k}", "P")[0] for k in range(1000)) and fs.largest == 1000


def test_bookkeeping_matches_a_brute_force_model() -> None:
    rng = random.Random(7)
    fs = FairShare(20)
    model: dict[str, str] = {}  # holder -> party
    order: list[str] = []  # use order, least recent first
    for step in range(5000):
        holder, party = f"h{rng.randrange(60)}", f"p{rng.randrange(6)}"
        if rng.random() < 0.3 and model:
            gone = rng.choice(sorted(model))
            fs.remove(gone)
            del model[gone]
            order.remove(gone)
        elif rng.random() < 0.2 and model:
            used = rng.choice(sorted(model))
            fs.touch(used)
            order.remove(used)
            order.append(used)
        else:
            counts = Counter(model.values())
            top = max(counts.values(), default=0)
            got = fs.admit(holder, party)
            if holder in model:
                assert got == (True, None)
                order.remove(holder)
                order.append(holder)
            elif len(model) < 20:
                assert got == (True, None)
                model[holder] = party
                order.append(holder)
            elif counts[party] + 2 <= top:
                ok, victim = got
                assert ok and victim is not None and counts[model[victim]] == top
                # the LRU holder of its party
                assert victim == next(h for h in order if model[h] == model[victim])
                del model[victim]
                order.remove(victim)
                model[holder] = party
                order.append(holder)
            else:
                assert got == (False, None), step
        counts = Counter(model.values())
        assert len(fs) == len(model) and fs.largest == max(counts.values(), default=0)
        assert all(fs.held(p) == n for p, n in counts.items())


@pytest.mark.parametrize(("member", "ip", "party"), [
    ("", "203.0.113.9", "net:203.0.113.0/24"),
    ("", "::ffff:203.0.113.200", "net:203.0.113.0/24"),  # IPv4-mapped
    ("", "2001:db8:1:2:3::4", "net:2001:db8:1::/48"),
    ("", "", "source:"),  # the transport did not say
    ("acme", "203.0.113.9", "member:acme"),
])
def test_relay_party(member: str, ip: str, party: str) -> None:
    assert relay_party(member, source_of(ip) if ip else "") == party
