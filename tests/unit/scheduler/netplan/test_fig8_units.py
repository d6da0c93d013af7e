"""Fig. 8's cluster units (benchmarks/heroserve.py): core uplinks from the paper's switch
counts, and prefill and decode units joined through the core."""

from __future__ import annotations

from types import ModuleType

import pytest

from llmfabric.scheduler.netplan.paths import Routes
from llmfabric.testing.benchmark_module import load_benchmark

pytestmark = pytest.mark.unit



@pytest.fixture(scope="module")
def hs() -> ModuleType:
    return load_benchmark("heroserve")


def test_core_uplinks_from_the_papers_switch_counts(hs: ModuleType) -> None:
    # 2tracks: 24 GPU ports per access switch, 8 ports left, but 27 x 32 core ports over 400
    # access switches is 2.16 ports: 216 Gbit/s (24 x 100 / 216 = 11:1 oversubscribed)
    assert hs.core_uplink_gbps("2tracks") == pytest.approx(216.0)
    # 8tracks: 16 GPU ports, 16 left; 280 x 32 / 600 = 14.93 ports: 1493 Gbit/s (1.07:1)
    assert hs.core_uplink_gbps("8tracks") == pytest.approx(1493.333, abs=1e-3)
    with pytest.raises(ValueError, match="tracks must be"):
        hs.core_uplink_gbps("4tracks")


@pytest.mark.parametrize(
    ("tracks", "servers", "n_tracks", "first_decode"),
    [("2tracks", 6, 2, "gpu48"), ("8tracks", 16, 8, "gpu128")],
)
def test_kv_from_prefill_to_decode_crosses_the_core(
    hs: ModuleType, tracks: str, servers: int, n_tracks: int, first_decode: str
) -> None:
    topo = hs.pd_units(tracks)
    assert len(topo.gpus()) == 2 * servers * 8
    assert sorted(topo.switches()) == sorted(
        ["core0"] + [f"{u}access{t}" for u in "pd" for t in range(n_tracks)]
    )
    up = hs.core_uplink_gbps(tracks) * 1e9 / 8
    nic = 100e9 / 8
    routes = Routes(topo, 1 << 20)
    kv = routes.route("gpu0", first_decode)  # GPU 0 of the first server of each unit
    assert kv.nodes == ("gpu0", "paccess0", "core0", "daccess0", first_decode)
    assert kv.inverse_bw_sum == pytest.approx(2 / nic + 2 / up)
    # inside the prefill unit, across servers, the access switch suffices
    assert routes.route("gpu0", "gpu8").nodes == ("gpu0", "paccess0", "gpu8")
    problem = hs.unit_problem(tracks, "chatbot")
    assert problem.prefill_gpus == tuple(f"gpu{k}" for k in range(servers * 8))
    assert problem.decode_gpus[0] == first_decode


def test_four_gpu_servers_spread_over_every_track(hs: ModuleType) -> None:
    """The testbed-sized sensitivity (`--fig8-gpus-per-server 4`): half the GPUs, the same
    core share (the core's ports bind either way), and the NICs counted over the unit pair,
    so 8tracks still uses all eight access switches (k mod 8 within a 4-GPU server would
    leave four of them without a GPU)."""
    assert hs.core_uplink_gbps("2tracks", 4) == hs.core_uplink_gbps("2tracks")
    assert hs.core_uplink_gbps("8tracks", 4) == hs.core_uplink_gbps("8tracks")
    topo = hs.pd_units("8tracks", gpus_per_server=4)
    assert len(topo.gpus()) == 2 * 16 * 4
    access = {g: next(e.other(g) for e in topo.neighbours(g) if e.kind == "ethernet")
              for g in topo.gpus()}
    assert [access[f"gpu{k}"] for k in range(8)] == [f"paccess{t}" for t in range(8)]
    assert access["gpu64"] == "daccess0"  # the decode unit starts on its own first switch
    assert {topo.gpu(f"gpu{k}").host for k in range(8)} == {"server0", "server1"}
    assert hs.pd_units("2tracks").gpus() == hs.pd_units("2tracks", gpus_per_server=8).gpus()
    problem = hs.unit_problem("2tracks", "summarization", gpus_per_server=4)
    assert len(problem.prefill_gpus) == len(problem.decode_gpus) == 24
