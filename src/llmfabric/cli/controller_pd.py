"""`llmfabric controller --pd-plan plan.json`: ThunderServe's lightweight rescheduling.

The controller joins the fabric as a bare CPU member (as the assigning controller does),
loads a saved plan (`llmfabric plan pd --json`, with the same cluster inputs and
`--gpus-yaml`), binds the plan's GPUs to the live sessions serving the model
(scheduler/phasesplit/binding.py: `--label pd.gpus=...` on a node, else role + GPU type; on
certificate networks with `--provider P` only nodes whose verified provider is P), publishes
the plan's routing as the signed plan item of its own record, and then each round runs
`pd_decide`: a node of the plan
DOWN, LEFT, gone or suspected, or the ingresses' observed workload drifting past `--drift`,
flips phases (signed `/_fabric/v1/role` requests to the nodes over the peer protocol) and
publishes the new routing. Ingresses follow plans only from controllers they list with
`--controller PEER_ID`; nodes flip only for controllers they accept (`--accept-assignments`,
`--controller`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from llmfabric.cli.untrusted import configure_logging
from llmfabric.registry.records import NodeRecord

if TYPE_CHECKING:
    from llmfabric.node.daemon import Node


def run_pd_controller(plan_path: Path, cluster_path: Path | None, links_path: Path | None,
                      topology_path: Path | None, gpus_yaml: Path | None, model_id: str | None,
                      node_overrides: dict[str, Any], interval: float, drift: float,
                      once: bool, settle: float) -> None:
    from llmfabric import sim
    from llmfabric.cli.gpus_yaml import gpu_hint
    from llmfabric.scheduler.errors import SchedulerError
    from llmfabric.scheduler.phasesplit.inputs import load_cluster
    from llmfabric.scheduler.phasesplit.plan import plan_from_json

    try:
        # (a plan made with `plan pd --gpus-yaml` names GPUs only that file adds)
        catalog = (sim.load_gpus_yaml(gpus_yaml) if gpus_yaml is not None
                   else sim.DEFAULT_CATALOG)
        cluster = load_cluster(cluster_path, links_path, topology_path, catalog)
        plan = plan_from_json(json.loads(plan_path.read_text()), cluster)
    except (OSError, ValueError, KeyError, SchedulerError, sim.SimError) as exc:
        raise click.ClickException(gpu_hint(f"{plan_path}: {exc}", gpus_yaml=True)) from None
    model = model_id or plan.model.name
    configure_logging(logging.INFO, "%(asctime)s %(message)s")

    async def main() -> None:
        from llmfabric.cli.controller_node import controller_node
        from llmfabric.clock import SystemClock
        from llmfabric.controller.pd_executor import PeerPDExecutor
        from llmfabric.scheduler.phasesplit.binding import bind_sessions, observed_pd_workload
        from llmfabric.scheduler.phasesplit.controller import (
            PDController,
            PDControllerConfig,
            current_routing,
        )

        clock = SystemClock()
        async with controller_node(node_overrides, settle, clock) as ctl_node:
            node, reader = ctl_node.node, ctl_node.reader
            trusted = _own_provider(node)
            notes: list[str] = []
            binding = bind_sessions(plan, reader.live_records(), model, trusted, notes)
            for note in notes:
                logging.warning("%s", note)
            if not binding.gpus:
                raise click.ClickException(f"no live node serves {model!r}; nothing to bind "
                                           "the plan to")
            unbound = sorted(set(range(len(plan.cluster.gpus)))
                             - {g for ids in binding.gpus.values() for g in ids})
            if unbound:
                logging.warning("plan GPUs %s have no live session (no matching node)",
                                unbound)

            def publish(item: bytes) -> None:
                node.session.update_self(node.meta(pd_plan=item))

            executor = PeerPDExecutor(node.transport, reader.peer_of, model, publish)
            await executor.apply(current_routing(plan, binding))
            if once:
                sys.stdout.write(json.dumps({
                    "controller": node.key.peer_id, "plan_id": plan.plan_id, "model": model,
                    "binding": {s: list(g) for s, g in binding.gpus.items()},
                    "unbound_gpus": unbound, "failures": executor.failures}, indent=2) + "\n")
                return
            logging.info("PD controller %s: plan %s for %s, %d sessions bound",
                         node.key.peer_id, plan.plan_id, model, len(binding.gpus))
            ctl = PDController(
                plan, binding, reader.records_with_suspicion,
                lambda: observed_pd_workload(reader.live_records(), model, plan, trusted),
                executor,
                clock, PDControllerConfig(drift_threshold=drift, interval_s=interval))
            await ctl.run(ctl_node.stop)  # (SIGTERM/SIGINT set stop; a bug ends it loudly)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


def _own_provider(node: Node) -> Callable[[NodeRecord], bool]:
    """Which records the controller binds and reads demand from: on certificate networks
    with `--provider P` (the node's config.provider) those whose verified provider is P
    (labels and demand are claims any member can make); without it, or on PSK networks,
    where no identity binds a provider name, every record."""
    provider = node.config.provider
    if provider and not node.config.operator_key:
        logging.warning("--provider %r: on a network without certificates no identity binds "
                        "a provider name, so the PD controller binds every live record",
                        provider)
    if not (node.config.operator_key and provider):
        return lambda _rec: True
    return lambda rec: node.providers.identity(rec) == provider
