"""LoRA adapters through a real ingress (openai SDK): "base:adapter" and "adapter" reach only
the node whose engine has the adapter loaded, and the engine is asked for the adapter by
name; the base model still spreads over every node."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator

import openai
import pytest
from aiohttp import web

from llmfabric.forward import EngineProxy, HttpForwarder, add_engine_proxy_routes
from llmfabric.front import build_ingress_app
from llmfabric.ingress import FORWARD_PREFIX, IngressConfig, RecordsCandidateSource
from llmfabric.net.ports import free_port
from llmfabric.registry.records import ServedModel
from llmfabric.tenancy.accounts_auth import StaticKeys

from .test_ingress_support import Backend, LoopThread, record, serve, wait_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def setup() -> Iterator[tuple[str, dict[str, Backend]]]:
    lt = LoopThread()
    backends = {"A": Backend("A"), "B": Backend("B")}
    runners: list[web.AppRunner] = []
    proxies: list[EngineProxy] = []
    port = free_port()

    async def start() -> None:
        recs = []
        for name, b in backends.items():
            eport, nport = free_port(), free_port()
            runners.append(await serve(b.app(), eport))
            proxy = EngineProxy(f"http://127.0.0.1:{eport}")
            proxies.append(proxy)
            node = web.Application()
            add_engine_proxy_routes(node, proxy)
            runners.append(await serve(node, nport))
            r = record(f"n{name}", "p", f"127.0.0.1:{nport}", ["llama"])
            if name == "A":  # only A's engine loaded the adapter
                model = ServedModel("llama", adapters=("sql",))
                r = dataclasses.replace(r, meta=dataclasses.replace(r.meta, models=(model,)))
            recs.append(r)
        source = RecordsCandidateSource(lambda: [(r, False) for r in recs])
        keys = StaticKeys({"sk": "k"})
        app = build_ingress_app(IngressConfig(), source, HttpForwarder(FORWARD_PREFIX),
                                auth=keys, usage_sink=keys, rng=random.Random(3))
        runners.append(await serve(app, port))

    lt.call(start)
    wait_port(port)
    try:
        yield f"http://127.0.0.1:{port}/v1", backends
    finally:
        async def stop() -> None:
            for r in reversed(runners):
                await r.cleanup()
            for p in proxies:
                await p.aclose()
        lt.call(stop)
        lt.stop()


def test_adapter_requests_go_only_to_nodes_that_have_it(
        setup: tuple[str, dict[str, Backend]]) -> None:
    url, backends = setup
    c = openai.OpenAI(base_url=url, api_key="sk", max_retries=0, timeout=20)
    for name in ("llama:sql", "sql") * 4:
        raw = c.chat.completions.with_raw_response.create(
            model=name, messages=[{"role": "user", "content": "q"}])
        assert raw.headers["x-fabric-node"] == "nA"
        assert backends["A"].bodies[-1]["model"] == "sql"  # the engine's adapter name
    seen = {c.chat.completions.with_raw_response.create(
        model="llama", messages=[{"role": "user", "content": "q"}]).headers["x-fabric-node"]
        for _ in range(12)}
    assert seen == {"nA", "nB"}
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="llama:nope", messages=[{"role": "user", "content": "q"}])
    entry = next(m for m in c.models.list() if m.id == "llama")
    assert (entry.model_extra or {})["adapters"] == ["sql"]
