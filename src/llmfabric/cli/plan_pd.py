"""`llmfabric plan pd`: ThunderServe phase-split plan of one model on heterogeneous GPUs.

    llmfabric plan pd --cluster examples/thunderserve/cloud32.yaml \\
        --links examples/thunderserve/bw32.csv --model llama-30b \\
        --workload examples/thunderserve/coding.yaml [--compare] [--json] > plan.json
    llmfabric plan pd --cluster ... --links ... --reschedule plan.json --lost-gpus 0-3 \
        [--workload conversation.yaml]       # phase flips + new routing, no reload
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.command(name="pd")
@click.option("--cluster", "cluster_path", type=_FILE, default=None,
              help="instances YAML: {instances: [{gpu, count, host}]}, GPU ids in order")
@click.option("--links", "links_path", type=_FILE, default=None,
              help="GPU-pair bandwidth CSV (src,dst,gbps|gbs[,latency_ms] or a square matrix)")
@click.option("--topology", "topology_path", type=_FILE, default=None,
              help="topology YAML instead of --cluster/--links (GPUs, switches, edges)")
@click.option("--model", default=None, help="model name (sim.MODELS), e.g. llama-30b")
@click.option("--workload", "workload_path", type=_FILE, default=None,
              help="workload YAML: rate, mean_in, mean_out[, cv][, slo: {ttft_s, tpot_s}]")
@click.option("--reschedule", "reschedule_path", type=_FILE, default=None,
              help="lightweight rescheduling of a saved plan (--json output): phase flips and "
                   "new routing only, no reload; with --lost-gpus and/or a new --workload")
@click.option("--lost-gpus", default="", help="GPU ids lost, e.g. 0-3,9 (with --reschedule)")
@click.option("--slo-ttft", type=click.FloatRange(min=0, min_open=True), default=None,
              help="TTFT deadline, s (overrides the workload's)")
@click.option("--slo-tpot", type=click.FloatRange(min=0, min_open=True), default=None,
              help="TPOT deadline, s (overrides the workload's)")
@click.option("--gpus-yaml", type=_FILE, default=None,
              help="extra/overriding GPU specs (e.g. the paper's Table 1 figures)")
@click.option("--steps", type=click.IntRange(min=0), default=100, show_default=True,
              help="tabu search steps (0: the starting plan)")
@click.option("--neighbors", type=click.IntRange(min=1), default=10, show_default=True,
              help="neighbouring plans scored at each step")
@click.option("--tabu", type=click.IntRange(min=0), default=5, show_default=True,
              help="recently accepted plans the search may not return to")
@click.option("--seed", type=int, default=0, show_default=True,
              help="seed of the search, the workload's lengths and the simulation")
@click.option("--kv-bits", type=click.Choice(["2", "3", "4", "8", "16"]), default="4",
              show_default=True, help="KV bits on the prefill->decode wire (16: none)")
@click.option("--headroom", type=click.FloatRange(min=0, max=1, min_open=True), default=0.8,
              show_default=True,
              help="no replica loaded past this share of its capacity (load beyond counts as "
                   "missed in the search; 1: only the LP's own 90 % cap)")
@click.option("--compare", is_flag=True,
              help="also the colocated CP-SAT placement and the best fixed P:D split")
@click.option("--sim-duration", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="simulated seconds for the final plan's check")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def command(cluster_path: Path | None, links_path: Path | None, topology_path: Path | None,
            model: str | None, workload_path: Path | None, reschedule_path: Path | None,
            lost_gpus: str, slo_ttft: float | None, slo_tpot: float | None,
            gpus_yaml: Path | None, steps: int, neighbors: int, tabu: int, seed: int,
            kv_bits: str, headroom: float, compare: bool, sim_duration: float,
            as_json: bool) -> None:
    """Plan prefill/decode groups, their parallelism and the X/Y routing (ThunderServe)."""
    from llmfabric import sim
    from llmfabric.cli.gpus_yaml import gpu_hint
    from llmfabric.scheduler.errors import SchedulerError
    from llmfabric.scheduler.phasesplit.baselines import best_fixed_split, colocated_cpsat
    from llmfabric.scheduler.phasesplit.inputs import load_cluster, load_workload
    from llmfabric.scheduler.phasesplit.problem import TabuOptions
    from llmfabric.scheduler.phasesplit.tabu import tabu_search

    try:
        catalog = (sim.load_gpus_yaml(gpus_yaml) if gpus_yaml is not None
                   else sim.DEFAULT_CATALOG)
        cluster = load_cluster(cluster_path, links_path, topology_path, catalog)
        bits = None if kv_bits == "16" else int(kv_bits)
        opts = TabuOptions(n_step=steps, n_neigh=neighbors, n_mem=tabu, seed=seed,
                           kv_bits=bits, headroom=headroom)
        workload = (load_workload(workload_path, slo_ttft=slo_ttft, slo_tpot=slo_tpot)
                    if workload_path is not None else None)
        if reschedule_path is not None:
            plan, decisions = _reschedule(reschedule_path, cluster, workload, lost_gpus, opts)
            workload = plan.workload
            spec = plan.model
        else:
            if model is None or workload is None:
                raise click.UsageError("give --model and --workload (or --reschedule PLAN)")
            spec = sim.get_model(model)
            plan = tabu_search(cluster, spec, workload, opts)
            decisions = []
        doc: dict[str, Any] = plan.to_json()
        if reschedule_path is not None:
            doc["decisions"] = [{"type": type(d).__name__, **_fields(d)} for d in decisions]
        score = plan.evaluate(duration_s=sim_duration, seed=seed)
        doc["simulated"] = {"attainment": score.attainment,
                            "throughput_rps": score.throughput_rps,
                            "mean_ttft_s": score.mean_ttft_s, "mean_tpot_s": score.mean_tpot_s}
        if score.trend is not None:
            doc["simulated"].update(first_half_attainment=score.trend.first_attainment,
                                    second_half_attainment=score.trend.second_attainment,
                                    growing_queue=score.trend.growing)
        if compare:
            fixed = best_fixed_split(cluster, spec, workload, opts)
            fs = fixed.evaluate(duration_s=sim_duration, seed=seed)
            coloc = colocated_cpsat(cluster, spec, workload, duration_s=sim_duration,
                                    seed=seed)
            doc["compare"] = {
                "best_fixed_split": {"n_prefill": fixed.n_prefill, "n_decode": fixed.n_decode,
                                     "analytic_attainment": fixed.attainment,
                                     "simulated_attainment": fs.attainment,
                                     "throughput_rps": fs.throughput_rps},
                "colocated_cpsat": {"groups": [list(g) for g in coloc.groups],
                                    "simulated_attainment": coloc.attainment,
                                    "throughput_rps": coloc.throughput_rps},
            }
    except (SchedulerError, sim.SimError) as e:
        raise click.ClickException(gpu_hint(str(e), gpus_yaml=True)) from None
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    _print(doc)


def _fields(d: Any) -> dict[str, Any]:
    import dataclasses

    return {k: list(v) if isinstance(v, tuple) else v
            for k, v in dataclasses.asdict(d).items()}


def _short(value: Any) -> str:
    """A decision's field for people: floats at 2 decimals, sequences space-separated."""
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, list | tuple):
        return "[" + " ".join(_short(v) for v in value) + "]"
    return str(value)


def _lost(spec: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise click.BadParameter(f"not a GPU id or range: {part!r}",
                                     param_hint="--lost-gpus") from None
        if a < 0 or b < a or b - a > 4096:
            raise click.BadParameter(f"bad range {part!r}", param_hint="--lost-gpus")
        out += range(a, b + 1)
    return out


def _reschedule(path: Path, cluster: Any, workload: Any, lost: str, opts: Any
                ) -> tuple[Any, list[Any]]:
    from llmfabric.scheduler.errors import SpecError
    from llmfabric.scheduler.phasesplit.plan import plan_from_json
    from llmfabric.scheduler.phasesplit.reschedule import lightweight

    try:
        saved = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise SpecError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:  # (was "'utf-8' codec can't decode byte 0x80 in position 128")
        raise SpecError(f"{path} is not a saved plan: not UTF-8 text") from None
    except ValueError as e:
        raise SpecError(f"{path} is not a saved plan (JSON from `plan pd --json`): {e}") \
            from None
    plan = plan_from_json(saved, cluster)
    return lightweight(plan, lost_gpus=_lost(lost), workload=workload, options=opts)


def _print(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from llmfabric.cli.console import table_console

    console = table_console()
    t = Table(title=f"ThunderServe plan {doc['plan_id']} ({doc['model']}, "
                    f"{doc['rate']:g} req/s, KV {doc['kv_bits'] or 16}-bit)")
    for col in ("group", "GPUs", "phase", "TP", "PP", "layers", "replicas",
                "latency / throughput"):
        t.add_column(col, justify="left" if col in ("GPUs", "phase") else "right")
    for g in doc["groups"]:
        gpus = " + ".join(f"{n}x{ty}" for ty, n in g["types"].items()) + \
            " @ " + ",".join(g["hosts"])
        layers = "/".join(str(s["layers"]) for s in g["stages"][0])
        perf = (f"{g['latency_s'] * 1e3:.0f} ms" if g["phase"] == "prefill"
                else f"{g['throughput_tps']:.0f} tok/s")
        t.add_row(str(g["group"]), gpus, g["phase"], str(g["tp"]), str(g["pp"]), layers,
                  str(g["replicas"]), perf)
    console.print(t)
    r = doc["routing"]
    console.print("X (prefill replicas): " + " ".join(f"{v:.2f}" for v in r["x"]))
    for i, row in enumerate(r["y"]):
        console.print(f"Y[{i}]: " + " ".join(f"{v:.2f}" for v in row))
    s = doc["simulated"]
    console.print(f"{doc['n_prefill']} prefill / {doc['n_decode']} decode replicas; "
                  f"attainment {doc['attainment']:.1%} (analytic), {s['attainment']:.1%} "
                  f"(simulated); throughput {s['throughput_rps']:.2f} req/s; "
                  f"search {doc['solve_s']:.1f} s; unserved {r['unserved']:.1%}")
    if "load_decode" in r:
        def fmt(vals: list[float | None]) -> str:
            return " ".join("inf" if v is None else f"{v:.2f}" for v in vals)

        console.print(f"predicted utilisation: prefill {fmt(r['load_prefill'])}; decode "
                      f"{fmt(r['load_decode'])}; beyond the headroom "
                      f"{r.get('overload', 0.0):.1%}")
    if s.get("growing_queue"):
        console.print("warning: a queue grows in the simulation (attainment "
                      f"{s['first_half_attainment']:.1%} in the first half, "
                      f"{s['second_half_attainment']:.1%} in the second): the plan is not "
                      "stable at this load")
    for d in doc.get("decisions", []):  # (printed as a Python dict, floats at 17 digits)
        console.print(f"decision: {d['type']} " + "; ".join(
            f"{k} {_short(v)}" for k, v in d.items() if k != "type"), markup=False)
    if "compare" in doc:
        c = doc["compare"]
        f, k = c["best_fixed_split"], c["colocated_cpsat"]
        # (groups are [gpu, tp, replicas]: they printed as a Python list)
        colocated = ", ".join(f"{gpu} TP{tp} x{n}" for gpu, tp, n in k["groups"]) or "-"
        console.print(f"best fixed P:D split ({f['n_prefill']}P/{f['n_decode']}D): "
                      f"{f['simulated_attainment']:.1%} simulated; colocated CP-SAT "
                      f"({colocated}): {k['simulated_attainment']:.1%}")
