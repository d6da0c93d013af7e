"""Pipelined pipeline parallelism: micro-batches overlap across stages.

Without it (`StepCostModel`), a PP replica runs one batch through its stages one after another:
step time = sum of the stage times, every stage idle most of the step. vLLM instead keeps PP
micro-batches in flight (one virtual engine per stage), so stage s works on micro-batch k while
stage s+1 works on k-1. `PipelineCost` prices one engine iteration of a PP replica that way:

- the step's sequences (decodes and prompt chunks) are dealt round-robin into
  n_mb = min(pp, items) micro-batches;
- t[k][s] = stage s's time for micro-batch k (its layers, its TP all-reduces, the LM head on
  the last stage only) plus the activation send over the boundary link after it;
- steady-state cycle = max(longest micro-batch latency max_k sum_s t[k][s], busiest stage
  max_s sum_k t[k][s]) + the per-step CPU overhead once.

So with >= PP micro-batches in flight the step costs PP x the slowest stage's micro-batch time
(for identical micro-batches), and a single sequence still pays the sum (latency). Decode
stretches keep their closed form: for B sequences the cycle is affine in the cached context S
with coefficients of the bottleneck (stage or whole-latency) term at the stretch's start.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from llmfabric.sim.costs import StepCostModel, _linear_times, cost_model_for
from llmfabric.sim.operators import embedding_op
from llmfabric.sim.parallel import Deployment


class PipelineCost:
    """Per-stage step costs of a PP deployment (build with `PipelineCost(cost)`)."""

    __slots__ = ("_decode", "act_bytes", "head", "links", "overhead", "pp", "stages")

    def __init__(self, cost: StepCostModel) -> None:
        dep = cost.deployment
        self.pp = dep.pp
        self.stages: list[StepCostModel] = []
        for i, st in enumerate(dep.stages):
            model = dataclasses.replace(dep.model, n_layers=st.n_layers,
                                        name=f"{dep.model.name}[stage {i}]", aliases=())
            sub = Deployment(model, (st,), tp_link=dep.tp_link,
                             stage_allreduces=(dep.stage_allreduce(i),))
            self.stages.append(cost_model_for(sub, cost.stages[i].eff))
        self.links = [dep.stage_pp_link(b) for b in range(dep.pp - 1)]
        self.act_bytes = dep.model.hidden * dep.model.act_bits / 8
        self.overhead = cost.step_overhead_s
        self.head = cost.head_time  # the LM head runs on the last stage only
        self._decode: dict[int, list[tuple[float, float]]] = {}

    def _send(self, stage: int, tokens: float) -> float:
        if stage >= len(self.links) or tokens <= 0:
            return 0.0
        link = self.links[stage]
        return link.latency_s + tokens * self.act_bytes / link.bandwidth

    def _embedding(self, s: int, tokens: int) -> float:
        """The embedding lookup every one-stage sub-model includes; only stage 0 runs it."""
        st = self.stages[s].stages[0]
        m = np.array([float(tokens)])
        return float(_linear_times((embedding_op(self.stages[s].model),), m, st.gpu, st.eff,
                                   st.dtype_bits)[0])

    def _stage_time(self, s: int, n_decode: int, ctx: float, chunks: list[tuple[int, int]],
                    n_sampled: int) -> float:
        sub = self.stages[s]
        tokens = n_decode + sum(c for c, _ in chunks)
        t = sub.mixed_step_time(n_decode, ctx, chunks, n_sampled) - sub.step_overhead_s
        if s != self.pp - 1:
            t -= sub.head_time(n_decode + n_sampled)
        if s != 0 and tokens > 0:
            t -= self._embedding(s, tokens)
        return t + self._send(s, tokens)

    @staticmethod
    def _cycle(times: list[list[float]]) -> float:
        latency = max(sum(row) for row in times)
        busiest = max(sum(col) for col in zip(*times, strict=True))
        return float(max(latency, busiest))

    def mixed_step_time(self, n_decode: int, decode_context: float,
                        chunks: list[tuple[int, int]], n_sampled: int) -> float:
        """One iteration with `n_decode` decodes (context `decode_context` in all) and prompt
        `chunks` (tokens, cached prefix), `n_sampled` of which finish their prompt."""
        items = n_decode + len(chunks)
        if items <= 0:
            return 0.0
        n_mb = min(self.pp, items)
        # decodes and chunks dealt round-robin; sampled chunks are the last ones
        first_sampled = len(chunks) - n_sampled
        times = []
        for k in range(n_mb):
            nd = n_decode // n_mb + (1 if k < n_decode % n_mb else 0)
            ck = [c for j, c in enumerate(chunks) if (n_decode + j) % n_mb == k]
            ns = sum(1 for j in range(len(chunks))
                     if (n_decode + j) % n_mb == k and j >= first_sampled)
            ctx = decode_context * nd / n_decode if n_decode else 0.0
            times.append([self._stage_time(s, nd, ctx, ck, ns) for s in range(self.pp)])
        return self._cycle(times) + self.overhead

    def prefill_time(self, prompt_lens: list[int]) -> float:
        """A prefill-only iteration over whole prompts."""
        return self.mixed_step_time(0, 0.0, [(p, 0) for p in prompt_lens], len(prompt_lens))

    def _decode_terms(self, batch: int) -> list[tuple[float, float]]:
        """(a_s, g_s) per stage: a micro-batch of ceil(batch / n_mb) sequences costs
        a_s + g_s x (its cached context) on stage s."""
        got = self._decode.get(batch)
        if got is None:
            n_mb = min(self.pp, batch)
            b = math.ceil(batch / n_mb)
            got = []
            for s, sub in enumerate(self.stages):
                a = self._stage_time(s, b, 0.0, [], 0)
                got.append((a, sub.decode_context_coeff(b)))
            self._decode[batch] = got
        return got

    def decode_coeffs(self, batch: int, context: float) -> tuple[float, float]:
        """(a, g) such that one decode step of `batch` sequences with `context` cached tokens
        in all costs about a + g x context (the bottleneck term at this context)."""
        if batch <= 0:
            return (0.0, 0.0)
        n_mb = min(self.pp, batch)
        terms = self._decode_terms(batch)
        per_mb = context / n_mb
        # latency of one micro-batch (sum over stages) vs n_mb x the busiest stage
        a_sum = sum(a for a, _ in terms)
        g_sum = sum(g for _, g in terms) / n_mb
        s_max = max(range(self.pp), key=lambda s: terms[s][0] + terms[s][1] * per_mb)
        a_max, g_max = n_mb * terms[s_max][0], terms[s_max][1]
        if a_sum + g_sum * context >= a_max + g_max * context:
            return (a_sum + self.overhead, g_sum)
        return (a_max + self.overhead, g_max)

    def decode_step_time(self, batch: int, context: float) -> float:
        a, g = self.decode_coeffs(batch, context)
        return a + g * context
