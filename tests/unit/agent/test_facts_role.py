"""The prefill/decode role a node publishes: the engine's /v1/models `role`, vLLM's
--kv-transfer-config kv_role, else both; garbage never becomes a role."""

from __future__ import annotations

from llmfabric.agent.facts import role_of, served_models
from llmfabric.node.pd_roles import with_roles
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
