"""`llmfabric start`: run a node; with `--process CMD...` it also supervises an engine.

    llmfabric start --bootstrap host:7946 --network-secret S --process vllm serve M --port 8000

Settings come from defaults < `--config FILE` (YAML) < env vars (LLMFABRIC_*) < flags.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pathlib
import signal
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from llmfabric.cli.untrusted import configure_logging
from llmfabric.net.fd_limit import raise_open_file_limit
from llmfabric.node.config import (
    DIAL_EXAMPLE,
    HTTP_DIAL_EXAMPLE,
    ConfigError,
    NodeConfig,
    build_config,
    load_config_file,
    parse_dial_addr,
)
from llmfabric.routing.policies import POLICIES
from llmfabric.untrusted import get_logger

F = TypeVar("F", bound=Callable[..., Any])
# Slurm's default KillWait: SIGKILL follows SIGTERM after this many seconds.
SLURM_KILL_WAIT_S = 30.0


def _labels(_: click.Context, __: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not key=value")
        out[key] = value
    return out


def batch_limit_option(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
                       ) -> dict[str, str]:
    """`--batch-limit KEY=VALUE` (repeatable) as KEY -> VALUE, each checked
    (`batch/limits.py batch_limits`: a BatchLimits cap, a whole number or a size above 0)."""
    from llmfabric.batch.limits import batch_limits

    out = _labels(ctx, param, values)
    try:
        batch_limits(out)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    return out


def _aliases(_: click.Context, __: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        alias, sep, model = item.partition("=")
        if not sep or not alias.strip() or not model.strip():
            raise click.BadParameter(f"{item!r} is not ALIAS=MODEL (e.g. llama=meta-llama/"
                                     "Llama-3.1-8B-Instruct)")
        out[alias.strip()] = model.strip()
    return out


def _dial_addr(example: str, in_url: bool = False
               ) -> Callable[[click.Context, click.Parameter, str | None], str | None]:
    """Check an address published for others to dial (node/config.py parse_dial_addr) when
    it is given, naming the flag; config files get the same check with the setting's name."""

    def check(_: click.Context, __: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_dial_addr(value, example=example, in_url=in_url)
            except ConfigError as exc:
                raise click.BadParameter(str(exc)) from None
        return value

    return check


# Per-phase forwarding timeouts of one attempt (llmfabric.ingress.Timeouts): ONE definition
# for `start --ingress` and `ingress`; defaults come from NodeConfig.
_TIMEOUTS = (
    ("--connect-timeout", "connect_timeout_s", "TCP connect to a node"),
    ("--first-byte-timeout", "first_byte_timeout_s",
     "request sent -> response head (and a stream's first chunk)"),
    ("--idle-timeout", "idle_timeout_s", "gap between two chunks of a stream"),
    ("--total-timeout", "total_timeout_s", "one whole attempt"),
)


def ingress_timeout_options(*, with_defaults: bool) -> Callable[[F], F]:
    """Add the four timeout options; `with_defaults=False` leaves unset ones to the config
    file/NodeConfig (values: seconds > 0)."""

    def decorate(fn: F) -> F:
        for flag, dest, what in reversed(_TIMEOUTS):
            default = NodeConfig.model_fields[dest].default
            fn = click.option(
                flag, dest, type=click.FloatRange(min=0, min_open=True),
                default=default if with_defaults else None,
                help=f"ingress: seconds for {what} [{default:g}]",
            )(fn)
        return fn

    return decorate


# Shared by `start` and `ingress` (its fabric mode): one definition each.
home_option = click.option(
    "--home", type=click.Path(file_okay=False, path_type=pathlib.Path),
    envvar="LLMFABRIC_HOME", help="state dir (keys, logs, db) [~/.llmfabric]")
network_secret_file_option = click.option(
    "--network-secret-file", type=click.Path(dir_okay=False, path_type=pathlib.Path),
    envvar="LLMFABRIC_NETWORK_SECRET_FILE",
    help="read the network secret from this file (mode 0600; line 2: the previous secret "
         "during a rotation); re-read on SIGHUP")


def node_options(fn: Any) -> Any:
    """Options shared by `start` and `ingress` (a node with the ingress role)."""
    options = [
        click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False,
                     path_type=pathlib.Path), help="YAML file with any of these options"),
        home_option,
        click.option("--bootstrap", multiple=True, envvar="LLMFABRIC_BOOTSTRAP",
                     help="host:port of a bootstrap peer (repeatable; env: comma-separated)"),
        click.option("--listen", envvar="LLMFABRIC_LISTEN",
                     help="peer (TLS) listener host:port [0.0.0.0:7946]"),
        click.option("--http-listen", envvar="LLMFABRIC_HTTP_LISTEN",
                     help="HTTP API host:port [127.0.0.1:8090]"),
        click.option("--public-addr", envvar="LLMFABRIC_PUBLIC_ADDR",
                     callback=_dial_addr(DIAL_EXAMPLE),
                     help="host:port other nodes should dial (behind port forwarding)"),
        click.option("--allowed-host", "allowed_hosts", multiple=True,
                     envvar="LLMFABRIC_ALLOWED_HOSTS", metavar="NAME",
                     help="a host name the HTTP listeners answer (repeatable; env: "
                          "comma-separated); IP addresses, localhost, the machine's name and "
                          "the names in --public-addr, --public-http-addr and the listeners "
                          "are always answered, others get 421 (DNS rebinding). '*': any "
                          "name, e.g. behind a proxy that rewrites Host; an ingress with "
                          "API keys answers its OpenAI routes under any name "
                          "(docs/ingress.md 'Allowed hosts')"),
        click.option("--public-http-addr", envvar="LLMFABRIC_PUBLIC_HTTP_ADDR",
                     callback=_dial_addr(HTTP_DIAL_EXAMPLE, in_url=True),
                     help="host:port (no scheme; IPv6 as [addr]:port) ingresses use for the "
                          "direct HTTP path to this node [derived from the HTTP listener and "
                          "the peer address]"),
        click.option("--min-relays", type=click.IntRange(min=1),
                     help="relays a node that cannot be dialled keeps registered [1]"),
        click.option("--relay", is_flag=True, default=None,
                     help="relay for nodes that cannot be dialled"),
        click.option("--provider", envvar="LLMFABRIC_PROVIDER",
                     help="provider id shown to consumers [the node's peer id]"),
        click.option("--label", "labels", multiple=True, callback=_labels,
                     help="k=v site/cluster label (repeatable)"),
        click.option("--tier", type=click.Choice(["stable", "transient"]), default=None,
                     help="advertised in the record: stable (long-lived, e.g. an ingress) or "
                     "transient (e.g. a Slurm job) [transient]"),
        click.option("--preset", type=click.Choice(["lan", "wan", "local"]), default=None,
                     envvar="LLMFABRIC_PRESET", help="gossip/SWIM timing preset [lan]"),
        click.option("--network", envvar="LLMFABRIC_NETWORK", help="network name [default]"),
        click.option("--network-secret", envvar="LLMFABRIC_NETWORK_SECRET",
                     help="pre-shared network secret (admission); on a shared host "
                          "other users can read it from the command line: prefer "
                          "$LLMFABRIC_NETWORK_SECRET or --network-secret-file"),
        network_secret_file_option,
        click.option("--network-secret-previous",
                     envvar="LLMFABRIC_NETWORK_SECRET_PREVIOUS",
                     help="rotation: the previous network secret, still accepted"),
        click.option("--tls-cert", type=click.Path(dir_okay=False, path_type=pathlib.Path),
                     help="serve the HTTP listeners (API, dashboard, --api-listen) over TLS "
                          "with this PEM certificate (reloaded on SIGHUP)"),
        click.option("--tls-key", type=click.Path(dir_okay=False, path_type=pathlib.Path),
                     help="the PEM private key for --tls-cert"),
        click.option("--allow-engine-public-bind", is_flag=True, default=None,
                     help="let the engine command bind a non-loopback address"),
        click.option("--front-limit", "front_limits", multiple=True, callback=_labels,
                     metavar="KEY=VALUE",
                     help="a limit of the lean front (HTTP port and --api-listen; "
                          "repeatable), e.g. "
                          "header_timeout_s=10, max_connections_per_client=64 "
                          "(docs/ingress.md 'Front limits')"),
        click.option("--dataplane-port", type=click.IntRange(0, 65535),
                     help="port of the data-plane HTTPS listener (direct path) [any free]"),
        click.option("--membership-cert", type=click.Path(exists=True, dir_okay=False,
                     path_type=pathlib.Path), envvar="LLMFABRIC_MEMBERSHIP_CERT",
                     help="operator-signed membership certificate (admission)"),
        click.option("--operator-key", envvar="LLMFABRIC_OPERATOR_KEY",
                     help="operator public key (base64) that signs membership certificates"),
        click.option("--revocation-list", type=click.Path(dir_okay=False,
                     path_type=pathlib.Path), envvar="LLMFABRIC_REVOCATION_LIST",
                     help="the operator-signed revocation list (`llmfabric keys "
                          "revoke-node`), with --membership-cert: revoked members are "
                          "refused and disconnected; re-read when the file changes. The "
                          "fabric passes the newest list on to every node, so one node "
                          "with the file is enough"),
        click.option("--ingress", is_flag=True, default=None,
                     help="serve the OpenAI API (lean front), accounts and dashboard "
                          "(aiohttp) on the HTTP port"),
        click.option("--policy", help="ingress load-balancing policy: "
                     f"{', '.join(POLICIES)} (docs/routing.md) [random]"),
        click.option("--api-listen", envvar="LLMFABRIC_API_LISTEN",
                     help="ingress: also serve the OpenAI API on this host:port (the lean "
                          "HTTP/1.1 front, OpenAI routes only)"),
        click.option("--max-retries", type=click.IntRange(min=0),
                     help="ingress retries on other nodes [2]"),
        click.option("--db", envvar="LLMFABRIC_DB", help="accounts database path or URL "
                     "[<home>/accounts.db]"),
        click.option("--record-trace", type=click.Path(dir_okay=False, path_type=pathlib.Path),
                     help="ingress: append an anonymized trace (JSONL) of served requests"),
        click.option("--demand-interval", "demand_interval_s", type=float,
                     help="ingress: seconds between updates of the observed per-model demand "
                          "published for the fleet controller [15]"),
        click.option("--max-inflight", "max_inflight", type=click.IntRange(min=1),
                     help="ingress: requests in flight at most; more wait in per-owner fair "
                          "queues (429 + Retry-After past fair_queue_max_wait_s) [no limit]"),
        click.option("--batch-dir", "batch_dir", type=click.Path(
                         file_okay=False, path_type=pathlib.Path),
                     help="ingress: serve OpenAI's Batch API (/v1/files, /v1/batches; off by "
                          "default), keeping files and batches in this directory "
                          "(docs/batch.md)"),
        click.option("--batch-concurrency", "batch_concurrency",
                     type=click.IntRange(min=1),
                     help="ingress with --batch-dir: batch lines in flight at once [4]"),
        click.option("--batch-limit", "batch_limits", multiple=True,
                     callback=batch_limit_option, metavar="KEY=VALUE",
                     help="ingress with --batch-dir: a cap of the Batch API (repeatable), "
                          "e.g. max_bytes_per_owner=200MiB, max_active_batches_per_owner=2; "
                          "the keys: max_file_bytes, max_lines, max_files_per_owner, "
                          "max_bytes_per_owner, max_active_batches_per_owner, "
                          "max_output_bytes, max_output_files_per_owner (docs/batch.md "
                          "'Ownership and limits')"),
        click.option("--batch-retention", "batch_retention_s", metavar="DURATION",
                     callback=retention_option,
                     help="ingress with --batch-dir: delete files, and batches that ended, "
                          "this long after (12h, 30d, 2w) [keep them until deleted or their "
                          "own expires_after]"),
        click.option("--link-probe-interval", "link_probe_interval_s",
                     type=click.FloatRange(min=0),
                     help="seconds between rounds of link probes (RTT, throughput) to a few "
                          "peers, read by `plan net --from-fabric`; 0 = off [60]"),
        click.option("--no-auth", "no_auth", is_flag=True, default=None,
                     help="ingress without API keys (local demo only)"),
        click.option("--public-fleet-info", "public_fleet_info", is_flag=True, default=None,
                     help="ingress: serve the fleet views (/v1/fabric/nodes, models, providers, "
                          "...) without an API key [they need one]"),
        click.option("--accept-assignments", is_flag=True, default=None,
                     help="let the fleet controller start an engine on this bare node"),
        click.option("--key-issuer", "key_issuers", multiple=True,
                     help="ingress: also accept the API keys this ingress publishes in the "
                          "registry, and count its budget spending (its peer id, or its "
                          "certificate's provider; repeatable)"),
        click.option("--model-alias", "model_aliases", multiple=True, callback=_aliases,
                     metavar="NAME=ID",
                     help="ingress: requests for NAME go to replicas of model ID only, "
                          "whatever aliases members list (repeatable; an alias several "
                          "models list is otherwise refused with 409)"),
        click.option("--controller", "controllers", multiple=True,
                     help="peer id allowed to send assignments, releases and role flips "
                          "(repeatable; default: any member); on an ingress also the PD "
                          "controller whose routing plans it follows (default: none)"),
        click.option("--engine-url", help="engine base URL [parsed from the command]"),
        click.option("--engine", "engine_kind", metavar="KIND",
                     help="engine kind: vllm, sglang, llama.cpp, llama-cpp-python, tgi, torch, "
                          "sim, openai (any OpenAI-compatible server) [detected from the "
                          "command]"),
        click.option("--kv-events-config", "kv_events_config", metavar="JSON",
                     help="where the engine publishes KV-cache events (vLLM's flag, e.g. "
                          "'{\"enable_kv_cache_events\": true, \"endpoint\": "
                          "\"tcp://127.0.0.1:5557\"}'): the gossiped prefix sketch then "
                          "follows what the engine holds [read from the engine command]"),
        click.option("--model-id", "model_ids", multiple=True,
                     help="a model id the engine serves but does not list on /v1/models "
                          "(repeatable)"),
        click.option("--on-engine-exit", "on_engine_exit",
                     type=click.Choice(["restart", "leave"]),
                     help="when the engine's main process exits: restart it (with backoff, "
                          "up to --engine-restarts times, then leave) or leave at once "
                          "[restart]"),
        click.option("--engine-restarts", "engine_restarts", type=click.IntRange(min=0),
                     help="engine restarts before the node leaves [3]"),
        click.option("--alias", "aliases", multiple=True, callback=_aliases,
                     metavar="ALIAS=MODEL",
                     help="also serve the engine's MODEL under ALIAS (repeatable)"),
        click.option("--ready-timeout", "ready_timeout_s", type=float,
                     help="seconds to wait for the engine to load [900]"),
        click.option("--health-interval", "health_interval_s",
                     type=click.FloatRange(min=0, min_open=True),
                     help="seconds between engine health checks [2]"),
        click.option("--health-failures", "health_failures", type=click.IntRange(min=1),
                     help="consecutive failed health checks that mark the node DOWN [3]"),
        click.option("--drain-timeout", "drain_timeout_s", type=click.FloatRange(min=0),
                     help="SIGTERM: seconds to drain in-flight requests before LEFT [20]"),
        click.option("--engine-stop-timeout", "engine_stop_timeout_s",
                     type=click.FloatRange(min=0),
                     help="SIGTERM: seconds the engine gets to exit before SIGKILL [5]"),
        click.option("--alloc-end", "alloc_end", type=click.FloatRange(min=0, min_open=True),
                     help="Unix time this node's allocation ends [in a Slurm job: the job's "
                          "end; else none]"),
        click.option("--drain-lead", "drain_lead_s", type=click.FloatRange(min=0),
                     help="seconds before the allocation end to drain and leave [120]"),
        click.option("--gpu", help="override the GPU model (or 'cpu')"),
        click.option("--gpu-count", type=int, help="override the number of GPUs"),
        click.option("--gpu-memory", "gpu_memory_gb", type=float, help="GiB per GPU"),
        click.option("-v", "--verbose", count=True, help="more logging: -v info, -vv debug"),
    ]
    fn = ingress_timeout_options(with_defaults=False)(fn)  # (listed after the others)
    for option in reversed(options):
        fn = option(fn)
    return fn


def retention_option(ctx: click.Context, param: click.Parameter, value: str | None
                     ) -> float | None:
    """`--batch-retention DURATION` in seconds (None: not given)."""
    if value is None:
        return None
    from llmfabric.batch.retention import parse_retention

    try:
        return float(parse_retention(value))
    except ValueError as e:
        raise click.BadParameter(str(e)) from e


def config_from_options(
    options: dict[str, Any], process: tuple[str, ...] = (), **fixed: Any
) -> NodeConfig:
    opts = dict(options)
    opts.pop("verbose", None)
    config_file = opts.pop("config_file", None)
    file_values = load_config_file(config_file) if config_file else {}
    if not opts.get("bootstrap"):
        opts.pop("bootstrap", None)
    for name in ("labels", "controllers", "aliases", "model_aliases", "front_limits",
                 "batch_limits", "model_ids", "key_issuers", "allowed_hosts"):
        if not opts.get(name):
            opts.pop(name, None)
    no_auth = opts.pop("no_auth", None)
    if no_auth:
        opts["auth"] = False
    if process:
        opts["process"] = process
    opts.update(fixed)
    return build_config(file_values, opts)


def setup_logging(verbose: int) -> None:
    level = logging.WARNING - 10 * min(verbose, 2)
    configure_logging(level, "%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The engine's start (a model load of minutes) is reported without -v: starting,
    # still waiting after N s, ready after N s with its models (agent/supervisor.py).
    get_logger("llmfabric.agent.supervisor").setLevel(min(level, logging.INFO))


def warn_config(config: NodeConfig) -> None:
    """Loud warnings for settings that are legal but risky."""
    if config.ingress and not config.auth:
        bar = "!" * 78
        click.echo(f"{bar}\n!! WARNING: API keys are OFF (--no-auth). Anyone who can reach "
                   f"{config.http_listen}\n!! can use every engine of this fabric. Local demo "
                   f"only.\n{bar}", err=True)
        get_logger("llmfabric.node").warning("authentication is switched off")
    stop = config.drain_timeout_s + config.engine_stop_timeout_s
    if config.process and stop > SLURM_KILL_WAIT_S - 2:
        click.echo(f"warning: drain ({config.drain_timeout_s:g} s) + engine stop "
                   f"({config.engine_stop_timeout_s:g} s) may exceed Slurm's default KillWait "
                   f"({SLURM_KILL_WAIT_S:g} s): SIGKILL could cut the node off before it "
                   "announces LEFT; lower them or raise KillWait", err=True)


def run_node(config: NodeConfig, *, banner: bool = True) -> int:
    """Run a node until SIGTERM/SIGINT (graceful: drain, LEFT) or a fail-stop."""
    from llmfabric.node.daemon import EXIT_REVOKED, Node, NodeError, NodeRevoked

    class _Revoked(click.ClickException):
        exit_code = EXIT_REVOKED  # (docs/node.md: the node's own key or certificate)

    warn_config(config)
    raise_open_file_limit()

    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()

    async def main() -> int:
        try:
            node = Node(config)
        except NodeRevoked as exc:
            raise _Revoked(str(exc)) from exc
        except (NodeError, ConfigError) as exc:
            raise click.ClickException(str(exc)) from exc
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(node.stop()))
        loop.add_signal_handler(signal.SIGHUP, node.reload)  # TLS certificate, secret file
        try:
            await node.start()
        except Exception:
            await node.stop(drain=False)
            raise
        if banner:
            _print_banner(node)
        return await node.wait_stopped()

    return asyncio.run(main())


def _print_banner(node: Any) -> None:
    cfg = node.config
    click.echo(f"llmfabric node {node.session_id} (peer {node.key.peer_id})", err=True)
    click.echo(f"  peer listener: {node.transport.listen_addr or 'none (outbound only)'}",
               err=True)
    click.echo(f"  http:          http://{node.http_addr}", err=True)
    if cfg.ingress:
        click.echo(f"  OpenAI API:    http://{node.http_addr}/v1", err=True)
        if node.ingress is not None and node.ingress.api_addr:
            click.echo(f"  fast API:      http://{node.ingress.api_addr}/v1", err=True)
        click.echo(f"  dashboard:     http://{node.http_addr}/ui/", err=True)
        if cfg.auth:
            click.echo(f"  admin key in:  {cfg.admin_key_file or cfg.home / 'admin.key'}",
                       err=True)
    sys.stderr.flush()


@click.command(
    "start",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@node_options
@click.option("--process", "process_flag", is_flag=True,
              help="everything after it is the engine command to supervise")
@click.argument("process", nargs=-1, type=click.UNPROCESSED)
def command(process_flag: bool, process: tuple[str, ...], **options: Any) -> None:
    """Start a node: it joins the fabric, advertises its hardware and, with --process, serves
    the models of the engine command that follows (e.g. `--process vllm serve M`)."""
    if process and not process_flag:
        raise click.UsageError(f"unexpected arguments {' '.join(process)!r}; put the engine "
                               "command after --process")
    if process_flag and not process:
        raise click.UsageError("--process needs the engine command after it")
    setup_logging(options.get("verbose") or 0)
    try:
        config = config_from_options(options, process)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    check_engine_command(config)
    sys.exit(run_node(config))


def check_engine_command(config: NodeConfig) -> None:
    """The engine command's kind and port, read before anything starts: a command whose port
    cannot be told (or an unknown --engine KIND) raised a traceback once the node had joined."""
    from llmfabric.agent.command import parse_engine_command
    from llmfabric.agent.errors import EngineCommandError

    if not config.process:
        return
    try:
        parse_engine_command(config.process, config.engine_url, config.engine_kind)
    except EngineCommandError as exc:
        raise click.ClickException(str(exc)) from None
