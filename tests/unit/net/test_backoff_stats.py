import random

from hypothesis import given
from hypothesis import strategies as st

from llmfabric.net.addressbook import AddressBook, parse_addr
from llmfabric.net.backoff import Backoff
from llmfabric.net.stats import NetStats, rates


@given(st.integers(0, 2**32), st.integers(1, 40))
def test_full_jitter_stays_under_the_exponential_ceiling(seed, n):
    b = Backoff(base=0.5, cap=30.0, rng=random.Random(seed))
    for i in range(n):
        d = b.next_delay()
        assert 0.0 <= d <= min(30.0, 0.5 * 2**i)


def test_backoff_ceiling_grows_then_caps_and_resets():
    b = Backoff(base=1.0, cap=8.0, rng=random.Random(1))
    ceilings = []
    for _ in range(6):
        ceilings.append(b.ceiling())
        b.next_delay()
    assert ceilings == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    b.reset()
    assert b.ceiling() == 1.0


def test_rates_from_snapshots():
    s = NetStats()
    a = s.snapshot(10.0)
    s.bytes_sent += 500
    s.bytes_received += 100
    s.drop("oversized")
    b = s.snapshot(15.0)
    r = rates(a, b)
    assert r.bytes_sent_per_s == 100.0 and r.bytes_received_per_s == 20.0
    assert dict(b.dropped) == {"oversized": 1}


def test_address_book_and_parse():
    assert parse_addr("127.0.0.1:80") == ("127.0.0.1", 80)
    assert parse_addr("[::1]:7000") == ("::1", 7000)
    book = AddressBook()
    book.set("p", ["a:1", "a:1"], ["r"])
    book.learn_addr("p", "b:2")
    assert book.get("p").addrs == ("a:1", "b:2") and book.get("p").relays == ("r",)
    book.remove("p")
    assert "p" not in book
