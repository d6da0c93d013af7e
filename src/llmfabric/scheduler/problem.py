"""The placement problem's inputs: GPU pools (the cluster) and per-model workloads.

A *pool* is a set of identical nodes: one GPU type, the same GPU count per node and the same
interconnect. Tensor parallelism stays inside one node, so a pool's node size bounds TP. When
`exclusive_nodes` is set, a node hosts replicas of one model only (one engine per node), so a
model's allocation in that pool is a multiple of the node size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmfabric.scheduler.errors import SpecError

TP_DEGREES: tuple[int, ...] = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class Pool:
    name: str  # unique; defaults to the GPU type
    gpu_type: str
    nodes: int
    gpus_per_node: int
    interconnect: str = "nvlink"
    cost_per_gpu_hour: float = 0.0
    exclusive_nodes: bool = False
    # The registry session id of each node (len == nodes) when the pool comes from the fleet.
    session_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.nodes < 0 or self.gpus_per_node < 1:
            raise SpecError(
                f"pool {self.name!r}: nodes must be >= 0 and gpus_per_node >= 1 "
                f"(got {self.nodes}, {self.gpus_per_node})"
            )
        if self.session_ids and len(self.session_ids) != self.nodes:
            raise SpecError(f"pool {self.name!r}: {len(self.session_ids)} session ids for "
                            f"{self.nodes} nodes; give one per node or none")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def tp_options(self) -> tuple[int, ...]:
        return tuple(t for t in TP_DEGREES if t <= self.gpus_per_node)


@dataclass(frozen=True, slots=True)
class Cluster:
    pools: tuple[Pool, ...]

    def __post_init__(self) -> None:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise SpecError(f"pool names must be unique, got {names}")

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({p.gpu_type for p in self.pools}))

    def pool(self, name: str) -> Pool:
        for p in self.pools:
            if p.name == name:
                return p
        raise SpecError(f"no pool named {name!r}; pools are {[p.name for p in self.pools]}")


@dataclass(frozen=True, slots=True)
class ModelLoad:
    """One model's workload: Poisson arrivals, token-length means (and optional spreads)."""

    model: str
    arrival_rate: float  # requests per second
    mean_in: float
    mean_out: float
    std_in: float = 0.0
    std_out: float = 0.0
    slo_e2e_s: float = 0.0  # 0 = no SLO for this model

    def __post_init__(self) -> None:
        if self.arrival_rate < 0 or self.mean_in < 0 or self.mean_out < 1:
            raise SpecError(
                f"workload {self.model!r}: need arrival_rate >= 0, mean_in >= 0, mean_out >= 1 "
                f"(got {self.arrival_rate}, {self.mean_in}, {self.mean_out})"
            )


@dataclass(frozen=True, slots=True)
class Workload:
    loads: tuple[ModelLoad, ...]

    def __post_init__(self) -> None:
        names = [m.model for m in self.loads]
        if len(set(names)) != len(names):
            raise SpecError(f"each model appears once in a workload, got {names}")

    @property
    def total_rate(self) -> float:
        return sum(m.arrival_rate for m in self.loads)

    def get(self, model: str) -> ModelLoad | None:
        for m in self.loads:
            if m.model == model:
                return m
        return None


@dataclass(frozen=True, slots=True)
class FixedGroup:
    """Replicas already running (not reclaimed): they take load but use no pool capacity."""

    model: str
    gpu_type: str
    tp: int
    replicas: int
    session_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Problem:
    cluster: Cluster
    workload: Workload
    fixed: tuple[FixedGroup, ...] = field(default=())
