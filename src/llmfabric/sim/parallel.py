"""Communication costs (alpha-beta / Hockney model) and parallel layouts.

- `Link`: latency alpha (s) + bandwidth beta (bytes/s, one direction).
- Ring all-reduce over n ranks: 2(n-1) alpha + 2(n-1)/n * bytes / beta (HeroServe eq. 11);
  a stage's TP all-reduce on its GPU's own link uses the fitted `collectives` model instead
  (`Deployment.stage_allreduce`).
- KV transfer between a prefill and a decode replica: alpha + bytes / beta (ThunderServe eq. 1),
  optionally quantized for transfer (KIVI-style: `bits` per element plus an fp16 scale and
  minimum per group of `group` elements, so 4-bit, group 64 = 4.5 bits per element);
  `kv_transfer_time_staged`: per pipeline-stage pair, each stage's layers going to the decode
  stages that hold the same layers over their own link, the slowest pair deciding (HeroServe
  eqs. 14-15; eq. 1 when both sides have one stage).
- `Deployment`: one replica = pipeline stages, each (GPU, TP degree, number of layers); stages
  may use different GPU types and get non-uniform layer counts (`balanced_layer_split`, which
  water-fills under per-stage layer caps when given); optional per-stage all-reduce models
  (e.g. from a network plan) and per-boundary pipeline links.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llmfabric.sim.collectives import AllReduceModel, allreduce_model, ring_model
from llmfabric.sim.errors import InfeasibleError, SpecError
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


DEFAULT_KV_GROUP = 64  # elements per quantization group (KIVI's default)
QUANT_META_BYTES = 4.0  # per group: an fp16 scale and an fp16 minimum


def kv_bytes_per_element(model: ModelSpec, bits: int | None = None,
                         group: int | None = None) -> float:
    """Bytes per KV element on the wire: the cache's own width, or `bits` plus the group's
    scale and minimum when re-quantized below it (4-bit, group 64: 0.5 + 4/64 = 0.5625 B,
    4.5 bits; the 16/4-bit ratio is 3.56, not 4)."""
    if bits is None or bits >= model.kv_bits:
        return (bits if bits is not None else model.kv_bits) / 8
    if bits < 1:
        raise SpecError("KV transfer bits must be >= 1")
    g = DEFAULT_KV_GROUP if group is None else group
    if g < 1:
        raise SpecError("a KV quantization group needs >= 1 element")
    return bits / 8 + QUANT_META_BYTES / g


def kv_transfer_bytes(model: ModelSpec, n_tokens: float, bits: int | None = None,
                      group: int | None = None) -> float:
    """KV cache bytes of `n_tokens` tokens, re-quantized to `bits` for transfer if given
    (with the scale/minimum metadata of every `group` elements, default 64)."""
    elements = model.kv_bytes_per_token() / (model.kv_bits / 8)
    return elements * kv_bytes_per_element(model, bits, group) * n_tokens


def kv_transfer_time(model: ModelSpec, n_tokens: float, link: Link, bits: int | None = None,
                     group: int | None = None) -> float:
    """Time to ship the KV cache of one request from a prefill to a decode replica."""
    return link.transfer_time(kv_transfer_bytes(model, n_tokens, bits, group))


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
    stages share a GPU type, else the inter-node link). `pp_links` gives one link per stage
    boundary (pp - 1 of them; wins over `pp_link`); `stage_allreduces` one all-reduce model
    per stage (None: the default for that stage), e.g. a planned INA or ring over a path.
    """

    model: ModelSpec
    stages: tuple[Stage, ...]
    tp_link: Link | None = None
    pp_link: Link | None = None
    pp_links: tuple[Link, ...] = ()
    stage_allreduces: tuple[AllReduceModel | None, ...] = ()

    def __post_init__(self) -> None:
        if not self.stages:
            raise SpecError("a deployment needs at least one stage")
        if sum(s.n_layers for s in self.stages) != self.model.n_layers:
            raise SpecError(
                f"stages hold {sum(s.n_layers for s in self.stages)} layers but "
                f"{self.model.name} has {self.model.n_layers}"
            )
        if self.pp_links and len(self.pp_links) != len(self.stages) - 1:
            raise SpecError(f"pp_links needs one link per stage boundary "
                            f"({len(self.stages) - 1}), got {len(self.pp_links)}")
        if self.stage_allreduces and len(self.stage_allreduces) != len(self.stages):
            raise SpecError(f"stage_allreduces needs one entry per stage ({len(self.stages)})")

    def layer_ranges(self) -> list[tuple[int, int]]:
        """[start, end) layer indices of every stage."""
        out, start = [], 0
        for s in self.stages:
            out.append((start, start + s.n_layers))
            start += s.n_layers
        return out

    @property
    def n_gpus(self) -> int:
        return sum(s.tp for s in self.stages)

    @property
    def pp(self) -> int:
        return len(self.stages)

    def stage_tp_link(self, stage: Stage) -> Link:
        return self.tp_link or intra_node_link(stage.gpu)

    def stage_allreduce(self, stage: Stage | int) -> AllReduceModel:
        """The TP all-reduce cost of a stage (object or index): its entry in
        `stage_allreduces` if set, else the ring formula over `tp_link` when one is given,
        else the GPU's fitted model (`collectives.allreduce_model`)."""
        if isinstance(stage, int):
            index, stage = stage, self.stages[stage]
        else:
            index = self.stages.index(stage)
        if self.stage_allreduces and self.stage_allreduces[index] is not None:
            planned = self.stage_allreduces[index]
            assert planned is not None
            return planned
        if self.tp_link is not None:
            return ring_model(self.tp_link.bandwidth, self.tp_link.latency_s)
        return allreduce_model(stage.gpu)

    def stage_pp_link(self, boundary: int | None = None) -> Link:
        """The link between stage `boundary` and the next (None: the common default)."""
        if self.pp_links and boundary is not None:
            if not 0 <= boundary < len(self.pp_links):
                raise SpecError(f"no stage boundary {boundary}")
            return self.pp_links[boundary]
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


def _water_fill(n_layers: int, weights: Sequence[float], caps: Sequence[int]) -> list[float]:
    """Real-valued shares proportional to `weights`, no stage above its cap: stages whose
    share exceeds the cap are pinned there and the rest re-shared among the others."""
    raw = [0.0] * len(weights)
    free = list(range(len(weights)))
    left = float(n_layers)
    while free:
        total = sum(weights[i] for i in free)
        over = [i for i in free if left * weights[i] / total > caps[i]]
        if not over:
            for i in free:
                raw[i] = left * weights[i] / total
            break
        for i in over:
            raw[i] = float(caps[i])
            left -= caps[i]
        free = [i for i in free if i not in over]
    return raw


def balanced_layer_split(n_layers: int, weights: Sequence[float],
                         caps: Sequence[int] | None = None) -> list[int]:
    """Split layers proportionally to per-stage speed `weights` (largest-remainder rounding),
    every stage keeping at least one layer. `caps`: the most layers each stage may hold
    (e.g. what its memory allows beside a minimum of KV, `layersplit.layer_caps`); shares
    are water-filled under them. Raises InfeasibleError when the caps cannot hold the model."""
    if not weights or any(not w > 0 for w in weights):
        raise SpecError("balanced_layer_split needs positive stage weights")
    if n_layers < len(weights):
        raise SpecError("more pipeline stages than layers")
    if caps is None:
        caps = [n_layers] * len(weights)
    elif len(caps) != len(weights):
        raise SpecError("give one layer cap per stage")
    if min(caps) < 1 or sum(caps) < n_layers:
        raise InfeasibleError(
            f"stage layer caps {list(caps)} cannot hold {n_layers} layers with >= 1 per stage: "
            "add GPUs, use larger-memory GPUs or lower the KV minimum")
    raw = _water_fill(n_layers, weights, caps)
    counts = [min(caps[i], max(1, int(r + 1e-9))) for i, r in enumerate(raw)]
    while sum(counts) > n_layers:
        i = max((j for j in range(len(counts)) if counts[j] > 1),
                key=lambda j: counts[j] - raw[j])
        counts[i] -= 1
    while sum(counts) < n_layers:
        i = max((j for j in range(len(counts)) if counts[j] < caps[j]),
                key=lambda j: raw[j] - counts[j])
        counts[i] += 1
    return counts


def kv_transfer_time_staged(pre: Deployment, dec: Deployment, n_tokens: float,
                            link_of: Callable[[int, int], Link], bits: int | None = None,
                            group: int | None = None) -> float:
    """KV hand-off of one request when every prefill stage sends its layers' KV to the decode
    stages holding the same layers, each stage pair over `link_of(stage_p, stage_d)`, all
    pairs in parallel: the max over overlapping pairs of alpha + bytes(overlap) / beta
    (HeroServe eqs. 14-15; ThunderServe eq. 1 when both sides have one stage)."""
    if pre.model.n_layers != dec.model.n_layers:
        raise SpecError("prefill and decode deployments serve different layer counts")
    per_layer = kv_transfer_bytes(pre.model, n_tokens, bits, group) / pre.model.n_layers
    worst = 0.0
    for p, (a0, a1) in enumerate(pre.layer_ranges()):
        for d, (b0, b1) in enumerate(dec.layer_ranges()):
            overlap = min(a1, b1) - max(a0, b0)
            if overlap > 0:
                worst = max(worst, link_of(p, d).transfer_time(per_layer * overlap))
    return worst


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
