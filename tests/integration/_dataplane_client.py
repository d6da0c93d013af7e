"""A test-side data-plane client: joins a PSK fabric as a member (its own node key) and
sends one forwarded request to a node the way an ingress does (session exchange over the
peer network, then pinned HTTPS with a per-request authorization)."""

from __future__ import annotations

import asyncio

from llmfabric.forward.raw import RawHttpForwarder
from llmfabric.forward.secure import DataPlaneSessions, PinnedHttpsForwarder
from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.paths import FORWARD_PREFIX
from llmfabric.net import TlsTransport, TransportConfig
from llmfabric.net.handshake import client_ssl_context
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate


async def forward_once(secret: str, peer_addr: str, path: str, body: bytes, *,
                       network: str = "default", http_host: str = "127.0.0.1") -> int:
    """The status the node at `peer_addr` answers to one authorized forwarded request."""
    key = NodeKey.generate()
    t = TlsTransport(key, PskAdmission(network, secret.encode()), TransportConfig(host=None))
    async with t:
        peer = await t.connect_bootstrap(peer_addr)
        fwd = PinnedHttpsForwarder(DataPlaneSessions(key, t),
                                   RawHttpForwarder(FORWARD_PREFIX, ssl=client_ssl_context()))
        cand = Candidate(session_id="test", peer_id=peer, provider_id="p",
                         http_addr=f"{http_host}:1", relays=(), hardware=Hardware(),
                         model=ServedModel("m"), load=LoadHints())
        try:
            up = await fwd.open(cand, path, body, Timeouts(5, 10, 10, 20))
            await up.read()
            await up.aclose()
            return up.status
        finally:
            await fwd.aclose()


def forward_status(secret: str, peer_addr: str, path: str, body: bytes) -> int:
    return asyncio.run(forward_once(secret, peer_addr, path, body))
