"""`llmfabric controller`: the fleet controller loop.

    llmfabric controller --bootstrap host:7946 --network-secret S
    llmfabric controller --node http://127.0.0.1:8080 --workload w.yaml --once   # dry run
    llmfabric controller --bootstrap host:7946 --network-secret S --pd-plan plan.json \
        --pd-cluster cloud.yaml --pd-links bw.csv       # prefill/decode (controller_pd.py)

With `--bootstrap` (and a credential) the controller joins the fabric as a member, reads its own
replica, and sends each assignment to the node agent over the authenticated peer protocol; the
node (started with --accept-assignments) renders the engine command from its own template and
moves to SERVING. With only `--node URL` it polls that node's read-only /v1/fabric/nodes and
logs the decisions it would take.

The workload is, by default, what the fabric's ingress nodes observe: each publishes its recent
per-model request rate and token lengths in its record (scheduler.observed); `--workload FILE`
plans for a fixed workload instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Collection, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from llmfabric.cli.status import UNREACHABLE, node_url
from llmfabric.cli.untrusted import configure_logging
from llmfabric.registry.records import (
    Hardware,
    Lifecycle,
    ModelDemand,
    NodeMeta,
    NodeRecord,
    ServedModel,
)


def record_from_view(view: dict[str, Any]) -> NodeRecord | None:
    """A NodeRecord from a /v1/fabric/nodes entry (None for suspected or malformed ones)."""
    try:
        if view.get("suspected"):
            return None
        hw = view.get("hardware") or {}
        meta = NodeMeta(
            provider_id=str(view.get("provider_id", "")),
            hardware=Hardware(str(hw.get("gpu_model", "cpu")), int(hw.get("gpu_count", 0)),
                              float(hw.get("gpu_memory_gb", 0.0)),
                              str(hw.get("interconnect", "none"))),
            engine=str(view.get("engine", "")),
            models=tuple(ServedModel(str(m["id"]), tuple(str(a) for a in m.get("aliases", [])))
                         for m in view.get("models", [])),
            roles=tuple(str(r) for r in view.get("roles", [])),
            demand=tuple(ModelDemand(str(d["model"]), float(d["rate"]), float(d["mean_in"]),
                                     float(d["mean_out"])) for d in view.get("demand", [])),
        )
        return NodeRecord(str(view["session_id"]), str(view.get("peer_id", "")), b"",
                          Lifecycle[str(view["state"])], int(view.get("incarnation", 0)),
                          int(view.get("version", 0)), float(view.get("updated_at", 0.0)), meta)
    except (KeyError, ValueError, TypeError):
        return None


def _capacity(rec: NodeRecord) -> bool:
    """Serving nodes, and bare nodes that accept assignments, are the controller's fleet."""
    return bool(rec.meta.engine) or "assignable" in rec.meta.roles


Trusted = Callable[[NodeRecord], bool]


def provider_filter(identity: Callable[[NodeRecord], str], providers: Collection[str]
                    ) -> Trusted | None:
    """`--provider`: the records whose verified provider identity (registry/provider.py
    `ProviderVerifier.identity`: the membership certificate's provider, or the key
    fingerprint, i.e. the peer id, on PSK networks) is one of `providers`, as routing
    allowlists match; None (every record) without any."""
    if not providers:
        return None
    allowed = frozenset(providers)
    return lambda rec: identity(rec) in allowed


def fleet_of(records: Iterable[NodeRecord], trusted: Trusted | None) -> list[NodeRecord]:
    """The records the controller counts and assigns: serving nodes and bare nodes that
    accept assignments, of the allowed providers (capacity is a record's claim)."""
    return [r for r in records if _capacity(r) and (trusted is None or trusted(r))]


def why_no_decision(fleet: list[NodeRecord], rates: Iterable[float],
                    reclaim: bool) -> str | None:
    """Why a round may decide nothing, for `--once` (an empty list alone says nothing):
    no node the controller may fill, or no demand. None when the plan just keeps the fleet."""
    from llmfabric.scheduler.controller import is_idle, is_reclaimable

    if not any(is_idle(r) or (reclaim and is_reclaimable(r)) for r in fleet):
        return ("no node to fill: none is bare and accepts assignments (`llmfabric start "
                "--accept-assignments`, no --process)" + ("" if reclaim else
                "; serving nodes are re-planned only with --reclaim"))
    if not any(rate > 0 for rate in rates):
        return ("no demand to plan for: the ingress nodes have observed no requests for "
                "models the simulator knows (send traffic, or give --workload FILE)")
    return None


async def _fetch(url: str) -> list[tuple[NodeRecord, str]]:
    """(record, verified provider) of each /v1/fabric/nodes entry (the node's verification)."""
    import aiohttp

    key = os.environ.get("LLMFABRIC_API_KEY")  # an ingress's fleet views need a key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    where = url.rstrip("/") + "/v1/fabric/nodes"
    try:
        return await _fetch_from(where, headers, key)
    except (aiohttp.ClientError, OSError) as exc:  # (was 'cannot read the registry: ...')
        raise click.ClickException(f"cannot reach {where}: {exc} ({UNREACHABLE})") from None


async def _fetch_from(where: str, headers: dict[str, str], key: str | None
                      ) -> list[tuple[NodeRecord, str]]:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(
            where, headers=headers) as resp:
        if resp.status == 401:  # (was a traceback: an ingress's fleet views need a key)
            what = "refused the API key" if key else "needs an API key"
            raise click.ClickException(
                f"{where} {what} (HTTP 401): set $LLMFABRIC_API_KEY to a key of that "
                "ingress (its admin key is in <its home>/admin.key), or start the ingress "
                "with --public-fleet-info")
        if resp.status != 200:
            raise click.ClickException(f"cannot read the registry: {where} answered HTTP "
                                       f"{resp.status} {resp.reason or ''}".rstrip())
        try:
            body = await resp.json(content_type=None)
        except ValueError as exc:
            raise click.ClickException(f"cannot read the registry: {where} answered no "
                                       f"JSON ({exc})") from None
    out = []
    for view in body.get("nodes", []):
        rec = record_from_view(view)
        if rec is not None:
            out.append((rec, str(view.get("verified_provider", ""))))
    return out


@click.command(name="controller")
@click.option("--node", "node_url", default=None, callback=node_url,
              help="dry run: HTTP address of any node, e.g. http://127.0.0.1:8080 (an "
                   "ingress's fleet views need one of its keys: $LLMFABRIC_API_KEY)")
@click.option("--bootstrap", multiple=True, envvar="LLMFABRIC_BOOTSTRAP",
              help="join the fabric through this peer and execute the decisions")
@click.option("--network-secret", envvar="LLMFABRIC_NETWORK_SECRET",
              help="with --bootstrap: the network's pre-shared secret (other users can read a "
              "command line: prefer $LLMFABRIC_NETWORK_SECRET or --network-secret-file)")
# (as `start`/`ingress` take it, checked the same way when the node is built:
# node/admission.py read_secret_file; the controller does not re-read it on SIGHUP)
@click.option("--network-secret-file", type=click.Path(dir_okay=False, path_type=Path),
              envvar="LLMFABRIC_NETWORK_SECRET_FILE",
              help="with --bootstrap: read the network secret from this file (yours, mode "
              "0600; line 2: the previous secret during a rotation), at start "
              "[env LLMFABRIC_NETWORK_SECRET_FILE]")
@click.option("--membership-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              envvar="LLMFABRIC_MEMBERSHIP_CERT",
              help="with --bootstrap: the controller node's membership certificate "
              "(`llmfabric keys sign-node`) [env LLMFABRIC_MEMBERSHIP_CERT]")
@click.option("--operator-key", envvar="LLMFABRIC_OPERATOR_KEY",
              help="with --membership-cert: the operator public key (base64) that signs "
              "certificates [env LLMFABRIC_OPERATOR_KEY]")
@click.option("--home", type=click.Path(file_okay=False, path_type=Path),
              envvar="LLMFABRIC_HOME", help="state dir of the controller's own node key")
@click.option("--listen", default="0.0.0.0:0", show_default=True,
              help="peer listener of the controller's node")
@click.option("--preset", type=click.Choice(["lan", "wan", "local"]), default="lan",
              show_default=True, help="gossip/SWIM timing preset, as the fabric's nodes use")
@click.option("--workload", "workload_path", default=None,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="plan for this workload YAML [default: the demand the ingress nodes observe]")
@click.option("--template", type=click.Choice(["sim", "vllm", "sglang"]), default="sim",
              show_default=True, help="the engine assigned nodes start: sim is SIMULATED "
              "(`llmfabric engine sim`: made-up text, for tests and demos); vllm or sglang "
              "for real models")
@click.option("--policy", type=click.Choice(["cpsat", "greedy", "memp"]), default="cpsat",
              show_default=True, help="placement policy (as `llmfabric plan --policy`)")
@click.option("--interval", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="seconds between placement rounds")
@click.option("--drift", type=click.FloatRange(min=0.0), default=0.25, show_default=True,
              help="relative arrival-rate change that triggers a new plan")
@click.option("--reclaim", is_flag=True, help="also re-plan nodes that are already serving "
              "(release and reassign those whose model the plan changes)")
@click.option("--max-releases", type=click.IntRange(min=1), default=1, show_default=True,
              help="--reclaim: serving nodes released a round; the rest of a plan follows "
              "in the next rounds, each re-planned")
@click.option("--reclaim-idle", type=click.FloatRange(min=0.0), default=60.0,
              show_default=True, help="--reclaim: seconds a bare node must stay bare before "
              "it counts as capacity (a node flapping between bare and busy moves nothing; "
              "--once: 0)")
@click.option("--reclaim-hold", type=click.FloatRange(min=0.0), default=600.0,
              show_default=True, help="--reclaim: seconds a node the controller moved "
              "(released or assigned) is not released again (demand that swings every round "
              "moves each node at most once per hold)")
@click.option("--provider", "providers", multiple=True, metavar="PROVIDER",
              help="count and assign only nodes, and read demand only from ingresses, whose "
              "verified provider is PROVIDER (repeatable): the provider their membership "
              "certificate names, or on PSK networks their peer id (key fingerprint), as "
              "X-Fabric-Providers matches; with --pd-plan (once) the provider whose nodes "
              "are bound, on certificate networks only [default: every member]")
@click.option("--once", is_flag=True, help="one round; print the decisions as JSON and exit")
@click.option("--settle", type=float, default=3.0, show_default=True,
              help="with --bootstrap: seconds to let the replica fill before planning "
                   "(longer, up to 30 s more, while it knows no other member)")
@click.option("--launcher", type=click.Choice(["assign", "slurm"]), default="assign",
              show_default=True, help="assign: fill idle nodes; slurm: submit and cancel "
              "Slurm jobs of --profile as demand moves (launch/capacity.py)")
@click.option("--profile", "profile_path", type=click.Path(exists=True, dir_okay=False,
              path_type=Path), help="--launcher slurm: the job profile (with `controller:`)")
@click.option("--pd-plan", "pd_plan", type=click.Path(exists=True, dir_okay=False,
              path_type=Path), help="run the prefill/decode controller for this saved plan "
              "(`llmfabric plan pd --json`): role flips and routing plans, no assignments")
@click.option("--pd-cluster", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="--pd-plan: the cluster YAML the plan was made for")
@click.option("--pd-links", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="--pd-plan: its GPU-pair bandwidth CSV")
@click.option("--pd-topology", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="--pd-plan: its topology YAML (instead of --pd-cluster/--pd-links)")
@click.option("--gpus-yaml", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="--pd-plan: the extra/overriding GPU specs the plan was made with (`plan "
              "pd --gpus-yaml`)")
@click.option("--pd-model", default=None,
              help="--pd-plan: the model id nodes serve [default: the plan's model]")
def command(node_url: str | None, bootstrap: tuple[str, ...], network_secret: str | None,
            network_secret_file: Path | None, membership_cert: Path | None,
            operator_key: str | None, home: Path | None,
            listen: str, preset: str, workload_path: Path | None, template: str, policy: str,
            interval: float, drift: float, reclaim: bool, max_releases: int,
            reclaim_idle: float, reclaim_hold: float, providers: tuple[str, ...], once: bool,
            settle: float,
            launcher: str, profile_path: Path | None, pd_plan: Path | None,
            pd_cluster: Path | None, pd_links: Path | None, pd_topology: Path | None,
            gpus_yaml: Path | None, pd_model: str | None) -> None:
    """Fill idle nodes with models (plan, then assign), or with --launcher slurm grow and
    shrink a fleet of Slurm jobs with the demand the ingress nodes observe, or with --pd-plan
    keep a prefill/decode plan current (role flips, routing plans; ThunderServe)."""
    if pd_plan is not None:
        from llmfabric.cli.controller_pd import run_pd_controller

        if not bootstrap:
            raise click.UsageError("--pd-plan needs --bootstrap (the controller joins the "
                                   "fabric)")
        if len(providers) > 1:
            raise click.UsageError("--pd-plan binds the nodes of one --provider")
        if pd_topology is None and (pd_cluster is None or pd_links is None):
            # (checked here: the loader's own message names plan pd's --cluster/--links)
            raise click.UsageError("--pd-plan needs the inputs the plan was made for: "
                                   "--pd-cluster with --pd-links, or --pd-topology")
        run_pd_controller(pd_plan, pd_cluster, pd_links, pd_topology, gpus_yaml, pd_model, {
            "bootstrap": bootstrap, "network_secret": network_secret,
            "network_secret_file": network_secret_file,
            "membership_cert": membership_cert, "operator_key": operator_key,
            "listen": listen, "http_listen": "127.0.0.1:0", "preset": preset, "gpu": "cpu",
            "home": home, "provider": providers[0] if providers else None},
            interval, drift, once, settle)
        return
    # The other modes read none of these (and plan on the simulator's own GPUs): ignoring
    # them silently hid a forgotten --pd-plan.
    stray = [flag for flag, value in (
        ("--pd-cluster", pd_cluster), ("--pd-links", pd_links), ("--pd-topology", pd_topology),
        ("--gpus-yaml", gpus_yaml), ("--pd-model", pd_model)) if value is not None]
    if stray:
        raise click.UsageError(f"{', '.join(stray)} {'goes' if len(stray) == 1 else 'go'} "
                               "with --pd-plan (add --pd-plan PLAN.json, or drop "
                               f"{'it' if len(stray) == 1 else 'them'})")
    if launcher == "slurm":
        from llmfabric.cli.controller_slurm import run_launcher

        if providers:
            raise click.UsageError("--launcher slurm trusts its profile's fabric.provider; "
                                   "drop --provider")
        if profile_path is None or not bootstrap:
            raise click.UsageError("--launcher slurm needs --profile and --bootstrap")
        run_launcher(profile_path, {
            "bootstrap": bootstrap, "network_secret": network_secret,
            "network_secret_file": network_secret_file,
            "membership_cert": membership_cert, "operator_key": operator_key,
            "listen": listen, "http_listen": "127.0.0.1:0", "preset": preset, "gpu": "cpu",
            "home": home}, interval, once, settle)
        return
    from llmfabric.clock import SystemClock
    from llmfabric.scheduler.controller import ControllerConfig, FleetController
    from llmfabric.scheduler.decisions import Executor, LoggingExecutor
    from llmfabric.scheduler.errors import SchedulerError
    from llmfabric.scheduler.observed import observed_workload
    from llmfabric.scheduler.problem import Workload
    from llmfabric.scheduler.simadapter import SimPerformance
    from llmfabric.scheduler.spec import load_workload

    if not node_url and not bootstrap:
        raise click.UsageError("give --bootstrap (execute) or --node URL (dry run)")
    configure_logging(logging.INFO, "%(asctime)s %(message)s")
    fixed: Workload | None = None
    if workload_path is not None:
        try:
            fixed = load_workload(workload_path)
        except SchedulerError as e:
            raise click.ClickException(str(e)) from None
    latest: list[NodeRecord] = []
    config = ControllerConfig(policy=policy, template=template, drift_threshold=drift,
                              reclaim=reclaim, max_releases=max_releases,
                              # one round has no history to hold bare nodes against
                              reclaim_idle_s=0.0 if once else reclaim_idle,
                              reclaim_hold_s=reclaim_hold,
                              interval_s=interval)
    clock = SystemClock()
    perf = SimPerformance.for_workload(fixed) if fixed is not None else SimPerformance()
    warned: set[str] = set()

    def knows(model: str) -> bool:
        try:
            perf.params_b(model)
        except SchedulerError:
            return False
        return True

    def _rates(workload: Workload) -> list[float]:
        return [m.arrival_rate for m in workload.loads]

    def workload_of(records: list[NodeRecord], trusted: Trusted | None) -> Workload:
        if fixed is not None:
            return fixed
        observed, notes = observed_workload(records, known=knows,
                                            trusted=trusted or (lambda _rec: True))
        for note in notes:
            if note not in warned:  # once per model, not every round
                warned.add(note)
                logging.warning(note)
        return observed

    async def loop(ctl: FleetController, refresh: Any,
                   explain: Callable[[], str | None]) -> None:
        while True:
            try:
                await refresh()
                decisions = await ctl.step()
            except (SchedulerError, RuntimeError) as e:
                logging.error("placement round failed: %s", e)
                decisions = []
            except OSError as e:
                raise click.ClickException(f"cannot read the registry: {e}") from None
            if once:
                sys.stdout.write(json.dumps(
                    [{"kind": type(d).__name__, **asdict(d)} for d in decisions], indent=2) + "\n")
                reason = None if decisions else explain()
                if reason is not None:
                    click.echo(f"nothing to do: {reason}", err=True)
                return
            await clock.sleep(interval)

    async def dry_run() -> None:
        assert node_url is not None
        executor: Executor = LoggingExecutor()
        verified: dict[str, str] = {}  # session id -> verified provider (the node's view)
        trusted = provider_filter(lambda rec: verified.get(rec.session_id, ""), providers)
        ctl = FleetController(lambda: fleet_of(latest, trusted),
                              lambda: workload_of(latest, trusted), executor, perf, clock,
                              config)

        async def refresh() -> None:
            fetched = await _fetch(node_url)
            latest[:] = [rec for rec, _ in fetched]
            verified.clear()
            verified.update((rec.session_id, who) for rec, who in fetched)

        await loop(ctl, refresh, lambda: why_no_decision(
            fleet_of(latest, trusted), _rates(workload_of(latest, trusted)), reclaim))

    async def in_fabric() -> None:
        from llmfabric.cli.controller_node import controller_node
        from llmfabric.controller.executor import PeerExecutor

        overrides: dict[str, Any] = {
            "bootstrap": bootstrap,
            "network_secret": network_secret, "network_secret_file": network_secret_file,
            "membership_cert": membership_cert,
            "operator_key": operator_key, "listen": listen, "http_listen": "127.0.0.1:0",
            "preset": preset, "gpu": "cpu", "home": home,
        }
        if template == "sim":  # (the default: real GPU nodes would serve made-up text)
            logging.warning("--template sim: assigned nodes start SIMULATED engines "
                            "(llmfabric engine sim); give --template vllm or sglang for real "
                            "models")
        # No signal handlers: the placement loop runs until the process is interrupted.
        async with controller_node(overrides, settle, clock, signals=False) as ctl_node:
            reader = ctl_node.reader
            live = reader.live_records
            # --provider: verified identities only (registry/provider.ProviderVerifier)
            trusted = provider_filter(ctl_node.node.providers.identity, providers)

            def records() -> list[NodeRecord]:
                # Bare nodes are capacity only when they accept assignments.
                return fleet_of(live(), trusted)

            executor = PeerExecutor(ctl_node.node.transport, reader.peer_of)
            ctl = FleetController(records, lambda: workload_of(live(), trusted), executor,
                                  perf, clock, config)

            async def refresh() -> None:
                return None

            await loop(ctl, refresh, lambda: why_no_decision(
                records(), _rates(workload_of(live(), trusted)), reclaim))

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(in_fabric() if bootstrap else dry_run())
