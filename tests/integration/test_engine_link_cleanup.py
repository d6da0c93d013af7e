"""A forwarded request's engine connection and in-flight count are released on every path:
the caller resets the stream before the body's first byte (the response body is closed
unread), or while the engine has not answered yet (the handler is cancelled), also on the
sealed data-plane path. Before, each such request left an open engine connection and an
in-flight count that a drain (SIGTERM) waits on for good."""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web

from llmfabric.agent import InflightTracker
from llmfabric.clock import SystemClock
from llmfabric.dataplane.authz import AUTH_HEADER, authorize
from llmfabric.dataplane.exchange import SESSION_PATH, finish, offer
from llmfabric.dataplane.sealing import seal_body
from llmfabric.forward.engine_proxy import EngineProxy
from llmfabric.identity import NodeKey
from llmfabric.ingress.paths import FORWARD_PREFIX
from llmfabric.net import PeerRequest
from llmfabric.net.messages import BodyStream, Headers
from llmfabric.net.ports import free_port
from llmfabric.node.config import NodeConfig
from llmfabric.node.engine_link import EngineLink
from llmfabric.node.serve.dataplane_server import DataPlaneServer

from ._sim_engine_proc import sim_command

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("error::ResourceWarning")]

PATH = FORWARD_PREFIX + "/v1/chat/completions"
BODY = orjson.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]})


class StuckEngine:
    """Streams one chunk then keeps writing until the node hangs up ("stream"), or never
    answers ("silent"); `asked` when a request came, `gone` when the node closed it."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.asked = asyncio.Event()
        self.gone = asyncio.Event()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.asked.set()
        if self.mode == "silent":
            try:
                await asyncio.Event().wait()
            finally:
                self.gone.set()  # (aiohttp cancels the handler when the client leaves)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            while True:
                await resp.write(b'data: {"x": 1}\n\n')
                await asyncio.sleep(0.02)
        except (ConnectionError, asyncio.CancelledError):
            self.gone.set()
            raise


@pytest.fixture
async def stuck(request: pytest.FixtureRequest) -> AsyncIterator[tuple[StuckEngine, str]]:
    engine = StuckEngine(request.param)
    app = web.Application(handler_args={"handler_cancellation": True})
    app.router.add_post("/v1/chat/completions", engine.chat)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield engine, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _link(tmp_path: pathlib.Path, base: str) -> EngineLink:
    config = NodeConfig(home=tmp_path, process=tuple(sim_command(free_port())))
    link = EngineLink(config, SystemClock(), InflightTracker())
    link.proxy = EngineProxy(base)  # (the engine process itself is not needed here)
    return link


@pytest.mark.parametrize("stuck", ["stream"], indirect=True)
async def test_a_body_closed_unread_releases_the_engine_and_the_inflight_count(
    tmp_path: pathlib.Path, stuck: tuple[StuckEngine, str]
) -> None:
    engine, base = stuck
    link = await _link(tmp_path, base)
    try:
        resp = await link.serve_body(PATH, BODY)
        assert resp.status == 200 and link.inflight.inflight == 1
        await resp.body.aclose()  # type: ignore[union-attr]  # what a reset stream does
        assert link.inflight.inflight == 0
        await asyncio.wait_for(engine.gone.wait(), 20)  # the engine connection was closed
    finally:
        await link.proxy.aclose()  # type: ignore[union-attr]


@pytest.mark.parametrize("stuck", ["silent"], indirect=True)
async def test_a_cancel_before_the_engine_answers_ends_the_inflight_count(
    tmp_path: pathlib.Path, stuck: tuple[StuckEngine, str]
) -> None:
    engine, base = stuck
    link = await _link(tmp_path, base)
    try:
        task = asyncio.create_task(link.serve_body(PATH, BODY))
        await engine.asked.wait()
        assert link.inflight.inflight == 1
        task.cancel()  # (what the peer transport does when the caller resets the stream)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert link.inflight.inflight == 0
        await asyncio.wait_for(engine.gone.wait(), 20)
    finally:
        await link.proxy.aclose()  # type: ignore[union-attr]


def _peer_request(peer: str, path: str, headers: Headers, body: bytes) -> PeerRequest:
    stream = BodyStream(ack=lambda _n: None, on_abort=lambda: None)
    stream.push((body, len(body)))
    stream.push(None)
    return PeerRequest(peer, "POST", path, headers, stream)


@pytest.mark.parametrize("stuck", ["stream"], indirect=True)
async def test_a_sealed_body_closed_after_its_head_releases_the_engine(
    tmp_path: pathlib.Path, stuck: tuple[StuckEngine, str]
) -> None:
    engine, base = stuck
    link = await _link(tmp_path, base)
    prov_key, ing_key = NodeKey.generate(), NodeKey.generate()
    dp = DataPlaneServer(prov_key, lambda: link, lambda _p: False, max_body_bytes=1 << 20)
    try:
        sent = offer(ing_key, prov_key.peer_id)
        got = await dp.handle_session(
            _peer_request(ing_key.peer_id, SESSION_PATH, (), sent.message)
        )
        assert got.status == 200 and isinstance(got.body, bytes)
        s = finish(sent, got.body, time.time())
        header, rid = authorize(s, PATH.encode(), b"", time.time())
        prefix = header[: header.rindex(b".")]
        sealed = seal_body(s.key, rid, prefix + b"\n" + PATH.encode(), BODY)
        resp = await dp.handle_sealed(
            _peer_request(ing_key.peer_id, PATH, ((AUTH_HEADER.lower(), header.decode()),), sealed)
        )
        assert resp.status == 200 and link.inflight.inflight == 1
        frames = resp.body
        assert not isinstance(frames, bytes)
        it = aiter(frames)
        await anext(it)  # the head frame: the engine's body is not read yet
        await it.aclose()  # type: ignore[attr-defined]  # the caller reset the stream here
        assert link.inflight.inflight == 0
        await asyncio.wait_for(engine.gone.wait(), 20)
    finally:
        await link.proxy.aclose()  # type: ignore[union-attr]
