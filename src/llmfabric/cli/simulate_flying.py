"""`llmfabric simulate flying`: Flying Serving (DP engines binding into TP groups online).

    llmfabric simulate flying --model llama-3.1-70b --gpu H200 --gpus 8 --base-tp 2 \\
        --widths 1,2,4 --policy hysteresis --arrival onoff --low 2-5 --high 10-30 \\
        --requests 4000 --plot timeline.png
    llmfabric simulate flying --max-context --model llama-3.1-70b --gpu H200 --gpus 8 \\
        --base-tp 4
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import click


def rate_range(text: str) -> tuple[float, float]:
    """LOW-HIGH or LOW,HIGH requests/s (or one rate): `bench --low-rate` wrote ranges with a
    comma, this command with a dash, and each refused the other's."""
    lo, _, hi = text.replace(",", "-", 1).partition("-")
    try:
        a, b = float(lo), float(hi or lo)
    except ValueError:
        raise click.BadParameter(f"{text!r}: want LOW-HIGH requests/s, e.g. 2-5") from None
    if not 0 < a <= b or not math.isfinite(b):
        raise click.BadParameter(f"{text!r}: want 0 < LOW <= HIGH")
    return a, b


def _widths(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r}: want powers of two like 1,2,4") from None
    if not out or any(w < 1 for w in out):
        raise click.BadParameter(f"{text!r}: want powers of two like 1,2,4")
    return out


def plot_timeline(result: Any, path: Path, title: str) -> None:
    """Fig. 8 style: arrival rate and queue on top, the mode (widest group) below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 4.5),
                                      gridspec_kw={"height_ratios": [2, 1]})
    top.plot(result.samples_t, result.samples_rate, label="arrival rate (EWMA, req/s)")
    top.plot(result.samples_t, result.samples_queue, label="queued requests", alpha=0.7)
    top.legend(loc="upper right", fontsize=8)
    top.set_title(title, fontsize=9)
    bottom.step(result.samples_t, result.samples_width, where="post", color="tab:red")
    bottom.set_ylabel("TP width")
    bottom.set_xlabel("time (s)")
    bottom.set_yticks(sorted(set(int(w) for w in result.samples_width) | {1}))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@click.command(name="flying")
@click.option("--model", required=True, help="preset name or Hugging Face config.json")
@click.option("--gpu", required=True, help="GPU name, e.g. H200")
@click.option("--gpus", "n_gpus", type=click.IntRange(min=1), default=8, show_default=True,
              help="GPUs in all (split into DP engines of --base-tp GPUs)")
@click.option("--base-tp", type=click.IntRange(min=1), default=2, show_default=True,
              help="TP of one DP engine (engines = gpus / base-tp)")
@click.option("--widths", default="1,2", show_default=True,
              help="allowed group widths in engines (powers of two dividing the engines)")
@click.option("--policy", default="hysteresis", show_default=True,
              type=click.Choice(["load_threshold", "hysteresis", "priority", "context_length",
                                 "scheduled"]),
              help="the switching policy: when engines bind into a TP group and release it "
              "(docs/engines-torchref.md)")
@click.option("--method", type=click.Choice(["hard", "soft", "sequential"]), default="hard",
              show_default=True, help="transition method of binds")
@click.option("--preempt-kv", type=click.Choice(["keep", "recompute"]), default="keep",
              show_default=True, help="paused DP requests keep their KV or re-prefill")
@click.option("--switch-latency", type=click.FloatRange(min=0), default=0.015,
              show_default=True, help="seconds per bind/release")
@click.option("--arrival", type=click.Choice(["poisson", "onoff"]), default="onoff",
              show_default=True, help="poisson at --rate, or low load alternating with bursts")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=4.0,
              show_default=True, help="requests/s for --arrival poisson")
@click.option("--low", default="2-5", show_default=True, help="low-load rate range, req/s")
@click.option("--high", default="10-30", show_default=True, help="burst rate range, req/s")
@click.option("--period", type=click.FloatRange(min=0, min_open=True), default=60.0,
              show_default=True, help="seconds per low + burst cycle")
@click.option("--burst", type=click.FloatRange(min=0, min_open=True), default=15.0,
              show_default=True, help="burst seconds per cycle")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=300.0,
              show_default=True, help="seconds of arrivals")
@click.option("--requests", "n_requests", type=click.IntRange(min=1), default=None,
              help="stop after this many requests")
@click.option("--input", "input_tokens", type=click.IntRange(min=1), default=1024,
              show_default=True, help="prompt tokens per request")
@click.option("--output", "output_tokens", type=click.IntRange(min=1), default=256,
              show_default=True, help="output tokens per request")
@click.option("--priority-share", type=click.FloatRange(0, 1), default=0.15, show_default=True,
              help="share of requests with priority 1 (seeded)")
@click.option("--max-context", is_flag=True,
              help="print the longest single request, static vs flying, and exit")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write a PNG of the mode timeline (Fig. 8 style)")
@click.option("--seed", type=int, default=0, show_default=True,
              help="seed of the arrivals and of which requests get priority 1")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def flying_command(model: str, gpu: str, n_gpus: int, base_tp: int, widths: str, policy: str,
                   method: str, preempt_kv: str, switch_latency: float, arrival: str,
                   rate: float, low: str, high: str, period: float, burst: float,
                   duration: float, n_requests: int | None, input_tokens: int,
                   output_tokens: int, priority_share: float, max_context: bool,
                   plot: Path | None, seed: int, as_json: bool) -> None:
    """Simulate Flying Serving: gpus / base-tp DP engines that bind into TP groups and
    release online under a switching policy (the same policies as the engines)."""
    import numpy as np

    from llmfabric import sim
    from llmfabric.cli.gpus_yaml import gpu_hint
    from llmfabric.sim import flying

    w = _widths(widths)
    try:
        if max_context:
            out = {m: flying.max_context_tokens(model, gpu, n_gpus, base_tp, m, w)
                   for m in ("static", "flying")}
            click.echo(json.dumps(out) if as_json else
                       f"static (TP{base_tp}): {out['static']:,} tokens; flying "
                       f"({n_gpus // base_tp} engines, widest {max(w)}): {out['flying']:,}")
            return
        if arrival == "onoff":
            wl = flying.burst_trace(rate_range(low), rate_range(high), period, burst, duration,
                                    input_tokens, output_tokens, n_requests, seed)
        else:
            wl = sim.poisson(rate, duration, input_tokens, output_tokens, seed)
        prio = (np.random.default_rng(seed + 1).random(len(wl)) < priority_share).astype(int)
        res = flying.simulate_flying(model, gpu, n_gpus, base_tp, wl, widths=w, policy=policy,
                                     method=method,  # type: ignore[arg-type]
                                     preempt_kv=preempt_kv,  # type: ignore[arg-type]
                                     switch_latency_s=switch_latency, priority=prio)
    except (sim.SimError, ValueError) as exc:
        raise click.ClickException(gpu_hint(str(exc), gpus_yaml=False)) from exc
    if plot is not None:
        plot_timeline(res, plot, f"{model} on {n_gpus}x{gpu}, base TP{base_tp}, "
                                 f"policy {policy}, {res.switches} switches")
    summary = res.summary()
    if as_json:
        sys.stdout.write(json.dumps(_finite(summary)) + "\n")
        return
    s = res.serving
    cls = res.class_stats()
    click.echo(f"{s.n_completed}/{s.n_requests} requests, {res.switches} switches, "
               f"{s.output_tokens_per_s:,.0f} output tok/s")
    for name in ("all", "priority"):
        c = cls[name]
        click.echo(f"  {name:8s} TTFT mean {c['mean_ttft_s'] * 1e3:,.1f} ms, p90 "
                   f"{c['p90_ttft_s'] * 1e3:,.1f} ms; TPOT {c['mean_tpot_s'] * 1e3:,.1f} ms")
    if plot is not None:
        click.echo(f"wrote {plot}")


def _finite(value: Any) -> Any:
    """NaN (e.g. no priority requests) as JSON null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
