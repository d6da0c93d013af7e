"""The step-synchronous scheduler of the reference engine (Flying Serving §5, Algorithm 1).

One coordinator owns every engine's queue and block allocator and decides each step for all
of them, so all members of a TP group get the identical batch in the identical order
(invariant i) and every layout change happens between two steps that every engine sees
(ii); plans only name pre-built aligned groups (iii); an engine's plan names the one group it
runs in at that step (iv). The per-step plan plays the role of the paper's state all-reduce:
it is the agreed queue (SyncWorkload) and the switch signal at once.

Transitions (`request_bind`/`request_release`, or a switching policy's actions):
  sequential  members stop admitting; the bind happens once their DP work is done
  soft        members keep admitting (marked soft); once only soft work is left the bind
              happens and that work is folded into its prompt and re-prefilled under TP
  hard        the bind happens at the next step; members' DP requests pause with their KV
              blocks intact and resume, unchanged, when the group is released
A release drains the group (sequential) or folds its requests back into the queues.

This module does not import torch: the executor (engine.py) runs the plans.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from llmfabric.engines.torchref.blocks import BlockAllocator
from llmfabric.engines.torchref.config import EOS
from llmfabric.engines.torchref.plans import Entry, StepPlan, StepResult
from llmfabric.scheduler.switching import (
    Bind,
    Method,
    Pending,
    Release,
    SwitchPolicy,
    SwitchState,
    actions_for_width,
    ewma_rate,
    min_width,
)

Group = tuple[int, ...]
# Below this temperature decoding is greedy (vLLM's _SAMPLING_EPS): logits / 1e-310
# overflow to inf, the probabilities become NaN and the sampler raises inside the step,
# which fails the whole engine.
SAMPLING_EPS = 1e-5
Event = tuple[Any, ...]  # ("token", id) | ("done", finish_reason) | ("error", message)


def queue_key(r: Request) -> tuple[int, bool, float, int]:
    """A queue's order: priority first, then folded requests, then arrival (rid breaks ties,
    so no two keys are equal). Fixed while the request waits: priority and arrival never
    change, folds only while it runs."""
    return (-r.priority, r.folds == 0, r.arrival, r.rid)


class Executor(Protocol):
    def execute(self, plans: dict[int, StepPlan]) -> list[StepResult]: ...


@dataclass(eq=False)
class Request:
    prompt: list[int]
    max_tokens: int
    sink: Callable[[Event], None] = lambda _: None
    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    priority: int = 0
    prompt_logprobs: bool = False
    record_logits: bool = False
    rid: int = 0
    engine: int = 0  # whose queue it waits in
    arrival: float = 0.0
    min_width: int = 1
    home: Group | None = None  # the group its KV lives on (None: queued)
    tables: dict[int, list[int]] = field(default_factory=dict)
    computed: int = 0  # leading tokens whose KV is cached
    output: list[int] = field(default_factory=list)
    soft: bool = False
    finish: str | None = None
    cancelled: bool = False
    token_logprobs: list[float] | None = None
    logits: list[np.ndarray] = field(default_factory=list)
    folds: int = 0
    _rng: np.random.Generator | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def total(self) -> int:
        return len(self.prompt) + self.max_tokens


@dataclass(frozen=True, slots=True)
class SwitchRecord:
    requested_at: float
    applied_step: int
    before: tuple[Group, ...]
    after: tuple[Group, ...]
    cutover_s: float | None = None  # first to last engine entering the new layout
    latency_s: float | None = None  # request to the first step done in the new layout


class FlyingScheduler:
    def __init__(self, executor: Executor, n: int, widths: tuple[int, ...], n_blocks: int,
                 block_tokens: int, max_model_len: int, *, policy: SwitchPolicy | None = None,
                 max_batch: int = 32, max_prefill_tokens: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.executor = executor
        self.n = n
        self.widths = tuple(sorted(widths))
        self.block_tokens = block_tokens
        self.max_model_len = max_model_len
        self.policy = policy
        self.max_batch = max_batch
        self.max_prefill_tokens = max_prefill_tokens
        self.clock = clock
        self.groups: list[Group] = [(i,) for i in range(n)]
        self.alloc = [BlockAllocator(n_blocks, block_tokens) for _ in range(n)]
        # each engine's waiting requests, kept in queue_key order (insort): a step reads the
        # head of the line without sorting the whole queue
        self.queues: list[list[Request]] = [[] for _ in range(n)]
        # queued requests one group's admission looks at per step (those it admits included),
        # so a step's cost does not grow with the queue; smaller ones behind requests that
        # do not fit are still taken up to here (vLLM's FCFS stops at the first)
        self.lookahead = 256
        self.running: list[Request] = []
        self.pending_bind: dict[Group, Method] = {}
        self.pending_release: dict[Group, Method] = {}
        self.switches: list[SwitchRecord] = []
        self.started = clock()
        self.mode_since = self.started
        self.step_no = 0
        self.last_results: dict[int, StepResult] = {}
        self.inbox: collections.deque[Callable[[], None]] = collections.deque()
        self._ids = itertools.count(1)
        self._arrivals = 0
        self._rate = 0.0
        self._rate_at = clock()
        self._switch_requested_at: float | None = None
        self._unrecorded: tuple[float, tuple[Group, ...], tuple[Group, ...]] | None = None

    # -- inputs (call from the scheduler's thread, or through `post`) -------------------

    def post(self, fn: Callable[[], None]) -> None:
        """Queue a mutation from another thread; it runs at the start of the next step."""
        self.inbox.append(fn)

    @property
    def per_engine_tokens(self) -> int:
        return self.alloc[0].n_blocks * self.block_tokens

    def check(self, prompt_tokens: int, max_tokens: int) -> int:
        """The width a request needs; ValueError when no allowed width can hold it."""
        total = prompt_tokens + max_tokens
        if total > self.max_model_len:
            raise ValueError(f"This model's maximum context length is {self.max_model_len} "
                             f"tokens. However, you requested {total} tokens "
                             f"({prompt_tokens} in the prompt, {max_tokens} for the "
                             "completion).")
        w = min_width(total, self.per_engine_tokens, self.widths)
        if w is None:
            raise ValueError(f"{total} tokens exceed the KV cache of the widest group "
                             f"({self.per_engine_tokens * self.widths[-1]} tokens)")
        return w

    def add(self, req: Request) -> Request:
        req.min_width = self.check(len(req.prompt), req.max_tokens)
        req.rid = next(self._ids)
        req.arrival = self.clock()
        load = [4 * len(self.queues[e]) + self._active_on(e) for e in range(self.n)]
        req.engine = min(range(self.n), key=lambda e: (load[e], e))
        if req.temperature >= SAMPLING_EPS:
            req._rng = np.random.default_rng(req.seed if req.seed is not None else req.rid)
        if not req.cancelled:  # (cancelled before it was added: never queued)
            bisect.insort(self.queues[req.engine], req, key=queue_key)
        self._arrivals += 1
        return req

    def backlog(self) -> int:
        """Requests waiting, plus commands posted and not yet run (each admission is one).
        Safe to read from another thread: it may count a request twice while its admission
        runs, never zero times, so a bound checked against it holds."""
        return len(self.inbox) + sum(len(q) for q in self.queues)

    def cancel(self, req: Request) -> None:
        req.cancelled = True
        if req.home is None:
            self._dequeue(req)

    def _dequeue(self, req: Request) -> None:
        q = self.queues[req.engine]
        i = bisect.bisect_left(q, queue_key(req), key=queue_key)
        if i < len(q) and q[i] is req:
            del q[i]

    def request_bind(self, group: Group, method: Method) -> None:
        if len(group) not in self.widths or group[0] % len(group) or \
                group != tuple(range(group[0], group[0] + len(group))) or group[-1] >= self.n:
            raise ValueError(f"{group} is not an aligned group of an allowed width")
        self.pending_release.pop(group, None)
        if group not in self.groups:
            self.pending_bind[group] = method
            self._switch_requested_at = self._switch_requested_at or self.clock()

    def request_release(self, group: Group, method: Method = "sequential") -> None:
        self.pending_bind.pop(group, None)
        if group in self.groups and len(group) > 1:
            self.pending_release[group] = method
            self._switch_requested_at = self._switch_requested_at or self.clock()

    def switch_to(self, width: int, method: Method) -> None:
        if width not in self.widths:
            raise ValueError(f"width {width} not among the allowed widths {self.widths}")
        # the latest target wins: transitions still waiting for an earlier one are dropped
        self.pending_bind.clear()
        self.pending_release.clear()
        self._switch_requested_at = None
        for action in actions_for_width(self.observe(), width, method):
            if isinstance(action, Bind):
                self.request_bind(action.engines, action.method)
            else:
                self.request_release(action.engines, method)

    # -- observation --------------------------------------------------------------------

    def _active(self) -> list[Request]:
        return [r for r in self.running if r.home in self.groups]

    def _active_on(self, engine: int) -> int:
        return sum(1 for r in self.running if r.home is not None and engine in r.home)

    @property
    def width(self) -> int:
        return max(len(g) for g in self.groups)

    def observe(self) -> SwitchState:
        now = self.clock()
        self._rate = ewma_rate(self._rate, now - self._rate_at, self._arrivals)
        self._rate_at, self._arrivals = now, 0
        queued = list(itertools.islice(heapq.merge(*self.queues, key=queue_key), 16))
        return SwitchState(
            width=self.width, groups=tuple(self.groups),
            waiting=tuple(len(q) for q in self.queues),
            running=tuple(self._active_on(e) for e in range(self.n)),
            free_kv=tuple(a.free * self.block_tokens for a in self.alloc),
            widths=self.widths, now=now - self.started,
            mode_since=self.mode_since - self.started,
            arrival_rate=self._rate,
            pending=tuple(Pending(r.total, r.priority, r.engine) for r in queued),
            running_priority=max((r.priority for r in self.running), default=0),
            running_wide=sum(1 for r in self.running if r.min_width > 1),
        )

    def has_work(self) -> bool:
        return bool(self.inbox or self.running or any(self.queues) or self.pending_bind
                    or self.pending_release)

    # -- one iteration ------------------------------------------------------------------

    def step(self) -> bool:
        """Run one agreed step on every engine; False when there was nothing to run."""
        while self.inbox:
            try:
                self.inbox.popleft()()
            except ValueError as exc:  # a bad command must not stop the engine
                print(f"WARNING: torch engine: ignored command: {exc}", flush=True)
        self._drop_cancelled()
        if self.policy is not None:
            for action in self.policy(self.observe()):
                if isinstance(action, Bind):
                    self.request_bind(action.engines, action.method)
                elif isinstance(action, Release):
                    self.request_release(action.engines)
        self._transitions()
        self._admit()
        batches = {g: [r for r in self._active() if r.home == g] for g in self.groups}
        if not any(batches.values()) and self._unrecorded is None:
            return False  # (a new layout is still sent to every engine, work or not)
        self.step_no += 1
        plans: dict[int, StepPlan] = {}
        for g, reqs in batches.items():
            for e in g:
                plans[e] = StepPlan(self.step_no, g, [
                    Entry(r.rid, r.tokens[r.computed:], r.computed, r.tables[e],
                          r.prompt_logprobs and r.computed == 0 and r.folds == 0)
                    for r in reqs])
        results = self.executor.execute(plans)
        self.last_results = {res.rank: res for res in results}
        self._record_switch(results)
        outputs = {rid: (logits, lps) for res in results for rid, logits, lps in res.outputs}
        for reqs in batches.values():
            for r in reqs:
                logits, lps = outputs[r.rid]
                if lps is not None:
                    r.token_logprobs = lps
                self._advance(r, logits)
        return True

    def _advance(self, r: Request, logits: np.ndarray) -> None:
        r.computed = len(r.tokens)
        if r.record_logits:
            r.logits.append(logits)
        if r._rng is not None:
            z = logits.astype(np.float64) / r.temperature
            p = np.exp(z - z.max())
            tok = int(r._rng.choice(len(p), p=p / p.sum()))
        else:
            tok = int(np.argmax(logits))
        r.output.append(tok)
        if tok == EOS and not r.ignore_eos:
            r.finish = "stop"
        elif len(r.output) >= r.max_tokens or len(r.tokens) >= self.max_model_len:
            r.finish = "length"
        if tok != EOS:
            r.sink(("token", tok))
        if r.finish is not None:
            self._free(r)
            self.running.remove(r)
            r.sink(("done", r.finish))

    # -- layout changes -----------------------------------------------------------------

    def _set_layout(self, groups: list[Group]) -> None:
        before = tuple(self.groups)
        self.groups = sorted(groups)
        self.mode_since = self.clock()
        requested = self._switch_requested_at or self.mode_since
        self._unrecorded = (requested, before, tuple(self.groups))
        if not self.pending_bind and not self.pending_release:
            self._switch_requested_at = None

    def _record_switch(self, results: list[StepResult]) -> None:
        if self._unrecorded is None:
            return
        requested, before, after = self._unrecorded
        self._unrecorded = None
        times = [r.mode_at for r in results if r.mode_at is not None]
        cutover = max(times) - min(times) if times else None
        self.switches.append(SwitchRecord(requested, self.step_no, before, after, cutover,
                                          self.clock() - requested))
        del self.switches[:-256]

    def _transitions(self) -> None:
        for g, method in list(self.pending_release.items()):
            homed = [r for r in self.running if r.home == g]
            if g not in self.groups or (method == "sequential" and homed):
                if g not in self.groups:
                    del self.pending_release[g]
                continue
            del self.pending_release[g]
            for r in homed:
                self._fold(r)
            self._set_layout([x for x in self.groups if x != g] + [(e,) for e in g])
        for g, method in list(self.pending_bind.items()):
            overlap = [x for x in self.groups if set(x) & set(g)]
            active = [r for r in self._active() if r.home in overlap]
            if method == "sequential" and active:
                continue
            if method == "soft" and any(not r.soft for r in active):
                continue
            del self.pending_bind[g]
            for r in active:
                if method == "soft" or len(r.home or ()) > 1:
                    self._fold(r)  # soft work, or a narrower TP group's: recompute
                # hard: a DP request keeps its blocks and pauses until its engine is free
            self._set_layout([x for x in self.groups if x not in overlap] + [g])

    def _fold(self, r: Request) -> None:
        """Fold generated tokens into the prompt: free the KV, re-queue at the front."""
        self._free(r)
        self.running.remove(r)
        r.home, r.computed, r.soft = None, 0, False
        r.folds += 1
        bisect.insort(self.queues[r.engine], r, key=queue_key)  # ahead of unfolded ones

    def _free(self, r: Request) -> None:
        for e, blocks in r.tables.items():
            self.alloc[e].release(blocks)
        r.tables = {}

    # -- admission ----------------------------------------------------------------------

    def _blocked(self, g: Group) -> tuple[bool, bool]:
        """(no admission, admissions are soft) for group g."""
        if g in self.pending_release:
            return True, False
        soft = False
        for b, method in self.pending_bind.items():
            if set(b) & set(g):
                if method != "soft":
                    return True, False
                soft = True
        return False, soft

    def _admit(self) -> None:
        budget = self.max_prefill_tokens
        active = self._active()
        for g in sorted(self.groups, key=lambda g: (sum(1 for r in active if r.home == g)
                                                    / len(g), -len(g), g)):
            blocked, soft = self._blocked(g)
            if blocked:
                continue
            count = sum(1 for r in active if r.home == g)
            admitted: list[Request] = []
            # the members' queues are each in queue_key order: merge them lazily, so only
            # the head of the line is read
            queued = heapq.merge(*(self.queues[e] for e in g), key=queue_key)
            for r in itertools.islice(queued, self.lookahead):
                if count >= self.max_batch * len(g) or not all(self.alloc[e].free for e in g):
                    break  # (full batch, or no free block for any request)
                prefill = len(r.tokens)
                if r.min_width > len(g) or (prefill > budget and budget <
                                            self.max_prefill_tokens):
                    continue
                need = self.alloc[g[0]].blocks_for(r.total, len(g))
                if any(self.alloc[e].free < need for e in g):
                    continue
                r.tables = {e: self.alloc[e].allocate(need) for e in g}
                r.home, r.soft = g, soft
                admitted.append(r)
                budget -= prefill
                count += 1
            for r in admitted:  # (not while the merge reads the queues)
                self._dequeue(r)
                self.running.append(r)

    def _drop_cancelled(self) -> None:
        for r in [r for r in self.running if r.cancelled]:
            self._free(r)
            self.running.remove(r)
        # (a queued request leaves its queue when it is cancelled)

    # -- status -------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        last = self.switches[-1] if self.switches else None
        return {
            "width": self.width,
            "widths": list(self.widths),
            "groups": [list(g) for g in self.groups],
            "mode_since": time.time() - (self.clock() - self.mode_since),  # Unix time
            "mode_age_s": self.clock() - self.mode_since,
            "uptime_s": self.clock() - self.started,
            "switches": len(self.switches),
            "pending": {"bind": [[list(g), m] for g, m in self.pending_bind.items()],
                        "release": [[list(g), m] for g, m in self.pending_release.items()]},
            "last_switch": None if last is None else {
                "step": last.applied_step, "cutover_s": last.cutover_s,
                "latency_s": last.latency_s, "after": [list(g) for g in last.after]},
            "step": self.step_no,
            "running": len(self._active()),
            "paused": len(self.running) - len(self._active()),
            "waiting": sum(len(q) for q in self.queues),
        }
