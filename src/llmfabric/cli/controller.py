"""`llmfabric controller`: the fleet controller loop, reading the registry through a node.

    llmfabric controller --node http://127.0.0.1:8080 --workload workload.yaml --once

It polls the node's read-only /v1/fabric/nodes view, plans for idle (bare, JOIN) nodes and
prints/logs each decision with the engine command it implies. This command is a dry run: the
executor that sends assignments to node agents is wired by the node package.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from llmfabric.registry.records import (
    Hardware,
    Lifecycle,
    NodeMeta,
    NodeRecord,
    ServedModel,
)


def record_from_view(view: dict[str, Any]) -> NodeRecord | None:
    """A NodeRecord from a /v1/fabric/nodes entry (None for suspected or malformed ones)."""
    try:
        if view.get("suspected"):
            return None
        hw = view.get("hardware") or {}
        meta = NodeMeta(
            provider_id=str(view.get("provider_id", "")),
            hardware=Hardware(str(hw.get("gpu_model", "cpu")), int(hw.get("gpu_count", 0)),
                              float(hw.get("gpu_memory_gb", 0.0)),
                              str(hw.get("interconnect", "none"))),
            engine=str(view.get("engine", "")),
            models=tuple(ServedModel(str(m["id"])) for m in view.get("models", [])),
        )
        return NodeRecord(str(view["session_id"]), str(view.get("peer_id", "")), b"",
                          Lifecycle[str(view["state"])], int(view.get("incarnation", 0)),
                          int(view.get("version", 0)), float(view.get("updated_at", 0.0)), meta)
    except (KeyError, ValueError, TypeError):
        return None


async def _fetch(url: str) -> list[NodeRecord]:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(
            url.rstrip("/") + "/v1/fabric/nodes") as resp:
        resp.raise_for_status()
        body = await resp.json()
    return [r for r in (record_from_view(v) for v in body.get("nodes", [])) if r is not None]


@click.command(name="controller")
@click.option("--node", "node_url", required=True,
              help="HTTP address of any node, e.g. http://127.0.0.1:8080")
@click.option("--workload", "workload_path", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="workload YAML (until ingress statistics are wired in)")
@click.option("--template", type=click.Choice(["sim", "vllm", "sglang"]), default="sim",
              show_default=True)
@click.option("--policy", type=click.Choice(["cpsat", "greedy", "memp"]), default="cpsat",
              show_default=True)
@click.option("--interval", type=click.FloatRange(min=0.1), default=30.0, show_default=True)
@click.option("--drift", type=click.FloatRange(min=0.0), default=0.25, show_default=True,
              help="relative arrival-rate change that triggers a new plan")
@click.option("--reclaim", is_flag=True, help="also re-plan nodes that are already serving")
@click.option("--once", is_flag=True, help="one round; print the decisions as JSON and exit")
def command(node_url: str, workload_path: Path, template: str, policy: str, interval: float,
            drift: float, reclaim: bool, once: bool) -> None:
    """Fill idle nodes with models (dry run: decisions are logged, not executed)."""
    from llmfabric.clock import SystemClock
    from llmfabric.scheduler.controller import ControllerConfig, FleetController
    from llmfabric.scheduler.decisions import LoggingExecutor
    from llmfabric.scheduler.errors import SchedulerError
    from llmfabric.scheduler.simadapter import SimPerformance
    from llmfabric.scheduler.spec import load_workload

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        workload = load_workload(workload_path)
    except SchedulerError as e:
        raise click.ClickException(str(e)) from None
    latest: list[NodeRecord] = []
    executor = LoggingExecutor()
    config = ControllerConfig(policy=policy, template=template, drift_threshold=drift,
                              reclaim=reclaim, interval_s=interval)
    clock = SystemClock()
    ctl = FleetController(lambda: latest, lambda: workload, executor,
                          SimPerformance.for_workload(workload), clock, config)

    async def main() -> None:
        while True:
            try:
                latest[:] = await _fetch(node_url)
                decisions = await ctl.step()
            except SchedulerError as e:
                logging.error("placement round failed: %s", e)
                decisions = []
            except OSError as e:
                raise click.ClickException(f"cannot read {node_url}: {e}") from None
            if once:
                sys.stdout.write(json.dumps(
                    [{"kind": type(d).__name__, **asdict(d)} for d in decisions], indent=2) + "\n")
                return
            await clock.sleep(interval)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
