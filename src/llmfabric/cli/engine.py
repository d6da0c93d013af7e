"""`llmfabric engine sim`: run the simulated OpenAI-compatible engine (a stand-in for vLLM)."""

from __future__ import annotations

import asyncio

import click

from llmfabric.engines.sim_server import SimEngineConfig, serve


@click.group("engine")
def command() -> None:
    """Engines shipped with llmfabric."""


@command.command("sim")
@click.option("--model", "models", multiple=True, required=True,
              help="model id to serve (repeat for several); a llmfabric.sim preset name "
              "gives roofline timing and its context length")
@click.option("--gpu", default="H100-SXM", show_default=True, help="simulated GPU type")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="tensor-parallel degree")
@click.option("--dp", type=click.IntRange(min=1), default=1, show_default=True,
              help="data-parallel replicas (each with its own batch) behind the one API")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), required=True)
@click.option("--speed", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, help="run this many times faster than the timing model")
@click.option("--slow", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, help="start slowed down by this factor")
@click.option("--max-model-len", type=click.IntRange(min=16), default=None,
              help="context length [default: from the model preset, else 4096]")
@click.option("--startup-delay", type=click.FloatRange(min=0), default=0.0,
              help="seconds of simulated model loading before the port opens")
@click.option("--crash-after-requests", type=click.IntRange(min=0), default=0,
              help="exit with status 3 on request N+1 (0: never)")
@click.option("--hang-after-requests", type=click.IntRange(min=0), default=0,
              help="stop answering after N requests (0: never)")
@click.option("--fail-after-requests", type=click.IntRange(min=0), default=0,
              help="answer inference with --fail-status after N requests (0: never)")
@click.option("--fail-status", type=click.IntRange(400, 599), default=500, show_default=True)
@click.option("--exit-after", type=click.FloatRange(min=0), default=0.0,
              help="crash after this many seconds (0: never)")
@click.option("--log-line", default="", help="print this line to stdout after --log-after s")
@click.option("--log-after", type=click.FloatRange(min=0), default=0.0)
@click.option("--ignore-sigterm", is_flag=True, help="ignore SIGTERM (tests SIGKILL escalation)")
def sim(models: tuple[str, ...], gpu: str, tp: int, dp: int, host: str, port: int, speed: float,
        slow: float, max_model_len: int | None, startup_delay: float,
        crash_after_requests: int, hang_after_requests: int, fail_after_requests: int,
        fail_status: int, exit_after: float, log_line: str, log_after: float,
        ignore_sigterm: bool) -> None:
    """Serve MODEL(s) through an OpenAI-compatible API with simulated GPU timing.

    Misbehaviour on demand: POST /sim/control {"action": "crash"|"hang"|"slow"|"fail"|"log"|
    "reset"} (see docs/agent.md).
    """
    config = SimEngineConfig(
        models=models, gpu=gpu, tp=tp, dp=dp, host=host, port=port, speed=speed, slow=slow,
        max_model_len=max_model_len, startup_delay_s=startup_delay,
        crash_after_requests=crash_after_requests, hang_after_requests=hang_after_requests,
        fail_after_requests=fail_after_requests, fail_status=fail_status,
        exit_after_s=exit_after, log_line=log_line, log_after_s=log_after,
        ignore_sigterm=ignore_sigterm,
    )
    asyncio.run(serve(config))


if __name__ == "__main__":  # python -m llmfabric.cli.engine sim ...
    command()
