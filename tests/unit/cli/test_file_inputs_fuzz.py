"""Hostile FILE inputs of the planning and simulation commands (`plan`, `plan pd`, `plan net`,
`simulate`, `simulate e2e|collective|net`, `trace analyze`): every bad file ends in a short
error (exit 1 or 2, a few lines naming the problem), never a traceback, a pydantic dump, a
hang, a memory blow-up or a silently accepted nonsense value (NaN/inf/negative capacity).

Each row is (command, which file, its content, words the error must contain); the other
files of the command are small valid ones. `simulate flying` reads no file (its --plot is
an output) and so has no rows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from llmfabric.cli.main import cli

pytestmark = pytest.mark.unit

# --- valid inputs (small, so a row that slips through validation still finishes fast) ------

CLUSTER = "pools:\n  - {gpu: A100-80GB, nodes: 1, gpus_per_node: 2}\n"
WORKLOAD = "models:\n  - {model: Llama-2-13b, rate: 1, mean_in: 100, mean_out: 10}\n"
PD_CLUSTER = ("instances:\n  - {gpu: RTX-A6000, count: 2, host: a}\n"
              "  - {gpu: RTX-A6000, count: 2, host: b}\n")
LINKS = "src,dst,gbs,latency_s\n" + "".join(
    f"{a},{b},10,1e-05\n" for a in range(4) for b in range(4) if a != b)
PD_WORKLOAD = "rate: 1\nmean_in: 100\nmean_out: 10\nslo: {ttft_s: 2, tpot_s: 0.2}\n"
TOPOLOGY = """\
gpus:
  - {id: g0, type: A100-80GB, host: s0}
  - {id: g1, type: A100-80GB, host: s0}
  - {id: g2, type: A100-80GB, host: s1}
  - {id: g3, type: A100-80GB, host: s1}
switches:
  - {id: sw, aggregator_slots: 8}
edges:
  - {a: g0, b: g1, kind: nvlink, gbs: 300, latency_s: 2.0e-6}
  - {a: g2, b: g3, kind: nvlink, gbs: 300, latency_s: 2.0e-6}
  - {a: g0, b: sw, kind: ethernet, gbps: 100, latency_s: 1.0e-6}
  - {a: g1, b: sw, kind: ethernet, gbps: 100, latency_s: 1.0e-6}
  - {a: g2, b: sw, kind: ethernet, gbps: 100, latency_s: 1.0e-6}
  - {a: g3, b: sw, kind: ethernet, gbps: 100, latency_s: 1.0e-6}
"""
NET_WORKLOAD = "rate: 1\nmean_in: 128\nmean_out: 16\n"
GPUS_YAML = "gpus:\n  Z900: {base: H100, mem_bw_gbs: 4000}\n"
E2E_HEADER = ("model,gpu,backend,backend_version,precision,gemm_quant,tp,isl,osl,concurrency,"
              "ttft_ms,tpot_ms")
E2E_ROWS = E2E_HEADER + "\nmeta-llama/Llama-3.1-8B-Instruct,h100_sxm,vllm,,,,1,128,8,1,50,8\n"
SIM_TRACE = "time_s,input_tokens,output_tokens\n0,100,10\n0.5,100,10\n"
TRACE = "timestamp,model,input_tokens,output_tokens\n1,m,100,10\n2,m,100,10\n"

VALID = {"cluster": CLUSTER, "workload": WORKLOAD, "pd_cluster": PD_CLUSTER, "links": LINKS,
         "pd_workload": PD_WORKLOAD, "topology": TOPOLOGY, "net_workload": NET_WORKLOAD,
         "gpus": GPUS_YAML, "rows": E2E_ROWS, "sim_trace": SIM_TRACE, "trace": TRACE}
SUFFIX = {"links": ".csv", "rows": ".csv", "sim_trace": ".csv", "trace": ".csv",
          "netplan": ".json", "pd_plan": ".json"}

# Each command's argv from the paths of its files.
Files = dict[str, str]
COMMANDS: dict[str, Callable[[Files], list[str]]] = {
    "plan": lambda f: ["plan", "--cluster", f["cluster"], "--workload", f["workload"],
                       "--policy", "greedy", "--json"],
    "plan-trace": lambda f: ["plan", "--cluster", f["cluster"], "--workload-trace",
                             f["trace"], "--policy", "greedy", "--json"],
    "plan pd": lambda f: ["plan", "pd", "--cluster", f["pd_cluster"], "--links", f["links"],
                          "--model", "llama-3.1-8b", "--workload", f["pd_workload"],
                          "--gpus-yaml", f["gpus"], "--steps", "0", "--sim-duration", "1",
                          "--json"],
    "plan pd --topology": lambda f: ["plan", "pd", "--topology", f["topology"], "--model",
                                     "llama-3.1-8b", "--workload", f["pd_workload"],
                                     "--steps", "0", "--sim-duration", "1", "--json"],
    "plan pd --reschedule": lambda f: ["plan", "pd", "--cluster", f["pd_cluster"], "--links",
                                       f["links"], "--reschedule", f["pd_plan"],
                                       "--sim-duration", "1", "--json"],
    "plan net": lambda f: ["plan", "net", "--topology", f["topology"], "--model",
                           "llama-3.1-8b", "--prefill-gpus", "g0,g1", "--decode-gpus",
                           "g2,g3", "--workload", f["net_workload"], "--sla-ttft", "4",
                           "--sla-tpot", "0.2", "--max-candidates", "2", "--json"],
    "simulate --gpus-yaml": lambda f: ["simulate", "--model", "llama-3.1-8b", "--gpu", "Z900",
                                       "--gpus-yaml", f["gpus"], "--rate", "1", "--duration",
                                       "1"],
    "simulate --trace": lambda f: ["simulate", "--model", "llama-3.1-8b", "--gpu", "H100",
                                   "--trace", f["sim_trace"], "--trace-limit", "50"],
    "simulate e2e": lambda f: ["simulate", "e2e", f["rows"], "--waves", "2", "--runs", "1"],
    "simulate collective": lambda f: ["simulate", "collective", "--topology", f["topology"],
                                      "--group", "g0,g2"],
    "simulate net": lambda f: ["simulate", "net", "--plan", f["netplan"], "--rate", "1",
                               "--duration", "1"],
    "trace analyze": lambda f: ["trace", "analyze", f["trace"], "--out", f["out"], "--quiet",
                                "--no-plots"],
}

GARBAGE = bytes(range(256)) * 4
NOT_YAML = "pools: [unclosed\n  - {: :\n"
BOMB = "a: &a ['x','x','x','x','x','x','x','x','x']\n" + "".join(
    f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n"
    for p, c in zip("abcdefgh", "bcdefghi", strict=True))


def _bomb(key: str, tail: str = "") -> str:
    """A billion-laughs document whose `key` is 9**9 strings (a few hundred bytes of YAML)."""
    return BOMB + f"{key}: *i\n" + tail


def _generic_yaml(name: str, where: str) -> list[tuple[str, Any, tuple[str, ...]]]:
    """The rows every YAML input gets."""
    return [
        (f"{name}-empty", "", (where,)),
        (f"{name}-not-yaml", NOT_YAML, (where,)),
        (f"{name}-binary", GARBAGE, (where,)),
        (f"{name}-list", "- 1\n- 2\n", (where,)),
        (f"{name}-scalar", "42\n", (where,)),
        (f"{name}-5000-digits", "a: " + "9" * 5000 + "\n", ("digits",)),
        (f"{name}-bad-date", "a: 2020-13-45\n", ("month",)),
        (f"{name}-deep", "[" * 5000 + "]" * 5000, ("deeply",)),
        (f"{name}-recursive", "&a [*a]\n", ("alias",)),
        (f"{name}-duplicate-key", "a: 1\na: 2\n", ("twice",)),
        (f"{name}-python-tag", "!!python/object/apply:os.system ['true']\n", ("tag",)),
    ]


def _rows() -> list[Any]:
    rows: list[Any] = []

    def add(command: str, file: str, cases: list[tuple[str, Any, tuple[str, ...]]]) -> None:
        rows.extend(pytest.param(command, file, content, needles, id=f"{command}:{case}")
                    for case, content, needles in cases)

    pool = "pools:\n  - {{gpu: A100-80GB, nodes: {n}, gpus_per_node: {g}{extra}}}\n"
    add("plan", "cluster", [*_generic_yaml("cluster", "cluster"),
        ("pools-mapping", "pools: {gpu: A100-80GB}\n", ("pools",)),
        ("pool-list", "pools: [[1, 2]]\n", ("pools.0",)),
        ("nodes-string", pool.format(n="'many'", g=2, extra=""), ("nodes",)),
        ("gpu-list", "pools:\n  - {gpu: [A100], nodes: 1, gpus_per_node: 2}\n", ("gpu",)),
        ("missing-gpu", "pools:\n  - {nodes: 1, gpus_per_node: 2}\n", ("gpu",)),
        ("unknown-key", pool.format(n=1, g=2, extra=", colour: red"), ("colour",)),
        ("nodes-negative", pool.format(n=-1, g=2, extra=""), ("nodes",)),
        ("nodes-nan", pool.format(n=".nan", g=2, extra=""), ("nodes",)),
        ("nodes-inf", pool.format(n=".inf", g=2, extra=""), ("nodes",)),
        ("nodes-1e308", pool.format(n="1.0e+308", g=2, extra=""), ("nodes",)),
        ("nodes-10**100", pool.format(n=10**100, g=2, extra=""), ("nodes",)),
        ("nodes-10**9", pool.format(n=10**9, g=8, extra=""), ("nodes",)),
        ("gpus-per-node-0", pool.format(n=1, g=0, extra=""), ("gpus_per_node",)),
        ("cost-nan", pool.format(n=1, g=2, extra=", cost_per_gpu_hour: .nan"), ("cost",)),
        ("cost-inf", pool.format(n=1, g=2, extra=", cost_per_gpu_hour: .inf"), ("cost",)),
        ("cost-negative", pool.format(n=1, g=2, extra=", cost_per_gpu_hour: -1"), ("cost",)),
        ("unknown-gpu", "pools:\n  - {gpu: Z900, nodes: 1, gpus_per_node: 2}\n", ("Z900",)),
        ("duplicate-names", "pools:\n  - {name: p, gpu: A100-80GB, nodes: 1, gpus_per_node: 2}"
         "\n  - {name: p, gpu: H100, nodes: 1, gpus_per_node: 2}\n", ("p",)),
        ("no-pools", "pools: []\n", ("pool",)),
        ("bomb", _bomb("pools"), ("aliases",)),
        ("bomb-gpu", BOMB + "pools:\n  - {gpu: *i, nodes: 1, gpus_per_node: 2}\n",
         ("aliases",)),
    ])
    load = "models:\n  - {{model: Llama-2-13b, rate: {r}, mean_in: {i}, mean_out: {o}{extra}}}\n"
    add("plan", "workload", [*_generic_yaml("workload", "workload"),
        ("models-mapping", "models: {model: Llama-2-13b}\n", ("models",)),
        ("rate-string", load.format(r="'fast'", i=100, o=10, extra=""), ("rate",)),
        ("model-list", "models:\n  - {model: [a], rate: 1, mean_in: 1, mean_out: 1}\n",
         ("model",)),
        ("missing-rate", "models:\n  - {model: Llama-2-13b, mean_in: 100, mean_out: 10}\n",
         ("rate",)),
        ("unknown-key", load.format(r=1, i=100, o=10, extra=", colour: red"), ("colour",)),
        ("rate-nan", load.format(r=".nan", i=100, o=10, extra=""), ("rate",)),
        ("rate-inf", load.format(r=".inf", i=100, o=10, extra=""), ("rate",)),
        ("rate-negative", load.format(r=-1, i=100, o=10, extra=""), ("rate",)),
        ("rate-1e308", load.format(r="1.0e+308", i=100, o=10, extra=""), ("rate",)),
        ("mean-in-inf", load.format(r=1, i=".inf", o=10, extra=""), ("mean_in",)),
        ("mean-out-nan", load.format(r=1, i=100, o=".nan", extra=""), ("mean_out",)),
        ("mean-out-10**100", load.format(r=1, i=100, o=10**100, extra=""), ("mean_out",)),
        ("std-nan", load.format(r=1, i=100, o=10, extra=", std_in: .nan"), ("std_in",)),
        ("slo-inf", load.format(r=1, i=100, o=10, extra=", slo_e2e_s: .inf"), ("slo_e2e_s",)),
        ("unknown-model", "models:\n  - {model: nope-7b, rate: 1, mean_in: 1, mean_out: 1}\n",
         ("nope-7b",)),
        ("duplicate-models", load.format(r=1, i=100, o=10, extra="") +
         "  - {model: Llama-2-13b, rate: 2, mean_in: 100, mean_out: 10}\n", ("Llama-2-13b",)),
        ("no-models", "models: []\n", ("model",)),
        ("bomb", _bomb("models"), ("aliases",)),
    ])
    add("plan-trace", "trace", [
        ("empty", "", ("trace",)),
        ("binary", GARBAGE, ("trace",)),
        ("missing-columns", "timestamp,model\n1,m\n", ("trace",)),
        ("non-numeric", "timestamp,model,input_tokens,output_tokens\n1,m,lots,10\n", ("trace",)),
    ])

    inst = "instances:\n  - {{gpu: {g}, count: {c}, host: a}}\n"
    add("plan pd", "pd_cluster", [*_generic_yaml("pd-cluster", "yaml"),
        ("instances-mapping", "instances: {gpu: RTX-A6000, count: 4}\n", ("instances",)),
        ("count-string", inst.format(g="RTX-A6000", c="'four'"), ("count",)),
        ("count-0", inst.format(g="RTX-A6000", c=0), ("count",)),
        ("count-nan", inst.format(g="RTX-A6000", c=".nan"), ("count",)),
        ("count-10**9", inst.format(g="RTX-A6000", c=10**9), ("count",)),
        ("gpu-list", inst.format(g="[RTX-A6000]", c=4), ("gpu",)),
        ("missing-gpu", "instances:\n  - {count: 4, host: a}\n", ("gpu",)),
        ("duplicate-hosts", PD_CLUSTER.replace("host: b", "host: a"), ("host",)),
        ("unknown-key", PD_CLUSTER.replace("host: a}", "hots: a}"), ("hots",)),
        ("unknown-top-key", PD_CLUSTER + "colour: red\n", ("colour",)),
        ("bomb-gpu", BOMB + "instances:\n  - {gpu: *i, count: 4, host: a}\n", ("aliases",)),
        ("bomb-host", BOMB + "instances:\n  - {gpu: RTX-A6000, count: 4, host: *i}\n",
         ("aliases",)),
    ])
    add("plan pd", "links", [
        ("empty", "", ("link",)),
        ("binary", GARBAGE, ("links",)),
        ("nul", "src,dst,gbs\n0,1,\x0010\n", ("links",)),
        ("header-only", "src,dst,gbs\n", ("link",)),
        ("missing-unit", "src,dst\n0,1\n", ("gbs",)),
        ("short-row", "src,dst,gbs\n0,1\n", ("cells",)),
        ("non-numeric", LINKS.replace("10,1e-05", "fast,1e-05", 1), ("fast",)),
        ("bandwidth-nan", LINKS.replace("10,1e-05", "nan,1e-05", 1), ("links",)),
        ("bandwidth-negative", LINKS.replace("10,1e-05", "-10,1e-05", 1), ("links",)),
        ("bandwidth-0", LINKS.replace("10,1e-05", "0,1e-05", 1), ("links",)),
        ("latency-inf", LINKS.replace("10,1e-05", "10,inf", 1), ("links",)),
        ("latency-negative", LINKS.replace("10,1e-05", "10,-1", 1), ("links",)),
        ("too-few-gpus", "src,dst,gbs\n0,1,10\n", ("link",)),
        ("huge-id", LINKS + "0,1000000000,10,1e-05\n", ("link",)),
        ("duplicate-pair", LINKS + "0,1,99,1e-05\n", ("twice",)),
        ("square-ragged", "gbs,0,1\n0,,10\n1,10\n", ("links",)),
    ])
    add("plan pd", "pd_workload", [*_generic_yaml("pd-workload", "yaml"),
        ("rate-string", PD_WORKLOAD.replace("rate: 1", "rate: fast"), ("rate",)),
        ("rate-list", PD_WORKLOAD.replace("rate: 1", "rate: [1]"), ("rate",)),
        ("missing-mean-in", PD_WORKLOAD.replace("mean_in: 100\n", ""), ("mean_in",)),
        ("rate-nan", PD_WORKLOAD.replace("rate: 1", "rate: .nan"), ("rate",)),
        ("rate-inf", PD_WORKLOAD.replace("rate: 1", "rate: .inf"), ("rate",)),
        ("rate-negative", PD_WORKLOAD.replace("rate: 1", "rate: -1"), ("rate",)),
        ("rate-0", PD_WORKLOAD.replace("rate: 1", "rate: 0"), ("rate",)),
        ("rate-1e308", PD_WORKLOAD.replace("rate: 1", "rate: 1.0e+308"), ("rate",)),
        ("rate-10**400", PD_WORKLOAD.replace("rate: 1", f"rate: {10**400}"), ("rate",)),
        ("mean-in-inf", PD_WORKLOAD.replace("mean_in: 100", "mean_in: .inf"), ("mean_in",)),
        ("mean-out-10**100", PD_WORKLOAD.replace("mean_out: 10", f"mean_out: {10**100}"),
         ("mean_out",)),
        ("cv-negative", PD_WORKLOAD + "cv: -1\n", ("cv",)),
        ("samples-10**9", PD_WORKLOAD + "samples: 1000000000\n", ("samples",)),
        ("seed-inf", PD_WORKLOAD + "seed: .inf\n", ("seed",)),
        ("unknown-key", PD_WORKLOAD.replace("rate: 1", "rat: 1"), ("rat",)),
        ("slo-typo", PD_WORKLOAD.replace("ttft_s", "ttft"), ("ttft",)),
        ("slo-list", PD_WORKLOAD.replace("slo: {ttft_s: 2, tpot_s: 0.2}", "slo: [2]"),
         ("slo",)),
        ("slo-negative", PD_WORKLOAD.replace("ttft_s: 2", "ttft_s: -2"), ("slo",)),
        ("slo-nan", PD_WORKLOAD.replace("ttft_s: 2", "ttft_s: .nan"), ("ttft",)),
        ("bomb-rate", _bomb("rate", "mean_in: 100\nmean_out: 10\n"), ("aliases",)),
    ])
    add("plan pd", "gpus", [*_generic_yaml("gpus-yaml", "yaml"),
        ("gpus-list", "gpus: [Z900]\n", ("gpus",)),
        ("body-scalar", "gpus:\n  Z900: fast\n", ("Z900",)),
        ("unknown-base", "gpus:\n  Z900: {base: Q1}\n", ("Q1",)),
        ("bw-string", "gpus:\n  Z900: {base: H100, mem_bw_gbs: fast}\n", ("mem_bw_gbs",)),
        ("bw-nan", "gpus:\n  Z900: {base: H100, mem_bw_gbs: .nan}\n", ("mem_bw_gbs",)),
        ("bw-negative", "gpus:\n  Z900: {base: H100, mem_bw_gbs: -1}\n", ("mem_bw_gbs",)),
        ("bw-0", "gpus:\n  Z900: {base: H100, mem_bw_gbs: 0}\n", ("mem_bw_gbs",)),
        ("memory-inf", "gpus:\n  Z900: {base: H100, memory_gb: .inf}\n", ("memory_gb",)),
        ("memory-0", "gpus:\n  Z900: {base: H100, memory_gb: 0}\n", ("memory_gb",)),
        ("flops-1e308", "gpus:\n  Z900: {base: H100, fp16_tflops: 1.0e+308}\n",
         ("fp16_tflops",)),
        ("bw-10**400", f"gpus:\n  Z900: {{base: H100, mem_bw_gbs: {10**400}}}\n",
         ("mem_bw_gbs",)),
        ("unknown-key", "gpus:\n  Z900: {base: H100, colour: red}\n", ("colour",)),
        ("duplicate-gpu", "gpus:\n  Z900: {base: H100}\n  Z900: {base: A100}\n", ("Z900",)),
        ("missing-fields", "gpus:\n  Z900: {mem_bw_gbs: 100}\n", ("Z900",)),
        ("bomb-base", BOMB + "gpus:\n  Z900: {base: *i}\n", ("aliases",)),
    ])
    add("plan pd --reschedule", "pd_plan", [
        ("empty", "", ("pd_plan",)),
        ("binary", GARBAGE, ("pd_plan",)),
        ("list", "[1, 2]", ("plan",)),
        ("missing-keys", "{}", ("plan",)),
        ("wrong-types", '{"groups": "x", "routing": 1, "model": 2}', ("plan",)),
    ])

    topo_cases = [*_generic_yaml("topology", "topology"),
        ("gpus-mapping", "gpus: {id: g0}\n", ("gpus",)),
        ("gpu-missing-type", "gpus:\n  - {id: g0}\n", ("type",)),
        ("unknown-top-key", TOPOLOGY + "colour: red\n", ("colour",)),
        ("edge-unknown-key", TOPOLOGY.replace("latency_s: 1.0e-6", "latency_ms: 5", 1),
         ("latency_ms",)),
        ("unknown-gpu", TOPOLOGY.replace("type: A100-80GB, host: s0", "type: Z900, host: s0",
                                         1), ("Z900",)),
        ("duplicate-gpu", TOPOLOGY.replace("id: g1,", "id: g0,"), ("g0",)),
        ("edge-to-undefined", TOPOLOGY + "  - {a: g0, b: ghost, kind: ethernet, gbps: 1}\n",
         ("ghost",)),
        ("self-loop", TOPOLOGY + "  - {a: g0, b: g0, kind: nvlink, gbs: 1}\n", ("g0",)),
        ("edge-no-bandwidth", TOPOLOGY + "  - {a: g0, b: g2, kind: ethernet}\n", ("edges",)),
        ("edge-bandwidth-string", TOPOLOGY.replace("gbps: 100", "gbps: fast", 1), ("edges",)),
        ("edge-bandwidth-nan", TOPOLOGY.replace("gbps: 100", "gbps: .nan", 1), ("edges",)),
        ("edge-bandwidth-inf", TOPOLOGY.replace("gbps: 100", "gbps: .inf", 1), ("edges",)),
        ("edge-bandwidth-0", TOPOLOGY.replace("gbps: 100", "gbps: 0", 1), ("edges",)),
        ("edge-bandwidth-negative", TOPOLOGY.replace("gbps: 100", "gbps: -100", 1),
         ("edges",)),
        ("edge-latency-negative", TOPOLOGY.replace("latency_s: 1.0e-6", "latency_s: -1", 1),
         ("edges",)),
        ("edge-latency-nan", TOPOLOGY.replace("latency_s: 1.0e-6", "latency_s: .nan", 1),
         ("edges",)),
        ("edge-kind-list", TOPOLOGY.replace("kind: ethernet", "kind: [ethernet]", 1),
         ("edges",)),
        ("slots-string", TOPOLOGY.replace("aggregator_slots: 8", "aggregator_slots: many"),
         ("switches",)),
        ("slots-negative", TOPOLOGY.replace("aggregator_slots: 8", "aggregator_slots: -8"),
         ("switches",)),
        ("slots-10**100", TOPOLOGY.replace("aggregator_slots: 8",
                                           f"aggregator_slots: {10**100}"), ("switches",)),
        ("bomb-gpus", _bomb("gpus"), ("aliases",)),
        ("bomb-edges", BOMB + "edges: {x: *i}\n", ("aliases",)),
        ("bomb-type", BOMB + "gpus:\n  - {id: g0, type: *i}\n", ("aliases",)),
    ]
    add("plan pd --topology", "topology", [*topo_cases,
        ("disconnected", TOPOLOGY.replace("  - {a: g2, b: sw", "  - {a: g2, b: g3").replace(
            "  - {a: g3, b: sw, kind: ethernet, gbps: 100, latency_s: 1.0e-6}\n", ""),
         ("topology",)),
    ])
    add("plan net", "topology", [*topo_cases,
        ("disconnected", TOPOLOGY.replace("  - {a: g2, b: sw", "  - {a: g2, b: g3").replace(
            "  - {a: g3, b: sw, kind: ethernet, gbps: 100, latency_s: 1.0e-6}\n", ""),
         ("g",)),
    ])
    # (collective prices links only: a GPU type it does not know is no error there)
    add("simulate collective", "topology", [c for c in topo_cases if c[0] != "unknown-gpu"])
    add("plan net", "net_workload", [*_generic_yaml("net-workload", "workload"),
        ("rate-string", NET_WORKLOAD.replace("rate: 1", "rate: fast"), ("rate",)),
        ("missing-mean-in", "rate: 1\nmean_out: 16\n", ("mean_in",)),
        ("unknown-key", "rat: 5\nmean_in: 128\nmean_out: 16\n", ("rat",)),
        ("rate-nan", NET_WORKLOAD.replace("rate: 1", "rate: .nan"), ("rate",)),
        ("rate-inf", NET_WORKLOAD.replace("rate: 1", "rate: .inf"), ("rate",)),
        ("rate-negative", NET_WORKLOAD.replace("rate: 1", "rate: -1"), ("rate",)),
        ("mean-out-10**100", NET_WORKLOAD.replace("mean_out: 16", f"mean_out: {10**100}"),
         ("mean_out",)),
        ("mean-in-0", NET_WORKLOAD.replace("mean_in: 128", "mean_in: 0"), ("mean_in",)),
        ("bomb", _bomb("mean_in", "mean_out: 16\n"), ("aliases",)),
    ])

    add("simulate --gpus-yaml", "gpus", [*_generic_yaml("gpus-yaml", "yaml"),
        ("bw-nan", "gpus:\n  Z900: {base: H100, mem_bw_gbs: .nan}\n", ("mem_bw_gbs",)),
        ("bw-inf", "gpus:\n  Z900: {base: H100, mem_bw_gbs: .inf}\n", ("mem_bw_gbs",)),
        ("memory-negative", "gpus:\n  Z900: {base: H100, memory_gb: -80}\n", ("memory_gb",)),
        ("flops-0", "gpus:\n  Z900: {base: H100, fp16_tflops: 0, fp32_tflops: 0}\n",
         ("tflops",)),
        ("bomb", _bomb("gpus"), ("aliases",)),
    ])
    add("simulate --trace", "sim_trace", [
        ("empty", "", ("trace",)),
        ("binary", GARBAGE, ("trace",)),
        ("missing-columns", "time_s,input_tokens\n0,100\n", ("output_tokens",)),
        ("non-numeric", "time_s,input_tokens,output_tokens\n0,lots,10\n", ("input_tokens",)),
        ("time-nan", "time_s,input_tokens,output_tokens\nnan,100,10\n", ("time_s",)),
        ("tokens-negative", "time_s,input_tokens,output_tokens\n0,-100,10\n",
         ("input_tokens",)),
        ("tokens-10**100", f"time_s,input_tokens,output_tokens\n0,{10**100},10\n",
         ("tokens",)),
        ("time-1e308", "time_s,input_tokens,output_tokens\n0,100,10\n1e308,100,10\n",
         ("span",)),
    ])
    add("simulate e2e", "rows", [
        ("empty", "", ("columns",)),
        ("binary", GARBAGE, ("rows",)),
        ("nul", E2E_ROWS.replace(",50,", ",5\x000,"), ("ttft_ms",)),
        ("missing-columns", "model,gpu\nx,y\n", ("columns",)),
        ("short-row", E2E_HEADER + "\nmeta-llama/Llama-3.1-8B-Instruct,h100_sxm\n", ("row",)),
        ("tp-string", E2E_ROWS.replace(",1,128,", ",one,128,"), ("tp",)),
        ("isl-10**100", E2E_ROWS.replace(",1,128,", f",1,{10**100},"), ("isl",)),
        ("concurrency-0", E2E_ROWS.replace(",8,1,50,", ",8,0,50,"), ("concurrency",)),
        ("ttft-nan", E2E_ROWS.replace(",50,8", ",nan,8"), ("ttft_ms",)),
        ("ttft-negative", E2E_ROWS.replace(",50,8", ",-50,8"), ("ttft_ms",)),
    ])
    add("simulate net", "netplan", [
        ("empty", "", ("netplan",)),
        ("binary", GARBAGE, ("netplan",)),
        ("list", "[1, 2]", ("netplan",)),
        ("no-inputs", '{"plan": {}}', ("inputs",)),
        ("inputs-empty", '{"inputs": {}}', ("netplan",)),
        ("inputs-wrong-types", '{"inputs": {"topology": 1, "model": [], "workload": "x"}}',
         ("netplan",)),
    ])
    add("trace analyze", "trace", [
        ("empty", "", ("trace",)),
        ("binary", GARBAGE, ("trace",)),
        ("missing-columns", "timestamp,model\n1,m\n", ("trace",)),
        ("non-numeric", "timestamp,model,input_tokens,output_tokens\n1,m,lots,10\n",
         ("input tokens",)),
    ])
    return rows


@pytest.fixture(scope="module")
def netplan(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A valid `plan net --out` file (its inputs are what `simulate net` re-plans from)."""
    d = tmp_path_factory.mktemp("netplan")
    files = {k: str(_write(d, k, v)) for k, v in VALID.items()}
    out = d / "netplan.json"
    res = CliRunner().invoke(cli, [*COMMANDS["plan net"](files), "--out", str(out)])
    assert res.exit_code == 0, res.output
    return str(out)


def _write(d: Path, key: str, content: str | bytes) -> Path:
    path = d / f"{key}{SUFFIX.get(key, '.yaml')}"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def _check(res: Result, needles: tuple[str, ...]) -> None:
    out = res.output
    assert "Traceback" not in out, out
    assert isinstance(res.exception, SystemExit), (repr(res.exception), out)
    assert res.exit_code in (1, 2), out
    assert "pydantic" not in out and "validation error" not in out, out
    assert len(out.strip().splitlines()) <= 6, out
    assert len(out) < 2000, out
    # no terminal control characters from the file (ESC, CR, ...) on the operator's screen
    assert all(c.isprintable() or c == "\n" for c in out), ascii(out)
    for needle in needles:
        assert needle.lower() in out.lower(), (needle, out)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("command", "file", "content", "needles"), _rows())
def test_bad_file_is_a_short_error(command: str, file: str, content: str | bytes,
                                   needles: tuple[str, ...], tmp_path: Path,
                                   netplan: str) -> None:
    files = {k: str(_write(tmp_path, k, v)) for k, v in VALID.items()}
    files["netplan"] = netplan
    files["out"] = str(tmp_path / "out")
    files[file] = str(_write(tmp_path, file, content))
    _check(CliRunner().invoke(cli, COMMANDS[command](files)), needles)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_valid_files_work(command: str, tmp_path: Path, netplan: str) -> None:
    """The rows above fail because of their one bad file: with all files valid each command
    succeeds (`plan pd --reschedule` with a plan `plan pd` just wrote)."""
    files = {k: str(_write(tmp_path, k, v)) for k, v in VALID.items()}
    files["netplan"] = netplan
    files["out"] = str(tmp_path / "out")
    if command == "plan pd --reschedule":
        res = CliRunner().invoke(cli, COMMANDS["plan pd"](files))
        assert res.exit_code == 0, res.output
        files["pd_plan"] = str(_write(tmp_path, "pd_plan", res.stdout))
    res = CliRunner().invoke(cli, COMMANDS[command](files))
    assert res.exit_code == 0, res.output


def test_anchors_and_merge_keys_within_bounds_still_load(tmp_path: Path) -> None:
    """The YAML reader's limits (alias expansion, duplicate keys) leave ordinary anchors and
    `<<` merges alone: a pool written once and reused loads as two pools."""
    files = {k: str(_write(tmp_path, k, v)) for k, v in VALID.items()}
    files["cluster"] = str(_write(tmp_path, "cluster", (
        "pools:\n  - &a100 {name: p0, gpu: A100-80GB, nodes: 1, gpus_per_node: 2}\n"
        "  - {<<: *a100, name: p1}\n")))
    res = CliRunner().invoke(cli, COMMANDS["plan"](files))
    assert res.exit_code == 0, res.output
