"""`llmfabric ingress`: a standalone OpenAI-compatible ingress in front of static backends.

A node started with `--ingress` mounts the same routes over its live registry replica (the node
wires `llmfabric.ingress.add_ingress_routes`); this command serves a fixed list of backends,
which is also what the ingress benchmark measures. Each backend's context is the one its
engine reports (ingress/sources.py `EngineContexts`), or the one `--max-context
MODEL=TOKENS` states.
`--workers N` runs N processes sharing the port through SO_REUSEPORT (Linux), each with its
own event loop (uvloop when installed).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import pathlib
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from llmfabric.cli.start import (
    _aliases,
    batch_limit_option,
    home_option,
    ingress_timeout_options,
    network_secret_file_option,
    retention_option,
)
from llmfabric.ingress.config import IngressConfig, Timeouts
from llmfabric.ingress.errors import ConfigError
from llmfabric.net.fd_limit import raise_open_file_limit
from llmfabric.net.httpaddr import is_loopback
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.policies import POLICIES

if TYPE_CHECKING:
    from aiohttp import web

    from llmfabric.accounts.store import AccountStore
    from llmfabric.batch import BatchService
    from llmfabric.front.host_check import HostGuard
    from llmfabric.ingress import Ingress


@dataclass(frozen=True, slots=True)
class Backend:
    model: str
    addr: str  # host:port
    provider: str
    gpu: str


@dataclass(frozen=True, slots=True)
class Settings:
    host: str
    port: int
    backends: tuple[Backend, ...]
    policy: str
    max_retries: int
    max_body_bytes: int
    auth: bool
    db_url: str | None
    forward_prefix: str
    timeouts: Timeouts
    front_limits: tuple[tuple[str, str], ...] = ()  # FrontLimits overrides (--front-limit)
    tls_cert: pathlib.Path | None = None  # HTTPS when both are set (reloaded on SIGHUP)
    tls_key: pathlib.Path | None = None
    native_responses: tuple[str, ...] = ()  # models whose engines serve /v1/responses
    model_aliases: tuple[tuple[str, str], ...] = ()  # --model-alias NAME=ID
    allowed_hosts: tuple[str, ...] = ()  # Host names answered besides IPs, localhost, --host
    max_contexts: tuple[tuple[str, int], ...] = ()  # --max-context MODEL=TOKENS
    batch_dir: pathlib.Path | None = None  # the Batch API's files and batches (None: off)
    batch_concurrency: int = 4  # batch lines in flight at once
    batch_limits: tuple[tuple[str, str], ...] = ()  # BatchLimits caps (--batch-limit)
    batch_max_file_bytes: int | None = None  # --batch-max-file-mb (None: the default cap)
    batch_retention_s: float | None = None  # ended batches and files deleted after (None: kept)


def parse_backend(spec: str) -> Backend:
    """MODEL=HOST:PORT[@PROVIDER][#GPU], e.g. llama=127.0.0.1:8000@uni-a#H100."""
    model, sep, rest = spec.partition("=")
    if not sep or not model or not rest:
        raise ConfigError(f"--backend {spec!r}: expected MODEL=HOST:PORT[@PROVIDER][#GPU]")
    rest, _, gpu = rest.partition("#")
    addr, _, provider = rest.partition("@")
    addr = addr.removeprefix("http://").rstrip("/")
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--backend {spec!r}: {addr!r} is not HOST:PORT")
    return Backend(model, addr, provider or "local", gpu or "unknown")


def parse_max_contexts(specs: tuple[str, ...], models: set[str]) -> dict[str, int]:
    """--max-context MODEL=TOKENS, each MODEL a --backend's model, named once; TOKENS a
    whole number > 0 (digits only: "32k" or "1e5" is refused rather than guessed at)."""
    out: dict[str, int] = {}
    for spec in specs:
        model, sep, tokens = spec.partition("=")
        model, tokens = model.strip(), tokens.strip()
        if not sep or not model or not tokens:
            raise ConfigError(f"--max-context {spec!r}: expected MODEL=TOKENS, e.g. "
                              "llama=32768")
        if not (tokens.isascii() and tokens.isdigit()) or int(tokens) == 0:
            raise ConfigError(f"--max-context {spec!r}: {tokens!r} is not a whole number of "
                              "tokens above 0")
        if model not in models:
            raise ConfigError(f"--max-context {spec!r}: no --backend serves {model!r} "
                              f"(they serve {', '.join(sorted(models))})")
        if model in out:
            raise ConfigError(f"--max-context {spec!r}: {model!r} is given twice")
        out[model] = int(tokens)
    return out


def candidates(backends: tuple[Backend, ...]) -> list[Candidate]:
    return [
        Candidate(
            session_id=f"static-{i}-{b.addr}", peer_id="", provider_id=b.provider,
            http_addr=b.addr, relays=(), hardware=Hardware(gpu_model=b.gpu, gpu_count=1),
            model=ServedModel(b.model), load=LoadHints(),
        )
        for i, b in enumerate(backends)
    ]


async def run_ingress(settings: Settings, reuse_port: bool, announce: bool = True) -> None:
    """Serve until SIGTERM/SIGINT. `announce`: log the backends whose engines do not report
    their context (one worker says it for all)."""
    from llmfabric.agent.probe import HttpProbe
    from llmfabric.apis.openapi import OPENAPI_BODY
    from llmfabric.forward import HttpForwarder
    from llmfabric.front.fast_front import FastFront
    from llmfabric.front.front_limits import front_limits
    from llmfabric.front.host_check import HostGuard, names_of
    from llmfabric.ingress import Ingress, StaticCandidateSource
    from llmfabric.ingress.sources import EngineContexts
    from llmfabric.tenancy.attach import attach_tenancy

    store = None
    auth = None
    if settings.auth:
        from llmfabric.accounts.bootstrap import default_db_url
        from llmfabric.accounts.ratelimit import RateLimiter
        from llmfabric.accounts.store import AccountStore
        from llmfabric.clock import SystemClock
        from llmfabric.tenancy.accounts_auth import AccountsAuth

        store = await AccountStore.open(settings.db_url or default_db_url())
        auth = AccountsAuth(store, RateLimiter(SystemClock()))
    config = IngressConfig(
        policy=settings.policy, max_retries=settings.max_retries,
        max_body_bytes=settings.max_body_bytes, auth_enabled=settings.auth,
        timeouts=settings.timeouts, native_responses_models=settings.native_responses,
        model_aliases=settings.model_aliases,
    )
    source = StaticCandidateSource(candidates(settings.backends))
    probe = HttpProbe()
    contexts = EngineContexts(source, probe, settings.forward_prefix,
                              stated=dict(settings.max_contexts))
    forwarder = HttpForwarder(settings.forward_prefix)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tls = None
    if settings.tls_cert is not None and settings.tls_key is not None:
        from llmfabric.net.server_tls import ServerTls

        tls = ServerTls(settings.tls_cert, settings.tls_key)
        loop.add_signal_handler(signal.SIGHUP, tls.reload)
    ingress = Ingress(config, source, forwarder, auth=auth, usage_sink=auth)
    tenancy = await attach_tenancy(ingress, store, env=os.environ)  # budgets, OTLP
    hosts = HostGuard([*settings.allowed_hosts, *names_of([f"{settings.host}:0"])])
    batch, batch_app = await _batch_service(settings, ingress, store, hosts)
    front = FastFront(ingress, limits=front_limits(dict(settings.front_limits)), hosts=hosts,
                      fallback=batch_app.server if batch_app is not None else None,
                      openapi_body=batch.openapi_body if batch is not None else OPENAPI_BODY)
    try:
        if batch is not None:
            batch.start()
        await contexts.ask(announce=announce)  # (before the port opens: GET /v1/models is
        contexts.start()                       # right from the first request)
        await front.start(settings.host, settings.port, reuse_port=reuse_port,
                          ssl=tls.context if tls else None)
        await stop.wait()
    finally:
        await contexts.aclose()
        await probe.aclose()
        await front.aclose()
        if batch is not None and batch_app is not None:
            await batch.aclose()
            await batch_app.cleanup()
        await tenancy.aclose()
        await forwarder.aclose()
        if store is not None:
            await store.aclose()


async def _batch_service(settings: Settings, ingress: Ingress, store: AccountStore | None,
                         hosts: HostGuard) -> tuple[BatchService | None, web.AppRunner | None]:
    """The Batch API (--batch-dir) and the aiohttp app the lean front hands its paths to
    (the batch routes, and the OpenAI routes for later requests on such a connection)."""
    if settings.batch_dir is None:
        return None, None
    from aiohttp import web

    from llmfabric.batch import BatchService
    from llmfabric.batch.limits import limits_of

    service = BatchService(ingress, settings.batch_dir, limits=limits_of(settings),
        principals=store.active_key if store is not None else None,
        retention_s=settings.batch_retention_s)
    runner = web.AppRunner(service.app(hosts), access_log=None, handle_signals=False)
    await runner.setup()
    return service, runner


def _run(settings: Settings, reuse_port: bool, announce: bool = True) -> None:
    raise_open_file_limit()  # (each worker process: limits are per process)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(run_ingress(settings, reuse_port, announce))


def _refuse_fabric_flags(ctx: click.Context) -> None:
    """A --backend ingress with fabric flags on its command line: it ran standalone and
    ignored them, so `--backend ... --bootstrap peer:7946` looked like a join. (Their
    environment variables, set for other commands, stay ignored.)"""
    given = [f"--{name.replace('_', '-')}" for name in
             ("bootstrap", "network_secret", "network_secret_file", "listen")
             if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE]
    if given:
        raise click.UsageError(
            f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} for a fabric "
            "ingress, which routes over the fabric's nodes: drop --backend to run one, or "
            f"drop {' and '.join(given)} for a standalone ingress over its --backend engines")


def _batch_flags(ctx: click.Context, batch_dir: pathlib.Path | None) -> set[str]:
    """The batch flags given (not defaults). They go with --batch-dir (they were ignored
    without it), and --batch-max-file-mb with no `--batch-limit max_file_bytes`."""
    from llmfabric.batch.limits import batch_flags_refusal

    given = {f"--{name.replace('_', '-')}" for name in
             ("batch_concurrency", "batch_max_file_mb", "batch_retention")
             if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)}
    if ctx.params.get("batch_limits"):
        given.add("--batch-limit")
    twice = "--batch-max-file-mb" in given and "max_file_bytes" in ctx.params["batch_limits"]
    if (why := batch_flags_refusal(sorted(given), batch_dir is not None,
                                   "--batch-max-file-mb" if twice else None)) is not None:
        raise click.UsageError(why)
    return given


@click.command("ingress")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address the HTTP listener (the OpenAI API) binds (with --no-auth: a "
              "loopback one only)")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True,
              help="port of the HTTP listener (the OpenAI API)")
@click.option("--backend", "backends", multiple=True,
              help="MODEL=HOST:PORT[@PROVIDER][#GPU] of an OpenAI-compatible engine (repeat); "
              "its context is the one the engine reports (asked at start and every minute), "
              "else 4096, unless --max-context states it")
@click.option("--max-context", "max_contexts", multiple=True, metavar="MODEL=TOKENS",
              help="--backend: the context (tokens) of MODEL's backends, advertised whatever "
              "their engines report (repeatable; a warning when an engine reports another): "
              "for engines that report none (llama-cpp-python, proxies). Budgets reserve it "
              "for a request without max_tokens; min_context filters on it")
@click.option("--bootstrap", multiple=True, envvar="LLMFABRIC_BOOTSTRAP",
              help="fabric mode: join through this peer (no --backend; routes over the registry)")
@click.option("--network-secret", envvar="LLMFABRIC_NETWORK_SECRET",
              help="fabric mode: the network's pre-shared secret (other users can read a "
              "command line: prefer $LLMFABRIC_NETWORK_SECRET or --network-secret-file)")
@network_secret_file_option
@home_option
@click.option("--listen", default="0.0.0.0:7946", show_default=True,
              help="fabric mode: peer (TLS) listener")
@click.option("--policy", type=click.Choice(sorted(POLICIES)), default="random",
              show_default=True, help="load-balancing policy: which backend or node of the "
              "model gets a request (docs/routing.md)")
@click.option("--max-retries", type=click.IntRange(min=0), default=2, show_default=True,
              help="other backends or nodes a failed request is retried on")
@click.option("--max-body-mb", type=click.FloatRange(min=0, min_open=True), default=8.0,
              show_default=True, help="the largest request body, MB (larger ones get 400 "
              "request_too_large)")
@click.option("--no-auth", is_flag=True, help="accept requests without API keys (demo only)")
@click.option("--db", "db_url", default=None, envvar="LLMFABRIC_DB",
              help="accounts database path or URL [env LLMFABRIC_DB; default "
              "<--home>/accounts.db]")
@click.option("--forward-prefix", default="", help="--backend: path prefix on backends "
              "(llmfabric nodes take forwarded requests only on their encrypted data plane: "
              "to route to nodes, run a fabric ingress with --network-secret instead)")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="--backend: processes sharing the port via SO_REUSEPORT")
@click.option("--front-limit", "front_limit", multiple=True, metavar="KEY=VALUE",
              help="a limit of the fast front (repeatable), e.g. header_timeout_s=10 "
              "(docs/ingress.md 'Front limits')")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False,
              path_type=pathlib.Path), help="serve HTTPS with this PEM certificate "
              "(reloaded on SIGHUP)")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False,
              path_type=pathlib.Path), help="the PEM private key for --tls-cert")
@click.option("--native-responses", "native_responses", multiple=True, metavar="MODEL",
              help="pass /v1/responses through unchanged for MODEL (repeat; '*' for all), "
              "for engines that serve it (vLLM >= 0.10); other models get it translated "
              "to chat completions")
@click.option("--model-alias", "model_aliases", multiple=True, callback=_aliases,
              metavar="NAME=ID", help="requests for NAME go to model ID only, whatever "
              "aliases members list (repeatable); an alias several models list is otherwise "
              "refused with 409 (docs/routing.md 'Model names')")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              envvar="LLMFABRIC_ALLOWED_HOSTS",
              help="a host name this ingress answers (repeatable); IP addresses, localhost, "
              "the machine's name and --host are always answered, others get 421 (DNS "
              "rebinding). With API keys the OpenAI routes answer any name. '*': any name, "
              "e.g. behind a proxy that rewrites Host (docs/ingress.md 'Allowed hosts')")
@click.option("--batch-dir", type=click.Path(file_okay=False, path_type=pathlib.Path),
              default=None, help="enable OpenAI's Batch API (/v1/files, /v1/batches; off "
              "by default): uploaded files, batches and their progress are kept in this "
              "directory (created if missing; one ingress process per directory). "
              "docs/batch.md")
@click.option("--batch-concurrency", type=click.IntRange(min=1), default=4,
              show_default=True, help="--batch-dir: batch lines in flight at once, all "
              "batches together")
@click.option("--batch-max-file-mb", type=click.FloatRange(min=0, min_open=True),
              default=100.0, show_default=True, help="--batch-dir: the largest batch input "
              "file (as --batch-limit max_file_bytes=SIZE)")
@click.option("--batch-limit", "batch_limits", multiple=True, callback=batch_limit_option,
              metavar="KEY=VALUE",
              help="--batch-dir: a cap of the Batch API (repeatable), e.g. "
              "max_bytes_per_owner=200MiB, max_active_batches_per_owner=2; the keys: "
              "max_file_bytes, max_lines, max_files_per_owner, max_bytes_per_owner, "
              "max_active_batches_per_owner, max_output_bytes, max_output_files_per_owner "
              "(docs/batch.md 'Ownership and limits')")
@click.option("--batch-retention", metavar="DURATION", default=None,
              callback=retention_option,
              help="--batch-dir: delete files, and batches that ended, this long after "
              "(12h, 30d, 2w) [default: keep them until deleted or their own expires_after]")
@ingress_timeout_options(with_defaults=True)
def command(
    host: str, port: int, backends: tuple[str, ...], bootstrap: tuple[str, ...],
    network_secret: str | None, network_secret_file: pathlib.Path | None,
    home: pathlib.Path | None, listen: str, policy: str, max_retries: int,
    max_body_mb: float, no_auth: bool, db_url: str | None, forward_prefix: str, workers: int,
    front_limit: tuple[str, ...], tls_cert: pathlib.Path | None,
    tls_key: pathlib.Path | None, native_responses: tuple[str, ...],
    model_aliases: dict[str, str], allowed_hosts: tuple[str, ...],
    max_contexts: tuple[str, ...], batch_dir: pathlib.Path | None, batch_concurrency: int,
    batch_max_file_mb: float, batch_limits: dict[str, str], batch_retention: float | None,
    connect_timeout_s: float,
    first_byte_timeout_s: float,
    idle_timeout_s: float, total_timeout_s: float,
) -> None:
    """Serve the OpenAI API (chat, completions, embeddings, models, responses; Anthropic's
    /v1/messages; rerank/score/tokenize pass-through; with --batch-dir the Batch API,
    /v1/files and /v1/batches): over static backends
    (--backend), or as a fabric ingress node (--network-secret or --network-secret-file
    [--bootstrap]): the same as
    `llmfabric start --ingress --relay --tier stable`, with the dashboard and API keys."""
    timeouts = Timeouts(connect_timeout_s, first_byte_timeout_s, idle_timeout_s,
                        total_timeout_s)
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    from llmfabric.front.front_limits import front_limits

    limits = tuple((k, v) for k, _, v in (item.partition("=") for item in front_limit))
    try:
        front_limits(dict(limits))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--front-limit") from exc
    from llmfabric.front.host_check import allowed_names

    try:
        allowed = allowed_names(allowed_hosts)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--allowed-host") from exc
    batch = _batch_flags(click.get_current_context(), batch_dir)
    max_file_bytes = (int(batch_max_file_mb * 1024 * 1024) if "--batch-max-file-mb" in batch
                      else None)
    if batch_dir is not None and workers > 1:
        raise click.UsageError("--batch-dir takes one worker: each worker's runner would run "
                               "the same batches (drop --workers, or run the batch ingress "
                               "on a port of its own)")
    if not backends:
        if native_responses:
            raise click.UsageError("--native-responses applies to --backend ingresses; a "
                                   "fabric ingress translates /v1/responses to chat")
        # (these were ignored in fabric mode without a word)
        if workers > 1:
            raise click.UsageError("--workers applies to --backend ingresses; a fabric "
                                   "ingress is one node process: start more ingress nodes")
        if forward_prefix:
            raise click.UsageError("--forward-prefix applies to --backend ingresses; a "
                                   "fabric ingress forwards over the nodes' data plane")
        if max_contexts:
            raise click.UsageError("--max-context applies to --backend ingresses; in a "
                                   "fabric each node advertises its engine's context")
        if not network_secret and network_secret_file is None:
            raise click.UsageError("give --backend MODEL=HOST:PORT (standalone) or "
                                   "--network-secret[-file] [--bootstrap HOST:PORT] (fabric "
                                   "ingress)")
        _run_fabric_ingress(host, port, bootstrap, network_secret, listen, policy, max_retries,
                            no_auth, db_url, max_body_mb, timeouts, tls_cert, tls_key,
                            model_aliases, allowed, dict(limits), network_secret_file, home,
                            batch_dir, batch_concurrency if "--batch-concurrency" in batch
                            else None, max_file_bytes, batch_retention, batch_limits)
        return
    _refuse_fabric_flags(click.get_current_context())
    if no_auth and not is_loopback(host):
        raise click.UsageError(
            f"--no-auth is for local demos only, but --host {host} is not a loopback address: "
            "use --host 127.0.0.1, or keep API keys on (`llmfabric keys create`)")
    if db_url is None and home is not None:  # (the node's default: <home>/accounts.db)
        db_url = str(home.expanduser() / "accounts.db")
    try:
        parsed = tuple(parse_backend(b) for b in backends)
    except ConfigError as e:
        raise click.BadParameter(str(e)) from e
    try:
        stated = parse_max_contexts(max_contexts, {b.model for b in parsed})
    except ConfigError as e:
        raise click.BadParameter(str(e), param_hint="--max-context") from e
    settings = Settings(
        host=host, port=port, backends=parsed, policy=policy, max_retries=max_retries,
        max_body_bytes=int(max_body_mb * 1024 * 1024), auth=not no_auth, db_url=db_url,
        forward_prefix=forward_prefix, timeouts=timeouts,
        tls_cert=tls_cert, tls_key=tls_key,
        front_limits=limits, native_responses=native_responses, allowed_hosts=allowed,
        model_aliases=tuple(sorted(model_aliases.items())),
        max_contexts=tuple(sorted(stated.items())),
        batch_dir=batch_dir, batch_concurrency=batch_concurrency,
        batch_limits=tuple(sorted(batch_limits.items())), batch_max_file_bytes=max_file_bytes,
        batch_retention_s=batch_retention,
    )
    if no_auth:
        click.echo("warning: authentication is OFF (--no-auth); use this for local demos only",
                   err=True)
    scheme = "https" if tls_cert is not None else "http"
    click.echo(f"llmfabric ingress on {scheme}://{host}:{port}/v1 ({workers} worker(s), "
               f"{len(parsed)} backend(s), policy {policy})", err=True)
    if workers == 1:
        _run(settings, reuse_port=False)
        return
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_run, args=(settings, True, False), daemon=True)
             for _ in range(workers - 1)]
    for p in procs:
        p.start()
    try:
        _run(settings, reuse_port=True)
    finally:
        for p in procs:
            if p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    p.terminate()
        for p in procs:
            p.join(timeout=10)


def _run_fabric_ingress(
    host: str, port: int, bootstrap: tuple[str, ...], network_secret: str | None, listen: str,
    policy: str, max_retries: int, no_auth: bool, db_url: str | None, max_body_mb: float,
    timeouts: Timeouts, tls_cert: pathlib.Path | None = None,
    tls_key: pathlib.Path | None = None, model_aliases: dict[str, str] | None = None,
    allowed_hosts: tuple[str, ...] = (), front_limits: dict[str, str] | None = None,
    network_secret_file: pathlib.Path | None = None, home: pathlib.Path | None = None,
    batch_dir: pathlib.Path | None = None, batch_concurrency: int | None = None,
    batch_max_file_bytes: int | None = None, batch_retention_s: float | None = None,
    batch_limits: dict[str, str] | None = None,
) -> None:
    from llmfabric.cli.start import run_node, setup_logging
    from llmfabric.node.config import ConfigError as NodeConfigError
    from llmfabric.node.config import build_config

    setup_logging(0)
    try:
        config = build_config({}, {
            "ingress": True, "relay": True, "tier": "stable", "http_listen": f"{host}:{port}",
            "listen": listen, "network_secret": network_secret,
            "network_secret_file": network_secret_file, "home": home, "policy": policy,
            "max_retries": max_retries, "auth": not no_auth, "db": db_url,
            "max_body_bytes": int(max_body_mb * 1024 * 1024),
            "bootstrap": bootstrap, "connect_timeout_s": timeouts.connect,
            "first_byte_timeout_s": timeouts.first_byte, "idle_timeout_s": timeouts.idle,
            "total_timeout_s": timeouts.total, "tls_cert": tls_cert, "tls_key": tls_key,
            "model_aliases": model_aliases or None,
            "allowed_hosts": allowed_hosts, "front_limits": front_limits or None,
            "batch_dir": batch_dir, "batch_concurrency": batch_concurrency,
            "batch_max_file_bytes": batch_max_file_bytes,
            "batch_retention_s": batch_retention_s, "batch_limits": batch_limits or None,
        })
    except NodeConfigError as e:
        raise click.ClickException(str(e)) from e
    raise SystemExit(run_node(config))
