"""The planner's memoisation (group signatures, combo scores, pair terms) gives the answers a
fresh deduction gives, on the concrete GPUs of the group asked about."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from llmfabric import sim
from llmfabric.scheduler.phasesplit.config import ConfigSearch, GroupConfig
from llmfabric.scheduler.phasesplit.evaluate import replicas_of
from llmfabric.scheduler.phasesplit.groups import Group
from llmfabric.scheduler.phasesplit.orchestrate import PairModel
from llmfabric.scheduler.phasesplit.pairmemo import PairMemo
from llmfabric.scheduler.phasesplit.problem import GPU, CloudCluster, PDWorkload
from llmfabric.sim.linkmatrix import LinkMatrix

pytestmark = pytest.mark.unit

MODEL = sim.get_model("llama-3.1-8b")
WL = PDWorkload.from_means(20.0, 800, 100, slo=sim.SLO(ttft_s=1.5, tpot_s=0.05))


@pytest.fixture(scope="module")
def cluster() -> CloudCluster:
    """Hosts h0, h1 (4 x A40 each) and h2 (4 x 3090 Ti); 10 GB/s inside a host, 2.5 GB/s
    between h0 and h1 and from both to h2, except that h1-h2 is 0.6 GB/s."""
    gpus = [GPU(i, "A40" if i < 8 else "RTX-3090-Ti", f"h{i // 4}") for i in range(12)]
    host_bw = np.array([[10e9, 2.5e9, 2.5e9], [2.5e9, 10e9, 0.6e9], [2.5e9, 0.6e9, 10e9]])
    h = np.arange(12) // 4
    bw = host_bw[h][:, h]
    return CloudCluster.from_links(gpus, LinkMatrix(bw, np.full((12, 12), 1e-4)))


def _shape(cfg: GroupConfig | None) -> object:
    assert cfg is not None
    return (
        cfg.tp,
        cfg.pp,
        [
            (
                tuple((s.type, s.layers, len(s.gpus)) for s in r.stages),
                r.kv_capacity_tokens,
                r.latency_s,
                r.throughput_tps,
            )
            for r in cfg.replica_configs
        ],
    )


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_a_group_with_a_known_signature_is_remapped_onto_its_own_gpus(cluster, phase):
    cs = ConfigSearch(cluster, MODEL, WL)
    first = cs.deduce(frozenset({0, 1, 2}), phase)
    again = cs.deduce(frozenset({1, 2, 3}), phase)  # same host, other GPUs
    other = cs.deduce(frozenset({4, 5, 6}), phase)  # other host, same links
    assert cs.deduced == 1
    for gpus, cfg in (({1, 2, 3}, again), ({4, 5, 6}, other)):
        assert cfg is not None
        used = [g for r in cfg.replica_configs for g in r.gpus]
        assert set(used) <= gpus and len(used) == len(set(used))
        fresh = ConfigSearch(cluster, MODEL, WL).deduce(frozenset(gpus), phase)
        assert _shape(cfg) == _shape(fresh) == _shape(first)


def test_links_are_part_of_the_signature(cluster):
    cs = ConfigSearch(cluster, MODEL, WL)
    cs.deduce(frozenset({0, 1, 8, 9}), "decode")  # A40 pair on h0 + 3090 Ti pair, 2.5 GB/s
    cs.deduce(frozenset({4, 5, 8, 9}), "decode")  # the same types over 0.6 GB/s
    assert cs.deduced == 2
    cs.deduce(frozenset({2, 3, 10, 11}), "decode")  # the first one's shape again
    assert cs.deduced == 2


def test_pair_terms_from_the_memo_equal_fresh_ones(cluster):
    cs = ConfigSearch(cluster, MODEL, WL)
    memo = PairMemo(cluster, MODEL, WL, 4, 64)
    groups = [
        Group(frozenset({0, 1}), "prefill"),
        Group(frozenset({4, 5}), "prefill"),
        Group(frozenset({8, 9, 10, 11}), "decode"),
        Group(frozenset({2, 3}), "decode"),
    ]
    configs = [cs.deduce(g.gpus, g.phase) for g in groups]
    assert all(c is not None for c in configs)
    pre = replicas_of(groups, configs, "prefill")  # type: ignore[arg-type]
    dec = replicas_of(groups, configs, "decode")  # type: ignore[arg-type]
    PairModel(pre, dec, cluster, MODEL, WL, 4, 64, memo)  # fills the memo
    assert memo.transfer and memo.prefill and memo.capacity
    cached = PairModel(pre, dec, cluster, MODEL, WL, 4, 64, memo)
    fresh = PairModel(pre, dec, cluster, MODEL, WL, 4, 64)
    for name in ("prefill_s", "a", "b", "kv_s"):
        assert np.array_equal(getattr(cached, name), getattr(fresh, name)), name
    lam_p, lam_d = np.full(len(pre), 4.0), np.full(len(dec), 5.0)
    assert np.array_equal(cached.attainment(lam_p, lam_d), fresh.attainment(lam_p, lam_d))
    # another model, workload or KV format never reads this memo
    assert memo.usable(cluster, MODEL, WL, 4, 64)
    assert not memo.usable(cluster, dataclasses.replace(MODEL, n_layers=2), WL, 4, 64)
    assert not memo.usable(cluster, MODEL, WL.scaled(5.0), 4, 64)
    assert not memo.usable(cluster, MODEL, WL, None, 64)
    other = PairModel(pre, dec, cluster, MODEL, WL, None, 64, memo)
    assert not np.array_equal(other.kv_s, fresh.kv_s)
