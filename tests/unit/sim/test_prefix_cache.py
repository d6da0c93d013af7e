"""The simulator's prefix cache: leading-run matches, LRU eviction at the KV capacity, and a
prefill that skips what is cached."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmfabric.sim.prefix_cache import BlockLRU, Prefill, PrefixEngine


def test_match_is_the_leading_run() -> None:
    lru = BlockLRU(10)
    lru.insert([1, 2, 3])
    assert lru.match([1, 2, 3, 4]) == 3
    assert lru.match([2, 3]) == 2
    assert lru.match([9, 1, 2]) == 0


def test_least_recently_used_blocks_go_first() -> None:
    lru = BlockLRU(3)
    lru.insert([1, 2, 3])
    lru.match([1])  # touched: now the most recent
    lru.insert([4])
    assert 2 not in lru and 1 in lru and 4 in lru
    assert lru.recent(2) == [4, 1]


@given(st.lists(st.lists(st.integers(0, 30), max_size=8), max_size=30), st.integers(0, 12))
def test_never_holds_more_than_its_capacity(prompts: list[list[int]], cap: int) -> None:
    lru = BlockLRU(cap)
    for p in prompts:
        lru.insert(p)
        assert len(lru) <= cap


def test_a_repeated_prompt_prefills_only_its_uncached_tail() -> None:
    eng = PrefixEngine(kv_blocks=100, block_tokens=512, prefill_s=lambda n: n / 1000.0)
    a = eng.submit(Prefill(0, 0.0, (1, 2, 3), 1500))
    assert a.cached_tokens == 0 and a.end == 1.5
    b = eng.submit(Prefill(1, 0.5, (1, 2, 3, 4), 2000))  # waits for a (FCFS)
    assert b.start == 1.5 and b.cached_tokens == 1536
    assert abs(b.end - (1.5 + 0.464)) < 1e-9
    assert eng.hit_tokens == 1536 and eng.prompt_tokens == 3500
