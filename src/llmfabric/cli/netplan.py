"""HeroServe commands: `llmfabric plan net`, `llmfabric simulate collective`,
`llmfabric simulate net` (registered as subcommands of `plan` and `simulate`).

    llmfabric plan net --topology examples/heroserve/testbed-2tracks.yaml --model opt-66b \\
        --prefill-gpus 'a100-*' --decode-gpus 'v100-*' \\
        --workload examples/heroserve/sharegpt.yaml --sla-ttft 2.5 --sla-tpot 0.15 \\
        --compare --out netplan.json
    llmfabric plan net --from-fabric http://127.0.0.1:8090 --model opt-66b ...   # measured
    llmfabric simulate collective --topology T.yaml --group gpu0,gpu1,gpu4,gpu5 --bytes 1MB
    llmfabric simulate net --plan netplan.json --rate 2 [--online]
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import click

_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1024, "mib": 1024 ** 2,
          "gib": 1024 ** 3}


def parse_bytes(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise click.BadParameter(f"{text!r}: give a size like 1MB, 512KiB or 4e6")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(value) or value < 0:
        raise click.BadParameter(f"{text!r}: a size must be finite and >= 0")
    return value


def _num(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _num(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_num(x) for x in v]
    return v


def _plan_doc(plan: Any) -> dict[str, Any]:
    doc: dict[str, Any] = _num(plan.to_json())
    return doc


def _print_plans(plans: list[Any]) -> None:
    from rich.table import Table

    from llmfabric.cli.console import table_console

    console = table_console()
    t = Table(title="network plans (H = largest rate meeting both SLAs and the links)")
    for col in ("system", "P_all (tp,pp | tp,pp)", "GPUs", "T_pre s", "T_dec s", "T_f s",
                "H req/s", "binds", "per GPU", "schemes"):
        t.add_column(col)
    for p in plans:
        schemes = sorted({f"{s}@{p.ina_switch[k]}" if s == "ina" else s
                          for k, s in p.schemes.items()})
        a, b, c, d = p.p_all
        t.add_row(p.system, f"{a},{b} | {c},{d}", str(p.n_gpus), f"{p.T_pre:.4f}",
                  f"{p.T_dec:.4f}", f"{p.T_f:.4f}", f"{p.H:.3f}", p.binding,
                  f"{p.per_gpu_rate:.4f}", ", ".join(schemes))
    console.print(t)
    best = plans[0]
    for i, inst in enumerate(best.prefill_groups):
        console.print(f"prefill instance {i}: " + " | ".join(",".join(map(str, g)) for g in inst))
    for i, inst in enumerate(best.decode_groups):
        console.print(f"decode instance {i}: " + " | ".join(",".join(map(str, g)) for g in inst))
    console.print(f"planner {best.planner_s:.2f} s, {best.candidates_tried} candidates, "
                  f"{best.sweeps} perturbation sweeps")


def _problem(topology: Any, model: str, prefill: str, decode: str, workload: str,
             sla_ttft: float, sla_tpot: float, max_candidates: int, seed: int,
             hop_latency: float | None, net_latency: float | None = None) -> Any:
    from llmfabric.scheduler.netplan.problem import NetProblem, NetWorkload
    from llmfabric.sim.topology import Topology

    topo = topology if isinstance(topology, Topology) else Topology.from_yaml(topology)
    return NetProblem.of(topo, model, prefill, decode,
                         NetWorkload.from_yaml(workload), sla_ttft, sla_tpot,
                         max_candi=max_candidates, seed=seed, hop_latency=hop_latency,
                         **({} if net_latency is None else {"net_collective_s": net_latency}))


def _fabric_topology(url: str, api_key: str | None, assume_gpu: str | None,
                     save: Path | None) -> Any:
    """The topology measured by a live fabric (scheduler/netplan/from_fabric.py); what
    was measured and what was left out goes to stderr (stdout may be --json)."""
    from llmfabric.cli.untrusted import printable
    from llmfabric.scheduler.netplan.from_fabric import fetch_fabric, parse_assume_gpu, summary

    ft = fetch_fabric(url, api_key=api_key,
                      assume_gpu=parse_assume_gpu(assume_gpu) if assume_gpu else None)
    if save is not None:
        ft.topology.to_yaml(save)
    for line in ft.skipped:  # (may quote a peer's error text)
        click.echo(f"left out: {printable(line)}", err=True)
    for e in summary(ft):
        alone = "; one side only: as it reports it" if e["sides"] == 1 else ""
        click.echo(f"measured {e['a']} <-> {e['b']}: RTT {e['rtt_ms']} ms, "
                   f"{e['gbps']} Gbit/s ({e['samples']} probes{alone})", err=True)
    return ft.topology


@click.command(name="net")
@click.option("--topology", type=click.Path(exists=True, dir_okay=False),
              help="topology YAML (gpus, switches with aggregator_slots, edges)")
@click.option("--from-fabric", "from_fabric", metavar="URL",
              help="instead of --topology: a live node's HTTP URL; its /v1/fabric/nodes and "
                   "the links its peers measured (/v1/fabric/links) make the topology")
@click.option("--api-key", envvar="LLMFABRIC_API_KEY",
              help="with --from-fabric: a key for an ingress's fleet views")
@click.option("--assume-gpu", metavar="TYPE[:N]",
              help="with --from-fabric: GPUs of nodes whose record names none (CPU fabrics)")
@click.option("--save-topology", type=click.Path(dir_okay=False, path_type=Path),
              help="with --from-fabric: also write the measured topology as YAML")
@click.option("--model", required=True, help="model name (e.g. opt-66b)")
@click.option("--prefill-gpus", required=True,
              help="comma list of GPU ids or globs over ids and GPU types ('a100-*')")
@click.option("--decode-gpus", required=True, help="as --prefill-gpus")
@click.option("--workload", required=True, type=click.Path(exists=True, dir_okay=False),
              help="YAML {rate, mean_in, mean_out}")
@click.option("--sla-ttft", type=click.FloatRange(min=0, min_open=True), required=True,
              help="TTFT SLA, seconds (the prefill phase's deadline)")
@click.option("--sla-tpot", type=click.FloatRange(min=0, min_open=True), required=True,
              help="TPOT SLA, seconds (the decode phase's deadline per output token)")
@click.option("--max-candidates", type=click.IntRange(min=1), default=20, show_default=True,
              help="TP/PP combinations of the two phases tried, most GPUs used first")
@click.option("--seed", type=int, default=0, show_default=True,
              help="seed of the GPU grouping search (the same seed gives the same plan)")
@click.option("--hop-latency", type=click.FloatRange(min=0), default=None,
              help="seconds per hop instead of the edges' latencies (0 = the paper's form)")
@click.option("--net-latency", type=click.FloatRange(min=0), default=None,
              help="fixed seconds per all-reduce through the NICs (default: the planner's, "
                   "measured on DGX-A100 nodes; 0 with --hop-latency 0 = the paper's form)")
@click.option("--compare", is_flag=True, help="also plan DistServe, DS-SwitchML, DS-ATP")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the plan (with its inputs) as JSON for `simulate net --plan`")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of tables")
def plan_net(topology: str | None, from_fabric: str | None, api_key: str | None,
             assume_gpu: str | None, save_topology: Path | None, model: str,
             prefill_gpus: str, decode_gpus: str, workload: str,
             sla_ttft: float, sla_tpot: float, max_candidates: int, seed: int,
             hop_latency: float | None, net_latency: float | None, compare: bool,
             out: Path | None, as_json: bool) -> None:
    """HeroServe: plan TP/PP, GPU groups, INA or ring per group and KV paths over a topology
    (a YAML file, or the links a live fabric measured), maximising the sustainable rate H
    under TTFT/TPOT SLAs."""
    from llmfabric.cli.gpus_yaml import gpu_hint
    from llmfabric.scheduler.netplan.baselines import BASELINES
    from llmfabric.scheduler.netplan.planner import HEROSERVE, plan_with
    from llmfabric.sim.errors import SimError

    if (topology is None) == (from_fabric is None):
        raise click.UsageError("give exactly one of --topology FILE and --from-fabric URL")
    if from_fabric is not None and out is not None and save_topology is None:
        # (the plan file names its topology; a URL is no file `simulate net` can re-plan on)
        raise click.UsageError("--out with --from-fabric needs --save-topology FILE: "
                               "`simulate net` re-plans on the measured topology saved there")
    try:
        topo: Any = topology
        if from_fabric is not None:
            topo = _fabric_topology(from_fabric, api_key, assume_gpu, save_topology)
        problem = _problem(topo, model, prefill_gpus, decode_gpus, workload, sla_ttft,
                           sla_tpot, max_candidates, seed, hop_latency, net_latency)
        plans = [plan_with(problem, s) for s in ((HEROSERVE, *BASELINES) if compare
                                                 else (HEROSERVE,))]
    except SimError as exc:
        raise click.ClickException(gpu_hint(str(exc), gpus_yaml=False)) from None
    where = (str(Path(topology).resolve()) if topology is not None
             else str(save_topology.resolve()) if save_topology is not None else from_fabric)
    inputs = {"topology": where, "model": model,
              "prefill_gpus": prefill_gpus, "decode_gpus": decode_gpus,
              "workload": str(Path(workload).resolve()), "sla_ttft": sla_ttft,
              "sla_tpot": sla_tpot, "max_candidates": max_candidates, "seed": seed,
              "hop_latency": hop_latency, "net_latency": problem.net_collective_s}
    doc = {"inputs": inputs, "plan": _plan_doc(plans[0]),
           "compare": [_plan_doc(p) for p in plans[1:]]}
    if out is not None:
        out.write_text(json.dumps(doc, indent=1))
    if as_json:
        click.echo(json.dumps(doc, indent=1))
    else:
        _print_plans(plans)


@click.command(name="collective")
@click.option("--topology", required=True, type=click.Path(exists=True, dir_okay=False),
              help="topology YAML (gpus, switches with aggregator_slots, edges)")
@click.option("--group", required=True, help="comma list of GPU ids")
@click.option("--bytes", "size", default="1MB", show_default=True,
              help="message per member (1MB, 512KiB, 4e6)")
@click.option("--hop-latency", type=click.FloatRange(min=0), default=None,
              help="seconds per hop instead of the edges' latencies (0 = the paper's form)")
@click.option("--net-latency", type=click.FloatRange(min=0), default=None,
              help="fixed seconds per all-reduce through the NICs (default: the planner's, "
                   "measured on DGX-A100 nodes; 0 with --hop-latency 0 = the paper's form)")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of text")
def simulate_collective(topology: str, group: str, size: str, hop_latency: float | None,
                        net_latency: float | None, as_json: bool) -> None:
    """All-reduce of one TP group: ring and INA at every switch (HeroServe eqs. 8-11; INA
    members forward over NVLink to the least-loaded NIC, as the planner prices HeroServe)."""
    from llmfabric.cli.gpus_yaml import gpu_hint
    from llmfabric.scheduler.netplan.commcost import (
        NET_COLLECTIVE_S,
        choose_scheme,
        ina_breakdown,
        t_ring,
    )
    from llmfabric.sim.errors import SimError
    from llmfabric.sim.topology import Topology

    nbytes = parse_bytes(size)
    try:
        topo = Topology.from_yaml(topology)
        members = [g.strip() for g in group.split(",") if g.strip()]
        ids = {str(g): g for g in topo.gpus()}
        members_ids = [ids.get(m, m) for m in members]
        net = NET_COLLECTIVE_S if net_latency is None else net_latency
        ring = t_ring(topo, members_ids, nbytes, hop_latency=hop_latency, net_s=net)
        ina = {}
        for s in topo.switches():
            b = ina_breakdown(topo, members_ids, s, nbytes, hop_latency=hop_latency, net_s=net,
                              spread=True)
            ina[str(s)] = {"collect_s": b.collect_s, "agg_s": b.agg_s,
                           "distribute_s": b.distribute_s, "net_s": b.net_s,
                           "total_s": b.total_s,
                           "slots": topo.switch(s).aggregator_slots}
        choice = choose_scheme(topo, members_ids, nbytes, hop_latency=hop_latency, net_s=net,
                               spread=True)
    except SimError as exc:
        raise click.ClickException(gpu_hint(str(exc), gpus_yaml=False)) from None
    doc = {"group": members, "bytes": nbytes, "ring_s": ring, "ina": ina,
           "choice": {"scheme": choice.scheme, "switch": choice.switch,
                      "t_ina": _num(choice.t_ina), "t_ring": choice.t_ring}}
    if as_json:
        click.echo(json.dumps(doc, indent=1))
        return
    click.echo(f"all-reduce of {nbytes:.4g} B over {len(members)} GPUs")
    click.echo(f"  ring: {ring * 1e6:.2f} us")
    for s, row in ina.items():
        click.echo(f"  INA at {s} ({row['slots']} slots): {row['total_s'] * 1e6:.2f} us "
                   f"(collect {row['collect_s'] * 1e6:.2f}, distribute "
                   f"{row['distribute_s'] * 1e6:.2f})")
    click.echo(f"  choice: {choice.scheme}" + (f" at {choice.switch}"
                                                if choice.scheme == "ina" else ""))


@click.command(name="net")
@click.option("--plan", "plan_path", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="JSON written by `llmfabric plan net --out`")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), required=True,
              help="mean arrival rate, requests/s")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=120.0,
              show_default=True, help="simulated seconds of arrivals")
@click.option("--arrival", type=click.Choice(["poisson", "onoff"]), default="poisson",
              show_default=True, help="poisson, or onoff: bursts at twice --rate and pauses, "
              "each a tenth of --duration")
@click.option("--system", default="heroserve", show_default=True,
              type=click.Choice(["heroserve", "distserve", "ds-switchml", "ds-atp"]),
              help="the system planned (from the plan file's inputs) and served: HeroServe "
              "or a baseline")
@click.option("--online", is_flag=True,
              help="also run the decode groups' all-reduces on the flow simulator, fixed "
                   "plan vs the online policy table")
@click.option("--seed", type=int, default=0, show_default=True,
              help="seed of the arrivals and the simulation")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of text")
def simulate_net(plan_path: Path, rate: float, duration: float, arrival: str, system: str,
                 online: bool, seed: int, as_json: bool) -> None:
    """Serve a planned PD deployment in the discrete-event simulator at RATE req/s."""
    from llmfabric.cli.gpus_yaml import gpu_hint
    from llmfabric.scheduler.netplan.runner import simulate_plan
    from llmfabric.sim.errors import SimError

    # Errors in words: a binary file printed the repr of its bytes (a UnicodeDecodeError),
    # a bad file Python reprs (KeyError('topology'), JSONDecodeError(...)).
    try:
        doc = json.loads(plan_path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise click.ClickException(f"{plan_path} is not a JSON file: not UTF-8 text") from None
    except ValueError as exc:
        raise click.ClickException(f"{plan_path} is not JSON: {exc}") from None
    try:
        if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), dict):
            raise click.ClickException(
                f"{plan_path} is no `llmfabric plan net --out` file (it has no inputs to "
                "re-plan from; a `plan pd --json` plan is for `controller --pd-plan`)")
        out = simulate_plan(doc["inputs"], system, rate, duration, arrival=arrival,
                            online=online, seed=seed)
    except KeyError as exc:
        raise click.ClickException(
            f"bad plan file {plan_path}: its inputs lack {exc.args[0]!r} (write the file with "
            "`llmfabric plan net --out`)") from None
    except (TypeError, ValueError) as exc:
        raise click.ClickException(f"bad plan file {plan_path}: {str(exc)[:200]}") from None
    except SimError as exc:
        raise click.ClickException(gpu_hint(str(exc), gpus_yaml=False)) from None
    if as_json:
        click.echo(json.dumps(_num(out), indent=1))
        return
    for k, v in out.items():  # (counts were printed as 133.0, times with 16 digits)
        click.echo(f"{k}: {v:.6g}" if isinstance(v, float) else f"{k}: {v}")
