"""HeldPrefixes: the sketch follows the engine's stored and removed blocks (fake clock)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.registry.cache_sketch import matched_blocks
from llmfabric.routing.held_prefixes import HeldPrefixes
from llmfabric.routing.kv_events import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KvBatch,
    KvEvent,
)
from llmfabric.routing.prefix import block_keys
from llmfabric.testing.fake_clock import FakeClock

BS = 16  # tokens per engine block; a 256-character key is 64 tokens: 4 blocks


def _batch(*events: KvEvent) -> KvBatch:
    return KvBatch(0, 0.0, events)


def _stored(hashes: list[BlockHash], parent: BlockHash | None = None) -> KvBatch:
    return _batch(BlockStored(tuple(hashes), parent, BS))


def _text(tag: str, chars: int) -> str:
    return (tag * chars)[:chars]


def _observe(held: HeldPrefixes, text: str) -> tuple[int, ...]:
    keys = block_keys(text)
    held.observe(keys, len(text.encode()))
    return keys


def _held(held: HeldPrefixes, keys: tuple[int, ...]) -> int:
    """Leading keys the published sketch claims."""
    return matched_blocks(held.sketch(), keys)


def test_stored_blocks_make_keys_held_and_removal_drops_them() -> None:
    clock = FakeClock()
    held = HeldPrefixes(clock.now)
    keys = _observe(held, _text("a", 1024))  # 4 keys, 64 tokens each
    assert _held(held, keys) == 0  # forwarded, nothing stored yet
    held.apply(_stored(list(range(16))))  # blocks 0..15: keys end in blocks 3, 7, 11, 15
    assert _held(held, keys) == 4 and len(held) == 4
    held.apply(_batch(BlockRemoved((12, 13, 14, 15))))  # the tail evicted (as vLLM does)
    assert _held(held, keys) == 3 and keys[3] not in held
    held.apply(_batch(BlockRemoved((5,))))
    assert _held(held, keys) == 3  # block 5 holds no key's end; block 7 still does
    held.apply(_batch(BlockRemoved((7,))))
    assert _held(held, keys) == 1
    held.apply(_batch(AllBlocksCleared()))
    assert held.sketch() == b"" and len(held) == 0
    assert held.stats.removed == 6 and held.stats.cleared == 1


def test_republished_only_after_a_change_and_at_most_once_per_interval() -> None:
    clock = FakeClock()
    held = HeldPrefixes(clock.now, interval_s=10.0)
    keys = _observe(held, _text("a", 1024))
    assert not held.due(clock.now())  # forwarding alone changes nothing held
    held.apply(_stored(list(range(16))))
    assert held.due(clock.now())
    sketch = held.published(clock.now())
    assert matched_blocks(sketch, keys) == 4
    assert not held.due(clock.now())
    held.apply(_batch(BlockRemoved((15,))))
    assert not held.due(clock.now() + 5.0)  # within the interval
    assert held.due(clock.now() + 10.0)
    assert matched_blocks(held.published(clock.now() + 10.0), keys) == 3


def test_chunked_prefill_continues_the_same_prompt() -> None:
    held = HeldPrefixes(FakeClock().now)
    a = _observe(held, _text("a", 1024))
    b = _observe(held, _text("b", 1024))
    held.apply(_stored(list(range(8))))  # prompt a, first chunk
    held.apply(_stored(list(range(100, 116))))  # prompt b, all of it
    held.apply(_stored(list(range(8, 16)), parent=7))  # prompt a, second chunk
    assert _held(held, a) == 4 and _held(held, b) == 4


def test_a_prefix_hit_run_claims_the_prompt_that_shares_the_prefix() -> None:
    held = HeldPrefixes(FakeClock().now)
    shared = _text("s", 512)
    a = _observe(held, shared + _text("a", 512))
    held.apply(_stored(list(range(16))))
    other = _observe(held, _text("o", 1024))  # forwarded first, its run comes later
    b = _observe(held, shared + _text("b", 512))
    assert a[:2] == b[:2] and a[2:] != b[2:]
    held.apply(_stored([200 + i for i in range(8, 16)], parent=7))  # b hit a's 8 blocks
    assert _held(held, b) == 4 and _held(held, a) == 4
    held.apply(_stored([300 + i for i in range(16)]))  # other, from its start
    assert _held(held, other) == 4
    held.apply(_batch(BlockRemoved(tuple(200 + i for i in range(8, 16)))))
    assert _held(held, b) == 2 and _held(held, a) == 4  # a's own blocks are still there
    held.apply(_batch(BlockRemoved((3,))))  # the shared first key's block
    assert _held(held, a) == 0 and a[1] in held  # (a leading miss stops the match)


def test_a_prompt_held_whole_makes_no_run_and_takes_no_others() -> None:
    """A repeat the engine serves from its cache stores nothing; its pending entry must not
    take the run of a later prompt that shares its prefix."""
    held = HeldPrefixes(FakeClock().now)
    shared = _text("s", 512)
    a = _observe(held, shared + _text("a", 512))
    held.apply(_stored(list(range(16))))
    _observe(held, shared + _text("a", 512))  # the repeat: a whole hit, no run
    b = _observe(held, shared + _text("b", 512))
    held.apply(_stored([200 + i for i in range(8, 16)], parent=7))
    assert _held(held, b) == 4 and _held(held, a) == 4
    held.apply(_batch(BlockRemoved(tuple(range(8, 16)))))  # a's own tail evicted
    assert _held(held, a) == 2 and _held(held, b) == 4


async def test_a_run_retires_prompts_forwarded_well_before_it() -> None:
    """FCFS: a prompt forwarded seconds before the one whose run arrives made no run (the
    engine held it); it must not take a later run."""
    clock = FakeClock()
    held = HeldPrefixes(clock.now)
    shared = _text("s", 512)
    _observe(held, shared + _text("x", 512))
    held.apply(_stored(list(range(16))))
    await clock.advance(1.0)
    _observe(held, _text("a", 1024))  # served from the engine's cache: no run
    await clock.advance(2.0)
    b = _observe(held, shared + _text("b", 512))
    held.apply(_stored([200 + i for i in range(8, 16)], parent=7))  # b's, a cannot fit it
    assert _held(held, b) == 4 and held.stats.hits == 1
    held.apply(_stored(list(range(100, 116))))  # a run nobody forwarded (a warm-up)
    assert held.stats.unclaimed == 1 and len(held) == 6


async def test_an_answered_prompt_without_a_run_takes_no_later_run() -> None:
    clock = FakeClock()
    held = HeldPrefixes(clock.now)
    a = _observe(held, _text("a", 1024))
    held.apply(_stored(list(range(16))))
    token = held.observe(a, 1024)  # the repeat: served from the cache, no run
    await clock.advance(0.2)
    held.finished(token)
    await clock.advance(1.0)
    b = _observe(held, _text("b", 1024))
    held.apply(_stored(list(range(100, 116))))
    assert _held(held, b) == 4 and held.stats.hits == 1


def test_concurrent_prompts_arriving_swapped_are_told_apart_by_length() -> None:
    """Two prompts forwarded together reach the engine in the other order: each run goes
    to the prompt of about as many blocks, so evicting one's tail drops only its keys."""
    held = HeldPrefixes(FakeClock().now)
    a = _observe(held, _text("a", 1024))  # 16 blocks
    b = _observe(held, _text("b", 2048))  # 32 blocks
    held.apply(_stored(list(range(100, 132))))  # b's run first
    held.apply(_stored(list(range(16))))
    assert _held(held, a) == 4 and _held(held, b) == 8
    held.apply(_batch(BlockRemoved(tuple(range(124, 132)))))  # b's tail: keys 6 and 7
    assert _held(held, b) == 6 and _held(held, a) == 4


def test_a_short_prompt_maps_to_its_last_whole_block() -> None:
    held = HeldPrefixes(FakeClock().now, calibrate=False)
    keys = _observe(held, _text("q", 100))  # one key, 25 tokens: block 0 is its last whole
    held.apply(_stored([1]))
    assert _held(held, keys) == 1
    tiny = _observe(held, _text("t", 40))  # 10 tokens: no whole block, never held
    held.apply(_stored([9]))
    assert _held(held, tiny) == 0


def test_blocks_larger_than_a_key_hold_every_key_they_cover() -> None:
    held = HeldPrefixes(FakeClock().now)
    keys = _observe(held, _text("w", 1200))  # 4 keys ending at tokens 64..256; 300 tokens
    held.apply(_batch(BlockStored((1,), None, 128)))  # tokens 0..127: keys 0 and 1
    assert _held(held, keys) == 2
    held.apply(_batch(BlockStored((2,), 1, 128)))  # tokens 128..255: keys 2 and 3
    assert _held(held, keys) == 4
    held.apply(_batch(BlockRemoved((1,))))
    assert _held(held, keys) == 0 and keys[2] in held


def test_characters_per_token_are_learned_from_first_runs() -> None:
    """A tokenizer at 2 characters per token: a 1,024-character prompt is 32 blocks, its keys
    end in blocks 7, 15, 23 and 31. Learned from the first run, the tail's eviction drops the
    last key; at the default 4 the sketch would still claim it (key 3 on block 15)."""
    for calibrate, last_key_held in ((True, False), (False, True)):
        held = HeldPrefixes(FakeClock().now, calibrate=calibrate)
        keys = _observe(held, _text("a", 1024))
        held.apply(_stored(list(range(32))))
        assert _held(held, keys) == 4
        held.apply(_batch(BlockRemoved(tuple(range(24, 32)))))
        assert (keys[3] in held) is last_key_held
        assert held.chars_per_token == (2.0 if calibrate else 4.0)
    held = HeldPrefixes(FakeClock().now)  # the right estimate is left alone
    _observe(held, _text("b", 1024))
    held.apply(_stored(list(range(16))))
    assert held.chars_per_token == 4.0 and held.stats.calibrations == 0


async def test_pending_prompts_expire_and_runs_without_a_prompt_hold_nothing() -> None:
    clock = FakeClock()
    held = HeldPrefixes(clock.now, pending_ttl_s=60.0)
    keys = _observe(held, _text("a", 1024))
    await clock.advance(61.0)  # (the prompt's run never came: a whole-prompt hit)
    held.apply(_stored(list(range(16))))
    assert _held(held, keys) == 0 and len(held) == 0
    assert held.stats.expired == 1 and held.stats.unclaimed == 1


def test_a_run_whose_parent_is_unknown_holds_nothing() -> None:
    held = HeldPrefixes(FakeClock().now)
    keys = _observe(held, _text("a", 1024))
    held.apply(_stored([5, 6, 7], parent=999))
    assert _held(held, keys) == 0 and held.stats.unplaced == 1


def test_bounds_forget_the_oldest_blocks_with_their_keys() -> None:
    held = HeldPrefixes(FakeClock().now, max_blocks=16, max_pending=2, capacity=3)
    a = _observe(held, _text("a", 1024))
    held.apply(_stored(list(range(16))))
    b = _observe(held, _text("b", 1024))
    held.apply(_stored(list(range(100, 116))))
    assert _held(held, a) == 0 and _held(held, b) == 3  # a forgotten; 3 keys in the sketch
    for tag in "cde":  # three pending prompts, two kept
        _observe(held, _text(tag, 300))
    assert held.stats.expired == 1


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abcd"), st.integers(1, 6), st.booleans()),
        min_size=1,
        max_size=25,
    ),
    st.integers(0, 2**32),
)
def test_removing_every_stored_block_leaves_nothing_held(
    ops: list[tuple[str, int, bool]], seed: int
) -> None:
    """Whatever runs were attributed to whichever prompts, the held keys are exactly those
    some held block maps: once every block is gone, the sketch is empty."""
    held = HeldPrefixes(FakeClock().now, max_blocks=40)
    next_hash = seed
    stored: list[int] = []
    for tag, quarters, chain in ops:
        _observe(held, _text(tag, quarters * 256))
        parent = stored[-1] if chain and stored else None
        hashes = list(range(next_hash, next_hash + quarters * 4))
        next_hash += len(hashes)
        held.apply(_stored(list(hashes), parent))
        stored.extend(hashes)
        assert len(held) <= 40
    held.apply(_batch(BlockRemoved(tuple(stored[-4096:]))))
    held.apply(_batch(BlockRemoved(tuple(stored[:-4096]))))
    assert len(held) == 0 and held.sketch() == b""
