"""PairMemo: what the orchestration's pair model can reuse between the tabu's evaluations."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from llmfabric.scheduler.phasesplit.problem import CloudCluster, PDWorkload
from llmfabric.sim.models import ModelSpec

Array = npt.NDArray[np.float64]


class PairMemo:
    """The per-replica and per-pair terms of D_ij, kept across the tabu's evaluations (its
    neighbours share most replicas): prefill times and decode capacities by cost model,
    KV-transfer times by the two replicas' stages (GPUs and layers). Used only with the
    model, workload, cluster and KV format it was made for (the KV-transfer rows depend on
    the model's bytes per token and layer)."""

    def __init__(
        self, cluster: CloudCluster, model: ModelSpec, workload: PDWorkload,
        kv_bits: int | None, kv_group: int,
    ) -> None:
        self.cluster, self.model, self.workload = cluster, model, workload
        self.kv = (kv_bits, kv_group)
        self.prefill: dict[int, tuple[object, Array]] = {}
        self.capacity: dict[tuple[int, int], tuple[object, float]] = {}
        self.transfer: dict[tuple[object, ...], Array] = {}

    def usable(
        self, cluster: CloudCluster, model: ModelSpec, workload: PDWorkload,
        kv_bits: int | None, kv_group: int,
    ) -> bool:
        return (cluster is self.cluster and model is self.model and workload is self.workload
                and (kv_bits, kv_group) == self.kv)
