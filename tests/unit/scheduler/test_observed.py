"""The controller's observed workload: ingress demand summed from the replica's records."""

from __future__ import annotations

import pytest

from llmfabric.identity.keys import NodeKey
from llmfabric.registry.records import Lifecycle, ModelDemand, NodeMeta, NodeRecord, ServedModel
from llmfabric.registry.signing import new_session_id
from llmfabric.scheduler.observed import DEFAULT_MEAN_IN, DEFAULT_MEAN_OUT, observed_workload


def _record(meta: NodeMeta, state: Lifecycle = Lifecycle.JOIN) -> NodeRecord:
    key = NodeKey.generate()
    return NodeRecord(new_session_id(key.public_bytes), key.peer_id, key.public_bytes, state,
                      0, 1, 0.0, meta)


def _ingress(*demand: ModelDemand, state: Lifecycle = Lifecycle.JOIN) -> NodeRecord:
    return _record(NodeMeta(roles=("ingress",), demand=demand), state)


def test_rates_add_up_and_lengths_average_by_rate() -> None:
    serving = _record(NodeMeta(engine="sim", models=(ServedModel("llama-3.1-8b",
                                                                 aliases=("llama",)),)),
                      Lifecycle.SERVING)
    records = [
        serving,
        _ingress(ModelDemand("llama", 3.0, 400.0, 100.0)),
        _ingress(ModelDemand("llama-3.1-8b", 1.0, 800.0, 200.0),
                 ModelDemand("qwen3-1.7b", 0.5, 0.0, 0.0)),
        _ingress(ModelDemand("llama", 50.0, 1.0, 1.0), state=Lifecycle.DOWN),  # gone: ignored
    ]
    workload, notes = observed_workload(records)
    assert notes == []
    llama = workload.get("llama-3.1-8b")
    assert llama is not None
    assert llama.arrival_rate == pytest.approx(4.0)
    assert llama.mean_in == pytest.approx(500.0) and llama.mean_out == pytest.approx(125.0)
    qwen = workload.get("qwen3-1.7b")  # no usage seen yet: default lengths
    assert qwen is not None and qwen.arrival_rate == 0.5
    assert (qwen.mean_in, qwen.mean_out) == (DEFAULT_MEAN_IN, DEFAULT_MEAN_OUT)


def test_models_the_performance_model_cannot_price_are_left_out_with_a_note() -> None:
    workload, notes = observed_workload(
        [_ingress(ModelDemand("mystery-9000", 2.0, 10.0, 10.0),
                  ModelDemand("qwen3-1.7b", 1.0, 10.0, 10.0))],
        known=lambda m: m != "mystery-9000")
    assert [m.model for m in workload.loads] == ["qwen3-1.7b"]
    assert len(notes) == 1 and "mystery-9000" in notes[0]


def test_no_ingress_demand_means_an_empty_workload() -> None:
    workload, notes = observed_workload([_record(NodeMeta(engine="sim"))])
    assert workload.loads == () and notes == []


@pytest.mark.hostile
def test_fake_demand_is_bounded() -> None:
    """A member claims 1e11 req/s for its model, from 8 sessions, some not even ingress."""
    from llmfabric.scheduler.observed import MAX_RATE_PER_INGRESS

    key = NodeKey.generate()
    fake = [NodeRecord(new_session_id(key.public_bytes), key.peer_id, key.public_bytes,
                       Lifecycle.SERVING, 0, 1, float(i),
                       NodeMeta(roles=("ingress",), demand=(
                           ModelDemand("evil-model", 1e11, 1e11, 1e11),
                           ModelDemand("evil-model", 1e11, 1.0, 1.0))))
            for i in range(8)]
    not_ingress = _record(NodeMeta(demand=(ModelDemand("evil-model", 1e11, 1.0, 1.0),)))
    honest = _ingress(ModelDemand("llama", 5.0, 100.0, 50.0))
    workload, _ = observed_workload([*fake, not_ingress, honest])
    evil = workload.get("evil-model")
    assert evil is not None and evil.arrival_rate == MAX_RATE_PER_INGRESS  # one peer, capped
    assert evil.mean_in <= 1e6 and evil.mean_out <= 1e6
    llama = workload.get("llama")
    assert llama is not None and llama.arrival_rate == 5.0
    only_trusted, _ = observed_workload([*fake, honest],
                                        trusted=lambda r: r.peer_id != key.peer_id)
    assert [m.model for m in only_trusted.loads] == ["llama"]


@pytest.mark.hostile
def test_an_alias_another_record_lists_for_its_own_model_is_not_taken_over() -> None:
    """An alias was mapped to the model of the first record listing it: a member listing an
    honest model's popular alias for its own model (and seen first) took that alias's demand,
    and the controller placed replicas of its model. As routing resolves names (an id is
    itself; an alias answers for every model listing it), an alias listed for two models
    maps to neither, whatever order the records come in, and says so in a note."""
    honest = _record(NodeMeta(engine="sim", models=(ServedModel("llama-3.1-8b",
                                                                aliases=("llama",)),)),
                     Lifecycle.SERVING)
    also_honest = _record(NodeMeta(engine="sim", models=(ServedModel("llama-3.1-8b",
                                                                     aliases=("llama",)),)),
                          Lifecycle.SERVING)
    evil = _record(NodeMeta(engine="vllm", models=(ServedModel("evil-model",
                                                               aliases=("llama",
                                                                        "llama-3.1-8b")),)),
                   Lifecycle.SERVING)
    demand = [_ingress(ModelDemand("llama", 30.0, 400.0, 100.0)),
              _ingress(ModelDemand("llama-3.1-8b", 2.0, 400.0, 100.0))]
    for records in ([evil, honest, also_honest, *demand], [honest, also_honest, evil, *demand],
                    [*demand, also_honest, evil, honest]):
        workload, notes = observed_workload(records)
        assert workload.get("evil-model") is None
        llama = workload.get("llama-3.1-8b")  # the id is always itself
        assert llama is not None and llama.arrival_rate == 2.0
        assert [m.model for m in workload.loads] == ["llama-3.1-8b"]
        assert len(notes) == 1 and "'llama'" in notes[0] and "evil-model" in notes[0]
    # records that agree map it; a record not serving (yet) does not count
    starting = _record(NodeMeta(models=(ServedModel("evil-model", aliases=("llama",)),)))
    workload, notes = observed_workload([starting, honest, also_honest, *demand])
    llama = workload.get("llama-3.1-8b")
    assert notes == [] and llama is not None and llama.arrival_rate == 32.0
