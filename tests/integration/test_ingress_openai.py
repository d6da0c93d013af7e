"""The official openai SDK (sync, async, streaming, errors) against a real ingress in front of
real node-side engine proxies and mock engines on loopback sockets."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from aiohttp import web

from llmfabric.forward import (
    ChoosingForwarder,
    EngineProxy,
    HttpForwarder,
    PeerForwarder,
    add_engine_proxy_routes,
)
from llmfabric.forward.engine_proxy import HttpUpstream
from llmfabric.front import build_ingress_app
from llmfabric.ingress import FORWARD_PREFIX, IngressConfig, RecordsCandidateSource
from llmfabric.net.errors import PeerUnreachable
from llmfabric.net.ports import free_port
from llmfabric.registry.records import Lifecycle, NodeRecord
from llmfabric.routing.candidates import claimed_provider
from llmfabric.tenancy.accounts_auth import StaticKeys

from ._sdk_clients import tracked
from .test_ingress_support import (
    Backend,
    LoopThread,
    raw_request,
    record,
    serve,
    wait_port,
)

KEY = "sk-good"


@dataclass
class _PeerResp:
    up: HttpUpstream
    via: str | None = "relay-1"  # (the FakePeerNetwork stands for a relayed path)

    @property
    def status(self) -> int:
        return self.up.status

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        return (("content-type", self.up.content_type),)

    def iter_chunks(self) -> AsyncIterator[bytes]:
        return self.up.chunks()

    async def aclose(self) -> None:
        await self.up.aclose()


class FakePeerNetwork:
    """Stands in for the transport's peer request API: peer id -> that node's EngineProxy."""

    def __init__(self) -> None:
        self.proxies: dict[str, EngineProxy] = {}
        self.calls = 0

    async def request(self, peer_id: str, method: str, path: str,
                      headers: Sequence[tuple[str, str]], body: bytes, *,
                      timeout: float = 30.0) -> _PeerResp:  # noqa: ASYNC109
        self.calls += 1
        assert path.startswith(FORWARD_PREFIX)
        proxy = self.proxies.get(peer_id)
        if proxy is None:  # what the real transport raises for a peer it cannot reach
            raise PeerUnreachable(f"cannot reach {peer_id}")
        return _PeerResp(await proxy.open(path[len(FORWARD_PREFIX):], body))


@dataclass
class Fabric:
    base_url: str
    backends: dict[str, Backend]
    keys: StaticKeys
    peer: FakePeerNetwork
    metrics_url: str


@pytest.fixture(scope="module")
def fabric() -> Iterator[Fabric]:
    lt = LoopThread()
    backends = {n: Backend(n) for n in ("A", "B", "G", "R")}
    backends["F"] = Backend("F", mode="fail500")
    runners: list[web.AppRunner] = []
    proxies: list[EngineProxy] = []
    peer = FakePeerNetwork()
    keys = StaticKeys({KEY: "key1"})
    ingress_port = free_port()

    async def start() -> None:
        node_addr: dict[str, str] = {}
        for name, b in backends.items():
            bport, nport = free_port(), free_port()
            runners.append(await serve(b.app(), bport))
            proxy = EngineProxy(f"http://127.0.0.1:{bport}")
            proxies.append(proxy)
            if name == "R":  # behind NAT: reachable only through the peer network
                peer.proxies["peer-nR"] = proxy
                continue
            node = web.Application()
            add_engine_proxy_routes(node, proxy)
            runners.append(await serve(node, nport))
            node_addr[name] = f"127.0.0.1:{nport}"
        dead = f"127.0.0.1:{free_port()}"
        records: list[NodeRecord] = [
            record("nA", "uni-a", node_addr["A"], ["m"]),
            record("nB", "uni-b", node_addr["B"], ["m"]),
            record("nF", "uni-a", node_addr["F"], ["flaky", "broken"]),
            record("nD", "uni-b", dead, ["flaky", "broken"]),
            record("nG", "uni-c", node_addr["G"], ["flaky"]),
            record("nGhost", "uni-a", dead, ["ghost"], state=Lifecycle.DOWN),
            record("nR", "uni-r", "", ["relayed"], relays=("relay-1",)),
        ]
        # Hand-made records stand for verified ones: their provider names are the identities
        # (a node verifies them with registry.provider; tests/unit/routing covers that).
        source = RecordsCandidateSource(lambda: [(r, False) for r in records],
                                        identify=claimed_provider)
        forwarder = ChoosingForwarder(HttpForwarder(FORWARD_PREFIX), PeerForwarder(peer))
        config = IngressConfig(node_id="ing", max_retries=2, max_body_bytes=64 * 1024)
        app = build_ingress_app(config, source, forwarder, auth=keys, usage_sink=keys,
                                rng=random.Random(1))
        runners.append(await serve(app, ingress_port))

    lt.call(start)
    wait_port(ingress_port)
    base = f"http://127.0.0.1:{ingress_port}"
    try:
        yield Fabric(base + "/v1", backends, keys, peer, base + "/metrics")
    finally:
        async def stop() -> None:
            for r in reversed(runners):
                await r.cleanup()
            for p in proxies:
                await p.aclose()
        lt.call(stop)
        lt.stop()


def client(f: Fabric, key: str = KEY) -> openai.OpenAI:
    return tracked(openai.OpenAI(base_url=f.base_url, api_key=key, max_retries=0, timeout=20))


def aclient(f: Fabric, key: str = KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f.base_url, api_key=key, max_retries=0, timeout=20)


MSG: list[Any] = [{"role": "user", "content": "hi"}]


def assert_still_serving(f: Fabric) -> None:
    r = client(f).chat.completions.create(model="m", messages=MSG)
    assert r.choices[0].message.content in ("hello from A", "hello from B")


def test_sync_chat_names_the_serving_node(fabric: Fabric) -> None:
    c = client(fabric)
    seen = set()
    for _ in range(12):
        raw = c.chat.completions.with_raw_response.create(model="m", messages=MSG)
        node = raw.headers["X-Fabric-Node"]
        reply = raw.parse()
        assert reply.choices[0].message.content == f"hello from {node[1:]}"
        assert reply.usage is not None and reply.usage.prompt_tokens == 7
        seen.add(node)
    assert seen == {"nA", "nB"}  # the random policy spreads over both


def test_streaming_is_relayed_and_usage_is_accounted_but_hidden(fabric: Fabric) -> None:
    before = list(fabric.keys.usage.get(("key1", "m"), [0, 0, 0]))
    stream = client(fabric).chat.completions.create(model="m", messages=MSG, stream=True)
    chunks = list(stream)
    assert len(chunks) == 4
    assert all(ch.choices for ch in chunks)  # the injected usage-only chunk was stripped
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert text.startswith(("A-0", "B-0"))
    # Usage is recorded just after the last byte went out, which may be after the client saw it.
    deadline = time.monotonic() + 30  # a loaded CI machine: the flush is asynchronous
    while fabric.keys.usage.get(("key1", "m"), [0, 0, 0])[2] == before[2]:
        assert time.monotonic() < deadline, "usage of the stream was never recorded"
        time.sleep(0.01)
    after = fabric.keys.usage[("key1", "m")]
    assert after[0] - before[0] == 7 and after[1] - before[1] == 4
    # The engine was asked for usage on the client's behalf.
    last = [b.bodies[-1] for b in (fabric.backends["A"], fabric.backends["B"]) if b.bodies]
    assert any(body.get("stream_options") == {"include_usage": True} for body in last)


def test_streaming_with_include_usage_keeps_the_usage_chunk(fabric: Fabric) -> None:
    stream = client(fabric).chat.completions.create(
        model="m", messages=MSG, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4


async def test_async_client_chat_stream_completions_embeddings(fabric: Fabric) -> None:
    c = aclient(fabric)
    r = await c.chat.completions.create(model="m", messages=MSG)
    assert r.choices[0].message.content.startswith("hello from")  # type: ignore[union-attr]
    pieces = [ch.choices[0].delta.content async for ch in
              await c.chat.completions.create(model="m", messages=MSG, stream=True)]
    assert len(pieces) == 4
    comp = await c.completions.create(model="m", prompt="once upon")
    assert comp.choices[0].text.startswith("hello from")
    comp_stream = [ch async for ch in await c.completions.create(model="m", prompt="x",
                                                                  stream=True)]
    assert len(comp_stream) == 4
    emb = await c.embeddings.create(model="m", input="hello")
    assert emb.data[0].embedding == [0.1, 0.2, 0.3]
    await c.close()


def test_bad_and_missing_keys_get_401_every_time(fabric: Fabric) -> None:
    for _ in range(3):
        with pytest.raises(openai.AuthenticationError) as e:
            client(fabric, key="sk-wrong").chat.completions.create(model="m", messages=MSG)
        assert e.value.status_code == 401
    r = raw_request("POST", fabric.base_url + "/chat/completions", b'{"model": "m"}')
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    assert raw_request("GET", fabric.base_url + "/models").status_code == 401
    assert_still_serving(fabric)


def test_unknown_model_404(fabric: Fabric) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client(fabric).chat.completions.create(model="nope", messages=MSG)
    assert e.value.status_code == 404
    assert_still_serving(fabric)


def test_malformed_and_oversized_bodies_400(fabric: Fabric) -> None:
    h = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    for bad in (b"{not json", b"[1, 2]", b'{"messages": []}', b'{"model": "m", "metadata": 3}',
                b'{"model": "m", "metadata": {"min_context": "lots"}}'):
        r = raw_request("POST", fabric.base_url + "/chat/completions", bad, h)
        assert r.status_code == 400, bad
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        client(fabric).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x" * 100_000}]
        )
    assert e.value.status_code == 400 and "larger than" in str(e.value)
    assert_still_serving(fabric)


def test_no_serving_provider_503_with_retry_after(fabric: Fabric) -> None:
    with pytest.raises(openai.InternalServerError) as e:
        client(fabric).chat.completions.create(model="ghost", messages=MSG)
    assert e.value.status_code == 503
    assert e.value.response.headers["Retry-After"] == "2"
    assert_still_serving(fabric)


def test_all_candidates_failed_502_after_retries(fabric: Fabric) -> None:
    hits = fabric.backends["F"].hits
    with pytest.raises(openai.InternalServerError) as e:
        client(fabric).chat.completions.create(model="broken", messages=MSG)
    assert e.value.status_code == 502
    assert "all 2 candidate" in str(e.value)
    assert fabric.backends["F"].hits == hits + 1  # the failing engine was tried exactly once
    with pytest.raises(openai.InternalServerError):  # streams that sent nothing: same
        list(client(fabric).chat.completions.create(model="broken", messages=MSG, stream=True))
    assert_still_serving(fabric)


def test_failed_candidates_are_retried_transparently(fabric: Fabric) -> None:
    c = client(fabric)
    for stream in (False, True):
        for _ in range(6):
            if stream:
                raw = c.chat.completions.with_raw_response.create(
                    model="flaky", messages=MSG, stream=True)
                assert raw.headers["X-Fabric-Node"] == "nG"
                assert len(list(raw.parse())) == 4
            else:
                raw = c.chat.completions.with_raw_response.create(model="flaky", messages=MSG)
                assert raw.headers["X-Fabric-Node"] == "nG"
                assert raw.parse().choices[0].message.content == "hello from G"
    text = raw_request("GET", fabric.metrics_url).text
    retried = [ln for ln in text.splitlines()
               if ln.startswith('llmfabric_ingress_retries_total{model="flaky"}')]
    assert retried and float(retried[0].split()[-1]) > 0


def test_trust_allowlist_is_honoured(fabric: Fabric) -> None:
    c = client(fabric)
    for _ in range(8):
        raw = c.chat.completions.with_raw_response.create(
            model="m", messages=MSG, extra_headers={"X-Fabric-Providers": "uni-b"})
        assert raw.headers["X-Fabric-Node"] == "nB"
        raw = c.chat.completions.with_raw_response.create(
            model="m", messages=MSG, metadata={"providers": "uni-a"})
        assert raw.headers["X-Fabric-Node"] == "nA"
    # Fabric metadata is consumed by the ingress, not passed to engines.
    assert "metadata" not in fabric.backends["A"].bodies[-1]
    # Header and body together: only providers in both lists.
    with pytest.raises(openai.InternalServerError) as e:
        c.chat.completions.create(model="m", messages=MSG, metadata={"providers": "uni-a"},
                                  extra_headers={"X-Fabric-Providers": "uni-b"})
    assert e.value.status_code == 503
    with pytest.raises(openai.InternalServerError):
        c.chat.completions.create(model="m", messages=MSG, metadata={"gpu": "A100"})
    raw = c.chat.completions.with_raw_response.create(
        model="m", messages=MSG, metadata={"gpu": "h100", "min_context": "2048"})
    assert raw.headers["X-Fabric-Node"] in ("nA", "nB")


def test_relayed_node_reached_through_the_peer_network(fabric: Fabric) -> None:
    calls = fabric.peer.calls
    c = client(fabric)
    raw = c.chat.completions.with_raw_response.create(model="relayed", messages=MSG)
    assert raw.headers["X-Fabric-Node"] == "nR"
    assert raw.parse().choices[0].message.content == "hello from R"
    chunks = list(c.chat.completions.create(model="relayed", messages=MSG, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks).startswith("R-0")
    assert fabric.peer.calls == calls + 2


def test_models_catalog_and_metrics(fabric: Fabric) -> None:
    models = client(fabric).models.list()
    by_id = {m.id: m.model_dump() for m in models.data}
    assert set(by_id) == {"m", "flaky", "broken", "relayed"}  # DOWN nodes are not listed
    assert by_id["m"]["providers"] == ["uni-a", "uni-b"]
    assert by_id["m"]["nodes"] == ["nA", "nB"] and by_id["m"]["gpus"] == ["H100-SXM"]
    assert by_id["flaky"]["serving"] == 3
    text = raw_request("GET", fabric.metrics_url).text
    assert 'llmfabric_ingress_requests_total{model="m",status="200"}' in text
    assert 'llmfabric_ingress_routed_total{node="nA"}' in text
    assert "llmfabric_ingress_ttft_seconds_bucket" in text
