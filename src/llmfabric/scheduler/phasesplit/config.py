"""Per-group parallel configuration (ThunderServe Algorithm 2, App. B; COMPANIONS.md §1.3a).

A stage is TP GPUs of one type on one host (TP never spans types or nodes). For each TP in
{1, 2, 4, 8} (heads divisible) and PP from the smallest that holds the weights to one more
(<= max_pp), replicas are built greedily: among the stage-bucket multisets still available,
the best single replica is taken, its GPUs removed, and again, so a group hosts DP copies
(Table 3's "8 x A40, TP=2, 4 prefill replicas"); leftovers idle. A replica's stage order comes
from the route search (all orders of <= 4 stages: the bitmask DP's optimum, by enumeration),
minimising sum of alpha + act_bytes / beta over the boundaries (beta = the minimum bandwidth
between the two stages' GPUs). Layers: memory-aware split proportional to prefill FLOP/s x TP
(prefill) or HBM bandwidth x TP (decode) under per-stage memory caps (sim.layersplit).
The group's configuration maximises capacity: prefill requests/s (sum of 1/latency over its
replicas), decode tokens/s (sum of B_max / t_decode(B_max)).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from llmfabric.scheduler.errors import SpecError
from llmfabric.scheduler.phasesplit.pairmemo import PairMemo
from llmfabric.scheduler.phasesplit.problem import CloudCluster, PDWorkload
from llmfabric.sim.costs import StepCostModel, cost_model_for
from llmfabric.sim.engine import EngineConfig
from llmfabric.sim.errors import InfeasibleError, SimError
from llmfabric.sim.hardware import GPUSpec
from llmfabric.sim.layersplit import memory_aware_layers
from llmfabric.sim.memory import memory_plan, weight_bytes
from llmfabric.sim.models import ModelSpec
from llmfabric.sim.parallel import Deployment, Link, Stage
from llmfabric.sim.pipeline import PipelineCost

Phase = Literal["prefill", "decode", "both"]
TP_CHOICES = (1, 2, 4, 8)
_ENGINE = EngineConfig()  # the simulator's admission limits, which plans are judged under
MAX_NUM_SEQS = _ENGINE.max_num_seqs
DECODE_ROUTE_BATCH = 32  # sequences whose activations cross a decode stage boundary


def decode_context(workload: PDWorkload) -> float:
    """Mean cached tokens of a decoding sequence, averaged over the batch in time: the prompt
    plus E[out^2] / (2 E[out]) (a sequence stays in the batch for its whole output, so long
    outputs are over-represented; out / 2 only for equal outputs)."""
    outs = workload.out_lengths.astype(np.float64)
    return workload.mean_in + float((outs * outs).mean() / (2 * outs.mean()))


def decode_seats(kv_capacity_tokens: float, ctx: float) -> int:
    """Sequences a decode replica holds at once as the simulator admits them: at most
    max_num_seqs, within the KV capacity less the watermark, each holding its context plus
    half a block of fragmentation."""
    room = kv_capacity_tokens * (1.0 - _ENGINE.watermark)
    return max(1, min(MAX_NUM_SEQS, int(room // (ctx + _ENGINE.block_size / 2))))


def slo_batch(step_time: Callable[[int], float], seats: int, tpot_s: float | None) -> int:
    """The largest decode batch (<= seats) whose step meets the TPOT deadline: seats without
    one, 0 when even a single sequence misses it. Step time grows with the batch."""
    if tpot_s is None:
        return seats
    if step_time(1) > tpot_s:
        return 0
    lo, hi = 1, seats
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if step_time(mid) <= tpot_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


def decode_rate(step: StepCostModel | PipelineCost, kv_capacity_tokens: float, ctx: float,
                tpot_s: float | None) -> float:
    """Decode tokens/s within the TPOT deadline: batch / step at the largest batch the KV,
    max_num_seqs and the deadline allow (0 if the deadline cannot be met)."""
    b = slo_batch(lambda k: step.decode_step_time(k, k * ctx),
                  decode_seats(kv_capacity_tokens, ctx), tpot_s)
    return b / step.decode_step_time(b, b * ctx) if b else 0.0


@dataclass(frozen=True, slots=True)
class StageConfig:
    gpus: tuple[int, ...]
    type: str
    layers: int


@dataclass(frozen=True, eq=False)
class ReplicaConfig:
    """One pipeline: its stages in route order, its simulator deployment and capacities."""

    stages: tuple[StageConfig, ...]
    deployment: Deployment
    kv_capacity_tokens: int
    latency_s: float          # prefill of one mean prompt
    throughput_tps: float     # decode tokens/s at the largest batch within KV and TPOT
    step: StepCostModel | PipelineCost

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(g for s in self.stages for g in s.gpus)

    def decode_step_time(self, batch: int, context_per_seq: float) -> float:
        return self.step.decode_step_time(batch, batch * context_per_seq)

    def prefill_time(self, n_tokens: int) -> float:
        return self.step.prefill_time([n_tokens])


@dataclass(frozen=True, eq=False)
class GroupConfig:
    tp: int
    pp: int
    replica_configs: tuple[ReplicaConfig, ...]

    @property
    def replicas(self) -> int:
        return len(self.replica_configs)

    @property
    def stages(self) -> tuple[StageConfig, ...]:
        return self.replica_configs[0].stages

    @property
    def latency_s(self) -> float:
        return min(r.latency_s for r in self.replica_configs)

    @property
    def throughput_tps(self) -> float:
        return sum(r.throughput_tps for r in self.replica_configs)

    @property
    def prefill_rps(self) -> float:
        return sum(1.0 / r.latency_s for r in self.replica_configs)


Bucket = tuple[str, str]  # (host, type)


def _buckets(gpus: Sequence[int], cluster: CloudCluster) -> dict[Bucket, list[int]]:
    out: dict[Bucket, list[int]] = {}
    for g in sorted(gpus):
        spec = cluster.gpus[g]
        out.setdefault((spec.host, spec.type), []).append(g)
    return out


def link_class(link: Link) -> tuple[int, int]:
    """A link bucketed to factor-2 steps of bandwidth and 1 ms of latency (-1: same GPU)."""
    bw = round(math.log2(link.bandwidth)) if math.isfinite(link.bandwidth) else -1
    return bw, round(link.latency_s * 1e3)


class ConfigSearch:
    """Algorithm 2 with caches: by GPU set and phase; by group SIGNATURE (the (type, count)
    of each (host, type) bucket and the link classes within and between buckets, with
    hosts anonymised: the tabu's neighbours mostly re-cut the same instances, so a new group
    is usually an old one on other GPU ids, whose configuration is re-mapped, not
    re-deduced); by stage types and link classes (a replica's cost model)."""

    def __init__(self, cluster: CloudCluster, model: ModelSpec, workload: PDWorkload, *,
                 pipelined_pp: bool = True, max_pp: int = 4) -> None:
        self.cluster, self.model, self.workload = cluster, model, workload
        self.pipelined_pp, self.max_pp = pipelined_pp, max_pp
        self._groups: dict[tuple[frozenset[int], str], GroupConfig | None] = {}
        self._replicas: dict[tuple[object, ...], ReplicaConfig | None] = {}
        self._routes: dict[tuple[str, tuple[Bucket, ...]], tuple[Bucket, ...]] = {}
        self._by_signature: dict[tuple[object, ...],
                                 tuple[GroupConfig | None, dict[Bucket, list[int]],
                                       tuple[Bucket, ...]]] = {}
        self._specs: dict[str, GPUSpec] = {}
        self._pair_memo: PairMemo | None = None
        self._templates: dict[tuple[object, ...],
                              tuple[tuple[Bucket, ...], ReplicaConfig | None]] = {}
        self.deduced = 0  # groups deduced from scratch (the rest were re-mapped)
        self.mean_in = workload.mean_in
        self.mean_out = workload.mean_out
        self.ctx = decode_context(workload)
        self._weights = weight_bytes(model)

    def pair_memo(self, cluster: CloudCluster, workload: PDWorkload, kv_bits: int | None,
                  kv_group: int) -> PairMemo:
        """The orchestration's memo for this search (a new one if the setting changed)."""
        memo = self._pair_memo
        if memo is None or not memo.usable(cluster, self.model, workload, kv_bits, kv_group):
            memo = self._pair_memo = PairMemo(cluster, self.model, workload, kv_bits, kv_group)
        return memo

    def spec(self, gpu_type: str) -> GPUSpec:
        got = self._specs.get(gpu_type)
        if got is None:
            got = self._specs[gpu_type] = self.cluster.gpu_spec(gpu_type)
        return got

    def deduce(self, gpus: frozenset[int], phase: Phase) -> GroupConfig | None:
        key = (gpus, phase)
        if key not in self._groups:
            self._groups[key] = self._by_signature_of(gpus, phase)
        return self._groups[key]

    def signature(self, buckets: dict[Bucket, list[int]]
                  ) -> tuple[tuple[object, ...], tuple[Bucket, ...]]:
        """(signature, buckets in canonical order): buckets ordered by type, size and link
        classes (host names only break ties), then every pair's link class in that order."""
        intra = {b: link_class(self._bucket_link(b, b, buckets)) for b in buckets}
        cls = {(a, b): link_class(self._bucket_link(a, b, buckets))
               for a in buckets for b in buckets if a != b}
        order = tuple(sorted(buckets, key=lambda b: (
            b[1], len(buckets[b]), intra[b],
            tuple(sorted(cls[b, c] for c in buckets if c != b)), b)))
        sig = (tuple((b[1], len(buckets[b]), intra[b]) for b in order),
               tuple(cls[a, b] for i, a in enumerate(order) for b in order[i + 1:]))
        return sig, order

    def _by_signature_of(self, gpus: frozenset[int], phase: Phase) -> GroupConfig | None:
        buckets = _buckets(list(gpus), self.cluster)
        sig, order = self.signature(buckets)
        got = self._by_signature.get((phase, sig))
        if got is None:
            self.deduced += 1
            got = (self._deduce(gpus, phase), buckets, order)
            self._by_signature[phase, sig] = got
        cfg, rep_buckets, rep_order = got
        if cfg is None or (rep_order == order and rep_buckets == buckets):
            return cfg
        ids = {a: b for rb, nb in zip(rep_order, order, strict=True)
               for a, b in zip(rep_buckets[rb], buckets[nb], strict=True)}
        return GroupConfig(cfg.tp, cfg.pp, tuple(
            ReplicaConfig(tuple(StageConfig(tuple(ids[g] for g in st.gpus), st.type, st.layers)
                                for st in r.stages), r.deployment, r.kv_capacity_tokens,
                          r.latency_s, r.throughput_tps, r.step)
            for r in cfg.replica_configs))

    def _deduce(self, gpus: frozenset[int], phase: Phase) -> GroupConfig | None:
        buckets = _buckets(list(gpus), self.cluster)
        m = self.model
        best: tuple[float, GroupConfig] | None = None
        for tp in TP_CHOICES:
            if m.n_heads % tp or (m.n_kv_heads % tp and tp % m.n_kv_heads):
                continue
            slots = {b: len(ids) // tp for b, ids in buckets.items() if len(ids) >= tp}
            if not slots:
                continue
            first_ok: int | None = None
            for pp in range(1, self.max_pp + 1):
                if first_ok is not None and pp > first_ok + 1:
                    break
                cfg = self._greedy_replicas(buckets, slots, tp, pp, phase)
                if cfg is None:
                    continue
                first_ok = pp if first_ok is None else first_ok
                score = cfg.throughput_tps if phase == "decode" else cfg.prefill_rps
                if best is None or score > best[0] * (1 + 1e-9):
                    best = (score, cfg)
        return best[1] if best else None

    def _greedy_replicas(self, buckets: dict[Bucket, list[int]], slots: dict[Bucket, int],
                         tp: int, pp: int, phase: Phase) -> GroupConfig | None:
        # A combo's template (so its score) does not depend on which GPUs are taken: score
        # every combo once, then take the best one still free, round after round. Same picks
        # as re-scoring each round: the free combos keep their lexicographic scan order.
        scored: list[tuple[dict[Bucket, int], float, tuple[Bucket, ...], ReplicaConfig]] = []
        for combo in itertools.combinations_with_replacement(sorted(slots), pp):
            need = {b: combo.count(b) for b in set(combo)}
            if any(n > slots[b] for b, n in need.items()):
                continue
            if sum(self.spec(b[1]).mem_bytes * tp for b in combo) < self._weights:
                continue
            order, template = self._template(combo, tp, phase, buckets)
            if template is None:
                continue
            score = (template.throughput_tps if phase == "decode"
                     else 1.0 / template.latency_s)
            scored.append((need, score, order, template))
        free = dict(slots)
        taken = {b: 0 for b in buckets}
        reps: list[ReplicaConfig] = []
        while True:
            best: tuple[dict[Bucket, int], float, tuple[Bucket, ...], ReplicaConfig] | None = None
            for cand in scored:
                if any(n > free[b] for b, n in cand[0].items()):
                    continue
                if best is None or cand[1] > best[1] * (1 + 1e-9):
                    best = cand
            if best is None:
                break
            reps.append(self._concrete(best[2], best[3], tp, buckets, taken))
            for b, n in best[0].items():
                free[b] -= n
                taken[b] += n
        return GroupConfig(tp, pp, tuple(reps)) if reps else None

    def _route(self, combo: Sequence[Bucket], buckets: dict[Bucket, list[int]], phase: Phase
               ) -> tuple[Bucket, ...]:
        """The stage order with the cheapest activation path (ties: widest bottleneck)."""
        if len(combo) == 1:
            return tuple(combo)
        key = (phase, tuple(combo))
        if key in self._routes:
            return self._routes[key]
        tokens = self.mean_in if phase == "prefill" else DECODE_ROUTE_BATCH
        act = tokens * self.model.hidden * self.model.act_bits / 8
        best: tuple[float, float, tuple[Bucket, ...]] | None = None
        for order in sorted(set(itertools.permutations(combo))):
            cost, neck = 0.0, math.inf
            for a, b in itertools.pairwise(order):
                link = self._bucket_link(a, b, buckets)
                cost += link.latency_s + act / link.bandwidth
                neck = min(neck, link.bandwidth)
            if best is None or (cost, -neck) < best[:2]:
                best = (cost, -neck, order)
        assert best is not None
        self._routes[key] = best[2]
        return best[2]

    def _bucket_link(self, a: Bucket, b: Bucket, buckets: dict[Bucket, list[int]]) -> Link:
        if a == b:
            ids = buckets[a]
            if len(ids) == 1:
                return Link(math.inf, 0.0)
            return self.cluster.link(ids, ids[::-1])
        return self.cluster.link(buckets[a], buckets[b])

    def _template(self, combo: Sequence[Bucket], tp: int, phase: Phase,
                  buckets: dict[Bucket, list[int]]
                  ) -> tuple[tuple[Bucket, ...], ReplicaConfig | None]:
        """(stage order, the replica's configuration without concrete GPUs); memoised by
        the combo and its buckets' GPUs, which fix its links."""
        memo_key = (phase, tp, tuple(combo), tuple(tuple(buckets[b]) for b in combo))
        got = self._templates.get(memo_key)
        if got is None:
            got = self._templates[memo_key] = self._template_of(combo, tp, phase, buckets)
        return got

    def _template_of(self, combo: Sequence[Bucket], tp: int, phase: Phase,
                     buckets: dict[Bucket, list[int]]
                     ) -> tuple[tuple[Bucket, ...], ReplicaConfig | None]:
        order = self._route(combo, buckets, phase)
        links = tuple(self._bucket_link(a, b, buckets) for a, b in itertools.pairwise(order))
        # links bucketed to factor-2 steps of bandwidth and 1 ms of latency: a replica's
        # boundary links matter little next to its GPUs, and every bucket costs a model build
        key = (phase, tp, tuple(b[1] for b in order), tuple(link_class(lk) for lk in links))
        template = self._replicas[key] if key in self._replicas else self._build(
            key, order, tp, phase, links)
        return order, template

    @staticmethod
    def _concrete(order: tuple[Bucket, ...], template: ReplicaConfig, tp: int,
                  buckets: dict[Bucket, list[int]], taken: dict[Bucket, int]) -> ReplicaConfig:
        """The template on concrete GPUs: the next free TP-slots of each bucket, in route
        order."""
        used = dict(taken)
        stages = []
        for b, st in zip(order, template.stages, strict=True):
            start = used[b] * tp
            stages.append(StageConfig(tuple(buckets[b][start:start + tp]), b[1], st.layers))
            used[b] += 1
        return ReplicaConfig(tuple(stages), template.deployment, template.kv_capacity_tokens,
                             template.latency_s, template.throughput_tps, template.step)

    def _build(self, key: tuple[object, ...], order: Sequence[Bucket], tp: int, phase: Phase,
               links: tuple[Link, ...]) -> ReplicaConfig | None:
        specs = [self.spec(b[1]) for b in order]
        tps = [tp] * len(order)
        weights = [(g.fp16_flops if phase == "prefill" else g.mem_bw) * tp for g in specs]
        rep: ReplicaConfig | None = None
        try:
            layers = memory_aware_layers(self.model, specs, tps, weights=weights)
        except InfeasibleError:
            layers = None
        if layers is not None:
            dep = Deployment(self.model, tuple(Stage(g, tp, n)
                                               for g, n in zip(specs, layers, strict=True)),
                             pp_links=links)
            plan = memory_plan(dep)
            ctx = self.ctx
            if plan.fits and plan.kv_capacity_tokens >= self.mean_in + self.mean_out:
                cost = cost_model_for(dep)
                step: StepCostModel | PipelineCost = (
                    PipelineCost(cost) if self.pipelined_pp and dep.pp > 1 else cost)
                latency = cost.prefill_time([max(1, round(self.mean_in))])
                tps_ = decode_rate(step, plan.kv_capacity_tokens, ctx, self.workload.slo.tpot_s)
                stages = tuple(StageConfig((), b[1], n)
                               for b, n in zip(order, layers, strict=True))
                rep = ReplicaConfig(stages, dep, int(plan.kv_capacity_tokens), latency, tps_,
                                    step)
        self._replicas[key] = rep
        return rep


def deduce_config(gpus: frozenset[int], phase: Phase, model: ModelSpec, cluster: CloudCluster,
                  workload: PDWorkload, *, pipelined_pp: bool = True) -> GroupConfig | None:
    """Algorithm 2 for one group (None: the group cannot hold a replica)."""
    return ConfigSearch(cluster, model, workload, pipelined_pp=pipelined_pp).deduce(gpus, phase)


def replica_from_stages(model: ModelSpec, cluster: CloudCluster, workload: PDWorkload,
                        tp: int, stages: Sequence[StageConfig], *,
                        pipelined_pp: bool = True) -> ReplicaConfig:
    """Rebuild a replica from its stages (a saved plan): same GPUs, types and layers."""
    if not stages or any(len(s.gpus) != tp for s in stages):
        raise SpecError("every stage needs exactly tp GPUs")
    for s in stages:
        name = cluster.gpu_spec(s.type).name
        if any(not 0 <= g < len(cluster.gpus) or cluster.gpus[g].type != name for g in s.gpus):
            raise SpecError(f"stage GPUs {list(s.gpus)} are not {s.type} GPUs of this cluster")
    links = tuple(cluster.link(a.gpus, b.gpus) for a, b in itertools.pairwise(stages))
    try:
        dep = Deployment(model, tuple(Stage(cluster.gpu_spec(s.type), tp, s.layers)
                                      for s in stages), pp_links=links)
    except SimError as e:
        raise SpecError(str(e)) from None
    plan = memory_plan(dep)
    if not plan.fits:
        raise SpecError(f"{model.name} does not fit on stages {[s.gpus for s in stages]}")
    cost = cost_model_for(dep)
    step: StepCostModel | PipelineCost = (
        PipelineCost(cost) if pipelined_pp and dep.pp > 1 else cost)
    ctx = decode_context(workload)
    return ReplicaConfig(tuple(stages), dep, int(plan.kv_capacity_tokens),
                         cost.prefill_time([max(1, round(workload.mean_in))]),
                         decode_rate(step, plan.kv_capacity_tokens, ctx, workload.slo.tpot_s),
                         step)
