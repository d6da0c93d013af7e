"""HeroServe (network-aware PD planning) against its paper's figures, simulated.

    .venv/bin/python benchmarks/heroserve.py --json results/heroserve.json [--fig8-candidates 8]
        [--fig8-kv-tpot amortized] [--fig8-gpus-per-server 4]

Sections (each row carries the paper's figure beside ours):
- fig1: share of the prefill latency spent in TP all-reduce (the paper's Fig. 1 is a
  "prefill cost breakdown"; the whole batch with its 63 decode steps is printed beside it),
  Llama-3-70B TP4 across servers
  (one GPU per server) over 100GbE, batch 8, 1024 in / 64 out; three all-reduce models:
  (a) ring over the 100GbE route with 1 us per hop (the topology's), (b) the same bandwidth
  with the per-collective latency measured across DGX-A100 nodes (vidur a100_dgx, 2 ranks,
  1 per node; intercept of a relative least-squares fit, unit-free), (c) the whole measured
  cross-node regime (intercept and slope, `size` read as bytes). Targets (COMPANIONS H5):
  >= 50 % on L40, >= 60 % on A100, A100 > L40.
- fig2: 1 MB INA over two Ethernet hops vs NVLink to a mate whose NIC is on the
  aggregating switch then one hop (paper: ~160 us vs ~90 us, 43 % lower).
- testbed (Fig. 7): 2 x (4 x A100-40GB) + 2 x (4 x V100-32GB), OPT-66B, chatbot and
  summarization; H (largest rate meeting both SLAs) per system, and the paper's metric, the
  largest per-GPU Poisson rate whose discrete-event run keeps >= 90 % within both SLAs.
- fig8: the large-scale clusters' units (2tracks: 6 x 8 A100-40GB on 2 access switches;
  8tracks: 16 x 8 on 8; A100-80GB again as a sensitivity), OPT-175B, one unit prefills and
  another decodes, joined through the core (Fig. 4), so the KV hand-off crosses it (`pd_units`);
  core uplinks per access switch from the paper's 400/27 and 600/280 switch counts with
  32 x 100G switches (`core_uplink_gbps`: 216 Gbit/s on 2tracks, 11:1; 1493 on 8tracks,
  1.07:1). Printed per plan: what binds at H (`NetPlan.binding`: prefill load, TTFT,
  KV-memory cap, TPOT, or link:<edge> when a link's capacity x 0.9 does), network against
  compute (prefill; TPOT = compute step + step network + KV hand-off + its wait on the
  bottleneck link), the busiest link's utilisation and the KV load on the core uplinks at
  H. Targets (H4): HeroServe >= every baseline; its gain on 2tracks >= on 8tracks.
  `--fig8-kv-tpot amortized` charges the KV hand-off once per request, spread over its
  output, instead of eq. 4's every token (a sensitivity: `NetProblem.kv_tpot`).
  `--fig8-gpus-per-server 4` builds the units from the testbed's 4-GPU servers (a
  sensitivity: tensor-parallel groups span servers sooner, where aggregation can matter).
- planner: run time and perturbation sweeps on the testbed (H6: <= 30 s on 2 cores, <= 5).
- fig9: concurrent all-reduces of three TP4 groups (each over two servers and both tracks
  of the 4 x 4 testbed shape) on the flow simulator, each group's cheapest policy on an idle
  network kept fixed vs the online policy table (printed).
- fig10: prefill-side KV residency (summarization, OPT-175B, 0.07 req/s): each request's KV
  stays on the prefill GPUs for T_f; resident bytes = rate x KV bytes x T_f (printed, with
  T_f's M/G/1 wait behind other hand-offs at that rate beside it).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_results

from llmfabric.scheduler.netplan.baselines import BASELINES
from llmfabric.scheduler.netplan.commcost import NET_COLLECTIVE_S, group_allreduce, ina_breakdown
from llmfabric.scheduler.netplan.online import run_rounds
from llmfabric.scheduler.netplan.planner import HEROSERVE, NetPlan, plan_with
from llmfabric.scheduler.netplan.problem import KV_TPOT, NetProblem, NetWorkload
from llmfabric.scheduler.netplan.runner import sla_rate
from llmfabric.sim.collectives import AllReduceModel, AllReduceRegime
from llmfabric.sim.costs import build_cost_model
from llmfabric.sim.hardware import get_gpu
from llmfabric.sim.memory import memory_plan
from llmfabric.sim.models import get_model
from llmfabric.sim.parallel import Deployment, Link, kv_transfer_bytes, make_deployment
from llmfabric.sim.topology import Topology, fat_tree_tracks

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("LLMFABRIC_SHARED_DATA", ROOT.parent / "shared" / "data"))
SYSTEMS = (HEROSERVE, *BASELINES)
FREE = AllReduceModel(AllReduceRegime(0.0, 0.0, 1e30))
FREE_LINK = Link(1e30, 0.0)


# --- Fig. 1 ----------------------------------------------------------------------------------
def measured_cross_node() -> tuple[float, float] | None:
    """(intercept s, slope s/byte) of vidur's a100_dgx all-reduce, 2 ranks on 2 nodes."""
    path = SHARED / "operator-profiles" / "vidur" / "network" / "a100_dgx" / "all_reduce.csv"
    if not path.exists():
        return None
    rows = [r for r in csv.DictReader(path.open())
            if r["num_workers"] == "2" and r["devices_per_node"] == "1"]
    x = np.array([float(r["size"]) for r in rows])
    y = np.array([float(r["time_stats.all_reduce.median"]) * 1e-3 for r in rows])
    a = np.vstack([np.ones_like(x), x]).T / y[:, None]
    (c0, c1), *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
    return float(c0), float(c1)


def net_excess_from_data() -> dict[str, float] | None:
    """Check of `commcost.NET_COLLECTIVE_S` on vidur's a100_dgx all-reduce (messages <= 64 KB,
    median over sizes of the per-size minimum): a line in ring steps 2(n-1) through the
    intra-node points (2, 4, 8 ranks on one node), and each cross-node point's excess over it
    (2, 4, 8, 16 ranks on two nodes; 2 ranks on two)."""
    path = SHARED / "operator-profiles" / "vidur" / "network" / "a100_dgx" / "all_reduce.csv"
    if not path.exists():
        return None
    rows = list(csv.DictReader(path.open()))

    def small(n: int, per_node: int) -> float:
        ts = [float(r["time_stats.all_reduce.min"]) * 1e-3 for r in rows
              if r["num_workers"] == str(n) and r["devices_per_node"] == str(per_node)
              and float(r["size"]) <= 65536]
        return float(np.median(ts))

    intra = [(2.0 * (n - 1), small(n, n)) for n in (2, 4, 8)]
    slope, icpt = np.polyfit([x for x, _ in intra], [y for _, y in intra], 1)
    out = {f"intra_{n}": small(n, n) for n in (2, 4, 8)}
    excess = []
    for n, per in ((2, 1), (4, 2), (8, 4), (16, 8)):
        t = small(n, per)
        out[f"cross_{n}x{per}"] = t
        excess.append(t - (icpt + slope * 2 * (n - 1)))
    out["excess_min"], out["excess_max"] = min(excess), max(excess)
    out["excess_mean"] = float(np.mean(excess))
    return out


def prefill_latency(dep: Deployment, batch: int = 8, k_in: int = 1024) -> float:
    """The batch's prefill: what Fig. 1 breaks down ("Prefill cost breakdown", [33])."""
    return build_cost_model(dep).prefill_time([k_in] * batch)


def batch_latency(dep: Deployment, batch: int = 8, k_in: int = 1024, k_out: int = 64) -> float:
    cm = build_cost_model(dep)
    t = cm.prefill_time([k_in] * batch)
    for k in range(1, k_out):
        t += cm.decode_step_time(batch, batch * (k_in + k))
    return t


def fig1() -> list[dict[str, Any]]:
    fit = measured_cross_node()
    topo = Topology()
    topo.add_switch("tor")
    for k in range(4):
        topo.add_gpu(f"g{k}", "A100-80GB", f"server{k}")
        topo.add_edge(f"g{k}", "tor", "ethernet", gbps=100, latency_s=1e-6)
    group = [f"g{k}" for k in range(4)]
    models = {"a: ring over 100GbE route (1 us/hop)": group_allreduce(topo, group, "ring", None),
              f"b: a + the NIC cost ({NET_COLLECTIVE_S * 1e6:.0f} us, the planner's default)":
              group_allreduce(topo, group, "ring", None, net_s=NET_COLLECTIVE_S)}
    if fit is not None:
        models["c: measured cross-node regime"] = AllReduceModel(
            AllReduceRegime(fit[0], 0.0, 1.0 / fit[1]))
    rows = []
    paper = {"L40": "> 65 %", "A100-80GB": "> 75 %"}
    for gpu in ("L40", "A100-80GB"):
        base = make_deployment("llama-3.1-70b", gpu, 4, 1)
        free = replace(base, stage_allreduces=(FREE,))
        compute, compute_pre = batch_latency(free), prefill_latency(free)
        for name, m in models.items():
            dep = replace(base, stage_allreduces=(m,))
            total, pre = batch_latency(dep), prefill_latency(dep)
            share, share_batch = (pre - compute_pre) / pre, (total - compute) / total
            rows.append({"section": "fig1", "case": f"{gpu} {name}",
                         "ours": f"prefill {share:.1%} all-reduce ({pre:.2f} s); "
                                 f"whole batch incl. 63 decode steps {share_batch:.1%} "
                                 f"({total:.2f} s)",
                         "paper": paper[gpu] + " (prefill)", "share": share,
                         "share_batch": share_batch})
    return rows


# --- Fig. 2 ----------------------------------------------------------------------------------
def fig2() -> list[dict[str, Any]]:
    t = Topology()
    for s in ("A", "B", "C"):
        t.add_switch(s, 4)
    t.add_gpu("a", "A100-80GB", "h0")
    t.add_gpu("m", "A100-80GB", "h0")
    t.add_gpu("b", "A100-80GB", "h1")
    for x, y in (("a", "A"), ("m", "B"), ("b", "B"), ("A", "C"), ("B", "C")):
        t.add_edge(x, y, "ethernet", gbps=100, latency_s=1e-6)
    t.add_edge("a", "m", "nvlink", gbs=300, latency_s=2e-6)
    core = ina_breakdown(t, ["a", "b"], "C", 1e6)
    near = ina_breakdown(t, ["a", "b"], "B", 1e6)
    return [{"section": "fig2", "case": "1 MB INA collect: 2 Ethernet hops (core)",
             "ours": f"{core.collect_s * 1e6:.1f} us", "paper": "~160 us"},
            {"section": "fig2", "case": "1 MB INA collect: NVLink + 1 hop (access)",
             "ours": f"{near.collect_s * 1e6:.1f} us "
                     f"({1 - near.collect_s / core.collect_s:.0%} lower)",
             "paper": "~90 us (43 % lower)"}]


# --- planning runs ---------------------------------------------------------------------------
def plans(problem: NetProblem) -> dict[str, NetPlan]:
    return {s.name: plan_with(problem, s) for s in SYSTEMS}


def testbed_problem(kind: str) -> NetProblem:
    topo = Topology.from_yaml(ROOT / "examples" / "heroserve" / "testbed-2tracks.yaml")
    wl, sla = (("sharegpt", 2.5) if kind == "chatbot" else ("longbench", 15.0))
    return NetProblem.of(topo, "opt-66b", "a100-*", "v100-*",
                         NetWorkload.from_yaml(ROOT / "examples" / "heroserve" / f"{wl}.yaml"),
                         sla, 0.15)


# The paper's simulation says "A100 GPU servers" without the memory; the only A100 it
# specifies (its testbed, §V) has 40 GB, so that is the default. With 40 GB one 8-GPU server
# (320 GB) cannot hold OPT-175B's 350 GB of FP16 weights: every instance spans servers.
FIG8_GPU = "A100-40GB"


# §V "Simulation Settings": 1200 servers; 2tracks = units of 6 servers on 2 access switches,
# "400 access switches and 27 core switches in total"; 8tracks = 16 servers on 8, "600 access
# switches and 280 core switches". Port counts are not given: every switch is taken as the
# testbed's Tofino 1 (§V "Testbed Deployment") with 32 x 100G ports, the core's ports shared
# evenly by the access switches, capped by the ports an access switch has left after its GPUs.
SWITCH_PORTS, PORT_GBPS, SERVERS_TOTAL = 32, 100.0, 1200
# tracks -> (servers per unit, access switches per unit, access switches, core switches)
CLUSTERS = {"2tracks": (6, 2, 400, 27), "8tracks": (16, 8, 600, 280)}


def core_uplink_gbps(tracks: str, gpus_per_server: int = 8) -> float:
    """Per access switch: 2tracks min(32 - 24, 27 x 32 / 400) x 100G = 216 Gbit/s (11:1 over
    its 24 GPU ports); 8tracks min(32 - 16, 280 x 32 / 600) x 100G = 1493 Gbit/s (1.07:1).
    (With 4 GPUs a server, the core's share binds on both: the same numbers.)"""
    if tracks not in CLUSTERS:
        raise ValueError(f"tracks must be one of {sorted(CLUSTERS)}, not {tracks!r}")
    servers, n_tracks, n_access, n_core = CLUSTERS[tracks]
    if SERVERS_TOTAL // servers * n_tracks != n_access:  # the paper's counts agree
        raise ValueError(f"{tracks}: {SERVERS_TOTAL} servers do not give {n_access} access")
    gpu_ports = servers * gpus_per_server // n_tracks
    return min(SWITCH_PORTS - gpu_ports, n_core * SWITCH_PORTS / n_access) * PORT_GBPS


def pd_units(tracks: str, gpu: str = FIG8_GPU, gpus_per_server: int = 8) -> Topology:
    """A prefill unit (`gpu0`..) and a decode unit, each its own servers on its own access
    switches (`paccess{t}`, `daccess{t}`), joined through the core (§III-B, Fig. 4: "each
    cluster has its own GPU cards ... and access switches ... These clusters communicate
    through a core switch"), so the KV hand-off crosses two core uplinks. The 27 / 280 core
    switches are one node `core0` whose link to each access switch is that switch's whole
    share (`core_uplink_gbps`). Inside a unit `fat_tree_tracks`' wiring: GPU k's 100G NIC on
    the unit's access switch k mod tracks (k counted over the unit pair's GPUs), NVLink
    all-to-all in a server (300 GB/s, 2 us), 1 us per Ethernet hop, 8 aggregator slots a
    switch. `gpus_per_server`: the paper's 8; 4 (its testbed's servers) is a sensitivity."""
    servers, n_tracks, _, _ = CLUSTERS[tracks]
    up = core_uplink_gbps(tracks, gpus_per_server)
    name = get_gpu(gpu).name
    topo = Topology()
    topo.add_switch("core0", 8)
    n = 0
    for u, unit in enumerate(("p", "d")):
        for t in range(n_tracks):
            topo.add_switch(f"{unit}access{t}", 8)
            topo.add_edge(f"{unit}access{t}", "core0", "ethernet", gbps=up, latency_s=1e-6)
        for s in range(u * servers, (u + 1) * servers):
            ids = [f"gpu{n + k}" for k in range(gpus_per_server)]
            for k, gid in enumerate(ids):
                topo.add_gpu(gid, name, f"server{s}")
                topo.add_edge(gid, f"{unit}access{(n + k) % n_tracks}", "ethernet", gbps=100,
                              latency_s=1e-6)
            n += gpus_per_server
            for a in range(gpus_per_server):
                for b in range(a + 1, gpus_per_server):
                    topo.add_edge(ids[a], ids[b], "nvlink", gbs=300, latency_s=2e-6)
    return topo


# Alg. 1's candidate cap for the units: the paper's max_candi, 20 (§III-B). 8 made the run
# ~2.6x shorter but left out layouts such as (8, 3, 8, 2) that every system picks on 2tracks
# summarization, which inflated HeroServe's gains there (docs/benchmarks.md "HeroServe
# Fig. 8 2tracks: INA members"); `--fig8-candidates 8` reproduces those numbers.
FIG8_MAX_CANDI = 20


def unit_problem(tracks: str, kind: str, rate: float = 1.0,
                 gpu: str = FIG8_GPU, max_candi: int = FIG8_MAX_CANDI,
                 kv_tpot: str = "per_token", gpus_per_server: int = 8) -> NetProblem:
    topo = pd_units(tracks, gpu, gpus_per_server)
    gpus = topo.gpus()
    half = len(gpus) // 2  # the prefill unit's GPUs, then the decode unit's
    wl = NetWorkload(rate, 512, 256) if kind == "chatbot" else NetWorkload(rate, 1792, 256)
    sla = (4.0, 0.2) if kind == "chatbot" else (25.0, 0.2)
    return NetProblem(topo, get_model("opt-175b"), tuple(gpus[:half]), tuple(gpus[half:]), wl,
                      *sla, max_candi=max_candi, restarts=3, kv_tpot=kv_tpot)


def at_h(p: NetPlan, core_bytes_s: float | None = None) -> dict[str, float]:
    """What binds at the plan's H: prefill utilisation and TTFT (M/D/1, as the planner), the
    decode batch (Little's law) against the KV-memory cap, and TPOT there. Network against
    compute: the prefill's network share (T_pre - T_c_pre) / T_pre; the TPOT at H split into
    the compute-only step, the step's network (all-reduces and PP sends) and the KV hand-off
    T_f (eq. 4 counts it in TPOT) with its wait behind other hand-offs on the bottleneck link
    (M/G/1, `NetPlan.T_f_wait_h`). `core_bytes_s`: the prefill unit's core uplinks in all;
    then the KV bytes H sends through them per second, as a share of it (H keeps every
    link's whole load, KV + all-reduce + PP, within `NetProblem.link_util` of its capacity:
    `NetPlan.link_util_h` on `link_edge_h`)."""
    assert p.problem is not None
    pre, dec = p.deployments()
    wl = p.problem.workload
    lp, ld = p.H / len(pre), p.H / len(dec)
    rho = lp * p.T_pre
    ctx = wl.mean_in + wl.mean_out / 2
    cms = [build_cost_model(d) for d in dec]
    free = [build_cost_model(replace(d, stage_allreduces=(FREE,) * d.pp,
                                     pp_links=(FREE_LINK,) * (d.pp - 1))) for d in dec]

    def step(b: float, models: list[Any] = cms) -> float:
        n = max(1, math.ceil(b))
        return max(cm.decode_step_time(n, n * ctx) for cm in models)

    cap = min(memory_plan(d).kv_capacity_tokens for d in dec) / (wl.mean_in + wl.mean_out)
    b = 1.0
    for _ in range(200):  # b = lambda_d K_out step(b), just below H
        b = min(cap, max(1.0, 0.999 * ld * wl.mean_out * step(b)))
    tpot = step(b) + p.problem.kv_in_tpot(p.T_f + p.T_f_wait_h)
    out = {"rho_pre": rho, "ttft_s": lp * p.T_pre ** 2 / (2 * (1 - rho)) + p.T_pre,
           "batch": b, "batch_cap": cap, "tpot_at_h_s": tpot,
           "net_share_pre": (p.T_pre - p.T_c_pre) / p.T_pre,
           "step_compute_s": step(b, free), "step_net_s": step(b) - step(b, free),
           "t_f_s": p.T_f, "t_f_wait_s": p.T_f_wait_h,
           "net_share_tpot": (tpot - step(b, free)) / tpot, "link_util": p.link_util_h}
    if core_bytes_s is not None:
        out["kv_core_load"] = p.H * kv_transfer_bytes(p.problem.model, wl.mean_in) / core_bytes_s
    return out


def comparison_rows(section: str, case: str, ps: dict[str, NetPlan],
                    paper: dict[str, str], binding: bool = False,
                    core_bytes_s: float | None = None) -> list[dict[str, Any]]:
    hero = ps["heroserve"]
    rows = []
    for name, p in ps.items():
        gain = hero.per_gpu_rate / p.per_gpu_rate if p.per_gpu_rate > 0 else float("inf")
        row = {"section": section, "case": f"{case} {name}",
               "ours": f"H {p.H:.3g} req/s, {p.per_gpu_rate:.3g}/GPU, P_all {p.p_all}, "
                       f"TPOT {p.T_dec * 1e3:.1f} ms; HeroServe x{gain:.2f}",
               "paper": paper.get(name, ""), "H": p.H, "per_gpu": p.per_gpu_rate,
               "gain": gain, "binding": p.binding, "link_edge": p.link_edge_h}
        if binding and p.H > 0:
            b = at_h(p, core_bytes_s)
            row["at_H"] = b
            assert p.problem is not None
            per = "" if p.problem.kv_tpot == "per_token" else \
                f" over {p.problem.workload.mean_out:.0f} tokens"
            row["ours"] += (f"; at H: prefill rho {b['rho_pre']:.2f}, TTFT "
                            f"{b['ttft_s']:.2f} s, decode batch {b['batch']:.0f} of "
                            f"{b['batch_cap']:.0f} (KV cap), TPOT {b['tpot_at_h_s'] * 1e3:.0f} ms"
                            f" = compute {b['step_compute_s'] * 1e3:.0f} + step network "
                            f"{b['step_net_s'] * 1e3:.1f} + (KV {b['t_f_s'] * 1e3:.0f} "
                            f"+ KV wait {b['t_f_wait_s'] * 1e3:.0f}){per} "
                            f"(network {b['net_share_tpot']:.0%}); prefill network "
                            f"{b['net_share_pre']:.0%}; binds: {p.binding}; busiest link "
                            f"{p.link_edge_h} {b['link_util']:.0%}")
            if "kv_core_load" in b:
                row["ours"] += f"; KV load on the core uplinks {b['kv_core_load']:.0%}"
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--fig8-candidates", type=int, default=FIG8_MAX_CANDI,
                    help="Alg. 1's max_candi for the Fig. 8 / Fig. 10 units (the paper's: 20)")
    ap.add_argument("--fig8-kv-tpot", choices=KV_TPOT, default="per_token",
                    help="how the KV hand-off enters TPOT in the Fig. 8 units: eq. 4 as "
                    "printed (every token), or amortized over the output (a sensitivity)")
    ap.add_argument("--fig8-gpus-per-server", type=int, choices=(4, 8), default=8,
                    help="GPUs a server in the Fig. 8 units: the paper's 8, or its testbed's 4 "
                    "(a sensitivity: tensor-parallel groups then span servers sooner)")
    args = ap.parse_args()
    if args.fig8_candidates < 1:
        ap.error("--fig8-candidates must be >= 1")
    n_candi = args.fig8_candidates
    t0 = time.perf_counter()
    rows = fig1() + fig2()
    payload: dict[str, Any] = {"fig1": [r for r in rows if r["section"] == "fig1"]}
    excess = net_excess_from_data()
    payload["net_collective_check"] = excess
    if excess is not None:
        rows.append({"section": "fig1", "case": "NIC cost per collective, from the data",
                     "ours": f"cross-node excess over the intra-node line "
                             f"{excess['excess_min'] * 1e6:.0f}-{excess['excess_max'] * 1e6:.0f}"
                             f" us, mean {excess['excess_mean'] * 1e6:.0f} us (planner: "
                             f"{NET_COLLECTIVE_S * 1e6:.0f} us)", "paper": "-"})
    paper7 = {"chatbot": {"distserve": "x1.53", "ds-atp": "x1.42", "ds-switchml": "x1.33"},
              "summarization": {"distserve": "x1.68", "ds-atp": "x1.58",
                                "ds-switchml": "x1.35"}}
    planner = []
    for kind in ("chatbot", "summarization"):
        problem = testbed_problem(kind)
        ps = plans(problem)
        planner.append({"kind": kind, "planner_s": ps["heroserve"].planner_s,
                        "sweeps": ps["heroserve"].sweeps,
                        "groupings": ps["heroserve"].groupings_priced,
                        "candidates": ps["heroserve"].candidates_tried})
        rows += comparison_rows("testbed", kind, ps, paper7[kind])
        # the paper's metric: max per-GPU rate at >= 90 % SLA attainment (discrete events)
        sim_rates = {n: sla_rate(p, duration=60.0) / p.n_gpus for n, p in ps.items()}
        payload.setdefault("testbed_sla_rate_per_gpu", {})[kind] = sim_rates
        rows.append({"section": "testbed", "case": f"{kind} per-GPU rate at 90 % SLA (sim)",
                     "ours": ", ".join(f"{n} {r:.3g}" for n, r in sim_rates.items())
                             + f"; HeroServe x{sim_rates['heroserve'] / sim_rates['distserve']:.2f}"
                             " vs DistServe",
                     "paper": paper7[kind]["distserve"] + " vs DistServe"})
    for p in planner:
        rows.append({"section": "planner", "case": f"testbed {p['kind']}",
                     "ours": f"{p['planner_s']:.2f} s, {p['sweeps']} sweeps, "
                             f"{p['candidates']} candidates, {p['groupings']} grouping "
                             "pairs priced for the chosen one",
                     "paper": "< 10 min; converges within 5 iterations"})
    payload["planner"] = planner
    payload["fig8_max_candi"] = n_candi
    payload["fig8_kv_tpot"] = args.fig8_kv_tpot
    payload["fig8_gpus_per_server"] = args.fig8_gpus_per_server
    paper8 = {"2tracks": "x1.12-1.94 vs baselines", "8tracks": "x1.09-1.83 vs baselines"}
    for gpu in (FIG8_GPU, "A100-80GB"):  # the paper's A100; 80 GB as a sensitivity
        gains: dict[str, dict[str, float]] = {}
        for tracks in ("2tracks", "8tracks"):
            for kind in ("chatbot", "summarization"):
                ps = plans(unit_problem(tracks, kind, gpu=gpu, max_candi=n_candi,
                                        kv_tpot=args.fig8_kv_tpot,
                                        gpus_per_server=args.fig8_gpus_per_server))
                uplinks = CLUSTERS[tracks][1] * core_uplink_gbps(
                    tracks, args.fig8_gpus_per_server) * 1e9 / 8
                rs = comparison_rows("fig8", f"{gpu} {tracks} {kind}", ps,
                                     {n: paper8[tracks] for n in ps if n != "heroserve"},
                                     binding=True, core_bytes_s=uplinks)
                rows += rs
                for r in rs:
                    gains.setdefault(tracks, {})[r["case"].split()[-1] + " " + kind] = r["gain"]
        ok_h4 = all(g >= 1 - 1e-6 for d in gains.values() for g in d.values())
        per_base = {k: (gains["2tracks"][k], gains["8tracks"][k]) for k in gains["2tracks"]}
        h4 = {"heroserve_ge_baselines": ok_h4,
              "gain_2tracks_ge_8tracks": {k: a >= b * (1 - 1e-3) for k, (a, b) in
                                          per_base.items()}}
        if gpu == FIG8_GPU:
            payload["fig8_gains"], payload["H4"] = gains, h4
        else:
            payload[f"fig8_gains_{gpu}"], payload[f"H4_{gpu}"] = gains, h4
    # Fig. 9: concurrent all-reduces, fixed vs online policy
    topo = fat_tree_tracks(servers=4, gpus_per_server=4, tracks=2, aggregator_slots=8)
    # TP4 groups spanning two servers and both tracks: their rings and INA trees share NICs
    groups = [["gpu0", "gpu1", "gpu4", "gpu5"], ["gpu8", "gpu9", "gpu12", "gpu13"],
              ["gpu2", "gpu7", "gpu10", "gpu15"]]
    fig9 = {}
    for mb in (4, 16, 64):
        fixed = run_rounds(topo, groups, mb * 1e6, 6, online=False)
        online = run_rounds(topo, groups, mb * 1e6, 6, online=True)
        fig9[mb] = (fixed.mean_s, online.mean_s)
        rows.append({"section": "fig9", "case": f"{mb} MB x 3 groups, fixed vs online",
                     "ours": f"{fixed.mean_s * 1e3:.2f} ms vs {online.mean_s * 1e3:.2f} ms "
                             f"({fixed.mean_s / online.mean_s - 1:+.1%} throughput)",
                     "paper": "+71.7 % vs DistServe, +20.1 % vs DS-SwitchML"})
    payload["fig9"] = fig9
    # Fig. 10: prefill-side KV residency
    for gpu in (FIG8_GPU, "A100-80GB"):
        problem = unit_problem("2tracks", "summarization", rate=0.07, gpu=gpu,
                               max_candi=n_candi)
        kv = kv_transfer_bytes(problem.model, problem.workload.mean_in)
        fig10 = {}
        for name, p in plans(problem).items():
            resident = problem.workload.rate * kv * p.T_f
            fig10[name] = {"T_f_s": p.T_f, "T_f_wait_s": p.T_f_wait, "resident_bytes": resident}
            rows.append({"section": "fig10", "case": f"{gpu} summarization 0.07 req/s {name}",
                         "ours": f"P_all {p.p_all}, T_f {p.T_f * 1e3:.1f} ms (+ wait "
                                 f"{p.T_f_wait * 1e3:.2f} ms behind other hand-offs), "
                                 f"{resident / 1e6:.1f} MB resident",
                         "paper": "HeroServe lowest"})
        payload["fig10" if gpu == FIG8_GPU else f"fig10_{gpu}"] = fig10
    payload["rows"] = rows
    payload["wall_s"] = time.perf_counter() - t0
    notes = (f"Wall time {payload['wall_s']:.1f} s. H4 ({FIG8_GPU}): HeroServe >= every "
             f"baseline: {payload['H4']['heroserve_ge_baselines']}; "
             f"gain(2tracks) >= gain(8tracks) per baseline (within 0.1 %): "
             f"{payload['H4']['gain_2tracks_ge_8tracks']}. Gains are per-GPU H ratios from "
             "the planner's analytic H (eq. 1 with M/D/1 queueing and Little's-law decode "
             "batches); the discrete-event runs are `llmfabric simulate net`.")
    write_results(args.json, payload, "HeroServe: network-aware PD planning (simulated)",
                  rows, notes, columns=["section", "case", "ours", "paper"])


if __name__ == "__main__":
    main()
