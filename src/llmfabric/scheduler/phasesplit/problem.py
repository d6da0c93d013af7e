"""ThunderServe's inputs: GPUs (id, type, host), the per-GPU-pair network, the workload with
its SLOs, and the search options (COMPANIONS.md §1.8)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from llmfabric.scheduler.errors import SpecError
from llmfabric.sim.hardware import DEFAULT_CATALOG, GPUCatalog, GPUSpec
from llmfabric.sim.linkmatrix import LinkMatrix
from llmfabric.sim.parallel import Link
from llmfabric.sim.results import SLO
from llmfabric.sim.topology import Topology


@dataclass(frozen=True, slots=True)
class GPU:
    id: int
    type: str
    host: str


@dataclass(frozen=True, eq=False)
class CloudCluster:
    """GPUs with ids 0..n-1 and their pairwise links (bandwidth bytes/s, latency s)."""

    gpus: tuple[GPU, ...]
    bandwidth: npt.NDArray[np.float64]
    latency_s: npt.NDArray[np.float64]
    catalog: GPUCatalog = DEFAULT_CATALOG  # where the GPU types are looked up
    _links: dict[tuple[tuple[int, ...], tuple[int, ...]], Link] = field(
        default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        n = len(self.gpus)
        if n == 0:
            raise SpecError("a cluster needs at least one GPU")
        if [g.id for g in self.gpus] != list(range(n)):
            raise SpecError("GPU ids must be 0..n-1 in order")
        for name, m in (("bandwidth", self.bandwidth), ("latency", self.latency_s)):
            if m.shape != (n, n):
                raise SpecError(f"the {name} matrix is {m.shape}, expected ({n}, {n})")
        off = ~np.eye(n, dtype=bool)
        if np.any(~(self.bandwidth[off] > 0)) or np.any(~np.isfinite(self.bandwidth[off])):
            raise SpecError("every GPU pair needs a finite bandwidth > 0")
        if np.any(self.latency_s[off] < 0) or np.any(~np.isfinite(self.latency_s[off])):
            raise SpecError("latencies must be finite and >= 0")

    @staticmethod
    def from_topology(topo: Topology, catalog: GPUCatalog = DEFAULT_CATALOG) -> CloudCluster:
        ids = topo.gpus()
        gpus = []
        for k, node in enumerate(ids):
            g = topo.gpu(node)
            gpus.append(GPU(k, g.gpu_type, g.host))
        links = LinkMatrix.from_topology(topo)
        return CloudCluster(tuple(gpus), _square(links.bandwidth, np.inf),
                            _square(links.latency_s, 0.0), catalog)

    @staticmethod
    def from_links(gpus: Sequence[GPU], links: LinkMatrix,
                   catalog: GPUCatalog = DEFAULT_CATALOG) -> CloudCluster:
        if links.shape != (len(gpus), len(gpus)):
            raise SpecError(f"the link matrix is {links.shape} but there are {len(gpus)} GPUs")
        return CloudCluster(tuple(gpus), _square(links.bandwidth, np.inf),
                            _square(links.latency_s, 0.0), catalog)

    def gpu_spec(self, gpu_type: str) -> GPUSpec:
        """The spec of a GPU type of this cluster (looked up in its catalog)."""
        return self.catalog.get(gpu_type)

    def link(self, a: Sequence[int], b: Sequence[int]) -> Link:
        """The slowest link between two GPU sets (ThunderServe: beta = min bandwidth)."""
        key = (tuple(a), tuple(b))
        got = self._links.get(key)
        if got is None:
            ix = np.ix_(np.asarray(key[0]), np.asarray(key[1]))
            got = Link(float(self.bandwidth[ix].min()), float(self.latency_s[ix].max()))
            self._links[key] = got
        return got

    def subset(self, keep: Sequence[int]) -> tuple[CloudCluster, dict[int, int]]:
        """The cluster restricted to `keep`, renumbered; returns the old -> new id map."""
        ids = sorted(set(keep))
        new = {old: k for k, old in enumerate(ids)}
        gpus = tuple(GPU(new[o], self.gpus[o].type, self.gpus[o].host) for o in ids)
        ix = np.ix_(ids, ids)
        return CloudCluster(gpus, self.bandwidth[ix], self.latency_s[ix], self.catalog), new


def _square(m: npt.NDArray[np.float64], diag: float) -> npt.NDArray[np.float64]:
    out = np.array(m, dtype=np.float64)
    np.fill_diagonal(out, diag)
    return out


@dataclass(frozen=True, eq=False)
class PDWorkload:
    """Arrival rate (req/s), a sample of request lengths, and the SLO."""

    rate: float
    in_lengths: npt.NDArray[np.int64]
    out_lengths: npt.NDArray[np.int64]
    slo: SLO = field(default_factory=SLO)

    def __post_init__(self) -> None:
        if not (self.rate > 0) or not np.isfinite(self.rate):
            raise SpecError("the arrival rate must be a finite number > 0")
        if len(self.in_lengths) == 0 or len(self.in_lengths) != len(self.out_lengths):
            raise SpecError("give matching, non-empty input and output length samples")
        if np.any(self.in_lengths < 1) or np.any(self.out_lengths < 1):
            raise SpecError("request lengths must be >= 1 token")

    @staticmethod
    def from_means(rate: float, mean_in: float, mean_out: float, *, cv: float = 0.5,
                   slo: SLO | None = None, n: int = 256, seed: int = 0) -> PDWorkload:
        """A seeded sample of `n` lengths, gamma-distributed around the means."""
        if mean_in < 1 or mean_out < 1 or cv < 0:
            raise SpecError("mean lengths must be >= 1 and cv >= 0")
        rng = np.random.default_rng(seed)

        def draw(mean: float) -> npt.NDArray[np.int64]:
            if cv == 0:
                return np.full(n, round(mean), dtype=np.int64)
            shape = 1 / cv**2
            return np.maximum(1, np.rint(rng.gamma(shape, mean / shape, n))).astype(np.int64)

        return PDWorkload(rate, draw(mean_in), draw(mean_out), slo or SLO())

    @staticmethod
    def from_samples(rate: float, in_lengths: npt.ArrayLike, out_lengths: npt.ArrayLike, *,
                     max_context: int | None = None, slo: SLO | None = None, n: int = 256,
                     seed: int = 0) -> PDWorkload:
        """A seeded draw (with replacement) of `n` (prompt, output) pairs from measured
        lengths, e.g. a trace. With `max_context`, each pair is made to fit the model's
        window as a serving front end must: the output is capped at max_context - 1, then
        the prompt cut to max_context - output (its oldest tokens dropped)."""
        ins = np.asarray(in_lengths, dtype=np.int64)
        outs = np.asarray(out_lengths, dtype=np.int64)
        if ins.ndim != 1 or ins.shape != outs.shape or len(ins) == 0:
            raise SpecError("give matching, non-empty 1-D input and output length samples")
        if n < 1:
            raise SpecError("n must be >= 1")
        if max_context is not None and max_context < 2:
            raise SpecError("max_context must be >= 2 tokens")
        idx = np.random.default_rng(seed).integers(0, len(ins), n)
        i, o = np.maximum(1, ins[idx]), np.maximum(1, outs[idx])
        if max_context is not None:
            o = np.minimum(o, max_context - 1)
            i = np.minimum(i, max_context - o)
        return PDWorkload(rate, i, o, slo or SLO())

    @property
    def mean_in(self) -> float:
        return float(np.mean(self.in_lengths))

    @property
    def mean_out(self) -> float:
        return float(np.mean(self.out_lengths))

    def scaled(self, rate: float) -> PDWorkload:
        return PDWorkload(rate, self.in_lengths, self.out_lengths, self.slo)


@dataclass(frozen=True, slots=True)
class TabuOptions:
    n_step: int = 100
    n_neigh: int = 10
    n_mem: int = 5
    seed: int = 0
    move_weights: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)
    evaluator: str = "analytic"
    pipelined_pp: bool = True
    allow_colocated: bool = False
    kv_bits: int | None = 4
    kv_group: int = 64
    orchestrate: bool = True   # False: routing proportional to capacity (Fig. 12 ablation)
    max_pp: int = 4
    # The simulator for the final plan: the `final_sim_top` best solutions by the analytic
    # evaluator (the start always among them) re-scored by the discrete-event simulator on
    # `final_sim_s` of arrivals (seed + 1: not the trace plans are judged on); 0: off.
    # A candidate whose queue grows over that window (stability.queue_trend) ranks below
    # every stable one; candidates are compared on the window's later half.
    final_sim_top: int = 0
    final_sim_s: float = 120.0
    # The stated headroom (stability.py): no replica loaded past this share of its capacity
    # by the routing LP; load beyond it counts as missed in the search's score.
    headroom: float = 0.8

    def __post_init__(self) -> None:
        if self.final_sim_top < 0 or not self.final_sim_s > 0:
            raise SpecError("final_sim_top >= 0 and final_sim_s > 0")
        if not 0 < self.headroom <= 1:
            raise SpecError("headroom must be in (0, 1]")
        if self.n_step < 0 or self.n_neigh < 1 or self.n_mem < 0:
            raise SpecError("n_step >= 0, n_neigh >= 1 and n_mem >= 0")
        if self.evaluator not in ("analytic", "sim"):
            raise SpecError("evaluator must be 'analytic' or 'sim'")
        if len(self.move_weights) != 4 or min(self.move_weights) < 0 or \
                sum(self.move_weights) <= 0:
            raise SpecError("move_weights: four weights >= 0 (flip, split, merge, move)")
        if not 1 <= self.max_pp <= 4:
            raise SpecError("max_pp must be in 1..4")
