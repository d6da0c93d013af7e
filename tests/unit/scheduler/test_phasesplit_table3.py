"""Table 3's deployments as groups on the benchmark's 32-GPU cloud (benchmarks/thunderserve.py),
and why the conversation one cannot carry the benchmark's rate here: its decode replicas hold
too few requests' KV."""

from __future__ import annotations

from collections import Counter
from types import ModuleType

import pytest

from llmfabric.scheduler.phasesplit.config import ConfigSearch, decode_context, decode_seats
from llmfabric.sim.models import get_model
from llmfabric.testing.benchmark_module import load_benchmark
from llmfabric.testing.shared_data import require_data, shared_data

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def ts() -> ModuleType:
    return load_benchmark("thunderserve")


def _rows(ts: ModuleType, name: str) -> tuple[Counter[tuple[str, str]], int]:
    cluster = ts.cluster_of(ts.CLOUD)
    groups = ts.paper_deployment(cluster, name)
    used = [i for g in groups for i in g.gpus]
    assert sorted(used) == list(range(32))  # every GPU exactly once
    shape = Counter((g.phase, "+".join(f"{n}x{t}" for t, n in sorted(
        Counter(cluster.gpus[i].type for i in g.gpus).items()))) for g in groups)
    return shape, len(groups)


def test_coding_is_8_prefill_and_4_decode_replicas_as_printed(ts: ModuleType) -> None:
    shape, n = _rows(ts, "coding")
    assert n == 12
    assert shape == Counter({
        ("prefill", "2xA40"): 4, ("prefill", "4xRTX-A5000"): 1, ("prefill", "2xRTX-A6000"): 2,
        ("prefill", "2xRTX-3090-Ti+2xRTX-A5000"): 1,
        ("decode", "4xRTX-3090-Ti"): 1, ("decode", "2xRTX-A6000"): 2,
        ("decode", "2xRTX-3090-Ti+2xRTX-A5000"): 1})


def test_conversation_is_4_prefill_and_8_decode_replicas_as_printed(ts: ModuleType) -> None:
    shape, n = _rows(ts, "conversation")
    assert n == 12
    assert shape == Counter({
        ("prefill", "2xA40"): 3, ("prefill", "2xRTX-3090-Ti+2xRTX-A5000"): 1,
        ("decode", "4xRTX-3090-Ti"): 1, ("decode", "2xA40"): 1, ("decode", "4xRTX-A5000"): 1,
        ("decode", "2xRTX-A6000"): 4, ("decode", "2xRTX-3090-Ti+2xRTX-A5000"): 1})


def test_conversation_decode_seats_fall_short_of_littles_law_at_the_benchmark_rate(
        ts: ModuleType) -> None:
    # LLaMA-30B's 65 GB of weights leave a 2-GPU replica ~25 GB of KV (1.6 MB a token): about
    # a dozen conversation requests each. At 8 req/s a request holds its seat for its ~218
    # output tokens at a TPOT of up to 0.1 s, so the decode side must seat up to ~170
    # requests; Table 3's eight decode replicas seat fewer than 100 in all.
    require_data(shared_data("traces", ts.TRACES["conversation"]))
    cluster = ts.cluster_of(ts.CLOUD)
    wl = ts.workload("conversation")  # the benchmark's: lengths from the Azure trace
    search = ConfigSearch(cluster, get_model(ts.MODEL), wl)
    ctx = decode_context(wl)
    seats = 0
    for g in ts.paper_deployment(cluster, "conversation"):
        if g.phase != "decode":
            continue
        cfg = search.deduce(g.gpus, "decode")
        assert cfg is not None
        seats += sum(decode_seats(r.kv_capacity_tokens, ctx) for r in cfg.replica_configs)
    demand = wl.rate * wl.mean_out * wl.slo.tpot_s
    assert 80 < seats < 100
    assert demand > 150
