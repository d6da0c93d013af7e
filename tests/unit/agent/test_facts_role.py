"""The prefill/decode role a node publishes: the engine's /v1/models `role`, vLLM's
--kv-transfer-config kv_role, else both; garbage never becomes a role."""

from __future__ import annotations

from llmfabric.agent.facts import role_of, served_models
from llmfabric.node.engine_role import with_roles
from llmfabric.registry.records import ModelRole, ServedModel


def test_role_from_the_engine_listing_or_the_vllm_kv_role() -> None:
    assert role_of({"role": "prefill"}, []) is ModelRole.PREFILL
    assert role_of({"role": "decode"}, []) is ModelRole.DECODE
    for junk in ("leader", "", "PREFILL", 3, None, ["prefill"], "x" * 10_000):
        assert role_of({"role": junk}, []) is ModelRole.BOTH
    vllm = ["vllm", "serve", "m", "--kv-transfer-config",
            '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}']
    assert role_of({}, vllm) is ModelRole.PREFILL
    assert role_of({}, ["--kv-transfer-config={\"kv_role\":\"kv_consumer\"}"]) \
        is ModelRole.DECODE
    assert role_of({}, ["--kv-transfer-config", "{not json"]) is ModelRole.BOTH
    assert role_of({}, ["--kv-transfer-config", '{"kv_role": "kv_boss"}']) is ModelRole.BOTH
    got = served_models([{"id": "m", "role": "decode"}, {"id": "n"}], [], 4096)
    assert [m.role for m in got] == [ModelRole.DECODE, ModelRole.BOTH]


def test_with_roles_changes_only_what_the_engine_reports() -> None:
    models = (ServedModel("a", role=ModelRole.PREFILL), ServedModel("b"))
    assert with_roles(models, {}) == models
    flipped = with_roles(models, {"a": ModelRole.DECODE, "zzz": ModelRole.PREFILL})
    assert [m.role for m in flipped] == [ModelRole.DECODE, ModelRole.BOTH]
    assert flipped[0].id == "a" and with_roles(flipped, {"a": ModelRole.DECODE}) == flipped


async def test_follow_roles_republishes_a_flip_once_on_the_fake_clock() -> None:
    import asyncio
    from types import SimpleNamespace

    from llmfabric.node.engine_role import follow_roles
    from llmfabric.testing.fake_clock import FakeClock

    clock = FakeClock()
    reported = {"m": ModelRole.PREFILL}
    calls: list[float] = []

    async def model_roles() -> dict[str, ModelRole]:
        calls.append(clock.now())
        return dict(reported)

    link = SimpleNamespace(supervisor=SimpleNamespace(model_roles=model_roles))
    state = {"models": (ServedModel("m", role=ModelRole.PREFILL),), "stop": False}
    published: list[tuple[ServedModel, ...]] = []

    def publish(models: tuple[ServedModel, ...]) -> None:
        published.append(models)
        state["models"] = models

    task = asyncio.create_task(follow_roles(
        clock, lambda: link, lambda: state["models"], publish,  # type: ignore[arg-type,return-value]
        lambda: bool(state["stop"]), interval_s=2.0, idle_interval_s=15.0))
    await clock.advance(5.0)
    assert published == [] and calls == [2.0, 4.0]
    reported["m"] = ModelRole.DECODE  # the flip
    await clock.advance(4.0)
    assert [m[0].role for m in published] == [ModelRole.DECODE]
    reported["m"] = ModelRole.BOTH
    await clock.advance(2.0)
    assert published[-1][0].role == ModelRole.BOTH
    n = len(calls)
    await clock.advance(13.0)  # all "both": the slow poll (next at t = 25)
    assert len(calls) == n
    await clock.advance(2.0)
    assert len(calls) == n + 1 and len(published) == 2
    state["stop"] = True
    await clock.advance(20.0)
    await asyncio.wait_for(task, 2)


def test_what_an_engine_lists_is_cut_to_what_a_record_carries() -> None:
    """An engine listing a 600-character model id or 300 LoRA adapters made the node sign a
    record every replica refuses (silently unroutable); a max_model_len of 2**64 could not be
    signed at all (the node died with a traceback)."""
    from llmfabric.identity import NodeKey
    from llmfabric.registry.codec import verify_record
    from llmfabric.registry.owner import RecordOwner
    from llmfabric.registry.records import Lifecycle, NodeMeta

    listing = [{"id": "m", "max_model_len": 2**64}, {"id": "x" * 600},
               *({"id": f"lora-{i}", "parent": "m"} for i in range(300))]
    got = served_models(listing, [], 4096)
    assert [m.id for m in got] == ["m"] and got[0].max_context == 4096
    assert len(got[0].adapters) == 256
    owner = RecordOwner(NodeKey.generate(), NodeMeta(models=got), wall=1e9)
    rec = owner.set_state(Lifecycle.SERVING, wall=1e9)
    assert verify_record(rec.body, rec.signature).record.meta.models == got
