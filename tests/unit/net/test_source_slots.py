import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.net.source_slots import HeldSlot, SourceSlots, source_of

pytestmark = pytest.mark.unit


def test_no_cap_means_no_cap_and_refusals_reach_the_owner() -> None:
    told: list[str] = []
    free = SourceSlots(None, None)
    assert all(free.take("a") for _ in range(1000)) and free.total == 1000
    per_source_only = SourceSlots(None, 2, on_refused=lambda: told.append("refused"))
    assert per_source_only.take("a") and per_source_only.take("a")
    assert not per_source_only.take("a")
    assert per_source_only.take("b")  # another address still fits
    assert per_source_only.refused == 1 and told == ["refused"]


@given(st.lists(st.sampled_from(["take", "release", "release"]), max_size=20))
def test_a_held_slot_is_given_back_at_most_once(ops: list[str]) -> None:
    """However often a connection's paths release its slot (done, refused, lost), the count
    drops by one per slot taken: it never goes below the other connections' slots."""
    slots = SourceSlots(3, 3)
    other = HeldSlot(slots)
    assert other.take("10.0.0.1")
    mine = HeldSlot(slots)
    for op in ops:
        if op == "take" and not mine.held:
            assert mine.take("10.0.0.2")
        elif op == "release":
            mine.release()
        assert slots.total == 1 + mine.held
        assert slots.per_source.get("10.0.0.2", 0) == int(mine.held)


@pytest.mark.parametrize(("ip", "source"), [
    ("10.1.2.3", "10.1.2.3"),
    ("::ffff:10.1.2.3", "10.1.2.3"),  # an IPv4 client of a dual-stack listener
    ("2001:db8:1:2::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),  # the same host's /64
    ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
    ("fe80::1%eth0", "fe80::/64"),
    ("not-an-ip", "not-an-ip"),
])
def test_ipv6_sources_count_by_their_64(ip: str, source: str) -> None:
    assert source_of(ip) == source


def test_one_ipv6_host_cannot_fill_the_slots_by_rotating_addresses() -> None:
    slots = SourceSlots(256, 2)
    taken = [slots.take(source_of(f"2001:db8:1:2::{i:x}")) for i in range(10)]
    assert taken == [True, True] + [False] * 8
    assert slots.take(source_of("2001:db8:9:9::1"))
