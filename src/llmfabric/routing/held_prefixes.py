"""What a node publishes about its prefix cache when its engine reports KV-cache events: the
prompt blocks the engine really holds (stored and not yet evicted).

The ingress keys prompts by TEXT blocks (routing/prefix.py `block_keys`: 256 characters per
key, key i covering the prompt up to its end); the engine keys its cache by TOKEN blocks
(kv_events.py: one hash per `block_size` tokens, each naming its whole prefix through the
parent chain). The node links the two when it forwards a prompt:

1. `observe(keys, chars)` notes the prompt as pending: where each key ends, in characters;
   in tokens that is at `chars_per_token` (4 to start with, then learned: see below), and
   so the depth of the engine block that holds the key's last token (or, for the prompt's
   tail, its last whole block of tokens). `finished` says the engine answered it: its run,
   if any, came by then (or within `REORDER_S`), so one still pending after that made none
   (a hit) and is retired rather than left to take another prompt's run.
2. A `BlockStored` event is a run of one request's new blocks; their depth follows from the
   parent's (0 after no parent). A run whose parent is the last block of an earlier run
   continues that request (chunked prefill, decode); any other run starts a request and
   claims the pending prompt that fits best: its keys agree with those of the parent's
   prompt on the shared prefix, its leading keys held in the sketch end where the run
   starts (the engine's cache hit stopped there), then it has about as many blocks as the
   run ends at (prompts forwarded together reach the engine in any order), then the
   oldest (FCFS). Each block then maps to the keys whose end falls in it.
   The first run of a prompt (from its start, new blocks) bounds how many tokens the engine
   made of it, chat template included: at least its n blocks, and fewer than n + 1 blocks
   unless the run was one chunk of a chunked prefill (runs under `MIN_CHUNK_TOKENS`). The
   bounds of all first runs are intersected (a run contradicting them starts afresh) and
   the estimate of characters per token moved just inside when it is outside (within
   0.5..16): a tokenizer far from 4 characters per token is learned from the first
   prompts, a right estimate is left alone. A claimed run also retires the pending prompts
   forwarded over `REORDER_S` before its own (under FCFS their runs came first, so they
   had none: hits).
3. `BlockRemoved` drops the blocks and every key no held block maps to any more;
   `AllBlocksCleared` drops everything.

The sketch is the Bloom filter of the `capacity` most recently stored keys (the same bound
and republishing rule as `ServedPrefixes`: at most one 512-byte sketch per `interval_s`,
only after `min_change` of it changed, nothing while idle). The mapping is exact when the
engine's token boundaries fall where the estimate puts them and requests start their
prefill in the order the node forwarded them (vLLM schedules FCFS); otherwise a key may be
tied to a neighbouring block of the same prompt, which shifts when it is dropped by a block.
Prompts that never produce a run (a hit the sketch did not foresee) expire after
`pending_ttl_s`. Everything is bounded: `max_blocks` blocks, `max_pending`
prompts, `max_runs` open runs.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from llmfabric.registry.cache_sketch import SKETCH_BYTES, build_sketch
from llmfabric.routing.cache_summary import DEFAULT_CAPACITY, DEFAULT_INTERVAL_S
from llmfabric.routing.kv_events import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KvBatch,
)
from llmfabric.routing.prefix import BLOCK_CHARS

CHARS_PER_TOKEN = 4.0
MIN_CPT, MAX_CPT = 0.5, 16.0
REORDER_S = 0.5  # requests forwarded this close together may reach the engine swapped
MAX_SCAN = 64  # pending prompts a run is matched against (the oldest)
MIN_CHUNK_TOKENS = 2048  # vLLM's smallest default prefill chunk: shorter runs are whole


@dataclass(slots=True)
class _Prompt:
    id: int
    keys: tuple[int, ...]
    end_chars: tuple[int, ...]  # characters up to each key's end
    chars: int  # the whole prompt's
    at: float
    done_at: float | None = None  # when the engine answered it (its run, if any, came)


@dataclass(slots=True)
class _Block:
    depth: int | None  # None: its parent was unknown
    prompt: _Prompt | None
    keys: tuple[int, ...] = field(default=())


@dataclass(slots=True)
class HeldStats:
    stored: int = 0  # blocks stored
    removed: int = 0  # blocks removed
    cleared: int = 0
    unplaced: int = 0  # runs whose parent block was unknown
    unclaimed: int = 0  # runs no pending prompt fitted
    expired: int = 0  # pending prompts that never produced a run
    calibrations: int = 0  # first runs that moved chars_per_token
    hits: int = 0  # prompts forwarded while held whole (not pending: they make no run)


class HeldPrefixes:
    def __init__(
        self,
        now: Callable[[], float],
        *,
        capacity: int = DEFAULT_CAPACITY,
        nbytes: int = SKETCH_BYTES,
        interval_s: float = DEFAULT_INTERVAL_S,
        min_change: float = 0.05,
        chars_per_token: float = CHARS_PER_TOKEN,
        max_blocks: int = 65536,
        max_pending: int = 256,
        max_runs: int = 1024,
        pending_ttl_s: float = 60.0,
        calibrate: bool = True,
    ) -> None:
        if capacity < 1 or max_blocks < 1 or max_pending < 1 or max_runs < 1:
            raise ValueError("capacity and the max_* bounds must be >= 1")
        if chars_per_token <= 0:
            raise ValueError("chars_per_token must be > 0")
        self._now = now
        self.capacity, self.nbytes = capacity, nbytes
        self.interval_s, self.min_change = interval_s, min_change
        self.chars_per_token = chars_per_token  # learned from first runs when `calibrate`
        self.calibrate = calibrate
        self._cpt_lo, self._cpt_hi = MIN_CPT, MAX_CPT  # what the first runs seen allow
        self.max_blocks, self.max_pending, self.max_runs = max_blocks, max_pending, max_runs
        self.pending_ttl_s = pending_ttl_s
        self.stats = HeldStats()
        self._blocks: OrderedDict[BlockHash, _Block] = OrderedDict()
        self._keys: OrderedDict[int, int] = OrderedDict()  # key -> held blocks mapping it
        self._pending: deque[_Prompt] = deque()
        self._runs: OrderedDict[BlockHash, _Prompt] = OrderedDict()  # last block -> prompt
        self._ids = itertools.count()
        self._changed = 0  # keys added or dropped since the last publish
        self._published_at: float | None = None

    # ---- the prompts the node forwards ---------------------------------------------------
    def observe(self, keys: Sequence[int], chars: int = 0) -> object | None:
        """A prompt with these block keys (of `chars` bytes of prompt text) is forwarded;
        returns the token to pass to `finished` when the engine has answered it."""
        if not keys:
            return None
        now = self._now()
        ends = tuple(
            min((i + 1) * BLOCK_CHARS, chars) if chars else (i + 1) * BLOCK_CHARS
            for i in range(len(keys))
        )
        total = max(chars, ends[-1])
        prompt = _Prompt(next(self._ids), tuple(keys), ends, total, now)
        self._pending.append(prompt)
        while len(self._pending) > self.max_pending:
            self._pending.popleft()
            self.stats.expired += 1
        return prompt

    def finished(self, token: object | None) -> None:
        """The engine answered the prompt `observe` returned `token` for: its prefill ran, so
        a run of its own came by now (or within `REORDER_S`: events travel apart from the
        answer); still pending after that, it made none (the engine held it: a hit)."""
        if isinstance(token, _Prompt) and token.done_at is None:
            token.done_at = self._now()

    # ---- the engine's events -------------------------------------------------------------
    def apply(self, batch: KvBatch) -> None:
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._stored(event)
            elif isinstance(event, BlockRemoved):
                for h in event.hashes:
                    self._remove(h)
            elif isinstance(event, AllBlocksCleared):
                self.stats.cleared += 1
                self._changed += len(self._keys)
                self._blocks.clear()
                self._keys.clear()
                self._runs.clear()

    def _stored(self, ev: BlockStored) -> None:
        if not ev.hashes:
            return
        parent = self._blocks.get(ev.parent) if ev.parent is not None else None
        if ev.parent is None:
            depth0: int | None = 0
        elif parent is not None and parent.depth is not None:
            depth0 = parent.depth + 1
        else:
            depth0 = None
            self.stats.unplaced += 1
        prompt = self._runs.pop(ev.parent, None) if ev.parent is not None else None
        if prompt is None and depth0 is not None:
            start = depth0 * ev.block_size
            reuse = ev.hashes[0] in self._blocks  # (a report of blocks held already)
            held_to = start + len(ev.hashes) * ev.block_size if reuse else start
            end = None if reuse else start + len(ev.hashes) * ev.block_size
            prompt = self._claim(
                parent.prompt if parent else None, start, held_to, end, ev.block_size
            )
        run_keys: list[int] = []
        first_run = ev.parent is None and ev.hashes[0] not in self._blocks  # (not a reuse)
        if prompt is not None and first_run and self.calibrate:
            self._calibrate(prompt, len(ev.hashes), ev.block_size)
        for j, h in enumerate(ev.hashes):
            depth = None if depth0 is None else depth0 + j
            keys = self._keys_in(prompt, depth, ev.block_size)
            run_keys.extend(keys)
            old = self._blocks.get(h)
            if old is not None:  # stored again (or a reuse report): it is recent
                self._blocks.move_to_end(h)
                for k in old.keys:
                    if k in self._keys:
                        self._keys.move_to_end(k)
                if old.keys or not keys:
                    continue
                self._blocks.pop(h)
            self._blocks[h] = _Block(depth, prompt, keys)
            self.stats.stored += 1
            for k in keys:
                if k in self._keys:
                    self._keys[k] += 1
                    self._keys.move_to_end(k)
                else:
                    self._keys[k] = 1
                    self._changed += 1
        for k in reversed(run_keys):  # a prompt's leading keys freshest: the sketch keeps
            if k in self._keys:  # the most recent, and a match stops at the first miss
                self._keys.move_to_end(k)
        while len(self._blocks) > self.max_blocks:  # forget the oldest (its keys with it)
            self._remove(next(iter(self._blocks)), count_removed=False)
        if prompt is not None:
            self._runs[ev.hashes[-1]] = prompt
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)

    def _claim(
        self,
        parent_prompt: _Prompt | None,
        start_token: int,
        held_to: int,
        end_token: int | None = None,
        size: int = 1,
    ) -> _Prompt | None:
        """The pending prompt this run fits best. The engine held the prompt up to token
        `held_to` (where the new blocks start, or where a reuse report ends), so the right
        prompt's leading keys held in the sketch end about there: a prompt the engine holds
        whole (a repeat: no run of its own) or one it holds none of scores worse than the
        one whose cached prefix stops where the run starts (within a key: a key the sketch
        holds through another prompt's block may end a few tokens past the engine's last
        shared block). It must agree with the parent's
        prompt on the keys before `start_token`. Next, a run of new blocks ending at
        `end_token` (under `MIN_CHUNK_TOKENS`: a whole prefill, not a chunk) fits a prompt
        of about as many whole blocks (concurrent prompts reach the engine in any order);
        last, the oldest (FCFS)."""
        now = self._now()
        while self._pending and now - self._pending[0].at > self.pending_ttl_s:
            self._pending.popleft()
            self.stats.expired += 1
        answered = [
            p for p in self._pending if p.done_at is not None and now - p.done_at > REORDER_S
        ]
        for p in answered:  # (answered without a run: hits)
            self._pending.remove(p)
            self.stats.hits += 1
        whole = end_token if end_token is not None and end_token < MIN_CHUNK_TOKENS else None
        pick, best = None, (0, 0)
        for p in itertools.islice(self._pending, MAX_SCAN):
            if parent_prompt is not None:
                shared = sum(1 for e in parent_prompt.end_chars if self._tokens(e) <= start_token)
                if p.keys[:shared] != parent_prompt.keys[:shared]:
                    continue
            cached = sum(1 for e in p.end_chars if self._tokens(e) <= held_to)
            held = 0
            for k in p.keys:
                if k not in self._keys:
                    break
                held += 1
            length = abs(self._tokens(p.chars) // size * size - whole) if whole is not None else 0
            score = (max(0, abs(held - cached) - 1), length // size)  # (a key of slack)
            if pick is None or score < best:
                pick, best = p, score
                if score == (0, 0):
                    break
        if pick is None:
            self.stats.unclaimed += 1
            return None
        self._pending.remove(pick)
        # FCFS: prompts forwarded well before this one would have had their run by now.
        while self._pending and self._pending[0].at < pick.at - REORDER_S:
            self._pending.popleft()
            self.stats.hits += 1
        return pick

    def _keys_in(self, prompt: _Prompt | None, depth: int | None, size: int) -> tuple[int, ...]:
        """The prompt's keys that block `depth` holds: the block with the key's last token
        when it lies within the prompt (all of the key cached; blocks of more tokens than a
        key hold several), else the key's last whole block (all but its tail cached; a key
        shorter than one block then has none: an engine caches no partial block)."""
        if prompt is None or depth is None:
            return ()
        out: list[int] = []
        total = self._tokens(prompt.chars)
        for k, e in zip(prompt.keys, prompt.end_chars, strict=True):
            t = self._tokens(e)
            d = (t - 1) // size
            if (d + 1) * size > total:
                d = t // size - 1
            if d == depth:
                out.append(k)
        return tuple(out)

    def _tokens(self, chars: int) -> int:
        return int(-(-chars // self.chars_per_token))

    def _calibrate(self, prompt: _Prompt, blocks: int, size: int) -> None:
        """Bound characters per token by a prompt's first run of `blocks` new blocks: the
        bounds of all such runs intersected (a run that contradicts them starts afresh),
        and the estimate moved to the nearest value inside when it falls outside."""
        hi = prompt.chars / (blocks * size)  # the prompt has at least these tokens
        lo = prompt.chars / ((blocks + 1) * size) if blocks * size < MIN_CHUNK_TOKENS else MIN_CPT
        lo, hi = max(lo, MIN_CPT), min(hi, MAX_CPT)
        if lo > hi:
            return
        if max(lo, self._cpt_lo) <= min(hi, self._cpt_hi):
            lo, hi = max(lo, self._cpt_lo), min(hi, self._cpt_hi)
        self._cpt_lo, self._cpt_hi = lo, hi
        if not lo <= self.chars_per_token <= hi:  # the nearest value they allow
            self.chars_per_token = min(max(self.chars_per_token, lo), hi)
            self.stats.calibrations += 1

    def _remove(self, h: BlockHash, *, count_removed: bool = True) -> None:
        block = self._blocks.pop(h, None)
        self._runs.pop(h, None)
        if block is None:
            return
        if count_removed:
            self.stats.removed += 1
        for k in block.keys:
            n = self._keys.get(k, 0)
            if n <= 1:
                self._keys.pop(k, None)
                self._changed += 1
            else:
                self._keys[k] = n - 1

    # ---- what the node publishes (the same interface as ServedPrefixes) ------------------
    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: int) -> bool:
        return key in self._keys

    def held_keys(self) -> list[int]:
        """The keys in the sketch: the `capacity` most recently stored, newest first."""
        out: list[int] = []
        for k in reversed(self._keys):
            if len(out) >= self.capacity:
                break
            out.append(k)
        return out

    def sketch(self) -> bytes:
        return build_sketch(self.held_keys(), self.nbytes)

    def due(self, now: float) -> bool:
        if not self._changed:
            return False
        if self._published_at is not None and now - self._published_at < self.interval_s:
            return False
        return self._changed >= max(1, int(self.min_change * max(1, len(self._keys))))

    def published(self, now: float) -> bytes:
        self._published_at = now
        self._changed = 0
        return self.sketch()
