"""Communicator Pool (Flying Serving §4.3): every aligned group of every allowed width is
created at start-up, by every rank, in the same order; a switch only selects a cached handle.

`group()` of anything else raises rather than building one on the critical path; `created()`
counts the process groups torch itself knows about (observable from /dtp_status), so a test
can prove none appears after start-up."""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributed as dist

from llmfabric.scheduler.switching import aligned_groups


class CommunicatorPool:
    def __init__(self, world: int, widths: Sequence[int]) -> None:
        self.world = world
        self._groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        for ranks in aligned_groups(world, widths):
            # every rank calls new_group for every group, members or not, in one order
            pg = dist.new_group(ranks=list(ranks), backend="gloo")
            if pg is not None and dist.get_rank() in ranks:
                self._groups[ranks] = pg

    def group(self, ranks: tuple[int, ...]) -> dist.ProcessGroup:
        try:
            return self._groups[ranks]
        except KeyError:
            raise RuntimeError(f"no pre-built communicator for {ranks}: only aligned groups "
                               "of the allowed widths exist") from None

    @staticmethod
    def created() -> int:
        """Process groups registered with torch.distributed (the world included)."""
        world = dist.distributed_c10d._world
        return len(world.pg_map)
