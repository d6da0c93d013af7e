"""`llmfabric simulate`: simulate serving a model on GPUs (rich table, or JSON with --json).

    llmfabric simulate --model llama-3.1-8b --gpu H100 --tp 2 --rate 4 --duration 600 \\
        --input 512 --output 256
    llmfabric simulate --model qwen3-32b --gpu H100 --tp 2 --concurrency 64 \\
        --engine-profile sglang          # closed loop: steady-state and first-wave TTFT
    llmfabric simulate e2e ROWS.csv --json OUT   # replay measured end-to-end rows (MAPE)
    llmfabric simulate flying --model llama-3.1-70b --gpu H200 --gpus 8 --base-tp 2 \\
        --widths 1,2,4 --arrival onoff --plot t.png   # Flying Serving (cli/simulate_flying.py)
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


@click.group(name="simulate", invoke_without_command=True)
@click.option("--model", "model", default=None,
              help="preset name (e.g. llama-3.1-8b) or path to a Hugging Face config.json "
                   "(required unless a subcommand is given)")
@click.option("--gpu", default=None, help="GPU name, e.g. H100, A100-80GB, RTX-4090, B200 "
              "(required unless a subcommand is given)")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="tensor-parallel degree: GPUs per pipeline stage")
@click.option("--pp", type=click.IntRange(min=1), default=1, show_default=True,
              help="pipeline-parallel stages of a replica")
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
              help="replicas (each of TP x PP GPUs) behind --router")
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
@click.option("--engine-profile", type=click.Choice(["vllm", "sglang", "trtllm"]),
              default=None, help="a real engine's defaults (scheduling, batch limits, CPU "
                                 "costs); the flags below override them. Default: vllm with "
                                 "--concurrency, else the plain engine model (vLLM V0 style)")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="closed loop: this many clients, each re-sending when its request "
                   "completes (replaces --rate/--arrival); prints steady-state and "
                   "first-wave TTFT separately")
@click.option("--requests", "n_requests", type=click.IntRange(min=1), default=None,
              help="requests sent in all with --concurrency (default 10 x concurrency)")
@click.option("--chunked-prefill/--no-chunked-prefill", default=None,
              help="override the profile's policy (plain engine model: off)")
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=None,
              help="override the profile's batch limit (plain engine model: 256)")
@click.option("--max-batched-tokens", type=click.IntRange(min=1), default=None,
              help="override the profile's token budget per step (plain engine model: 8192)")
@click.option("--slo-ttft", type=float, default=None, help="TTFT deadline, seconds")
@click.option("--slo-tpot", type=float, default=None, help="TPOT deadline, seconds")
@click.option("--slo-e2e", type=float, default=None, help="end-to-end deadline, seconds")
@click.option("--gpus-yaml", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="extra GPU specs (YAML, see docs/simulator.md)")
@click.option("--seed", type=int, default=0, show_default=True,
              help="seed of the arrivals and the request lengths")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of a table")
@click.pass_context
def command(ctx: click.Context, model: str | None, gpu: str | None, tp: int, pp: int,
            replicas: int, router: str, rate: float, duration: float, arrival: str, cv: float,
            on_s: float, off_s: float, input_tokens: int, output_tokens: int,
            trace: Path | None, trace_limit: int | None, trace_format: str,
            engine_profile: str | None, concurrency: int | None, n_requests: int | None,
            chunked_prefill: bool | None, max_num_seqs: int | None,
            max_batched_tokens: int | None, slo_ttft: float | None, slo_tpot: float | None,
            slo_e2e: float | None, gpus_yaml: Path | None, seed: int, as_json: bool) -> None:
    """Simulate serving --model on --gpu replicas (roofline costs + continuous batching).
    Subcommand `e2e` replays measured end-to-end rows instead; `flying` simulates Flying
    Serving (DP engines binding into TP groups online)."""
    if ctx.invoked_subcommand is not None:
        return
    if model is None or gpu is None:
        group = ctx.command
        subcommands = sorted(group.commands) if isinstance(group, click.Group) else []
        raise click.UsageError("--model and --gpu are required (or use a subcommand: "
                               f"{', '.join(subcommands)})")
    from llmfabric import sim
    from llmfabric.cli.gpus_yaml import gpu_hint

    overrides: dict[str, Any] = {k: v for k, v in (
        ("chunked_prefill", chunked_prefill), ("max_num_seqs", max_num_seqs),
        ("max_batched_tokens", max_batched_tokens)) if v is not None}
    if engine_profile is None and concurrency is not None:
        engine_profile = "vllm"
    try:
        catalog = (sim.load_gpus_yaml(gpus_yaml) if gpus_yaml is not None
                   else sim.DEFAULT_CATALOG)
        spec = sim.get_model(model)
        gpu_spec = sim.get_gpu(gpu, catalog)
        config = (sim.EngineConfig.for_engine(engine_profile, **overrides)
                  if engine_profile is not None else sim.EngineConfig(**overrides))
        if concurrency is not None:
            _closed_loop(spec, gpu_spec, tp, pp, engine_profile or "vllm", config, concurrency,
                         n_requests or 10 * concurrency, input_tokens, output_tokens, seed,
                         as_json)
            return
        if trace is not None:
            workload = sim.load_trace(trace, limit=trace_limit, fmt=trace_format)
        elif arrival == "gamma":
            workload = sim.gamma(rate, cv, duration, input_tokens, output_tokens, seed)
        elif arrival == "on_off":
            workload = sim.on_off(rate * (on_s + off_s) / on_s, on_s, off_s, duration,
                                  input_tokens, output_tokens, seed)
        else:
            workload = sim.poisson(rate, duration, input_tokens, output_tokens, seed)
        slo = sim.SLO(slo_ttft, slo_tpot, slo_e2e)
        rep = sim.ReplicaSpec.of(spec, gpu_spec, tp, pp, config)
        result = sim.simulate_cluster([rep] * replicas, workload, router=router,
                                      slo=None if slo.empty else slo, seed=seed)
        from llmfabric.sim.memory import memory_plan
        from llmfabric.sim.serving import _kv_capacity

        plan = memory_plan(rep.deployment, max_batched_tokens=config.max_batched_tokens,
                           gpu_memory_utilization=config.gpu_memory_utilization)
        kv_tokens = _kv_capacity(rep)  # as the replicas size it (profiles may differ)
    except sim.SimError as exc:
        raise click.ClickException(gpu_hint(str(exc), gpus_yaml=True)) from exc

    summary: dict[str, Any] = {
        "model": spec.name, "gpu": gpu_spec.name, "tp": tp, "pp": pp, "replicas": replicas,
        "router": router, "requests": len(workload),
        "kv_capacity_tokens": kv_tokens,
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
    from rich.table import Table

    from llmfabric.cli.console import table_console

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
        ("KV capacity / replica", f"{kv_tokens:,} tokens"),
        ("weights / GPU", _fmt(plan.weight_bytes_per_gpu, 1e-9, " GB")),
    ]
    for name, value in rows:
        table.add_row(name, value)
    table_console().print(table)


def _closed_loop(spec: Any, gpu_spec: Any, tp: int, pp: int, profile: str, config: Any,
                 concurrency: int, n_requests: int, input_tokens: int, output_tokens: int,
                 seed: int, as_json: bool) -> None:
    from llmfabric import sim

    res = sim.simulate_closed_loop(spec, gpu_spec, tp, concurrency, n_requests, input_tokens,
                                   output_tokens, pp=pp, engine_profile=profile, config=config,
                                   seed=seed)
    summary: dict[str, Any] = {"model": spec.name, "gpu": gpu_spec.name, "tp": tp, "pp": pp,
                               "engine_profile": profile, **res.summary()}
    if as_json:
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v)
                 for k, v in summary.items()}
        sys.stdout.write(json.dumps(clean, indent=2) + "\n")
        return
    from rich.table import Table

    from llmfabric.cli.console import table_console

    table = Table(title=f"{spec.name} on {tp * pp} x {gpu_spec.name} (tp={tp}, pp={pp}), "
                        f"{profile}, {concurrency} clients")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in (
        ("requests (completed / rejected)", f"{res.n_completed:,} / {res.n_rejected:,}"),
        ("TTFT steady state (first wave excluded)", _fmt(res.steady_ttft_s, 1e3, " ms")),
        ("TTFT first wave", _fmt(res.first_wave_ttft_s, 1e3, " ms")),
        ("TTFT mean, all requests", _fmt(res.mean_ttft_s, 1e3, " ms")),
        ("TPOT steady state / all requests", f"{_fmt(res.steady_tpot_s, 1e3, ' ms')} / "
                                             f"{_fmt(res.mean_tpot_s, 1e3, ' ms')}"),
        ("throughput", _fmt(res.throughput_rps, 1, " req/s")),
        ("output tokens/s", _fmt(res.output_tokens_per_s)),
        ("preemptions", f"{res.preemptions:,}"),
    ):
        table.add_row(name, value)
    table_console().print(table)


@command.command(name="e2e")
@click.argument("rows", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="write the per-row predictions and MAPE summary here "
                                 "(default: print the JSON)")
@click.option("--waves", type=click.IntRange(min=2), default=8, show_default=True,
              help="requests per client in each closed loop (the first is excluded)")
@click.option("--seed", type=int, default=0, show_default=True,
              help="seed of the first closed loop (see --runs)")
@click.option("--runs", type=click.IntRange(min=1), default=4, show_default=True,
              help="closed loops per row (seeds seed, seed+1, ...), averaged: client "
                   "clustering differs from draw to draw")
def e2e_command(rows: Path, json_out: Path | None, waves: int, seed: int, runs: int) -> None:
    """Replay measured end-to-end rows (CSV with the columns model, gpu, backend,
    backend_version, precision, gemm_quant, tp, isl, osl, concurrency, ttft_ms, tpot_ms):
    predicted TTFT/TPOT next to the measured ones, MAPE overall, per GPU and per backend,
    each with its floor: the least MAPE those rows allow any prediction that never falls as
    the concurrency rises (what the measurements' own disorder costs)."""
    from llmfabric import sim
    from llmfabric.sim import e2e

    try:
        out = e2e.replay(rows, waves=waves, seed=seed, runs=runs)
    except sim.SimError as exc:
        raise click.ClickException(str(exc)) from exc
    text = json.dumps(_nan_to_none(out), indent=2) + "\n"
    if json_out is None:
        sys.stdout.write(text)
        return
    json_out.write_text(text)
    s = out["summary"]["all"]
    failed = sum(1 for r in out["rows"] if "error" in r)
    click.echo(f"{s['n']} rows: TTFT MAPE {s['ttft_mape']:.1f} %, TPOT MAPE "
               f"{s['tpot_mape']:.1f} % (the rows' own floor: {s['ttft_floor']:.1f} / "
               f"{s['tpot_floor']:.1f} %); {failed} rows not simulated; wrote {json_out}")


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    return value


# HeroServe's network simulations ride on the `simulate` group (cli/netplan.py).
from llmfabric.cli.netplan import simulate_collective, simulate_net  # noqa: E402

command.add_command(simulate_collective)
command.add_command(simulate_net)


def _register_flying() -> None:
    from llmfabric.cli.simulate_flying import flying_command

    command.add_command(flying_command)


_register_flying()
