"""Real nodes in this process on loopback (TLS transport, gossip, SWIM; `local` preset), for
the tests that start, stop and restart whole nodes (test_node_resilience.py,
test_revocation_gossip.py)."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

from llmfabric.node.config import build_config
from llmfabric.node.daemon import Node
from llmfabric.testing.poll import wait_until


class LocalNodes:
    """Starts nodes under ROOT/NAME on ports of the system's choice; `admission(home)` gives
    the options that let a node in (a network secret, or a certificate it writes there).
    Leaving `async with` stops the nodes still running."""

    def __init__(self, root: pathlib.Path,
                 admission: Callable[[pathlib.Path], dict[str, Any]]) -> None:
        self.root = root
        self.admission = admission
        self.nodes: list[Node] = []

    async def start(self, name: str, **opts: Any) -> Node:
        home = self.root / name
        cfg = build_config({}, {
            "home": home, "listen": "127.0.0.1:0", "http_listen": "127.0.0.1:0",
            "preset": "local", "gpu": "cpu", **self.admission(home), **opts,
        })
        node = Node(cfg)
        self.nodes.append(node)
        await node.start()
        return node

    async def stop(self, node: Node) -> None:
        await node.stop(drain=False)
        self.nodes.remove(node)

    async def aclose(self) -> None:
        for node in self.nodes:
            await node.stop(drain=False)

    async def __aenter__(self) -> LocalNodes:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def eventually(check: Callable[[], bool], within: float, what: str) -> None:
    await wait_until(check, within, what, interval=0.1)
