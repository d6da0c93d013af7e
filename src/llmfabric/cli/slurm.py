"""`llmfabric slurm`: provider jobs from a profile (launch/profile.py).

    llmfabric slurm render gpu.yaml > job.sh      # the sbatch script, to read or edit
    llmfabric slurm submit gpu.yaml               # sbatch --parsable: prints the job id
    llmfabric slurm status --profile gpu.yaml --node http://ingress:8090
    llmfabric slurm cancel 1234                   # graceful: the node drains and leaves

A rejected submission prints Slurm's reason on one line and exits with status 1.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import sys
from typing import Any

import click

from llmfabric.cli.status import node_url
from llmfabric.cli.untrusted import printable
from llmfabric.launch.errors import LaunchError, SlurmMissing, SlurmTimeout
from llmfabric.launch.profile import SlurmProfile, load_profile
from llmfabric.launch.sbatch import render_sbatch
from llmfabric.launch.slurm import Slurm

_PROFILE = click.argument("profile", type=click.Path(exists=True, dir_okay=False,
                                                      path_type=pathlib.Path))


def _submit_error(exc: LaunchError) -> click.ClickException:
    """Slurm's refusal on one line; sbatch missing or silent is not a refusal."""
    if isinstance(exc, SlurmMissing):
        return click.ClickException(str(exc))
    if isinstance(exc, SlurmTimeout):
        return click.ClickException(f"{exc}: Slurm may have queued the job anyway (squeue)")
    if ": fatal: " in str(exc):  # sbatch gave up before asking (no slurm.conf here, ...)
        return click.ClickException(f"sbatch could not submit from this machine: {exc}")
    return click.ClickException(f"sbatch rejected the job: {exc}")


def _slurm_error(tool: str, exc: LaunchError, prefix: str = "") -> click.ClickException:
    """A Slurm command's failure; one that gave up before asking slurmctld (no slurm.conf
    here: "squeue: fatal: Could not establish a configuration source") says where to run."""
    if ": fatal: " in str(exc):
        return click.ClickException(f"{tool} could not reach Slurm from this machine: {exc} "
                                    "(run this on a Slurm login node)")
    return click.ClickException(f"{prefix}{exc}")


def _load(path: pathlib.Path) -> tuple[SlurmProfile, str]:
    try:
        profile = load_profile(path)
        return profile, render_sbatch(profile, source=str(path))
    except LaunchError as exc:
        raise click.ClickException(str(exc)) from None


@click.group(name="slurm")
def command() -> None:
    """Run providers as Slurm jobs: render, submit, status, cancel."""


@command.command()
@_PROFILE
def render(profile: pathlib.Path) -> None:
    """Print the sbatch script for PROFILE."""
    sys.stdout.write(_load(profile)[1])


@command.command()
@_PROFILE
@click.option("--count", type=click.IntRange(min=1, max=64), default=1, show_default=True,
              help="submit this many jobs")
@click.option("--test-only", is_flag=True,
              help="submit nothing: print when Slurm would start the job (sbatch --test-only)")
def submit(profile: pathlib.Path, count: int, test_only: bool) -> None:
    """Submit PROFILE's job with `sbatch --parsable`; prints each job id."""
    _, script = _load(profile)
    slurm = Slurm()
    if test_only:
        try:
            start = slurm.test_start(script, strict=True)
        except LaunchError as exc:
            raise _submit_error(exc) from None
        when = (datetime.datetime.fromtimestamp(start).isoformat(timespec="seconds")
                if start is not None else "unknown")
        click.echo(f"would start at {when}")
        return
    for _ in range(count):
        try:
            job_id = slurm.submit(script)
        except LaunchError as exc:
            raise _submit_error(exc) from None
        click.echo(job_id)


def _fabric_nodes(url: str, api_key: str | None = None) -> list[dict[str, Any]]:
    from llmfabric.cli.status import fleet_get

    try:
        nodes = fleet_get(url, "/v1/fabric/nodes", api_key=api_key)["nodes"]
    except (KeyError, TypeError) as exc:
        raise click.ClickException(f"cannot read the fabric's nodes from {url}: {exc}") from None
    if not isinstance(nodes, list):
        raise click.ClickException(f"{url} answered no list of nodes")
    # Only well-formed entries: the answer comes from the network.
    return [n for n in nodes if isinstance(n, dict) and isinstance(n.get("labels"), dict)
            and isinstance(n.get("session_id"), str) and isinstance(n.get("state"), str)
            and isinstance(n.get("models", []), list)
            and all(isinstance(m, dict) and isinstance(m.get("id"), str)
                    for m in n.get("models", []))]


def job_rows(slurm: Slurm, job_ids: list[str], name: str | None,
             nodes: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """squeue (+ sacct for jobs that left the queue) joined with the fabric's records."""
    queued = slurm.queue(job_ids, name=name if not job_ids else None, mine=not job_ids)
    rows: dict[str, dict[str, Any]] = {
        j.job_id: {"job": j.job_id, "name": j.name, "state": j.state, "start": j.start,
                   "end": j.end, "reason": j.reason, "host": j.nodes} for j in queued}
    gone = [j for j in job_ids if j not in rows]
    if gone:
        try:
            for f in slurm.accounting(gone):
                rows[f.job_id] = {"job": f.job_id, "state": f.state, "exit": f.exit_code,
                                  "elapsed": f.elapsed}
        except LaunchError as exc:
            for j in gone:
                rows[j] = {"job": j, "state": "GONE", "note": f"not in the queue; sacct: {exc}"}
    for row in rows.values():
        mine = [n for n in nodes or [] if n.get("labels", {}).get("slurm_job") == row["job"]]
        if nodes is not None:
            live = [n for n in mine if n.get("state") != "LEFT"] or mine
            row["fabric"] = [{"session_id": n["session_id"], "state": n["state"],
                              "suspected": n.get("suspected", False),
                              "models": [m["id"] for m in n.get("models", [])],
                              "alloc_end": n.get("alloc_end", 0.0)} for n in live]
    return [rows[k] for k in sorted(rows, key=lambda x: (len(x), x))]


@command.command()
@click.argument("job_ids", nargs=-1)
@click.option("--profile", type=click.Path(exists=True, dir_okay=False, path_type=pathlib.Path),
              help="all your queued jobs of this profile (by job name)")
@click.option("--node", "node_url", callback=node_url,
              help="a node's HTTP address, e.g. http://ingress:8090: "
              "join each job with the fabric's view of its node")
@click.option("--api-key", envvar="LLMFABRIC_API_KEY", default=None,
              help="with --node: a key of that ingress, whose fleet views need one (unless "
              "started with --public-fleet-info) [env LLMFABRIC_API_KEY]")
@click.option("--json", "as_json", is_flag=True, help="the rows as JSON (no header)")
def status(job_ids: tuple[str, ...], profile: pathlib.Path | None, node_url: str | None,
           api_key: str | None, as_json: bool) -> None:
    """Slurm's view of provider jobs (squeue, sacct) next to the fabric's view of their nodes:
    a line a job, under a header line when stdout is a terminal (piped, the rows only)."""
    name = _load(profile)[0].job_name if profile else None
    if not job_ids and name is None:
        raise click.UsageError("give JOB_IDS or --profile")
    nodes = _fabric_nodes(node_url, api_key) if node_url else None
    try:
        rows = job_rows(Slurm(), list(job_ids), name, nodes)
    except LaunchError as exc:
        raise _slurm_error("squeue", exc) from None
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    # The header only for a reader: scripts that parse the rows (`| awk`) read no header,
    # as `keys usage-export` escapes only for a terminal.
    for line in status_lines(rows, with_fabric=nodes is not None, header=_is_terminal()):
        click.echo(line)


def _is_terminal() -> bool:
    return sys.stdout.isatty()


def _status_line(job: str, state: str, host: str, detail: str, fabric: str) -> str:
    return f"{job:>10} {state:<11} {host:<12} {detail:<24} {fabric}".rstrip()


def status_lines(rows: list[dict[str, Any]], with_fabric: bool, header: bool = True
                 ) -> list[str]:
    """`slurm status`'s table: a header (unless `header` is false), then one line a job
    (FABRIC only with --node)."""
    lines = [_status_line("JOB", "STATE", "HOST", "REASON/EXIT",
                          "FABRIC (state models session)" if with_fabric else "")
             ] if header else []
    for row in rows:
        fabric = row.get("fabric")
        seen = "; ".join(f"{f['state']} {','.join(f['models']) or '-'} {f['session_id'][:12]}"
                         for f in fabric) if fabric else ("no node in the fabric"
                                                          if fabric is not None else "")
        seen = printable(seen)  # (other nodes' records: no terminal escapes)
        extra = row.get("reason") or row.get("note") or row.get("exit") or ""
        lines.append(_status_line(row["job"], row["state"], row.get("host", ""), extra, seen))
    return lines


@command.command()
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--now", is_flag=True, help="plain scancel: every process gets SIGTERM at once "
              "(the engine too: requests in flight fail over to other nodes)")
def cancel(job_ids: tuple[str, ...], now: bool) -> None:
    """Cancel jobs. By default only the node (the batch shell) gets SIGTERM: it announces
    DOWN, drains its requests, announces LEFT and stops its engine; then the job ends."""
    slurm = Slurm()
    for job in job_ids:
        try:
            slurm.cancel(job, signal=None if now else "TERM")
        except LaunchError as exc:
            raise _slurm_error("scancel", exc, prefix=f"scancel {job}: ") from None
        click.echo(f"{job} {'cancelled' if now else 'draining'}")
