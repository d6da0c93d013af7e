"""LoRA adapters: a node advertises the adapters its engine loaded; a request for "adapter" or
"base:adapter" matches only the models (and so the nodes) that have it, the engine is asked
for the adapter by its own name, and the field survives the signed record codec."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.agent.facts import served_models
from llmfabric.ingress.sources import StaticCandidateSource, merged_catalog
from llmfabric.registry.codec import decode_record_body, encode_body
from llmfabric.registry.records import (
    Hardware,
    Lifecycle,
    NodeMeta,
    NodeRecord,
    ServedModel,
)
from llmfabric.routing import candidates_by_model, candidates_for, model_is_known
from llmfabric.routing.candidates import Candidate

pytestmark = pytest.mark.unit

BASE = ServedModel("llama", aliases=("ll",), adapters=("sql", "chat-de"))
PLAIN = ServedModel("llama")


def rec(sid: str, model: ServedModel) -> NodeRecord:
    return NodeRecord(session_id=sid, peer_id=f"peer-{sid}", public_key=bytes(32),
                      state=Lifecycle.SERVING, incarnation=0, version=1, updated_at=0.0,
                      meta=NodeMeta(provider_id="p", http_addr="127.0.0.1:1",
                                    hardware=Hardware(gpu_model="H100-SXM", gpu_count=1),
                                    models=(model,)))


def test_adapter_names() -> None:
    for name in ("sql", "llama:sql", "ll:sql"):
        assert BASE.answers_to(name) and BASE.engine_name(name) == "sql"
    for name in ("llama", "ll"):
        assert BASE.answers_to(name) and BASE.engine_name(name) == "llama"
    for name in ("nope", "llama:nope", "other:sql", "sql:llama", ":sql"):
        assert not BASE.answers_to(name)
    assert not PLAIN.answers_to("llama:sql") and not PLAIN.answers_to("sql")


names = st.text(alphabet="ab:", max_size=6)


@given(names, names, st.lists(names, max_size=2), st.lists(names.filter(bool), max_size=3))
def test_every_listed_name_is_answered_and_only_those(
        name: str, mid: str, aliases: list[str], adapters: list[str]) -> None:
    m = ServedModel(mid, aliases=tuple(aliases), adapters=tuple(adapters))
    assert m.answers_to(name) == (name in m.names())


def test_only_nodes_with_the_adapter_are_candidates() -> None:
    recs = [(rec("a", BASE), False), (rec("b", PLAIN), False)]
    for name in ("sql", "llama:sql"):
        assert [c.session_id for c in candidates_for(name, recs)] == ["a"]
        assert [c.session_id for c in candidates_by_model(recs)[name]] == ["a"]
        assert [c.session_id for c in StaticCandidateSource(
            [Candidate.from_record(r, r.meta.models[0]) for r, _ in recs]).candidates(name)
        ] == ["a"]
    assert sorted(c.session_id for c in candidates_for("llama", recs)) == ["a", "b"]
    assert model_is_known("llama:chat-de", recs) and not model_is_known("llama:x", recs)


def test_catalog_lists_adapters() -> None:
    cands = [Candidate.from_record(rec("a", BASE), BASE),
             Candidate.from_record(rec("b", PLAIN), PLAIN)]
    (entry,) = merged_catalog(cands)["data"]
    assert entry["adapters"] == ["chat-de", "sql"]
    assert entry["capabilities"]["lora_adapters"] is True


def test_adapters_survive_the_record_codec_and_old_records_have_none() -> None:
    r = rec("a", BASE)
    assert decode_record_body(encode_body(r)).meta.models[0].adapters == ("sql", "chat-de")
    body = msgpack.unpackb(encode_body(rec("b", PLAIN)), raw=False)
    del body["m"]["models"][0]["adapters"]  # a record from a node before adapters existed
    old = decode_record_body(msgpack.packb(body, use_bin_type=True))
    assert old.meta.models[0].adapters == ()


def test_vllm_lora_modules_are_advertised_as_adapters_of_their_base() -> None:
    data = [{"id": "llama", "max_model_len": 8192, "parent": None},
            {"id": "sql", "parent": "llama", "root": "/loras/sql"},
            {"id": "orphan", "parent": "gone"}]
    models = served_models(data, ["vllm", "serve", "llama", "--enable-lora"], 4096)
    assert [(m.id, m.adapters) for m in models] == [("llama", ("sql",)), ("orphan", ())]
