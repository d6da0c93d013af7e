"""An engine's error answer becomes part of an exception message (and so a log line): a role
flip the engine refuses, asked by the node's supervisor or by the PD controller's executor.
Its first 200 characters are read, not the whole body: a broken or hostile engine's answer
may be megabytes, or never end (headers, then body bytes forever)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest
from aiohttp import web

from llmfabric.agent.probe import ProbeError
from llmfabric.agent.supervisor import EngineSupervisor
from llmfabric.controller.pd_executor import PDExecutionError, RoleFlipExecutor
from llmfabric.registry.records import ModelRole
from llmfabric.scheduler.decisions import SetRole

pytestmark = pytest.mark.hostile


@pytest.fixture
async def endless_engine() -> AsyncIterator[str]:
    """Answers every request 500 with an error text that never ends."""

    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=500)
        await resp.prepare(request)
        while True:
            await resp.write(b"engine error \x1b[2J" + b"E" * 65536)
            await asyncio.sleep(0.001)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_the_supervisor_reads_the_head_of_a_refused_flip(endless_engine: str) -> None:
    sup = SimpleNamespace(
        command=SimpleNamespace(adapter=SimpleNamespace(role_path="/sim/role"), kind="sim",
                                base_url=endless_engine),
        config=SimpleNamespace(health_timeout_s=5.0))
    with pytest.raises(ProbeError) as got:
        await EngineSupervisor.set_role(sup, ModelRole.PREFILL)  # type: ignore[arg-type]
    assert str(got.value).startswith("/sim/role answered 500: engine error")
    assert len(str(got.value)) < 300


async def test_the_pd_executor_reads_the_head_of_a_refused_flip(endless_engine: str) -> None:
    ex = RoleFlipExecutor({"s1": endless_engine}, timeout_s=5.0)
    with pytest.raises(PDExecutionError) as got:
        await ex.apply(SetRole(("s1",), "prefill"))
    assert "/sim/role answered 500: engine error" in str(got.value)
    assert len(str(got.value)) < 400
