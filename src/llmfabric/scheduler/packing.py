"""Packing a placement's replicas onto concrete nodes (first fit, largest TP first).

For power-of-two TP degrees this succeeds exactly when `placement.capacity_ok` holds; the
controller uses it to turn a placement into per-node assignments.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmfabric.scheduler.errors import InfeasibleError
from llmfabric.scheduler.placement import Group
from llmfabric.scheduler.problem import Pool


@dataclass(frozen=True, slots=True)
class Slot:
    """One engine replica on one node: `gpu_ids` are the node-local GPU indices it uses."""

    pool: str
    node: int  # index into the pool's nodes (and session_ids when given)
    model: str
    tp: int
    gpu_ids: tuple[int, ...]


def pack(pool: Pool, groups: list[Group]) -> list[Slot]:
    """Place every replica of `groups` (all in `pool`) on the pool's nodes."""
    free: list[list[int]] = [list(range(pool.gpus_per_node)) for _ in range(pool.nodes)]
    owner: list[str | None] = [None] * pool.nodes
    slots: list[Slot] = []
    for g in sorted(groups, key=lambda g: (-g.tp, g.model)):
        for _ in range(g.replicas):
            for n in range(pool.nodes):
                if len(free[n]) < g.tp:
                    continue
                if pool.exclusive_nodes and owner[n] not in (None, f"{g.model}/{g.tp}"):
                    continue
                # aligned block of tp GPUs (buddy style) keeps NVLink groups contiguous
                start = next((s for s in range(0, pool.gpus_per_node - g.tp + 1, g.tp)
                              if all(i in free[n] for i in range(s, s + g.tp))), None)
                if start is None:
                    continue
                ids = tuple(range(start, start + g.tp))
                free[n] = [i for i in free[n] if i not in ids]
                owner[n] = f"{g.model}/{g.tp}"
                slots.append(Slot(pool.name, n, g.model, g.tp, ids))
                break
            else:
                raise InfeasibleError(
                    f"cannot place a TP={g.tp} replica of {g.model} on pool {pool.name!r}; "
                    "the placement exceeds the pool (was it computed for another cluster?)")
    return slots
