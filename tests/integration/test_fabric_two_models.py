"""Real node processes, the async openai SDK: a node whose simulated engine serves TWO models
(one also under an `--alias`), and a second node on a GPU whose name contains the first's
(GH200 vs H200), behind an ingress node. Covers several models per node, routing by alias end
to end, the exact `metadata.gpu` rule, concurrent async calls, async streaming, embeddings and
async error cases."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Iterator

import openai
import pytest

from llmfabric.launch.local import EngineSpec, LocalFabric, NodeProcess
from llmfabric.net.ports import free_port

pytestmark = pytest.mark.slow

BIG, SMALL, ALIAS = "llama-3.1-8b", "qwen3-1.7b", "small"
MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def fabric(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalFabric, dict[str, str]]]:
    root: pathlib.Path = tmp_path_factory.mktemp("two-models")
    with LocalFabric(root) as fab:
        ingress = fab.start_ingress()
        port = free_port()
        duo: NodeProcess = fab._spawn("duo", [
            "--bootstrap", ingress.peer_addr, "--provider", "duo", "--gpu", "H200",
            "--gpu-count", "1", "--alias", f"{ALIAS}={SMALL}", "--health-failures", "2",
            "--process", *fab._cli(), "engine", "sim", "--model", BIG, "--model", SMALL,
            "--gpu", "H200", "--port", str(port), "--speed", "20",
        ], engine_port=port)
        gh = fab.add_node(EngineSpec(BIG, "GH200", provider="gh", speed=20), "gh")
        fab.wait_serving({BIG: 2, SMALL: 1}, timeout=90)
        sessions = {n.name: n.get_json("/v1/fabric/self")["session_id"] for n in (duo, gh)}
        yield fab, sessions


def _client(fab: LocalFabric, key: str | None = None) -> openai.AsyncOpenAI:
    assert fab.ingress is not None
    return openai.AsyncOpenAI(base_url=fab.ingress.http_url + "/v1",
                              api_key=key or fab.admin_key(), max_retries=0, timeout=30)


async def test_one_node_serves_two_models_and_an_alias(
    fabric: tuple[LocalFabric, dict[str, str]],
) -> None:
    fab, sessions = fabric
    async with _client(fab) as c:
        listed = {m.id: m.model_extra or {} for m in (await c.models.list()).data}
        assert listed[SMALL]["aliases"] == [ALIAS] and listed[SMALL]["gpus"] == ["H200"]
        assert set(listed[BIG]["nodes"]) == {sessions["duo"], sessions["gh"]}

        async def ask(model: str) -> tuple[str, str | None, str]:
            raw = await c.chat.completions.with_raw_response.create(
                model=model, messages=MSG, max_tokens=4)
            reply = raw.parse()
            assert reply.usage is not None and reply.usage.completion_tokens > 0
            return model, raw.headers.get("x-fabric-node"), reply.model

        got = await asyncio.gather(*(ask(m) for m in [BIG, SMALL, ALIAS] * 4))
    for model, node, served in got:
        if model in (SMALL, ALIAS):  # only the duo node serves qwen, by id and by alias
            assert node == sessions["duo"] and served == SMALL
        else:
            assert node in sessions.values() and served == BIG
    assert {node for m, node, _ in got if m == BIG} <= set(sessions.values())


async def test_async_streaming_and_embeddings_by_alias(
    fabric: tuple[LocalFabric, dict[str, str]],
) -> None:
    fab, _ = fabric
    async with _client(fab) as c:
        stream = await c.chat.completions.create(
            model=ALIAS, messages=MSG, max_tokens=10, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        chunks = [ch async for ch in stream]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 10
        emb = await c.embeddings.create(model=ALIAS, input=["a", "b"])
        assert len(emb.data) == 2 and emb.data[0].embedding


async def test_gpu_constraint_is_exact_across_real_nodes(
    fabric: tuple[LocalFabric, dict[str, str]],
) -> None:
    fab, sessions = fabric
    async with _client(fab) as c:
        for gpu, node in (("H200", "duo"), ("GH200", "gh"), ("grace hopper", "gh")):
            for _ in range(4):
                raw = await c.chat.completions.with_raw_response.create(
                    model=BIG, messages=MSG, max_tokens=2, metadata={"gpu": gpu})
                assert raw.headers.get("x-fabric-node") == sessions[node], gpu
        with pytest.raises(openai.InternalServerError) as e:  # no H100 in this fabric
            await c.chat.completions.create(model=BIG, messages=MSG, metadata={"gpu": "H100"})
        assert e.value.status_code == 503 and e.value.response.headers.get("retry-after")


async def test_async_error_cases_and_the_ingress_keeps_serving(
    fabric: tuple[LocalFabric, dict[str, str]],
) -> None:
    fab, _ = fabric
    async with _client(fab) as c, _client(fab, key="lf-0000000000000000-wrong") as bad:
        with pytest.raises(openai.NotFoundError) as nf:
            await c.chat.completions.create(model="no-such-model", messages=MSG)
        assert nf.value.code == "model_not_found"
        with pytest.raises(openai.AuthenticationError):
            await bad.chat.completions.create(model=BIG, messages=MSG)
        with pytest.raises(openai.AuthenticationError):
            await bad.models.list()
        with pytest.raises(openai.BadRequestError) as br:
            await c.chat.completions.create(model=BIG, messages=MSG,
                                            metadata={"min_context": "lots"})
        assert br.value.code == "invalid_constraint"
        with pytest.raises(openai.BadRequestError):  # engine-side 400 passed through
            await c.chat.completions.create(model=SMALL, messages=MSG, max_tokens=10**7)
        reply = await c.chat.completions.create(model=ALIAS, messages=MSG, max_tokens=2)
        assert reply.choices[0].message.content
