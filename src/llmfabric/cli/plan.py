"""`llmfabric plan`: place models on a heterogeneous cluster (rich table, or --json).

    llmfabric plan --cluster examples/cluster-table1.yaml --workload examples/workload-table1.yaml
    llmfabric plan --cluster C --workload W --policy memp --compare --json
    llmfabric plan --cluster C --workload-trace traces/ingress.jsonl --rate-scale 10
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import click


def placement_json(placement: Any, evaluation: Any) -> dict[str, Any]:
    def num(v: float) -> float | None:
        return None if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) else v

    return {
        "policy": placement.policy,
        "status": placement.status,
        "source": placement.source,
        "solver_status": placement.solver_status,
        "objective": num(placement.objective),
        "bound": num(placement.bound),
        "gap": num(placement.gap),
        "solve_s": placement.solve_s,
        "build_s": placement.build_s,
        "allocation": placement.allocation(),
        "groups": [{"model": g.model, "pool": g.pool, "gpu": g.gpu_type, "tp": g.tp,
                    "dp": g.replicas, "gpus": g.gpus, "load_share": g.load_share,
                    "running": g.fixed} for g in placement.groups],
        "unserved": dict(placement.unserved),
        "notes": list(placement.notes),
        "throughput_rps": num(evaluation.throughput_rps),
        "mean_latency_s": num(evaluation.mean_latency_s),
        "objective_evaluated_s": num(evaluation.objective_s),
        "offered_rps": evaluation.offered_rps,
        "cost_per_hour": evaluation.cost_per_hour,
        "per_model": {m: {"mean_latency_s": num(lat), "throughput_rps": thr}
                      for m, lat, thr in evaluation.per_model},
    }


def workload_json(workload: Any) -> dict[str, Any]:
    return {m.model: {"rate": m.arrival_rate, "mean_in": m.mean_in, "mean_out": m.mean_out,
                      "std_in": m.std_in, "std_out": m.std_out} for m in workload.loads}


def _table(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from llmfabric.cli.console import cell, table_console

    console = table_console()
    status = doc["status"] + (f", from {doc['source']}" if doc.get("source") else "")
    t = Table(title=f"placement: {doc['policy']} ({status})")
    for col in ("model", "GPU", "TP", "DP", "GPUs", "load share"):
        t.add_column(col, justify="left" if col in ("model", "GPU") else "right")
    for g in doc["groups"]:
        name = g["gpu"] + (" (running)" if g["running"] else "")
        # Model names may come from a trace: what clients asked for, as members named it.
        t.add_row(cell(g["model"]), cell(name), str(g["tp"]), str(g["dp"]), str(g["gpus"]),
                  f"{g['load_share']:.0%}")
    console.print(t)
    lat = doc["mean_latency_s"]
    gap = doc["gap"]
    if lat is None:
        console.print("nothing placed")
    else:
        console.print(
            f"mean E2E latency {lat:.3f} s (served requests), throughput "
            f"{doc['throughput_rps']:.2f} of {doc['offered_rps']:.2f} req/s offered; "
            f"objective {doc['objective']:.3f} s; solve {doc['solve_s']:.2f} s "
            f"(+{doc['build_s']:.2f} s estimating)"
            + (f", gap {gap:.2%}" if gap is not None else ""))
    for m, frac in doc["unserved"].items():
        console.print(cell(f"{m}: {frac:.0%} of its load has no replica", style="yellow"))
    for note in doc["notes"]:
        console.print(cell(f"note: {note}"))


@click.command(name="plan")
@click.option("--cluster", "cluster_path", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="cluster YAML (pools of GPUs, see docs/scheduler.md)")
@click.option("--workload", "workload_path", default=None,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="workload YAML (per-model rate and token lengths)")
@click.option("--workload-trace", "trace_path", default=None,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="derive the workload from a request trace (JSONL/CSV/Parquet; formats as "
                   "`llmfabric trace analyze`): per-model rate and length distributions")
@click.option("--trace-format", default="auto", show_default=True,
              help="the trace's format (auto, llmfabric, burstgpt, azure2023, ...)")
@click.option("--rate-scale", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, help="multiply the trace's arrival rates (replay at scale)")
@click.option("--policy", default="cpsat", show_default=True,
              type=click.Choice(["cpsat", "memp", "greedy", "exhaustive"]),
              help="placement: cpsat (the solver), memp and greedy (baselines), exhaustive "
              "(every choice; small clusters only) (docs/scheduler.md)")
@click.option("--objective", default="latency", show_default=True,
              type=click.Choice(["latency", "throughput", "cost"]),
              help="latency: mean E2E latency; throughput: most goodput within the SLOs, then "
              "latency; cost: most goodput, then the least $/h")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="CP-SAT time limit, seconds")
@click.option("--workers", type=click.IntRange(min=1), default=8, show_default=True,
              help="CP-SAT search workers (with fewer than 8 its bound closes slowly; 8 are "
              "fine on fewer cores)")
@click.option("--compare", is_flag=True, help="also place with memp and greedy and compare")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of tables")
def command(cluster_path: Path, workload_path: Path | None, trace_path: Path | None,
            trace_format: str, rate_scale: float, policy: str, objective: str,
            time_limit: float, workers: int, compare: bool, as_json: bool) -> None:
    """Choose GPUs and TP/DP per model (CP-SAT over simulator estimates)."""
    import time
    from dataclasses import replace

    from llmfabric.cli.gpus_yaml import gpu_hint
    from llmfabric.scheduler.errors import SchedulerError
    from llmfabric.scheduler.options import PlacementOptions
    from llmfabric.scheduler.placement import evaluate
    from llmfabric.scheduler.policies import get_policy
    from llmfabric.scheduler.problem import Problem, Workload
    from llmfabric.scheduler.simadapter import SimPerformance
    from llmfabric.scheduler.spec import load_cluster, load_workload
    from llmfabric.scheduler.tables import build_tables
    from llmfabric.scheduler.tracewl import workload_from_trace

    if (workload_path is None) == (trace_path is None):
        raise click.UsageError("give exactly one of --workload FILE and --workload-trace FILE")
    notes: list[str] = []
    try:
        if trace_path is not None:
            workload = workload_from_trace(trace_path, trace_format, rate_scale=rate_scale)
            probe = SimPerformance()
            known = []
            for m in workload.loads:
                try:
                    probe.params_b(m.model)
                    known.append(m)
                except SchedulerError:
                    notes.append(f"{m.model} ({m.arrival_rate:.3g} req/s in the trace) is "
                                 "unknown to the simulator; left out")
            if not known:
                raise click.ClickException(
                    f"no model of the trace is known to the simulator: {notes}")
            workload = Workload(tuple(known))
        else:
            assert workload_path is not None
            workload = load_workload(workload_path)
        problem = Problem(load_cluster(cluster_path), workload)
        perf = SimPerformance.for_workload(problem.workload)
        options = PlacementOptions(objective=objective,  # type: ignore[arg-type]
                                   time_limit_s=time_limit, workers=workers)
        t0 = time.perf_counter()
        tables = build_tables(problem, perf, options)  # shared by every policy compared
        build_s = time.perf_counter() - t0
        names = [policy] + ([p for p in ("memp", "greedy") if p != policy] if compare else [])
        docs = []
        for name in names:
            placement = get_policy(name)(problem, perf, options, tables)
            placement = replace(placement, build_s=build_s)
            doc = placement_json(placement, evaluate(problem, perf, placement,
                                                     options.unserved_latency_s))
            doc["notes"] = notes + doc["notes"]
            doc["workload"] = workload_json(problem.workload)
            docs.append(doc)
    except SchedulerError as e:
        raise click.ClickException(gpu_hint(str(e), gpus_yaml=False)) from None
    if as_json:
        out: Any = docs[0] if len(docs) == 1 else {d["policy"]: d for d in docs}
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return
    for doc in docs:
        _table(doc)


# Subcommands riding on `llmfabric plan` (the placement command above still runs on its own).
from llmfabric.cli.subcommands import with_subcommands  # noqa: E402

command = with_subcommands(command, {
    "net": "llmfabric.cli.netplan:plan_net",
    "pd": "llmfabric.cli.plan_pd:command",
})
