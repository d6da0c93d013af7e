"""Failures the transport catches so it keeps running are logged with context and counted in
NetStats.errors (exported as llmfabric_net_errors): a message handler or a peer-lost callback
that raises, and a request handler that raises (the caller gets a 500, the node goes on)."""

from __future__ import annotations

import contextlib
import logging

import pytest

from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.net import TlsTransport


def transport() -> TlsTransport:
    return TlsTransport(NodeKey.generate(), PskAdmission("errors-test", b"s" * 32))


def test_a_failing_message_handler_is_logged_and_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    t = transport()
    got: list[bytes] = []

    def handler(src: str, payload: bytes) -> None:
        got.append(payload)
        if payload == b"boom":
            raise ValueError("handler bug")

    t.set_handler(handler)
    with caplog.at_level(logging.ERROR, logger="llmfabric.net.tls_transport"):
        t.on_datagram("sender-1", b"boom", None)
        t.on_datagram("sender-1", b"fine", None)  # the next message is handled as usual
    assert got == [b"boom", b"fine"] and t.stats.errors == {"message_handler": 1}
    [rec] = [r for r in caplog.records if "message handler failed" in r.getMessage()]
    assert "sender-1" in rec.getMessage() and rec.exc_info is not None


async def test_a_failing_request_handler_answers_500_and_is_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    a, b = transport(), transport()

    async def handler(req: object) -> object:
        raise RuntimeError("request handler bug")

    async with a, b:
        b.set_request_handler(handler)  # type: ignore[arg-type]
        a.add_peer(b.local_id, [b.listen_addr])  # type: ignore[list-item]
        with caplog.at_level(logging.ERROR, logger="llmfabric.net.serving"):
            resp = await a.request(b.local_id, "POST", "/v1/thing", (), b"{}", timeout=10)
            body = await resp.read()
            await resp.aclose()
    assert resp.status == 500 and b"request handler bug" in body
    assert b.stats.errors == {"request_handler": 1}
    [rec] = [r for r in caplog.records if "request handler failed" in r.getMessage()]
    assert "POST /v1/thing" in rec.getMessage() and a.local_id in rec.getMessage()


def test_a_message_handler_failing_on_every_message_logs_a_few_lines_not_a_flood(
        caplog: pytest.LogCaptureFixture) -> None:
    t = transport()

    def handler(src: str, payload: bytes) -> None:
        raise ValueError("handler bug")

    t.set_handler(handler)
    with caplog.at_level(logging.ERROR, logger="llmfabric.net.tls_transport"):
        for _ in range(100):  # (a peer resending the message that fails)
            t.on_datagram("sender-1", b"boom", None)
    assert t.stats.errors == {"message_handler": 100}
    logged = [r for r in caplog.records if "message handler failed" in r.getMessage()]
    assert len(logged) == 7  # the 1st, 2nd, 4th ... 64th
    assert "ValueError('handler bug')" in logged[0].getMessage()
    assert logged[0].exc_info and not logged[1].exc_info  # (the traceback once)
    assert "64 failure(s) so far" in logged[-1].getMessage()


async def test_request_handler_and_response_failures_log_a_few_lines_not_one_each(
        caplog: pytest.LogCaptureFixture) -> None:
    from llmfabric.net.messages import HandlerResponse

    a, b = transport(), transport()

    async def handler(req: object) -> object:
        if getattr(req, "path", "") == "/stream":
            async def body():  # type: ignore[no-untyped-def]
                yield b"x"
                raise ValueError("body bug")

            return HandlerResponse(200, (), body())
        raise RuntimeError("request handler bug")

    async with a, b:
        b.set_request_handler(handler)  # type: ignore[arg-type]
        a.add_peer(b.local_id, [b.listen_addr])  # type: ignore[list-item]
        with caplog.at_level(logging.ERROR, logger="llmfabric.net.serving"):
            for path in ["/v1/thing"] * 5 + ["/stream"] * 5:
                resp = await a.request(b.local_id, "GET", path, timeout=10)
                with contextlib.suppress(Exception):
                    await resp.read()
                await resp.aclose()
    assert b.stats.errors == {"request_handler": 5, "respond": 5}
    for what in ("request handler failed", "streaming the response"):
        logged = [r for r in caplog.records if what in r.getMessage()]
        assert len(logged) == 3, what  # the 1st, 2nd and 4th
        assert logged[0].exc_info and not logged[1].exc_info
    assert "ValueError('body bug')" in caplog.text
