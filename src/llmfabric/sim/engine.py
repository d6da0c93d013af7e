"""One engine replica as a discrete-event model of vLLM-style continuous batching.

The replica advances one ITERATION (batch step) at a time and, when nothing can change the
batch (no admissible request, no finish, no arrival, KV not exhausted), a whole STRETCH of
decode steps in closed form: step i of a stretch costs a + G * (S + i*B) (B sequences, S
cached tokens), so k steps cost k*a + G*(k*S + B*k*(k-1)/2). Finishes are kept in a heap keyed
by the global decode-step counter, so no per-token events exist.

Scheduling (vLLM V0 default; V1 with `chunked_prefill=True`):
- FCFS admission while `max_num_seqs`, the token budget `max_batched_tokens` and free KV
  blocks (minus a watermark) allow; without chunked prefill a step runs either prompts or
  decodes; with it, every step carries all decodes plus prompt chunks up to the budget;
- preemption by recompute: before every step that adds KV (a decode stretch, or a chunked
  step carrying decodes), while the step's new tokens do not fit, the most recently admitted
  sequence is evicted and re-queued at the head with prompt = prompt + generated tokens (a
  sequence still prefilling counts as newer than every decoding one; its reserved prompt is
  released); with chunked prefill a prompt is admitted only if one step of the running
  decodes still fits after it. So the KV in use never exceeds the capacity (`kv_peak_tokens`);
- KV is counted in tokens with half a block of fragmentation per sequence;
- engine profiles (`profiles.py`, `EngineConfig.for_engine`) add the engine's CPU time per
  iteration (`step_cpu_s` + `step_cpu_per_seq_s` x sequences) and, with `no_evict`,
  TensorRT-LLM's admission (a request only with KV for its whole remaining output: no
  preemption, the queue waits instead); `whole_prompts` places prompts whole in mixed steps
  (TensorRT-LLM with context chunking off: a prompt that does not fit in what is left of
  the budget waits for the next step; only a step's first prompt is ever chunked).
Roles: "both" (default), "prefill" (hands each request off after its first token), "decode"
(receives requests whose KV was transferred; they join without prefill compute).
`set_role` flips the role mid-run without draining (requests already on the replica finish
in the role they arrived under); `pause`/`resume` freeze a replica's progress (its requests
keep their KV), e.g. while its GPUs serve a merged group (Flying Serving).
Pipeline parallelism: `EngineConfig.pp_microbatch=True` prices PP steps with micro-batches
overlapping across stages (`pipeline.PipelineCost`); by default stages run one after another.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from llmfabric.sim.costs import StepCostModel
from llmfabric.sim.errors import SpecError
from llmfabric.sim.pipeline import PipelineCost
from llmfabric.sim.profiles import get_profile

Role = Literal["both", "prefill", "decode"]
INF = float("inf")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    chunked_prefill: bool = False
    block_size: int = 16
    watermark: float = 0.01
    gpu_memory_utilization: float = 0.9
    kv_capacity_tokens: int | None = None  # None: from the memory plan
    pp_microbatch: bool = False  # PP: overlap micro-batches across stages (vLLM); else serial
    # engine CPU time around the GPU (engine profiles): per iteration, and per running
    # sequence per iteration; both depend on the batch only, so stretches stay closed form
    step_cpu_s: float = 0.0
    step_cpu_per_seq_s: float = 0.0
    # admit a request only if the KV of its whole output fits beside every admitted sequence's
    # remaining output (TensorRT-LLM's GUARANTEED_NO_EVICT): queues instead of preempting
    no_evict: bool = False
    # > 0: the KV cache takes this share of the memory left after weights and the runtime
    # reserve (TensorRT-LLM's free_gpu_memory_fraction) instead of gpu_memory_utilization
    kv_fraction_of_free: float = 0.0
    # mixed steps (chunked_prefill=True) place prompts WHOLE: a prompt that does not fit in
    # what is left of the step's token budget waits for the next step instead of filling it
    # with a chunk, unless it is the step's first prompt (then it is chunked, as it could
    # never fit whole): TensorRT-LLM's in-flight batching with enable_chunked_prefill off
    whole_prompts: bool = False
    # engine CPU time of an iteration that carries prompt tokens, beyond `step_cpu_s`:
    # such steps run outside the CUDA graphs captured for pure decode batches (TRT-LLM's
    # PyTorch backend graphs generation-only batches), so every kernel is launched eagerly
    prompt_step_cpu_s: float = 0.0

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_batched_tokens < 1 or self.block_size < 1:
            raise SpecError("max_num_seqs, max_batched_tokens and block_size must be >= 1")
        if not 0 <= self.watermark < 1 or not 0 < self.gpu_memory_utilization <= 1:
            raise SpecError("watermark must be in [0, 1) and gpu_memory_utilization in (0, 1]")
        if not 0 <= self.kv_fraction_of_free <= 1:
            raise SpecError("kv_fraction_of_free must be in [0, 1] (0: gpu_memory_utilization)")
        if not (self.step_cpu_s >= 0 and self.step_cpu_per_seq_s >= 0
                and self.prompt_step_cpu_s >= 0):
            raise SpecError("step_cpu_s, step_cpu_per_seq_s and prompt_step_cpu_s must be "
                            ">= 0 seconds")

    @classmethod
    def for_engine(cls, name: str, **overrides: Any) -> EngineConfig:
        """The defaults of a real engine ("vllm", "sglang", "trtllm": `profiles.PROFILES`),
        with `overrides` of any field, e.g. `EngineConfig.for_engine("sglang",
        max_num_seqs=512)`."""
        return cls(**{**get_profile(name).config_kwargs(), **overrides})

    def cpu_time(self, n_seqs: int) -> float:
        """Engine CPU seconds of one iteration over `n_seqs` sequences."""
        return self.step_cpu_s + self.step_cpu_per_seq_s * n_seqs


class RequestBook:
    """Per-request outcome columns shared by the replicas of one simulation."""

    __slots__ = ("arrival", "finish", "first_token", "input_tokens", "output_tokens",
                 "preemptions", "replica", "truncated")

    def __init__(self, arrival: list[float], input_tokens: list[int],
                 output_tokens: list[int]) -> None:
        n = len(arrival)
        self.arrival = arrival
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.first_token = [math.nan] * n
        self.finish = [math.nan] * n
        self.preemptions = [0] * n
        self.replica = [-1] * n
        self.truncated = [False] * n


# waiting entry: (rid, tokens to compute, tokens already cached, decode steps left, emit first)
_Wait = tuple[int, int, int, int, bool]


class Replica:
    """Mutable simulation state of one replica. Drive it with `submit` and `advance_to`."""

    def __init__(self, index: int, cost: StepCostModel, config: EngineConfig,
                 kv_capacity_tokens: int, book: RequestBook, role: Role = "both",
                 on_prefilled: Callable[[int, float, int], None] | None = None) -> None:
        if kv_capacity_tokens < config.block_size:
            raise SpecError(
                f"replica {index}: KV capacity {kv_capacity_tokens} tokens is below one block; "
                "use more GPUs (tp/pp), a smaller model or quantized weights/KV"
            )
        self.index = index
        self.cost = cost
        self.config = config
        self.role = role
        self.book = book
        self.on_prefilled = on_prefilled
        self.capacity = kv_capacity_tokens * (1.0 - config.watermark)
        self.now = 0.0
        self.gstep = 0
        self.ctx = 0  # S: cached tokens of running sequences
        self.waiting: deque[_Wait] = deque()
        self.queued_tokens = 0
        self.running: dict[int, tuple[int, int, int]] = {}  # rid -> (admit gstep, ctx0, finish)
        self.heap: list[tuple[int, int]] = []
        self.prefilling: list[list[int]] = []  # chunked: [rid, total, done, steps_left, emit]
        self.prefill_reserved = 0
        self.busy_start: list[float] = []
        self.busy_end: list[float] = []
        self.busy_tokens: list[int] = []
        self.preemptions = 0
        self.kv_peak_tokens = 0.0  # most KV tokens in use (incl. reservations) at any step end
        n = config.max_num_seqs + 1
        if n <= len(cost.lin):
            dec = cost.lin[:n] + cost.head[:n] + cost.decode_per_sequence * np.arange(n)
            self._dec_a: list[float] = [float(x) + cost.decode_wave_time(b)
                                        + cost.step_overhead_s + cost.decode_overhead_adjust_s
                                        + config.cpu_time(b)
                                        for b, x in enumerate(dec)]
        else:
            self._dec_a = [cost.decode_step_time(b, 0.0) + config.cpu_time(b)
                           for b in range(n)]
        self._g = [cost.decode_context_coeff(b) for b in range(n)]  # G(B)
        self._frag = config.block_size / 2.0
        self._pipe = (PipelineCost(cost) if config.pp_microbatch and cost.deployment.pp > 1
                      else None)
        self._old_role: dict[int, Role] = {}  # rid -> role it arrived under (after set_role)
        self.paused = False

    # --- views for routers -------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.prefilling)

    @property
    def kv_free_tokens(self) -> float:
        return self.capacity - self._usage()

    def _usage(self) -> float:
        return self.ctx + self.prefill_reserved + self._frag * (
            len(self.running) + len(self.prefilling))

    # --- input ------------------------------------------------------------------------
    def submit(self, rid: int, prompt: int, output: int, kv_ready: bool = False) -> None:
        """Queue a request at the replica's current time (call `advance_to(t)` first)."""
        self.book.replica[rid] = self.index
        if kv_ready:
            entry: _Wait = (rid, 0, prompt, output - 1, False)
        else:
            entry = (rid, prompt, 0, output - 1, True)
        longest = prompt + (output if self.config.no_evict else 1)
        if longest + self._frag > self.capacity:
            self.book.truncated[rid] = True  # can never fit: rejected like an over-long prompt
            return
        self.waiting.append(entry)
        self.queued_tokens += entry[1]

    # --- role and pause hooks ---------------------------------------------------------
    def set_role(self, role: Role, at_t: float | None = None, *,
                 on_prefilled: Callable[[int, float, int], None] | None = None) -> None:
        """Serve as `role` from `at_t` on (the replica first advances there). Drain-free:
        requests already queued, prefilling or running finish in the role they arrived
        under. `on_prefilled`: the hand-off callback a new prefill role reports to."""
        if role not in ("both", "prefill", "decode"):
            raise SpecError(f"unknown role {role!r}")
        if at_t is not None and self.now < at_t:
            self.advance_to(at_t)
        if on_prefilled is not None:
            self.on_prefilled = on_prefilled
        if role == self.role:
            return
        old = self.role
        live = [e[0] for e in self.waiting] + [it[0] for it in self.prefilling]
        live += list(self.running)
        # entries of requests that left since the last flip are dropped (finished decodes
        # never pass _join again)
        self._old_role = {rid: self._old_role.get(rid, old) for rid in live}
        self.role = role

    def pause(self, at_t: float | None = None) -> None:
        """Stop computing from `at_t` on (after advancing there); requests keep their KV and
        new ones queue until `resume`."""
        if at_t is not None and self.now < at_t:
            self.advance_to(at_t)
        self.paused = True

    def resume(self, at_t: float | None = None) -> None:
        """Compute again from `at_t` (default: the replica's clock)."""
        if at_t is not None and self.now < at_t:
            self.now = at_t
        self.paused = False

    def take_all(self) -> list[tuple[int, int, int, int, bool]]:
        """Remove every request (queued, prefilling, running) and return it as a queue entry
        (rid, tokens to compute, 0, decode steps left, emit first token) whose KV must be
        recomputed: prompt + tokens generated so far (Flying Serving's fold-back). Frees all
        KV; for `requeue` on this or another replica."""
        out = [(rid, comp + cached, 0, steps, emit)
               for rid, comp, cached, steps, emit in self.waiting]
        out += [(it[0], it[1], 0, it[3], bool(it[4])) for it in self.prefilling]
        g = self.gstep
        out += [(rid, ctx0 + (g - admit), 0, fin - g - 1, False)
                for rid, (admit, ctx0, fin) in self.running.items()]
        self.waiting.clear()
        self.prefilling.clear()
        self.running.clear()
        self.heap.clear()
        self.queued_tokens = self.ctx = self.prefill_reserved = 0
        return out

    def requeue(self, entry: tuple[int, int, int, int, bool], front: bool = False) -> None:
        """Queue an entry from `take_all` (no capacity check: it fitted where it came from)."""
        self.book.replica[entry[0]] = self.index
        if front:
            self.waiting.appendleft(entry)
        else:
            self.waiting.append(entry)
        self.queued_tokens += entry[1]

    # --- time -------------------------------------------------------------------------
    def advance_to(self, t: float) -> None:
        """Run iterations while the replica's clock is before `t` (the last may end after)."""
        if self.paused:
            self.now = max(self.now, t)
            return
        while self.now < t:
            if not self._step(t):
                self.now = t
                return

    def drain(self) -> None:
        while self._step(INF):
            pass

    def step(self) -> bool:
        """Run one iteration or decode stretch (a stretch ends at the next finish); False if
        idle. For closed-loop drivers that react to each completion."""
        return self._step(INF)

    def step_until(self, t: float) -> bool:
        """As `step`, but a decode stretch also ends at the first step ending at or after `t`
        (drivers with timed inputs: the step that spans `t` is the last one run)."""
        return self._step(t)

    def _step(self, t_limit: float) -> bool:
        """One iteration or stretch; False if idle (or paused)."""
        if self.paused:
            return False
        if self.config.chunked_prefill:
            if (self.waiting or self.prefilling) and self._chunked_step():
                return True
        elif self.waiting and self._prefill_step():
            return True
        if self.running:
            self._decode_stretch(t_limit)
            return True
        return False

    def _admissible(self, entry: _Wait, extra: int) -> bool:
        need = entry[1] + entry[2] + self._frag
        if self.config.no_evict:  # reserve the remaining output of everything admitted
            need += entry[3] + self._future_tokens()
        return self._usage() + extra + need <= self.capacity

    def _prefill_step(self) -> bool:
        cfg = self.config
        batch: list[_Wait] = []
        tokens = 0
        reserved = 0.0
        seats = cfg.max_num_seqs - len(self.running)
        while self.waiting and len(batch) < seats:
            entry = self.waiting[0]
            if batch and tokens + entry[1] > cfg.max_batched_tokens:
                break
            if not self._admissible(entry, int(reserved)):
                break
            self.waiting.popleft()
            self.queued_tokens -= entry[1]
            batch.append(entry)
            tokens += entry[1]
            reserved += entry[1] + entry[2] + self._frag + (entry[3] if cfg.no_evict else 0)
        if not batch:
            return False
        lens = [e[1] for e in batch if e[1] > 0]
        if lens:
            start = self.now
            pipe = self._pipe
            self.now += ((pipe.prefill_time(lens) if pipe else self.cost.prefill_time(lens))
                         + cfg.cpu_time(len(lens)) + cfg.prompt_step_cpu_s)
            self._record(start, tokens)
        for rid, comp, cached, steps_left, emit in batch:
            self._join(rid, comp + cached, steps_left, emit and comp > 0)
        return True

    def _join(self, rid: int, ctx: int, steps_left: int, emit: bool) -> None:
        book = self.book
        if emit:
            book.first_token[rid] = self.now
        role = self._old_role.pop(rid, self.role) if self._old_role else self.role
        if role == "prefill":
            book.finish[rid] = self.now
            if self.on_prefilled is not None:
                self.on_prefilled(rid, self.now, ctx)
            return
        if steps_left <= 0:
            book.finish[rid] = self.now
            return
        finish = self.gstep + steps_left
        self.running[rid] = (self.gstep, ctx, finish)
        self.ctx += ctx
        heapq.heappush(self.heap, (finish, rid))

    def _chunked_step(self) -> bool:
        cfg = self.config
        seats = cfg.max_num_seqs - len(self.running) - len(self.prefilling)
        while self.waiting and seats > 0:
            entry = self.waiting[0]
            if not self._admissible(entry, len(self.running)):  # + this step's decode tokens
                break
            self.waiting.popleft()
            self.queued_tokens -= entry[1]
            seats -= 1
            rid, comp, cached, steps_left, emit = entry
            if comp == 0:
                self._join(rid, cached, steps_left, False)
                continue
            self.prefilling.append([rid, comp, 0, steps_left, 1 if emit else 0])
            self.prefill_reserved += comp
        if not self.prefilling:
            return False
        if self.running and not self._make_room(len(self.running)):
            return True  # the last sequence could never grow: truncated; state changed
        if not self.prefilling:
            return False  # every prompt was preempted to make room for the decodes
        budget = cfg.max_batched_tokens - len(self.running)
        chunks: list[tuple[int, int]] = []
        done: list[list[int]] = []
        whole = cfg.whole_prompts
        for item in self.prefilling:
            if budget <= 0:
                break
            if whole and chunks and item[1] - item[2] > budget:
                break  # FCFS: it and the prompts behind it wait for the next step
            c = min(item[1] - item[2], budget)
            chunks.append((c, item[2]))
            item[2] += c
            budget -= c
            if item[2] >= item[1]:
                done.append(item)
        if not chunks:
            return False
        n_dec = len(self.running)
        start = self.now
        pipe = self._pipe
        self.now += ((pipe.mixed_step_time(n_dec, self.ctx, chunks, len(done)) if pipe
                      else self.cost.mixed_step_time(n_dec, self.ctx, chunks, len(done)))
                     + cfg.cpu_time(n_dec + len(chunks)) + cfg.prompt_step_cpu_s)
        self._record(start, n_dec + sum(c for c, _ in chunks))
        if n_dec:
            self.gstep += 1
            self.ctx += n_dec
            self._note_peak()
            self._pop_finished()
        for item in done:
            self.prefilling.remove(item)
            self.prefill_reserved -= item[1]
            self._join(item[0], item[1], item[3], bool(item[4]))
        return True

    def _decode_stretch(self, t_limit: float) -> None:
        b = len(self.running)
        used = self._usage()
        if used + b > self.capacity:
            if not self._make_room(b):
                return
            b = len(self.running)
            used = self._usage()
        k = self.heap[0][0] - self.gstep
        k_mem = int((self.capacity - used) // b)
        if k_mem < k:
            k = max(1, k_mem)
        s = self.ctx
        a = self._dec_a[b]
        g = self._g[b]
        if self._pipe is not None:  # pipelined PP: swap the GPU part, keep the rest of a
            pa, g = self._pipe.decode_coeffs(b, s)
            a += pa - self.cost.decode_step_time(b, 0.0)
        if t_limit < INF:
            gap = t_limit - self.now
            if gap <= a + g * s:
                k = 1
            else:
                qa = 0.5 * g * b
                qb = a + g * s - qa
                if qa > 0:
                    k_t = (-qb + math.sqrt(qb * qb + 4.0 * qa * gap)) / (2.0 * qa)
                else:
                    k_t = gap / qb
                k_t = max(1, math.ceil(k_t - 1e-9))
                if k_t < k:
                    k = k_t
        start = self.now
        self.now += k * a + g * (k * s + b * k * (k - 1) * 0.5)
        self._record(start, b * k)
        self.gstep += k
        self.ctx += k * b
        used += k * b  # the peak of the stretch: before its finished sequences leave
        if used > self.kv_peak_tokens:
            self.kv_peak_tokens = used
        self._pop_finished()

    def _pop_finished(self) -> None:
        heap = self.heap
        running = self.running
        finish = self.book.finish
        while heap and heap[0][0] <= self.gstep:
            f, rid = heapq.heappop(heap)
            entry = running.get(rid)
            if entry is None or entry[2] != f:
                continue  # stale: preempted
            del running[rid]
            self.ctx -= entry[1] + (self.gstep - entry[0])
            finish[rid] = self.now

    def _make_room(self, new_tokens: int) -> bool:
        """Preempt the newest sequences until `new_tokens` more KV tokens fit: prompts still
        prefilling first (admitted last), then decoding sequences, newest first. False when a
        single decoding sequence alone cannot grow (it is truncated: finished as it stands)."""
        while self._usage() + new_tokens > self.capacity:
            if self.prefilling:
                self._preempt_prefilling()
            elif len(self.running) > 1:
                self._preempt_newest()
                new_tokens = len(self.running)
            elif self.running:
                self._truncate_last()
                return False
            else:
                break
        return True

    def _future_tokens(self) -> int:
        """KV tokens the admitted sequences will still add (their remaining decode steps)."""
        g = self.gstep
        return (sum(fin - g for _, _, fin in self.running.values())
                + sum(item[3] for item in self.prefilling))

    def _note_peak(self) -> None:
        usage = self._usage()
        if usage > self.kv_peak_tokens:
            self.kv_peak_tokens = usage

    def _preempt_prefilling(self) -> None:
        rid, total, _done, steps_left, emit = self.prefilling.pop()
        self.prefill_reserved -= total
        self.preemptions += 1
        self.book.preemptions[rid] += 1
        self.waiting.appendleft((rid, total, 0, steps_left, bool(emit)))
        self.queued_tokens += total

    def _preempt_newest(self) -> None:
        rid, (admit, ctx0, fin) = self.running.popitem()
        ctx = ctx0 + (self.gstep - admit)
        self.ctx -= ctx
        self.preemptions += 1
        self.book.preemptions[rid] += 1
        entry: _Wait = (rid, ctx, 0, fin - self.gstep - 1, False)
        self.waiting.appendleft(entry)
        self.queued_tokens += ctx

    def _truncate_last(self) -> None:
        rid, (admit, ctx0, _fin) = self.running.popitem()
        self.ctx -= ctx0 + (self.gstep - admit)
        self.book.truncated[rid] = True
        self.book.finish[rid] = self.now

    def _record(self, start: float, tokens: int) -> None:
        self.busy_start.append(start)
        self.busy_end.append(self.now)
        self.busy_tokens.append(tokens)


