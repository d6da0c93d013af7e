"""`llmfabric bench`: load an OpenAI-compatible endpoint (an ingress, an engine) and measure it.

Always bounded: at most --num-prompts requests, sent within --duration seconds, and in-flight
requests get --drain seconds after the last send.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
from pathlib import Path
from typing import Any

import click

from llmfabric.cli.simulate_flying import rate_range

ARRIVAL_CHOICES = ("poisson", "gamma", "onoff", "replay")
FORMAT_CHOICES = ("auto", "llmfabric", "swissai", "burstgpt", "azure2023", "azure2024", "mooncake")


def _server_root(_: click.Context, __: click.Parameter, url: str) -> str:
    """The server root: OpenAI clients take the URL with /v1 (the demo prints it so), and
    that URL here sent every request to /v1/v1/... (404). Without a scheme every request
    failed as 'connection x1: 127.0.0.1:8000/v1/completions'."""
    if not url.startswith(("http://", "https://")):
        raise click.BadParameter(f"{url!r} is no URL: give it with http:// or https://, e.g. "
                                 "http://127.0.0.1:8080")
    return url.rstrip("/").removesuffix("/v1")


@click.command(name="bench")
@click.option(
    "--base-url",
    default="http://127.0.0.1:8000",
    show_default=True,
    callback=_server_root,
    help="server root (the client adds /v1/completions or /v1/chat/completions; a "
    "trailing /v1 is dropped)",
)
@click.option("--model", default=None, help="model to request (replay: default the trace's)")
@click.option(
    "--api-key", envvar="LLMFABRIC_API_KEY", default=None, help="bearer key [env LLMFABRIC_API_KEY]"
)
@click.option(
    "--endpoint",
    type=click.Choice(["completions", "chat"]),
    default="completions",
    show_default=True,
    help="the route requests go to: /v1/completions or /v1/chat/completions",
)
@click.option(
    "--arrival",
    type=click.Choice(ARRIVAL_CHOICES),
    default="poisson",
    show_default=True,
    help="when requests are sent: poisson or gamma (--request-rate), onoff (--low-*/--high-*), "
    "replay (--trace)",
)
@click.option(
    "--request-rate",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="mean req/s (poisson, gamma)",
)
@click.option(
    "--burstiness",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="gamma shape: 1 = Poisson, < 1 burstier",
)
@click.option(
    "--low-rate", default="2,5", show_default=True, help="on/off: low phase req/s (LOW,HIGH)"
)
@click.option("--high-rate", default="10,30", show_default=True, help="on/off: burst req/s")
@click.option(
    "--low-s",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="on/off: low phase length, s",
)
@click.option(
    "--high-s",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="on/off: burst length, s",
)
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="replay: the trace file",
)
@click.option(
    "--trace-format",
    type=click.Choice(FORMAT_CHOICES),
    default="auto",
    show_default=True,
    help="replay: the trace's format (auto: from the file)",
)
@click.option(
    "--time-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="replay: multiply trace gaps (0.5 = twice as fast)",
)
@click.option(
    "--num-prompts",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="request bound",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="send window bound, seconds",
)
@click.option(
    "--drain",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="seconds in-flight requests get after the last send",
)
@click.option(
    "--input-len",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="prompt tokens of a synthetic request (about: the bench has no tokenizer)",
)
@click.option(
    "--output-len",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="output tokens asked of a synthetic request (max_tokens)",
)
@click.option(
    "--range-ratio",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.0,
    show_default=True,
    help="lengths uniform in len*(1 +/- ratio)",
)
@click.option(
    "--max-input-len",
    type=click.IntRange(min=1),
    default=None,
    help="replay: clip trace input lengths",
)
@click.option(
    "--max-output-len",
    type=click.IntRange(min=1),
    default=None,
    help="replay: clip trace output lengths",
)
@click.option(
    "--max-concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="requests in flight at most; later arrivals wait for a slot [no cap]",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="per-request timeout, s",
)
@click.option(
    "--slo-ttft-ms",
    type=float,
    default=None,
    help="SLO: time to first token, ms (with any --slo-*: goodput and SLO attainment)",
)
@click.option("--slo-tpot-ms", type=float, default=None, help="SLO: time per output token, ms")
@click.option("--slo-e2el-ms", type=float, default=None, help="SLO: end-to-end latency, ms")
@click.option("--percentiles", default="99", show_default=True, help="comma-separated")
@click.option("--no-ignore-eos", is_flag=True, help="do not ask the server to ignore EOS")
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="random seed of arrivals, lengths and prompts (the same seed sends the same load)",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="write the result JSON here",
)
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="write the markdown table here",
)
@click.option("--save-detailed", is_flag=True, help="add per-request lists to the JSON")
@click.option("--quiet", is_flag=True, help="no live progress")
def command(**opts: Any) -> None:
    """Benchmark an OpenAI-compatible endpoint: TTFT, TPOT, ITL, latency, throughput, SLOs."""
    from llmfabric.bench import BenchConfigError, BenchError
    from llmfabric.traces import TraceError

    try:
        result = _run(opts)
    except (BenchConfigError, BenchError, TraceError) as exc:
        raise click.ClickException(str(exc)) from exc
    from llmfabric.bench import to_markdown, write_results

    write_results(result, opts["json_path"], opts["markdown_path"])
    click.echo(to_markdown(result))
    if result["num_prompts"] and not result["completed"]:
        # (a wrong URL, key or model exited 0 with all-zero tables: scripts took it for a run)
        by_kind = result.get("errors_by_kind") or {}
        kinds = ", ".join(f"{k}: {n}" for k, n in by_kind.items())
        why = ("the server's words are under Errors above" if set(by_kind) != {"connection"}
               else f"nothing answered at {opts['base_url']}: is the server running there? "
                    "(--base-url)")  # (no server, so no server's words to read)
        raise click.ClickException(f"no request succeeded ({kinds or 'no answer'}); {why}")


def _run(opts: dict[str, Any]) -> dict[str, Any]:
    from llmfabric.bench import (
        SLO,
        BenchConfig,
        BenchConfigError,
        Gamma,
        OnOff,
        Poisson,
        detailed,
        replay_workload,
        summarize,
        synthetic_workload,
    )

    arrival_name = opts["arrival"]
    if arrival_name == "replay":
        if opts["trace_path"] is None:
            raise BenchConfigError("--arrival replay needs --trace FILE")
        from llmfabric.traces import iter_records

        first = list(
            itertools.islice(
                iter_records(opts["trace_path"], opts["trace_format"]), opts["num_prompts"]
            )
        )
        specs = replay_workload(
            first,
            time_scale=opts["time_scale"],
            max_requests=opts["num_prompts"],
            max_duration_s=opts["duration"],
            model=opts["model"],
            max_input_len=opts["max_input_len"],
            max_output_len=opts["max_output_len"],
            seed=opts["seed"],
        )
    else:
        if not opts["model"]:
            raise BenchConfigError("--model is required (except when replaying a trace)")
        if arrival_name == "onoff":
            arrival: Any = OnOff(
                rate_range(opts["low_rate"]),
                rate_range(opts["high_rate"]),
                opts["low_s"],
                opts["high_s"],
            )
        elif arrival_name == "gamma":
            arrival = Gamma(opts["request_rate"], opts["burstiness"])
        else:
            arrival = Poisson(opts["request_rate"])
        specs = synthetic_workload(
            arrival,
            model=opts["model"],
            input_len=opts["input_len"],
            output_len=opts["output_len"],
            range_ratio=opts["range_ratio"],
            max_requests=opts["num_prompts"],
            max_duration_s=opts["duration"],
            seed=opts["seed"],
        )
    if not specs:
        raise BenchConfigError("the workload is empty: raise --duration or the request rate")
    config = BenchConfig(
        base_url=opts["base_url"],
        endpoint=opts["endpoint"],
        api_key=opts["api_key"],
        max_concurrency=opts["max_concurrency"],
        request_timeout_s=opts["timeout_s"],
        drain_s=opts["drain"],
        ignore_eos=not opts["no_ignore_eos"],
    )
    try:
        percentiles = [float(p) for p in opts["percentiles"].split(",") if p.strip()]
    except ValueError as exc:
        raise BenchConfigError(f"--percentiles {opts['percentiles']!r}: numbers only") from exc
    run = asyncio.run(_with_progress(specs, config, quiet=opts["quiet"]))
    slo = SLO(opts["slo_ttft_ms"], opts["slo_tpot_ms"], opts["slo_e2el_ms"])
    result: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S"),
        "backend": "openai-chat" if opts["endpoint"] == "chat" else "openai",
        "model_id": opts["model"] or specs[0].model,
        "num_prompts": len(specs),
        "request_rate": opts["request_rate"] if arrival_name in ("poisson", "gamma") else None,
        "burstiness": {"gamma": opts["burstiness"], "poisson": 1.0}.get(arrival_name),
        "max_concurrency": opts["max_concurrency"],
        "arrival": arrival_name,
    }
    result.update(
        summarize(run.outcomes, duration_s=run.duration_s, percentiles=percentiles, slo=slo)
    )
    if opts["save_detailed"]:
        result.update(detailed(run.outcomes))
    return result


async def _with_progress(specs: Any, config: Any, *, quiet: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from llmfabric.bench import run_load

    state = {"sent": 0, "ok": 0, "failed": 0, "ttft_sum": 0.0}
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=quiet,
        transient=True,
    ) as bar:
        task = bar.add_task("bench", total=len(specs))

        def describe() -> str:
            mean = state["ttft_sum"] / state["ok"] * 1000 if state["ok"] else 0.0
            return (
                f"sent {state['sent']:.0f} ok {state['ok']:.0f} failed {state['failed']:.0f}"
                f" mean TTFT {mean:.0f} ms"
            )

        def on_sent(_: Any) -> None:
            state["sent"] += 1
            bar.update(task, description=describe())

        def on_done(outcome: Any) -> None:
            if outcome.ok:
                state["ok"] += 1
                state["ttft_sum"] += outcome.ttft_s or 0.0
            else:
                state["failed"] += 1
            bar.update(task, advance=1, description=describe())

        return await run_load(specs, config, on_sent=on_sent, on_done=on_done)
