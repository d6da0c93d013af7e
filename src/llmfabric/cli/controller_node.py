"""The node every in-fabric controller runs as (assigning, `--launcher slurm`, `--pd-plan`).

`controller_node(overrides, settle, clock)` builds a bare CPU Node from the overrides (a
bad config -> ClickException), starts it, optionally makes SIGTERM/SIGINT set `stop`, waits
`settle` seconds for gossip to fill the replica (if settle > 0, longer, up to MORE_SETTLE_S,
while the replica knows no other member yet; then a warning names the likely causes), and
yields a `ControllerNode`: the node, the current session's replica reader and the stop
event. On exit the signal handlers are removed and the node stops (no drain).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from llmfabric.clock import Clock
from llmfabric.untrusted import get_logger

if TYPE_CHECKING:
    from llmfabric.node.daemon import Node
    from llmfabric.node.serve.replica_reader import AgentReplicaReader


# A loaded machine may not finish the first exchange with a seed within `settle`: a plan
# made from a replica that holds only our own record decides on nothing (`--once` would
# print no decisions). So we wait on while nobody else is known, this long at most.
MORE_SETTLE_S = 30.0
_POLL_S = 0.2
log = get_logger(__name__)


async def settle_replica(clock: Clock, settle: float, knows_others: Callable[[], bool],
                         stop: asyncio.Event) -> float:
    """Sleep `settle` s, then on until `knows_others()` (at most MORE_SETTLE_S more, or until
    `stop` is set); returns the seconds waited in all. `settle` 0: no wait at all."""
    start = clock.now()
    await clock.sleep(settle)
    while settle > 0 and not knows_others() and not stop.is_set():
        if clock.now() - start >= settle + MORE_SETTLE_S:
            # Alone: the controller runs anyway and finds nothing to plan for. Say why it
            # may be alone (it waited in silence, then decided nothing).
            log.warning(
                "the controller knows no other member after %.0f s: check --bootstrap and the "
                "network secret or certificate, and give it its own --home (with another "
                "node's home, e.g. an ingress's ~/.llmfabric on this machine, it has that "
                "node's key and its bootstrap takes it for itself)", clock.now() - start)
            break
        await clock.sleep(_POLL_S)
    return clock.now() - start


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
        reader = current_session_reader(node)
        await settle_replica(clock, settle, lambda: any(
            r.session_id != reader.session_id for r in reader.live_records()), stop)
        yield ControllerNode(node, reader, stop)
    finally:
        for sig, previous in handled.items():  # the process's own handling again
            loop.remove_signal_handler(sig)
            if previous is not None:
                signal.signal(sig, previous)
        await node.stop(drain=False)
