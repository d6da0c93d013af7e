"""`llmfabric simulate`: simulate serving a model on GPUs (rich table, or JSON with --json).

    llmfabric simulate --model llama-3.1-8b --gpu H100 --tp 2 --rate 4 --duration 600 \\
        --input 512 --output 256
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import click


def _fmt(value: float, scale: float = 1.0, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value * scale:,.2f}{unit}"


@click.command(name="simulate")
@click.option("--model", "model", required=True,
              help="preset name (e.g. llama-3.1-8b) or path to a Hugging Face config.json")
@click.option("--gpu", required=True, help="GPU name, e.g. H100, A100-80GB, RTX-4090")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--pp", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--router", default="least_outstanding", show_default=True,
              help="router policy for several replicas")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=4.0,
              show_default=True, help="mean arrival rate, requests/s")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=600.0,
              show_default=True, help="seconds of arrivals")
@click.option("--arrival", type=click.Choice(["poisson", "gamma", "on_off"]), default="poisson",
              show_default=True,
              help="poisson; gamma (burstiness --cv); on_off: Poisson bursts of --on-s seconds "
                   "separated by --off-s silent seconds (replay a file with --trace)")
@click.option("--cv", type=click.FloatRange(min=0, min_open=True), default=2.0,
              show_default=True, help="coefficient of variation for --arrival gamma")
@click.option("--on-s", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="burst length for --arrival on_off, seconds")
@click.option("--off-s", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="silence between bursts for --arrival on_off, seconds; --rate stays the "
                   "MEAN rate, so bursts run at rate x (on + off) / on")
@click.option("--input", "input_tokens", type=click.IntRange(min=1), default=512,
              show_default=True, help="prompt tokens per request")
@click.option("--output", "output_tokens", type=click.IntRange(min=1), default=256,
              show_default=True, help="output tokens per request")
@click.option("--trace", "trace", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="replay a CSV/JSONL trace (time, input, output) instead")
@click.option("--trace-limit", type=click.IntRange(min=1), default=None,
              help="replay only the first N requests of --trace")
@click.option("--trace-format", default="auto", show_default=True,
              help="format of --trace: auto, sim (time_s seconds), or a llmfabric.traces "
                   "format (azure2023, azure2024, mooncake, burstgpt, llmfabric)")
@click.option("--chunked-prefill/--no-chunked-prefill", default=False, show_default=True)
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--max-batched-tokens", type=click.IntRange(min=1), default=8192,
              show_default=True)
@click.option("--slo-ttft", type=float, default=None, help="TTFT deadline, seconds")
@click.option("--slo-tpot", type=float, default=None, help="TPOT deadline, seconds")
@click.option("--slo-e2e", type=float, default=None, help="end-to-end deadline, seconds")
@click.option("--gpus-yaml", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="extra GPU specs (YAML, see docs/simulator.md)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of a table")
def command(model: str, gpu: str, tp: int, pp: int, replicas: int, router: str, rate: float,
            duration: float, arrival: str, cv: float, on_s: float, off_s: float,
            input_tokens: int, output_tokens: int, trace: Path | None,
            trace_limit: int | None, trace_format: str, chunked_prefill: bool,
            max_num_seqs: int, max_batched_tokens: int, slo_ttft: float | None,
            slo_tpot: float | None, slo_e2e: float | None, gpus_yaml: Path | None, seed: int,
            as_json: bool) -> None:
    """Simulate serving MODEL on GPU replicas (roofline costs + continuous batching)."""
    from llmfabric import sim

    try:
        if gpus_yaml is not None:
            sim.load_gpus_yaml(gpus_yaml)
        spec = sim.get_model(model)
        gpu_spec = sim.get_gpu(gpu)
        if trace is not None:
            workload = sim.load_trace(trace, limit=trace_limit, fmt=trace_format)
        elif arrival == "gamma":
            workload = sim.gamma(rate, cv, duration, input_tokens, output_tokens, seed)
        elif arrival == "on_off":
            workload = sim.on_off(rate * (on_s + off_s) / on_s, on_s, off_s, duration,
                                  input_tokens, output_tokens, seed)
        else:
            workload = sim.poisson(rate, duration, input_tokens, output_tokens, seed)
        config = sim.EngineConfig(max_num_seqs=max_num_seqs,
                                  max_batched_tokens=max_batched_tokens,
                                  chunked_prefill=chunked_prefill)
        slo = sim.SLO(slo_ttft, slo_tpot, slo_e2e)
        rep = sim.ReplicaSpec.of(spec, gpu_spec, tp, pp, config)
        result = sim.simulate_cluster([rep] * replicas, workload, router=router,
                                      slo=None if slo.empty else slo, seed=seed)
        from llmfabric.sim.memory import memory_plan

        plan = memory_plan(rep.deployment, max_batched_tokens=max_batched_tokens)
    except sim.SimError as exc:
        raise click.ClickException(str(exc)) from exc

    summary: dict[str, Any] = {
        "model": spec.name, "gpu": gpu_spec.name, "tp": tp, "pp": pp, "replicas": replicas,
        "router": router, "requests": len(workload),
        "kv_capacity_tokens": plan.kv_capacity_tokens,
        "weight_gb_per_gpu": plan.weight_bytes_per_gpu / 1e9,
        "mean_utilisation": float(result.utilisation.busy_fraction.mean())
        if result.utilisation.busy_fraction.size else 0.0,
        **result.summary(),
    }
    if as_json:
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v)
                 for k, v in summary.items()}
        sys.stdout.write(json.dumps(clean, indent=2) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{spec.name} on {replicas} x {tp * pp} x {gpu_spec.name} "
                        f"(tp={tp}, pp={pp})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("requests (completed / rejected)",
         f"{result.n_completed:,} / {result.n_rejected:,}"),
        ("throughput", _fmt(result.throughput_rps, 1, " req/s")),
        ("output tokens/s", _fmt(result.output_tokens_per_s)),
        ("TTFT mean / p99", f"{_fmt(result.mean_ttft_s, 1e3, ' ms')} / "
                            f"{_fmt(result.p99_ttft_s, 1e3, ' ms')}"),
        ("TPOT mean / p99", f"{_fmt(result.mean_tpot_s, 1e3, ' ms')} / "
                            f"{_fmt(result.p99_tpot_s, 1e3, ' ms')}"),
        ("E2E mean / p50 / p99", f"{_fmt(result.mean_e2e_s, 1, ' s')} / "
                                 f"{_fmt(result.p50_e2e_s, 1, ' s')} / "
                                 f"{_fmt(result.p99_e2e_s, 1, ' s')}"),
        ("SLO attainment", _fmt(result.slo_attainment, 100, " %")),
        ("preemptions", f"{result.preemptions:,}"),
        ("mean GPU busy", _fmt(summary["mean_utilisation"], 100, " %")),
        ("KV capacity / replica", f"{plan.kv_capacity_tokens:,} tokens"),
        ("weights / GPU", _fmt(plan.weight_bytes_per_gpu, 1e-9, " GB")),
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)


# Subcommands riding on `llmfabric simulate` (the serving command above still runs on its own).
from llmfabric.cli.subcommands import with_subcommands  # noqa: E402

command = with_subcommands(command, {
    "collective": "llmfabric.cli.netplan:simulate_collective",
    "net": "llmfabric.cli.netplan:simulate_net",
})
