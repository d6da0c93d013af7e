"""Peers' answers that end up in a message or the log are read up to a bound: a relay's
refusal of a registration, its dial-back answer, a link probe's answer. A hostile peer's
megabytes are not buffered (the stream is reset past the bound) and a log line carries at
most a couple of hundred characters of its text."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgpack
import pytest

from llmfabric.clock import SystemClock
from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.net import TlsTransport, TransportConfig
from llmfabric.net.messages import BodyStream, PeerResponse

pytestmark = pytest.mark.hostile


class Body:
    """A response body as the h2 session delivers it; records an abort."""

    def __init__(self, *chunks: bytes) -> None:
        self.aborted = False
        self.stream = BodyStream(lambda _n: None, self._abort)
        for chunk in chunks:
            self.stream.push((chunk, len(chunk)))
        self.stream.push(None)

    def _abort(self) -> None:
        self.aborted = True


def _transport() -> TlsTransport:
    return TlsTransport(NodeKey.generate(), PskAdmission("bounds-test", b"s" * 32),
                        TransportConfig(relay=False))


def _answering(t: TlsTransport, status: int, body: Body) -> None:
    async def request(*_a: Any, **_k: Any) -> PeerResponse:
        return PeerResponse(status, (), body.stream, "peer")

    t.request = request  # type: ignore[method-assign]


HUGE = (b"E" * 65536,) * 64  # 4 MiB


async def test_a_dial_back_answer_is_read_up_to_64_kib() -> None:
    t = _transport()
    body = Body(*HUGE)
    _answering(t, 200, body)
    got = await t.relay.check_reachability("relay", "127.0.0.1:1")
    assert not got.ok and body.aborted and len(got.reason) < 300


async def test_a_dial_back_reason_is_clipped() -> None:
    t = _transport()
    _answering(t, 200, Body(msgpack.packb({"ok": False, "reason": "R" * 60_000})))
    got = await t.relay.check_reachability("relay", "127.0.0.1:1")
    assert not got.ok and len(got.reason) < 300 and got.reason.endswith("R" * 100)


async def test_a_relay_s_refusal_is_read_up_to_64_kib(caplog: pytest.LogCaptureFixture) -> None:
    t = _transport()
    body = Body(*HUGE)
    _answering(t, 403, body)

    async def ensure_conn(_peer: str) -> object:
        return object()

    class Stop(Exception):
        pass

    class Clock(SystemClock):
        async def sleep(self, _s: float) -> None:
            raise Stop

    t._ensure_conn = ensure_conn  # type: ignore[method-assign]
    t.clock = Clock()  # type: ignore[misc]
    with caplog.at_level(logging.INFO, "llmfabric.net"), pytest.raises(Stop):
        await t.relay._maintain("relay")
    [line] = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
    assert body.aborted and len(line) < 400


async def test_a_link_probe_answer_is_not_read_past_4_kib() -> None:
    from llmfabric.net import NetError
    from llmfabric.net.link_service import LinkService

    t = _transport()
    body = Body(*HUGE)
    _answering(t, 204, body)
    svc = LinkService(t, SystemClock(), lambda: [])
    with pytest.raises(NetError):
        await asyncio.wait_for(svc.probe("peer", 1024), 10)
    assert body.aborted
