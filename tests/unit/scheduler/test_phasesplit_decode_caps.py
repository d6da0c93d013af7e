"""Decode capacity in Algorithm 2 and in the routing LP: the simulator's seat limits (KV less
the watermark, half a block per sequence, max_num_seqs), the length-biased mean context,
and the TPOT deadline binding the batch, the same in both places."""

from __future__ import annotations

import numpy as np
import pytest

from llmfabric import sim
from llmfabric.scheduler.phasesplit.config import (
    MAX_NUM_SEQS,
    ConfigSearch,
    decode_context,
    decode_rate,
    decode_seats,
    slo_batch,
)
from llmfabric.scheduler.phasesplit.orchestrate import MAX_UTILIZATION, PairModel
from llmfabric.scheduler.phasesplit.problem import CloudCluster, PDWorkload
from llmfabric.sim.engine import EngineConfig
from llmfabric.sim.topology import cloud_instances

pytestmark = pytest.mark.unit
MODEL = sim.get_model("llama-30b")


def test_seats_follow_the_simulators_admission_limits():
    cfg = EngineConfig()
    kv, ctx = 164_800, 1100.0
    want = int(kv * (1 - cfg.watermark) // (ctx + cfg.block_size / 2))
    assert decode_seats(kv, ctx) == want == 147  # not kv // ctx = 149
    assert decode_seats(10**9, ctx) == MAX_NUM_SEQS == cfg.max_num_seqs
    assert decode_seats(100, ctx) == 1


def test_mean_context_is_length_biased():
    same = PDWorkload(1.0, np.full(100, 1000), np.full(100, 128))
    assert decode_context(same) == pytest.approx(1000 + 64)
    spread = PDWorkload(1.0, np.full(4, 1000), np.array([10, 10, 10, 370]))
    # the 370-token output holds its seat 37x as long as each 10-token one
    assert decode_context(spread) == pytest.approx(1000 + (3 * 100 + 370**2) / 4 / (2 * 100))


def test_slo_batch_is_the_largest_batch_within_the_deadline():
    def step(k: int) -> float:
        return 0.02 + 0.001 * k

    assert slo_batch(step, 200, 0.1) == 80
    assert slo_batch(step, 50, 0.1) == 50  # memory binds
    assert slo_batch(step, 50, None) == 50
    assert slo_batch(step, 50, 0.01) == 0  # even one sequence misses


@pytest.fixture(scope="module")
def setup():
    cluster = CloudCluster.from_topology(
        cloud_instances([("A40", 8), ("RTX-3090-Ti", 8)], inter_gbps=(5, 40), seed=3)
    )
    wl = PDWorkload.from_means(4, 1020, 129, slo=sim.SLO(ttft_s=2, tpot_s=0.1))
    return cluster, wl


def test_algorithm_2_rates_a_decode_replica_within_the_tpot_deadline(setup):
    cluster, wl = setup
    cfg = ConfigSearch(cluster, MODEL, wl).deduce(frozenset(range(8)), "decode")
    assert cfg is not None
    r = cfg.replica_configs[0]
    ctx = decode_context(wl)
    seats = decode_seats(r.kv_capacity_tokens, ctx)
    b = slo_batch(lambda k: r.decode_step_time(k, ctx), seats, wl.slo.tpot_s)
    assert 0 < b <= seats
    assert r.decode_step_time(b, ctx) <= wl.slo.tpot_s
    assert r.throughput_tps == pytest.approx(b / r.decode_step_time(b, ctx))
    unbounded = decode_rate(r.step, r.kv_capacity_tokens, ctx, None)
    assert unbounded >= r.throughput_tps
    # the LP's capacity is the same rate under the utilisation cap
    pm = PairModel([r], [r], cluster, MODEL, wl, 4, 64)
    assert pm.b[0] * wl.mean_out == pytest.approx(MAX_UTILIZATION * r.throughput_tps)
    assert pm.b_max(0) == seats


def test_a_deadline_no_batch_meets_gives_no_decode_capacity(setup):
    cluster, wl = setup
    tight = PDWorkload(wl.rate, wl.in_lengths, wl.out_lengths, sim.SLO(ttft_s=2, tpot_s=1e-4))
    cfg = ConfigSearch(cluster, MODEL, tight).deduce(frozenset(range(8)), "decode")
    assert cfg is not None and cfg.throughput_tps == 0.0
    pm = PairModel(cfg.replica_configs, cfg.replica_configs, cluster, MODEL, tight, 4, 64)
    assert np.all(pm.b == 0.0)
