"""KV bytes with quantization metadata, staged KV transfer, memory-aware layer splits,
per-boundary pipeline links and per-stage all-reduce models (hand-computed cases)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.sim import InfeasibleError, Link, ModelSpec, SpecError, get_gpu, get_model
from llmfabric.sim.collectives import AllReduceModel, AllReduceRegime
from llmfabric.sim.costs import build_cost_model
from llmfabric.sim.layersplit import layer_caps, memory_aware_deployment, memory_aware_layers
from llmfabric.sim.memory import memory_plan
from llmfabric.sim.parallel import (
    Deployment,
    Stage,
    balanced_layer_split,
    kv_bytes_per_element,
    kv_transfer_bytes,
    kv_transfer_time,
    kv_transfer_time_staged,
    make_deployment,
)


def test_kv_bytes_count_group_metadata() -> None:
    m = get_model("llama-30b")  # 60 layers, 52 KV heads x 128: 1,597,440 B per token (fp16)
    assert m.kv_bytes_per_token() == 2 * 60 * 52 * 128 * 2
    fp16 = kv_transfer_bytes(m, 1024)
    assert fp16 == pytest.approx(1.636e9, rel=1e-3)
    q4 = kv_transfer_bytes(m, 1024, bits=4)  # group 64: 0.5 + 4/64 B per element
    assert kv_bytes_per_element(m, 4) == 0.5625
    assert fp16 / q4 == pytest.approx(16 / 4.5)
    assert fp16 / kv_transfer_bytes(m, 1024, bits=4, group=32) == pytest.approx(2 / 0.625)
    assert kv_transfer_bytes(m, 1024, bits=16) == fp16  # no re-quantization, no metadata
    # ThunderServe T1: 1024 tokens at an effective 3.0 GB/s
    assert kv_transfer_time(m, 1024, Link(3.0e9, 0.0)) == pytest.approx(0.5453, rel=1e-3)
    with pytest.raises(SpecError):
        kv_transfer_bytes(m, 10, bits=4, group=0)


def _dep(model: ModelSpec, layers: list[int], gpu: str = "A100-80GB") -> Deployment:
    g = get_gpu(gpu)
    return Deployment(model, tuple(Stage(g, 1, n) for n in layers))


def test_staged_transfer_is_the_slowest_overlapping_pair() -> None:
    m = get_model("llama-30b")
    pre = _dep(m, [30, 30])
    dec = _dep(m, [20, 20, 20])
    per_layer = m.kv_bytes_per_token() * 100 / 60
    # overlaps (p, d): (0,0) 20, (0,1) 10, (1,1) 10, (1,2) 20 layers; (0,2), (1,0) none
    links = {(0, 0): Link(10e9, 1e-3), (0, 1): Link(1e9, 0.0), (1, 1): Link(10e9, 0.0),
             (1, 2): Link(4e9, 2e-3), (0, 2): Link(1e3, 9.0), (1, 0): Link(1e3, 9.0)}
    got = kv_transfer_time_staged(pre, dec, 100, lambda p, d: links[(p, d)])
    expect = max(1e-3 + 20 * per_layer / 10e9, 10 * per_layer / 1e9, 10 * per_layer / 10e9,
                 2e-3 + 20 * per_layer / 4e9)
    assert got == pytest.approx(expect)
    assert got == pytest.approx(10 * per_layer / 1e9)  # the 1 GB/s pair decides
    # one stage each: ThunderServe eq. 1
    one = _dep(m, [60])
    link = Link(3e9, 1e-4)
    assert kv_transfer_time_staged(one, one, 100, lambda p, d: link, bits=4) == pytest.approx(
        kv_transfer_time(m, 100, link, bits=4))
    # same split on both sides over fast local links beats one slow whole-replica link
    same = kv_transfer_time_staged(pre, pre, 100,
                                   lambda p, d: Link(10e9, 0) if p == d else Link(1e3, 9))
    assert same == pytest.approx(30 * per_layer / 10e9)


def test_layer_split_water_fills_under_caps() -> None:
    assert balanced_layer_split(60, [1, 1]) == [30, 30]
    assert balanced_layer_split(60, [1, 1], caps=[40, 25]) == [35, 25]
    # A40 x2 vs 3090Ti x2 by bandwidth: 24.6 / 35.4; capped at 33 -> 27 / 33
    w = [696e9 * 2, 1008e9 * 2]
    assert balanced_layer_split(60, w) == [25, 35]
    assert balanced_layer_split(60, w, caps=[72, 33]) == [27, 33]
    assert balanced_layer_split(10, [1, 1, 1], caps=[1, 8, 8]) == [1, 5, 4]
    with pytest.raises(InfeasibleError):
        balanced_layer_split(60, [1, 1], caps=[30, 29])
    with pytest.raises(InfeasibleError):
        balanced_layer_split(60, [1, 1], caps=[60, 0])
    with pytest.raises(SpecError):
        balanced_layer_split(60, [1, 1], caps=[60])


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 120), st.lists(st.floats(0.01, 100), min_size=1, max_size=6),
       st.data())
def test_layer_split_laws(n: int, weights: list[float], data: st.DataObject) -> None:
    if n < len(weights):
        return
    caps = data.draw(st.lists(st.integers(1, n), min_size=len(weights),
                              max_size=len(weights)))
    if sum(caps) < n:
        with pytest.raises(InfeasibleError):
            balanced_layer_split(n, weights, caps)
        return
    got = balanced_layer_split(n, weights, caps)
    assert sum(got) == n
    assert all(1 <= g <= c for g, c in zip(got, caps, strict=True))


def test_memory_aware_split_restores_kv_room() -> None:
    # COMPANIONS §0.2.4: LLaMA-30B over 2 x A40 + 2 x 3090 Ti stages
    m = get_model("llama-30b")
    speed_only = make_deployment(m, ["A40", "RTX-3090-Ti"], [2, 2])
    assert [s.n_layers for s in speed_only.stages] == [25, 35]
    # the 3090 Ti stage (35 layers on 2 x 24,564 MiB) leaves less KV than the 4096-token
    # minimum the memory-aware split guarantees below
    assert memory_plan(speed_only).kv_capacity_tokens < 4096
    caps = layer_caps(m, ["A40", "RTX-3090-Ti"], [2, 2], kv_min_tokens=4096)
    assert caps[0] > 60 > 35 > caps[1]
    dep = memory_aware_deployment(m, ["A40", "RTX-3090-Ti"], [2, 2], kv_min_tokens=4096)
    assert [s.n_layers for s in dep.stages] == memory_aware_layers(
        m, ["A40", "RTX-3090-Ti"], [2, 2], kv_min_tokens=4096)
    assert dep.stages[1].n_layers == caps[1]
    assert memory_plan(dep).kv_capacity_tokens >= 4096
    # the 36/24 split of the design note leaves ~19.3K tokens; a big KV minimum reaches it
    big = memory_aware_deployment(m, ["A40", "RTX-3090-Ti"], [2, 2], kv_min_tokens=19000)
    assert memory_plan(big).kv_capacity_tokens >= 19000
    with pytest.raises(InfeasibleError):
        memory_aware_layers(m, ["RTX-3090-Ti", "RTX-3090-Ti"], [1, 1])


def test_per_boundary_pp_links_and_stage_allreduce(tiny: ModelSpec) -> None:
    g = get_gpu("A100-80GB")
    stages = (Stage(g, 2, 1), Stage(g, 2, 1))
    base = build_cost_model(Deployment(tiny, stages, pp_link=Link(1e9, 1e-3)))
    slow = build_cost_model(Deployment(tiny, stages, pp_links=(Link(1e6, 5e-3),)))
    act = tiny.hidden * tiny.act_bits / 8
    m = 100
    assert slow.linear_time(m) - base.linear_time(m) == pytest.approx(
        (5e-3 + act * m / 1e6) - (1e-3 + act * m / 1e9))
    with pytest.raises(SpecError):
        Deployment(tiny, stages, pp_links=(Link(1e9, 0), Link(1e9, 0)))
    planned = AllReduceModel(AllReduceRegime(1e-3, 0.0, 1e12))
    dep = Deployment(tiny, stages, pp_link=Link(1e9, 1e-3), stage_allreduces=(planned, None))
    assert dep.stage_allreduce(0) is planned
    assert dep.stage_allreduce(1) == base.deployment.stage_allreduce(1)
    slow_ar = build_cost_model(dep)
    ar_bytes = 2 * tiny.hidden * tiny.act_bits / 8 / 2
    default_ar = base.deployment.stage_allreduce(0).time(ar_bytes * m, 2)
    # 2 all-reduces per layer, 1 layer in stage 0
    assert slow_ar.linear_time(m) - base.linear_time(m) == pytest.approx(
        2 * (planned.time(ar_bytes * m, 2) - default_ar), rel=1e-6)
    with pytest.raises(SpecError):
        Deployment(tiny, stages, stage_allreduces=(planned,))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=4),
       st.lists(st.integers(1, 20), min_size=1, max_size=4),
       st.floats(1e8, 1e11), st.floats(0, 1e-2), st.integers(1, 5000))
def test_staged_transfer_over_one_link_ships_the_largest_overlap(
        a: list[int], b: list[int], bw: float, lat: float, n: int) -> None:
    total = sum(a)
    if sum(b) != total:
        b = [*b[:-1], b[-1] + total - sum(b)] if sum(b) < total else [total]
    model = ModelSpec(name="law", n_layers=total, hidden=256, n_heads=8, n_kv_heads=2,
                      head_dim=32, ffn_hidden=512, vocab=1000)
    g = get_gpu("A100-80GB")
    pre = Deployment(model, tuple(Stage(g, 1, x) for x in a))
    dec = Deployment(model, tuple(Stage(g, 1, x) for x in b))
    link = Link(bw, lat)
    ra, rb = pre.layer_ranges(), dec.layer_ranges()
    biggest = max(min(x1, y1) - max(x0, y0) for x0, x1 in ra for y0, y1 in rb)
    got = kv_transfer_time_staged(pre, dec, n, lambda p, d: link, bits=4)
    per_layer = kv_transfer_bytes(model, n, bits=4) / total
    assert got == pytest.approx(lat + biggest * per_layer / bw)
    assert got <= kv_transfer_time(model, n, link, bits=4) * (1 + 1e-12)


def test_thunderserve_t1_kv_communication_times() -> None:
    # COMPANIONS §1.7 T1: LLaMA-30B, 1024-token prompt; 40 Gbps link (effective 3.0 GB/s) and
    # PCIe (10 GB/s); paper: 584 ms (16-bit), 133 ms (4-bit), 41 ms (4-bit, low-bandwidth plan)
    m = get_model("llama-30b")
    wan, pcie = Link(3.0e9, 0.0), Link(10e9, 0.0)
    t16 = kv_transfer_time(m, 1024, wan)
    t4 = kv_transfer_time(m, 1024, wan, bits=4)
    low = kv_transfer_time(m, 1024, pcie, bits=4)
    assert t16 == pytest.approx(0.584, rel=0.15)  # 545 ms
    assert low == pytest.approx(0.041, rel=0.15)  # 46 ms
    assert 3.5 <= t16 / t4 <= 4.5  # 3.56 with group-64 metadata (paper 4.39)
    # 153 ms: 15.3 % above the paper's 133 ms, just outside T1's 15 % band (the paper's
    # 4.39 ratio implies less metadata than a group-64 fp16 scale and minimum)
    assert t4 == pytest.approx(m.kv_bytes_per_token() * 1024 * 4.5 / 16 / 3.0e9)
    assert 0.15 < t4 < 0.16
