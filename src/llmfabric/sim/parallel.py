"""Communication costs (alpha-beta / Hockney model) and parallel layouts.

- `Link`: latency alpha (s) + bandwidth beta (bytes/s, one direction).
- Ring all-reduce over n ranks: 2(n-1) alpha + 2(n-1)/n * bytes / beta (HeroServe eq. 11);
  a stage's TP all-reduce on its GPU's own link uses the fitted `collectives` model instead
  (`Deployment.stage_allreduce`).
- KV transfer between a prefill and a decode replica: alpha + bytes / beta (ThunderServe eq. 1),
  optionally with 4-bit KV compression as ThunderServe does.
- `Deployment`: one replica = pipeline stages, each (GPU, TP degree, number of layers); stages
  may use different GPU types and get non-uniform layer counts (`balanced_layer_split`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmfabric.sim.collectives import AllReduceModel, allreduce_model, ring_model
from llmfabric.sim.errors import SpecError
from llmfabric.sim.hardware import GPUSpec, get_gpu
from llmfabric.sim.models import ModelSpec, get_model


@dataclass(frozen=True, slots=True)
class Link:
    bandwidth: float  # bytes/s, one direction
    latency_s: float

    def __post_init__(self) -> None:
        if self.bandwidth <= 0 or self.latency_s < 0:
            raise SpecError("a Link needs bandwidth > 0 bytes/s and latency >= 0 s")

    def transfer_time(self, n_bytes: float) -> float:
        return self.latency_s + n_bytes / self.bandwidth


def intra_node_link(gpu: GPUSpec) -> Link:
    return Link(gpu.intra_node_bw, gpu.intra_node_latency_s)


def inter_node_link(gpu: GPUSpec) -> Link:
    return Link(gpu.inter_node_bw, gpu.inter_node_latency_s)


def allreduce_time(n_bytes: float, n_ranks: int, link: Link) -> float:
    """Ring all-reduce of `n_bytes` (per rank) over `n_ranks` ranks."""
    if n_ranks <= 1:
        return 0.0
    steps = 2 * (n_ranks - 1)
    return steps * link.latency_s + steps / n_ranks * n_bytes / link.bandwidth


def kv_transfer_bytes(model: ModelSpec, n_tokens: float, bits: int | None = None) -> float:
    """KV cache bytes of `n_tokens` tokens, re-quantized to `bits` for transfer if given."""
    per_token = model.kv_bytes_per_token()
    if bits is not None:
        per_token = per_token * bits / model.kv_bits
    return per_token * n_tokens


def kv_transfer_time(model: ModelSpec, n_tokens: float, link: Link, bits: int | None = None
                     ) -> float:
    """Time to ship the KV cache of one request from a prefill to a decode replica."""
    return link.transfer_time(kv_transfer_bytes(model, n_tokens, bits))


@dataclass(frozen=True, slots=True)
class Stage:
    gpu: GPUSpec
    tp: int
    n_layers: int

    def __post_init__(self) -> None:
        if self.tp < 1 or self.n_layers < 0:
            raise SpecError("a pipeline stage needs tp >= 1 and n_layers >= 0")


@dataclass(frozen=True, slots=True)
class Deployment:
    """One model replica: pipeline stages in order; stage 0 embeds, the last runs the LM head.

    `tp_link` overrides the intra-stage link (default: the GPU's NVLink/PCIe); `pp_link` is
    the link between stages (default: the slower of the two stages' intra-node links when all
    stages share a GPU type, else the inter-node link).
    """

    model: ModelSpec
    stages: tuple[Stage, ...]
    tp_link: Link | None = None
    pp_link: Link | None = None

    def __post_init__(self) -> None:
        if not self.stages:
            raise SpecError("a deployment needs at least one stage")
        if sum(s.n_layers for s in self.stages) != self.model.n_layers:
            raise SpecError(
                f"stages hold {sum(s.n_layers for s in self.stages)} layers but "
                f"{self.model.name} has {self.model.n_layers}"
            )

    @property
    def n_gpus(self) -> int:
        return sum(s.tp for s in self.stages)

    @property
    def pp(self) -> int:
        return len(self.stages)

    def stage_tp_link(self, stage: Stage) -> Link:
        return self.tp_link or intra_node_link(stage.gpu)

    def stage_allreduce(self, stage: Stage) -> AllReduceModel:
        """The TP all-reduce cost of `stage`: the ring formula over `tp_link` when one is
        given, else the GPU's fitted model (`collectives.allreduce_model`)."""
        if self.tp_link is not None:
            return ring_model(self.tp_link.bandwidth, self.tp_link.latency_s)
        return allreduce_model(stage.gpu)

    def stage_pp_link(self) -> Link:
        if self.pp_link is not None:
            return self.pp_link
        gpus = {s.gpu.name for s in self.stages}
        if len(gpus) == 1 and self.n_gpus <= 8:
            return intra_node_link(self.stages[0].gpu)
        return inter_node_link(min((s.gpu for s in self.stages), key=lambda g: g.inter_node_bw))

    @property
    def price_per_hour(self) -> float | None:
        total = 0.0
        for s in self.stages:
            if s.gpu.price_per_hour is None:
                return None
            total += s.gpu.price_per_hour * s.tp
        return total


def even_layer_split(n_layers: int, pp: int) -> list[int]:
    base, extra = divmod(n_layers, pp)
    return [base + (1 if i < extra else 0) for i in range(pp)]


def balanced_layer_split(n_layers: int, weights: Sequence[float]) -> list[int]:
    """Split layers proportionally to per-stage speed `weights` (largest-remainder rounding),
    every stage keeping at least one layer."""
    if not weights or any(w <= 0 for w in weights):
        raise SpecError("balanced_layer_split needs positive stage weights")
    if n_layers < len(weights):
        raise SpecError("more pipeline stages than layers")
    total = sum(weights)
    raw = [n_layers * w / total for w in weights]
    counts = [max(1, int(r)) for r in raw]
    while sum(counts) > n_layers:
        i = max(range(len(counts)), key=lambda j: counts[j] - raw[j])
        counts[i] -= 1
    while sum(counts) < n_layers:
        i = max(range(len(counts)), key=lambda j: raw[j] - counts[j])
        counts[i] += 1
    return counts


def make_deployment(model: ModelSpec | str, gpu: GPUSpec | str | Sequence[GPUSpec | str],
                    tp: int | Sequence[int] = 1, pp: int = 1,
                    layers: Sequence[int] | None = None) -> Deployment:
    """Build a replica layout. One GPU type: `pp` equal stages of `tp` GPUs. A list of GPU
    types: one stage each (with per-stage `tp` if a list), layers split by memory bandwidth x
    GPUs unless `layers` is given."""
    spec = get_model(model)
    gpus = [get_gpu(gpu)] * pp if isinstance(gpu, (str, GPUSpec)) else [get_gpu(g) for g in gpu]
    tps = [tp] * len(gpus) if isinstance(tp, int) else list(tp)
    if len(tps) != len(gpus):
        raise SpecError("give one tp per pipeline stage")
    if layers is None:
        if len({g.name for g in gpus}) == 1 and len(set(tps)) == 1:
            layers = even_layer_split(spec.n_layers, len(gpus))
        else:
            layers = balanced_layer_split(spec.n_layers,
                                          [g.mem_bw * t for g, t in zip(gpus, tps, strict=True)])
    if len(layers) != len(gpus):
        raise SpecError("give one layer count per pipeline stage")
    stages = tuple(Stage(g, t, n) for g, t, n in zip(gpus, tps, layers, strict=True))
    return Deployment(spec, stages)
