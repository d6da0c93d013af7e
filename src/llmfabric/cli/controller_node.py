"""The node every in-fabric controller runs as (assigning, `--launcher slurm`, `--pd-plan`).

`controller_node(overrides, settle, clock)` builds a bare CPU Node from the overrides (a
bad config -> ClickException), starts it, optionally makes SIGTERM/SIGINT set `stop`, waits
`settle` seconds for gossip to fill the replica, and yields a `ControllerNode`: the node,
the current session's replica reader and the stop event. On exit the signal handlers are
removed and the node stops (no drain).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from llmfabric.clock import Clock

if TYPE_CHECKING:
    from llmfabric.node.daemon import Node
    from llmfabric.node.serve.replica_reader import AgentReplicaReader


@dataclass
class ControllerNode:
    node: Node
    reader: AgentReplicaReader  # reads the current session: survives an eviction -> rejoin
    stop: asyncio.Event  # set by SIGTERM/SIGINT when `signals` was asked for


@contextlib.asynccontextmanager
async def controller_node(
    overrides: dict[str, Any], settle: float, clock: Clock, *, signals: bool = True
) -> AsyncIterator[ControllerNode]:
    from llmfabric.node.config import ConfigError, build_config
    from llmfabric.node.daemon import Node, NodeError
    from llmfabric.node.serve.replica_reader import current_session_reader

    try:
        node = Node(build_config({}, overrides))
    except (ConfigError, NodeError) as exc:
        raise click.ClickException(str(exc)) from None
    await node.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)} \
        if signals else {}
    for sig in handled:
        loop.add_signal_handler(sig, stop.set)
    try:
        await clock.sleep(settle)
        yield ControllerNode(node, current_session_reader(node), stop)
    finally:
        for sig, previous in handled.items():  # the process's own handling again
            loop.remove_signal_handler(sig)
            if previous is not None:
                signal.signal(sig, previous)
        await node.stop(drain=False)
