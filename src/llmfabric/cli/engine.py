"""`llmfabric engine sim`: run the simulated OpenAI-compatible engine (a stand-in for vLLM);
`llmfabric engine torch`: the CPU reference engine that switches DP <-> TP (engines/torchref)."""

from __future__ import annotations

import asyncio

import click

from llmfabric.agent.kv_events_config import KvEventsConfigError
from llmfabric.agent.kv_events_config import parse as kv_events_config_from
from llmfabric.engines.pd_role import ROLES, KVLink
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
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address the OpenAI API listens on")
@click.option("--port", type=click.IntRange(1, 65535), required=True,
              help="port the OpenAI API listens on")
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
@click.option("--fail-status", type=click.IntRange(400, 599), default=500, show_default=True,
              help="--fail-after-requests: the HTTP status of the failed answers")
@click.option("--exit-after", type=click.FloatRange(min=0), default=0.0,
              help="crash after this many seconds (0: never)")
@click.option("--log-line", default="", help="print this line to stdout after --log-after s")
@click.option("--log-after", type=click.FloatRange(min=0), default=0.0,
              help="--log-line: seconds after start")
@click.option("--ignore-sigterm", is_flag=True, help="ignore SIGTERM (tests SIGKILL escalation)")
@click.option("--prefix-cache/--no-prefix-cache", default=True, show_default=True,
              help="automatic prefix caching: cached 16-token prompt blocks (an LRU of the "
                   "KV capacity) are not prefilled again")
@click.option("--kv-blocks", type=click.IntRange(min=1), default=None,
              help="the prefix cache's capacity in 16-token blocks (default: the model's KV "
                   "capacity on --gpu)")
@click.option("--kv-events-config", "kv_events_config", default=None, metavar="JSON",
              help="publish the prefix cache's stores and evictions as vLLM's KV-cache events "
                   "over ZMQ (vLLM's flag: {\"enable_kv_cache_events\": true, \"publisher\": "
                   "\"zmq\", \"endpoint\": \"tcp://127.0.0.1:5557\", \"topic\": \"kv\"})")
@click.option("--flying", is_flag=True,
              help="Flying Serving: the --dp batchers bind into TP batchers online "
                   "(GET /dtp_status, POST /dtp_switch)")
@click.option("--widths", "flying_widths", default="1,2", show_default=True,
              help="with --flying: allowed group widths (powers of two dividing --dp)")
@click.option("--switch-policy", default=None,
              type=click.Choice(["load_threshold", "hysteresis", "priority", "context_length",
                                 "scheduled"]),
              help="with --flying: switch automatically under this policy")
@click.option("--role", type=click.Choice(ROLES), default="both", show_default=True,
              help="prefill/decode disaggregation (vLLM's kv_transfer_params protocol): the "
              "phase this engine takes; every role also serves plain requests; flip it "
              "with POST /sim/role")
@click.option("--kv-bits", type=click.Choice(["2", "3", "4", "8", "16"]), default="16",
              show_default=True, help="bits per KV element on the prefill->decode wire "
              "(KIVI groups of 64 with fp16 scale/minimum below 16)")
@click.option("--kv-gbps", type=click.FloatRange(min=0, min_open=True), default=40.0,
              show_default=True, help="bandwidth of the link the KV arrives over (decode)")
@click.option("--kv-latency-ms", type=click.FloatRange(0, 60000, max_open=True), default=1.0,
              show_default=True, help="latency of that link")
def sim(models: tuple[str, ...], gpu: str, tp: int, dp: int, host: str, port: int, speed: float,
        slow: float, max_model_len: int | None, startup_delay: float,
        crash_after_requests: int, hang_after_requests: int, fail_after_requests: int,
        fail_status: int, exit_after: float, log_line: str, log_after: float,
        ignore_sigterm: bool, prefix_cache: bool, kv_blocks: int | None,
        kv_events_config: str | None, flying: bool, flying_widths: str,
        switch_policy: str | None, role: str, kv_bits: str, kv_gbps: float,
        kv_latency_ms: float) -> None:
    """Serve MODEL(s) through an OpenAI-compatible API with simulated GPU timing.

    Misbehaviour on demand: POST /sim/control {"action": "crash"|"hang"|"slow"|"fail"|"log"|
    "reset"} (see docs/agent.md).
    """
    try:
        kv_events = kv_events_config_from(kv_events_config) if kv_events_config else None
    except KvEventsConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--kv-events-config") from None
    config = SimEngineConfig(
        models=models, gpu=gpu, tp=tp, dp=dp, host=host, port=port, speed=speed, slow=slow,
        max_model_len=max_model_len, startup_delay_s=startup_delay,
        crash_after_requests=crash_after_requests, hang_after_requests=hang_after_requests,
        fail_after_requests=fail_after_requests, fail_status=fail_status,
        exit_after_s=exit_after, log_line=log_line, log_after_s=log_after,
        ignore_sigterm=ignore_sigterm, prefix_cache=prefix_cache, kv_blocks=kv_blocks,
        kv_events_endpoint=kv_events.endpoint if kv_events else None,
        kv_events_topic=kv_events.topic if kv_events else "", flying=flying,
        widths=tuple(int(w) for w in flying_widths.split(",") if w.strip()),
        switch_policy=switch_policy, role=role,
        kv_bits=None if kv_bits == "16" else int(kv_bits),
        kv_link=KVLink(kv_gbps, kv_latency_ms / 1000),
    )
    asyncio.run(serve(config))


@command.command("torch")
@click.option("--config", "config_spec", default="tiny-llama", show_default=True,
              help="model preset (tiny-llama, micro-llama, small-llama) or a Hugging Face "
              "config.json path (weights are seeded, the tokenizer is byte-level)")
@click.option("--seed", type=int, default=None, help="weight seed [default: the preset's]")
@click.option("--checkpoint", type=click.Path(exists=True, dir_okay=False), default=None,
              help="trained weights for --config (python -m llmfabric.engines.torchref.train"
              " --out FILE) instead of seeded ones")
@click.option("--dp", type=click.IntRange(min=1), default=2, show_default=True,
              help="engine processes, each with a full weight replica")
@click.option("--widths", default="1,2", show_default=True,
              help="allowed TP widths (powers of two dividing --dp)")
@click.option("--switch-policy", type=click.Choice(
    ["none", "load_threshold", "hysteresis", "priority", "context_length", "scheduled"]),
              default="none", show_default=True,
              help="automatic switching (none: only POST /dtp_switch)")
@click.option("--mu-tp", type=click.FloatRange(min=0, min_open=True), default=8.0,
              show_default=True, help="hysteresis: the TP group's service rate (requests/s)")
@click.option("--schedule", default="",
              help="scheduled: switch times as T:WIDTH,... (seconds after start), e.g. 5:2,10:1")
@click.option("--method", type=click.Choice(["sequential", "soft", "hard"]), default="hard",
              show_default=True,
              help="transition method of policy binds and of a /dtp_switch naming none")
@click.option("--kv-blocks", type=click.IntRange(min=1), default=256, show_default=True,
              help="KV blocks per engine (each holds --block-tokens tokens at width 1)")
@click.option("--block-tokens", type=click.IntRange(min=1), default=16, show_default=True,
              help="tokens a KV block holds at width 1 (at TP width W: W times as many)")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="torch threads per engine process")
@click.option("--max-waiting", type=click.IntRange(min=1), default=1024, show_default=True,
              help="requests waiting for a batch slot (all engines together) before new ones "
              "get 503 with Retry-After")
@click.option("--max-priority", type=click.IntRange(min=0), default=None,
              help="the highest `priority` a client's request gets (larger ones are clamped; "
              "0: clients cannot jump the queues or trigger a preempt) [default: 1 with "
              "--switch-policy priority, else 0]")
@click.option("--served-model-name", default=None, help="model id in the API [default: the "
              "config's name]")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address the OpenAI API listens on")
@click.option("--port", type=click.IntRange(1, 65535), required=True,
              help="port the OpenAI API listens on")
def torch_engine(config_spec: str, seed: int | None, checkpoint: str | None, dp: int,
                 widths: str, switch_policy: str,
                 mu_tp: float, schedule: str, method: str, kv_blocks: int, block_tokens: int,
                 threads: int, max_waiting: int, max_priority: int | None,
                 served_model_name: str | None, host: str, port: int) -> None:
    """Serve a small Llama model on CPU from DP engine processes that bind into TP groups
    and back online (Flying Serving; needs the extra llmfabric[torch]).

    Besides the OpenAI routes: POST /dtp_switch {"width": 2, "method": "hard-preempt"} and
    GET /dtp_status (docs/engines-torchref.md).
    """
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise click.ClickException("the torch engine needs PyTorch: pip install "
                                   "'llmfabric[torch]'")
    from llmfabric.engines.torchref.config import load_config
    from llmfabric.engines.torchref.engine import EngineOptions
    from llmfabric.engines.torchref.server import ServerConfig
    from llmfabric.engines.torchref.server import serve as serve_torch
    from llmfabric.scheduler.switching import Method, make_policy

    try:
        cfg = load_config(config_spec, seed)
        if checkpoint:  # checked here, before any engine process starts
            import pathlib
            from dataclasses import replace

            from llmfabric.engines.torchref.weights import init_weights

            cfg = replace(cfg, checkpoint=str(pathlib.Path(checkpoint).resolve()))
            init_weights(cfg)
        width_set = tuple(sorted({int(w) for w in widths.split(",") if w.strip()} | {1}))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    meth: Method = "sequential" if method == "sequential" else \
        "soft" if method == "soft" else "hard"
    policy = None
    if switch_policy == "priority":
        policy = make_policy("priority")
    elif switch_policy == "hysteresis":
        policy = make_policy("hysteresis", mu_tp=mu_tp, method=meth)
    elif switch_policy == "scheduled":
        try:
            times = [(float(t), int(w)) for t, w in
                     (item.split(":") for item in schedule.split(",") if item.strip())]
        except ValueError as exc:
            raise click.BadParameter("use T:WIDTH,...", param_hint="--schedule") from exc
        policy = make_policy("scheduled", times=times, method=meth)
    elif switch_policy != "none":
        policy = make_policy(switch_policy, method=meth)
    options = EngineOptions(config=cfg, dp=dp, widths=width_set, n_blocks=kv_blocks,
                            block_tokens=block_tokens, threads=threads, policy=policy,
                            method=meth, max_waiting=max_waiting,
                            max_priority=(max_priority if max_priority is not None else
                                          1 if switch_policy == "priority" else 0))
    try:
        from llmfabric.scheduler.switching import aligned_groups

        aligned_groups(dp, width_set)
        for w in width_set:
            cfg.check_width(w)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--widths") from exc
    code = asyncio.run(serve_torch(options, ServerConfig(host=host, port=port,
                                                         model_name=served_model_name)))
    if code:
        raise SystemExit(code)


if __name__ == "__main__":  # python -m llmfabric.cli.engine sim ...
    command()
