"""A member that breaks the HTTP/2 limits on a real TLS peer connection (net/h2limits.py):
it announces a 16 MiB frame and streams the bytes. The target closes that connection at
the frame's header, having read little of it, while another member's requests to the same
target keep being answered."""

from __future__ import annotations

import asyncio

import pytest

from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.net import HandlerResponse, PeerRequest, TlsTransport
from llmfabric.net.framing import FrameType

pytestmark = pytest.mark.hostile


def psk() -> PskAdmission:
    return PskAdmission("test", b"s" * 32)


async def test_an_oversized_h2_frame_closes_only_the_attackers_connection() -> None:
    target, honest, attacker = (TlsTransport(NodeKey.generate(), psk()) for _ in range(3))

    async def serve(req: PeerRequest) -> HandlerResponse:
        return HandlerResponse(200, (), b"ok " + await req.read())

    async with target, honest, attacker:
        target.set_request_handler(serve)
        await honest.connect_bootstrap(target.listen_addr or "")
        await attacker.connect_bootstrap(target.listen_addr or "")
        resp = await attacker.request(target.local_id, "POST", "/x", (), b"hi", timeout=5)
        assert await resp.read() == b"ok hi"  # the attacker is an admitted member
        conn = attacker.connection(target.local_id)
        assert conn is not None
        before = target.stats.bytes_received
        # A DATA frame header stating 16 MiB - 1 on a new stream id, then the bytes, in the
        # transport's own frames (1 MiB at most each), while the honest member calls.
        conn.send_frame(FrameType.H2_TO_SERVER, b"\xff\xff\xff\x00\x00\x00\x00\x00\x63")
        piece = b"\0" * (1 << 20)
        for _ in range(16):
            if not conn.send_frame(FrameType.H2_TO_SERVER, piece):
                break
            await conn.drain()
            got = await honest.request(target.local_id, "POST", "/y", (), b"me", timeout=5)
            assert await got.read() == b"ok me"
        async with asyncio.timeout(10):
            while target.connection(attacker.local_id) is not None:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        # Refused at the header: what the target read of the 16 MiB is what was in flight.
        assert target.stats.bytes_received - before < 4 << 20
        assert target.stats.dropped["garbled"] >= 1
        for _ in range(3):  # the honest member is unaffected
            got = await honest.request(target.local_id, "POST", "/z", (), b"still", timeout=5)
            assert (got.status, await got.read()) == (200, b"ok still")
