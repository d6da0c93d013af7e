"""`llmfabric controller --launcher slurm --profile P`: grow and shrink a fleet of Slurm jobs.

The controller joins the fabric as a bare CPU member (as the assigning controller does),
reads the demand the ingress nodes publish for the profile's model from its own replica,
and each round lets launch.SlurmLauncher observe the queue, decide (launch/capacity.py) and
submit or cancel jobs of the profile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import pathlib
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import click

from llmfabric.cli.untrusted import configure_logging
from llmfabric.launch.errors import LaunchError
from llmfabric.launch.launcher import SlurmLauncher, capacity_config
from llmfabric.launch.profile import load_profile
from llmfabric.launch.slurm import Slurm
from llmfabric.registry.records import NodeRecord
from llmfabric.scheduler.observed import observed_workload


def run_launcher(profile_path: pathlib.Path, node_overrides: dict[str, Any],
                 interval: float, once: bool, settle: float) -> None:
    try:
        profile = load_profile(profile_path)
        capacity = capacity_config(profile)  # may run the simulator once
    except LaunchError as exc:
        raise click.ClickException(str(exc)) from None
    assert profile.controller is not None
    model = profile.controller.model
    configure_logging(logging.INFO, "%(asctime)s %(message)s")

    async def main() -> None:
        from llmfabric.cli.controller_node import controller_node
        from llmfabric.clock import SystemClock

        clock = SystemClock()
        async with controller_node(node_overrides, settle, clock) as ctl_node:
            live = ctl_node.reader.live_records

            def demand() -> float:
                workload, _ = observed_workload(live())
                load = workload.get(model)
                return load.arrival_rate if load is not None else 0.0

            node, provider = ctl_node.node, profile.fabric.provider
            trusted: Callable[[NodeRecord], bool] | None = None
            if node.config.operator_key and provider:  # (PSK: no identity binds a name)
                def trusted(rec: NodeRecord) -> bool:
                    return node.providers.identity(rec) == provider

            launcher = SlurmLauncher(Slurm(), profile, clock, demand, live,
                                     source=str(profile_path), interval_s=interval,
                                     capacity=capacity, trusted=trusted)
            if once:
                try:
                    decisions = await launcher.step()
                except LaunchError as exc:  # (not a login node, Slurm down: was a traceback)
                    raise click.ClickException(str(exc)) from None
                sys.stdout.write(json.dumps(
                    [{"kind": type(d).__name__, **asdict(d)} for d in decisions]) + "\n")
                return
            logging.info("launching %s jobs for %s (%g req/s each, %d..%d jobs)",
                         profile.job_name, model, launcher.config.capacity_rps,
                         launcher.config.min_jobs, launcher.config.max_jobs)
            await launcher.run(ctl_node.stop)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
