"""DNS rebinding and cross-site requests at both fronts (front/host_check.py): a page on
an attacker's domain resolved to 127.0.0.1 sends its own name in Host (421); a form on another
site posting to an ingress without keys says so in Sec-Fetch-Site or Origin (403). API clients
(no Origin, an IP or a configured name) are served; with API keys the OpenAI routes answer
any name. Real sockets on loopback: a mock engine, the lean front (alone, and handing other
paths to a node-like aiohttp app with the dashboard) and the aiohttp ingress app."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import orjson
import pytest
from aiohttp import web

from llmfabric.dashboard import add_dashboard_routes
from llmfabric.forward import HttpForwarder
from llmfabric.front import add_ingress_routes
from llmfabric.front.fast_front import FastFront
from llmfabric.front.host_check import HostGuard
from llmfabric.front.web_app import build_ingress_app, host_middleware
from llmfabric.ingress import Ingress, IngressConfig, StaticCandidateSource
from llmfabric.node.config import build_config
from llmfabric.node.daemon import Node
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate
from llmfabric.tenancy.accounts_auth import StaticKeys

from .test_ingress_support import Backend, serve

pytestmark = [pytest.mark.integration, pytest.mark.hostile]

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
KEY = "sk-test"
EVIL = "rebind.evil.example:8090"


@dataclass
class Env:
    port: int
    keyed: bool
    engine: Backend


def _request(method: str, path: str, host: str, body: bytes = b"", extra: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{extra}"
    if method == "POST":
        head += f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


async def _call(port: int, method: str, path: str, host: str, body: bytes = b"",
                extra: str = "") -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request(method, path, host, body, extra))
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    if b"transfer-encoding: chunked" in head.lower():  # (aiohttp's streamed answers)
        body_out = b""
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size, 16)
            body_out, rest = body_out + rest[:n], rest[n + 2:]
        rest = body_out
    return status, rest


Closer = Callable[[], Awaitable[None]]


async def _lean(ingress: Ingress, keyed: bool) -> tuple[int, Closer]:
    front = FastFront(ingress, serve_metrics=True, hosts=HostGuard(["api.example.org"]))
    return await front.start("127.0.0.1", 0), front.aclose


async def _node(ingress: Ingress, keyed: bool) -> tuple[int, Closer]:
    # What a fabric ingress node runs on its HTTP port (node/daemon.py, ingress_link.py).
    hosts = HostGuard(["api.example.org"])
    app = web.Application(middlewares=[host_middleware(hosts, keyed)])

    async def nodes(_: web.Request) -> web.Response:
        return web.json_response({"nodes": [{"session_id": "s"}]})

    app.router.add_get("/v1/fabric/nodes", nodes)
    add_ingress_routes(app, ingress)
    add_dashboard_routes(app)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    assert runner.server is not None
    front = FastFront(ingress, serve_metrics=False, fallback=runner.server, hosts=hosts)
    port = await front.start("127.0.0.1", 0)

    async def close() -> None:
        await front.aclose()
        await runner.cleanup()

    return port, close


async def _aiohttp(ingress: Ingress, keyed: bool) -> tuple[int, Closer]:
    app = build_ingress_app(ingress.config, ingress.source, HttpForwarder(), ingress.auth,
                            hosts=HostGuard(["api.example.org"]))
    runner = await serve(app, 0)
    port = runner.addresses[0][1]
    return port, runner.cleanup


@pytest.fixture(params=[(_lean, False), (_lean, True), (_node, False), (_node, True),
                        (_aiohttp, False), (_aiohttp, True)],
                ids=["lean", "lean-keys", "node", "node-keys", "aiohttp", "aiohttp-keys"])
async def env(request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    kind, keyed = request.param
    backend = Backend("b0")
    engine = await serve(backend.app(), 0)
    cand = Candidate("node-b0", "", "p", f"127.0.0.1:{engine.addresses[0][1]}", (),
                     Hardware("H100", 1), ServedModel("m"), LoadHints())
    forwarder = HttpForwarder()
    auth = StaticKeys({KEY: "k1"}) if keyed else None
    ingress = Ingress(IngressConfig(max_retries=0, auth_enabled=keyed),
                      StaticCandidateSource([cand]), forwarder, auth, auth)
    port, close = await kind(ingress, keyed)
    try:
        yield Env(port, keyed, backend)
    finally:
        await close()
        await forwarder.aclose()
        await engine.cleanup()


def _key(env: Env) -> str:
    return f"Authorization: Bearer {KEY}\r\n" if env.keyed else ""


async def test_a_rebound_name_gets_421_where_no_key_protects_the_route(env: Env) -> None:
    paths = ["/metrics"]
    if not env.keyed:
        paths += ["/v1/models", "/openapi.json"]
    for path in paths:
        status, body = await _call(env.port, "GET", path, EVIL)
        if status == 404:  # (this front does not serve it)
            continue
        assert status == 421, (path, body)
        err = orjson.loads(body)["error"]
        assert err["code"] == "misdirected_request"
        assert "--allowed-host rebind.evil.example" in err["message"]
    if not env.keyed:
        status, _ = await _call(env.port, "POST", "/v1/chat/completions", EVIL, CHAT)
        assert status == 421 and env.engine.hits == 0


async def test_ips_localhost_and_configured_names_are_served(env: Env) -> None:
    for host in ("127.0.0.1", f"127.0.0.1:{env.port}", "localhost:1", "[::1]:8090",
                 "api.example.org", "API.example.org:443"):
        status, body = await _call(env.port, "GET", "/v1/models", host, extra=_key(env))
        assert status == 200, (host, body)


async def test_with_api_keys_the_openai_routes_answer_any_name(env: Env) -> None:
    # (an in-cluster client naming a Kubernetes Service, a load balancer's name); without
    # keys every route checks Host, these too
    want = 200 if env.keyed else 421
    status, body = await _call(env.port, "POST", "/v1/chat/completions",
                               "fab-ingress.llm.svc", CHAT, _key(env))
    assert status == want, body
    status, _ = await _call(env.port, "GET", "/v1/models", "fab-ingress:8090", extra=_key(env))
    assert status == want


async def test_a_cross_site_form_post_is_refused_without_reaching_a_node(env: Env) -> None:
    for extra in ("Origin: https://evil.example\r\n", "Sec-Fetch-Site: cross-site\r\n",
                  "Origin: null\r\n"):
        status, body = await _call(env.port, "POST", "/v1/chat/completions",
                                   f"127.0.0.1:{env.port}", CHAT, extra + _key(env))
        if env.keyed:  # (a key never rides along cross-site: nothing to refuse)
            assert status == 200, body
        else:
            assert status == 403, body
            assert orjson.loads(body)["error"]["code"] == "cross_origin_request"
    if not env.keyed:
        assert env.engine.hits == 0


async def test_curl_sdks_and_the_page_itself_are_served(env: Env) -> None:
    origin = f"Origin: http://127.0.0.1:{env.port}\r\n"
    for extra in ("", origin, "Sec-Fetch-Site: same-origin\r\n" + origin):
        status, body = await _call(env.port, "POST", "/v1/chat/completions",
                                   f"127.0.0.1:{env.port}", CHAT, extra + _key(env))
        assert status == 200, (extra, body)


@pytest.mark.parametrize("env", [(_node, False), (_node, True)], ids=["node", "node-keys"],
                         indirect=True)  # (the fronts that serve the dashboard)
async def test_the_dashboard_and_fleet_views_check_host_with_or_without_keys(
        env: Env) -> None:
    for path in ("/ui/", "/v1/fabric/nodes"):
        status, _ = await _call(env.port, "GET", path, f"127.0.0.1:{env.port}")
        assert status == 200, path
        status, body = await _call(env.port, "GET", path, EVIL)
        assert status == 421, (path, body)


@pytest.mark.parametrize("keyed", [False, True], ids=["no-keys", "keys"])
async def test_a_fabric_ingress_node_answers_its_own_names_only(
        tmp_path: pathlib.Path, keyed: bool) -> None:
    # The node's wiring (node/daemon.py): --public-addr and --allowed-host names, the
    # dashboard and fleet views behind the handed-over connection, the OpenAI routes.
    node = Node(build_config({}, {
        "home": tmp_path / "n", "listen": "127.0.0.1:0", "http_listen": "127.0.0.1:0",
        "preset": "local", "network_secret": "s" * 16, "gpu": "cpu", "ingress": True,
        "auth": keyed, "public_fleet_info": True, "public_addr": "Ingress.Example.org:7946",
        "allowed_hosts": ("dash.example.org",)}))
    await node.start()
    try:
        port = int(node.http_addr.rsplit(":", 1)[1])
        for path in ("/ui/", "/v1/fabric/nodes", "/healthz"):
            for host in ("127.0.0.1", "dash.example.org:8090", "ingress.example.org"):
                status, _ = await _call(port, "GET", path, host)
                assert status == 200, (path, host)
            status, _ = await _call(port, "GET", path, EVIL)
            assert status == 421, path
        status, body = await _call(port, "POST", "/v1/chat/completions", EVIL, CHAT)
        # with keys: the route asks for one (any name); without: the name is refused
        assert status == (401 if keyed else 421), body
        status, body = await _call(port, "POST", "/v1/chat/completions", "127.0.0.1", CHAT,
                                   "Sec-Fetch-Site: cross-site\r\n")
        assert status == (401 if keyed else 403), body
    finally:
        await node.stop(drain=False)
