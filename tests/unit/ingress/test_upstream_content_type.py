"""A hostile node's Content-Type never reaches the client: the ingress serves the dashboard on
the same origin, so a relayed `text/html` answer would run the node's script there."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmfabric.front.fast_wire import response_head
from llmfabric.front.front_limits import safe_content_type
from llmfabric.front.web_app import build_ingress_app
from llmfabric.ingress import IngressConfig, StaticCandidateSource, Timeouts
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing import Candidate
from llmfabric.telemetry.node_hop import NO_HOP

pytestmark = [pytest.mark.unit, pytest.mark.hostile]

PAGE = b"<html><script>fetch('/v1/fabric/records').then(r => r.text()).then(steal)</script>"


class _HtmlUpstream:
    status = 200
    hop = NO_HOP

    def __init__(self, content_type: str) -> None:
        self.content_type = content_type

    async def read(self) -> bytes:
        return PAGE

    async def read_capped(self, limit: int) -> bytes:
        return PAGE

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        yield PAGE

    def socket_relay(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


class _HostileNode:
    enforces_timeouts = False

    def __init__(self, content_type: str) -> None:
        self.content_type = content_type

    async def open(self, candidate: Candidate, path: str, body: bytes,
                   timeouts: Timeouts) -> _HtmlUpstream:
        return _HtmlUpstream(self.content_type)

    async def aclose(self) -> None:
        return None


def _cand() -> Candidate:
    return Candidate("evil", "peer-evil", "p", "127.0.0.1:1", (), Hardware("A100", 1),
                     ServedModel("m"), LoadHints())


@pytest.mark.parametrize("ctype", ["text/html", "Text/HTML; charset=utf-8", "image/svg+xml",
                                   "application/xhtml+xml", "", "unknown/unknown"])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_cross_site_form_post_gets_no_html_from_a_hostile_node(ctype: str,
                                                                      stream: bool) -> None:
    # A page submits a form (enctype text/plain, no preflight, no key) to an ingress without
    # auth; the hostile node that serves the model answers with a page. (From another site
    # the POST is refused now: test_front_host_guard.py; the page's own origin, the chat
    # playground, still must never get a page back.)
    app = build_ingress_app(IngressConfig(node_id="i", auth_enabled=False),
                            StaticCandidateSource([_cand()]), _HostileNode(ctype),
                            serve_metrics=False)
    client: TestClient[web.Request, web.Application] = TestClient(TestServer(app))
    await client.start_server()
    try:
        form = ('{"model":"m","messages":[{"role":"user","content":"hi"}],'
                f'"stream":{"true" if stream else "false"},"x":"="}}')
        resp = await client.post("/v1/chat/completions", data=form,
                                 headers={"Content-Type": "text/plain"})
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/octet-stream")
    finally:
        await client.close()


def test_the_lean_front_head_names_no_active_type() -> None:
    head = bytes(response_head(200, "text/html; charset=utf-8", "evil", None, False))
    assert b"Content-Type: application/octet-stream\r\n" in head


def test_api_types_pass_unchanged() -> None:
    for ctype in ("application/json", "application/json; charset=utf-8", "text/event-stream",
                  "text/event-stream; charset=utf-8", "text/plain; version=0.0.4",
                  "application/x-ndjson"):
        assert safe_content_type(ctype) == ctype
    assert safe_content_type("text/html\r\nSet-Cookie: a=b") == "application/octet-stream"
