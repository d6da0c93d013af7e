"""`llmfabric keys`: node and operator keys, membership certificates (and API keys).

- `keys init`: create (first time) or show this node's key and peer id.
- `keys operator-init`: create or show the operator key (signs membership certificates).
- `keys sign-node PEER_ID --network NET --out FILE [--expires DAYS] [--not-before DAYS]
  [--provider NAME] [--model M ...] [--max-sessions N]`: operator signs a node (and binds
  its identity).
- `keys revoke-node [PEER_ID ...] [--cert FILE ...] [--cert-id ID ...] --list FILE
  [--network NET]`: operator adds keys (or single certificates) to the signed revocation
  list FILE (created if missing), re-signed with a later issue time; a node started with
  `--revocation-list FILE` re-reads it when it changes and the fabric passes it on to every
  node (identity/revocation.py, node/revocations.py).

The group object is `keys_group` (also exported as `command`); other modules add
subcommands to it with `keys_group.add_command(...)`. The API-key commands of cli/apikeys.py,
usage_export.py and budgets.py (`API_KEY_COMMANDS`) are attached here when present.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import pathlib
import time
from collections.abc import Iterable

import click

from llmfabric.clock import utc_time
from llmfabric.identity.admission import MembershipCert, encode_public_key, sign_membership
from llmfabric.identity.errors import IdentityError
from llmfabric.identity.keys import NODE_KEY_FILE, OPERATOR_KEY_FILE, NodeKey, default_home
from llmfabric.identity.peer_id import check_peer_id
from llmfabric.identity.revocation import RevocationList, sign_revocations

home_option = click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=pathlib.Path),
    default=None,
    help="state directory [default: $LLMFABRIC_HOME or ~/.llmfabric]",
)


@click.group("keys")
def keys_group() -> None:
    """Node keys, operator keys, membership certificates and API keys."""


def _show(key: NodeKey, created: bool, path: pathlib.Path, as_json: bool, what: str) -> None:
    info = {
        "peer_id": key.peer_id,
        "public_key": encode_public_key(key.public_bytes),
        "path": str(path),
        "created": created,
    }
    if as_json:
        click.echo(json.dumps(info))
        return
    click.echo(f"{what} {'created' if created else 'exists'}: {path}")
    click.echo(f"peer id:    {key.peer_id}")
    click.echo(f"public key: {info['public_key']}")


def _load_or_create(home: pathlib.Path | None, filename: str) -> tuple[NodeKey, bool, pathlib.Path]:
    try:
        key, created = NodeKey.load_or_create(home, filename)
    except IdentityError as exc:
        raise click.ClickException(str(exc)) from exc
    return key, created, default_home(home) / filename


def _check_peer_ids(peer_ids: Iterable[str]) -> None:
    try:
        for peer in peer_ids:
            check_peer_id(peer)
    except IdentityError as exc:
        raise click.ClickException(str(exc)) from exc


def _operator_key(home: pathlib.Path | None) -> NodeKey:
    """The operator key of HOME (for sign-node and revoke-node), or a click error that says
    how to create it."""
    try:
        return NodeKey.load(default_home(home) / OPERATOR_KEY_FILE)
    except IdentityError as exc:
        raise click.ClickException(
            f"{exc} (create the operator key with `llmfabric keys operator-init`)"
        ) from exc


@keys_group.command("init")
@home_option
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def init(home: pathlib.Path | None, as_json: bool) -> None:
    """Create this node's Ed25519 key (0600) if missing and show its peer id."""
    key, created, path = _load_or_create(home, NODE_KEY_FILE)
    _show(key, created, path, as_json, "node key")


@keys_group.command("operator-init")
@home_option
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def operator_init(home: pathlib.Path | None, as_json: bool) -> None:
    """Create the operator key if missing; nodes trust its public key (--operator-key)."""
    key, created, path = _load_or_create(home, OPERATOR_KEY_FILE)
    _show(key, created, path, as_json, "operator key")


def _days(text: str) -> float:
    """`--expires DAYS` of sign-node. '30d' (as `keys create --expires` takes it) said
    "'30d' is not a valid float"; the message now says what the option wants."""
    try:
        days = float(text)
    except ValueError:
        days = math.nan
    if not (days > 0 and math.isfinite(days)):  # (float() takes "nan" and "inf")
        raise click.BadParameter(f"{text!r} is not a positive number of days: give e.g. 30, "
                                 "or 0.5 for 12 hours", param_hint="--expires")
    return days


@keys_group.command("sign-node")
@click.argument("peer_id")
@click.option("--network", default="default", show_default=True, help="network name")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=pathlib.Path),
    required=True,
    help="where to write the membership certificate (JSON)",
)
@click.option(
    "--expires", "days", default="30", show_default=True, metavar="DAYS",
    help="validity in days: a number (30, 0.5)"
)
@click.option("--provider", default="",
              help="the provider identity this node belongs to: what X-Fabric-Providers and "
                   "metadata.providers match [default: the node's peer id]")
@click.option("--model", "models", multiple=True,
              help="a model id or alias the node may publish (repeat; default: any)")
@click.option("--max-sessions", type=click.IntRange(0, 1 << 20), default=0,
              help="sessions the node may hold at once [default: the fabric's cap, 8]")
@click.option("--not-before", "not_before_days", default="-0.01", show_default=True,
              metavar="DAYS",
              help="valid from DAYS from now (negative: in the past; the default leaves a "
                   "quarter of an hour for clock skew); 'none': no lower bound (nodes older "
                   "than not_before support cannot verify a certificate with one)")
@home_option
def sign_node(
    peer_id: str, network: str, out: pathlib.Path, days: str, provider: str,
    models: tuple[str, ...], max_sessions: int, not_before_days: str,
    home: pathlib.Path | None
) -> None:
    """Sign a membership certificate admitting PEER_ID to NETWORK (operator key needed),
    optionally binding it to a provider identity, models and a session cap."""
    _check_peer_ids([peer_id])
    operator = _operator_key(home)
    validity_days = _days(days)
    now = time.time()
    not_before = 0.0
    if not_before_days.strip().lower() != "none":
        try:
            nb_days = float(not_before_days)
        except ValueError:
            nb_days = math.nan
        if not (math.isfinite(nb_days) and nb_days < validity_days):
            raise click.BadParameter("must be a number of days before --expires, or 'none'",
                                     param_hint="--not-before")
        not_before = max(0.0, now + nb_days * 86400.0)
    try:
        cert = sign_membership(operator, peer_id, network, now + validity_days * 86400.0,
                               provider=provider, models=models, max_sessions=max_sessions,
                               not_before=not_before)
    except IdentityError as exc:
        raise click.ClickException(str(exc)) from exc
    out.write_text(cert.to_json() + "\n")
    click.echo(f"membership certificate for {peer_id} on {network!r} written to {out}")
    click.echo(f"certificate id: {cert.cert_id} (what `keys revoke-node --cert-id` "
               "revokes)")


@keys_group.command("revoke-node")
@click.argument("peer_ids", nargs=-1, metavar="[PEER_ID]...")
@click.option("--list", "list_file", required=True,
              type=click.Path(dir_okay=False, path_type=pathlib.Path),
              help="the revocation list (JSON) to extend, or to create")
@click.option("--network", default="default", show_default=True, help="network name")
@click.option("--cert", "cert_files", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=pathlib.Path),
              help="revoke only this membership certificate (its file), not its key "
                   "(repeatable)")
@click.option("--cert-id", "cert_ids", multiple=True,
              help="revoke only the certificate with this id (printed by sign-node; "
                   "repeatable)")
@home_option
def revoke_node(
    peer_ids: tuple[str, ...], list_file: pathlib.Path, network: str,
    cert_files: tuple[pathlib.Path, ...], cert_ids: tuple[str, ...], home: pathlib.Path | None
) -> None:
    """Revoke the membership of PEER_ID (every certificate of its key) on NETWORK, or of
    single certificates: adds them to the revocation list FILE (created if missing) and
    re-signs it with the operator key. Copy FILE to the --revocation-list path of one node
    (or more): it re-reads it within seconds and the fabric passes it on to every node,
    which refuses the revoked members' handshakes, closes their connections and drops their
    registry records."""
    if not (peer_ids or cert_files or cert_ids):
        raise click.UsageError("name a PEER_ID to revoke, or a certificate (--cert, --cert-id)")
    _check_peer_ids(peer_ids)
    operator = _operator_key(home)
    try:
        certs = set(cert_ids)
        for f in cert_files:
            cert = MembershipCert.load(f)
            if cert.network != network:
                raise click.BadParameter(f"{f} is a certificate for network {cert.network!r}, "
                                         f"not {network!r}", param_hint="--cert")
            certs.add(cert.cert_id)
        old: RevocationList | None = None
        if list_file.exists():
            old = RevocationList.load(list_file)
            old.verify(operator.public_bytes, network)  # (ours: extend it, never replace it)
        now = time.time()
        # Strictly newer than the old list (even if the clock went back): nodes pass on a
        # list only to peers that hold an older one.
        issued_at = max(now, old.issued_at + 0.001) if old is not None else now
        new = sign_revocations(operator, network, issued_at,
                               set(peer_ids) | (old.peer_ids if old else frozenset()),
                               certs | (old.cert_ids if old else frozenset()))
    except IdentityError as exc:
        raise click.ClickException(str(exc)) from exc
    # Written whole then renamed: a node polling the file never reads half of it.
    tmp = list_file.with_name(f".{list_file.name}.{os.getpid()}.tmp")
    tmp.write_text(new.to_json() + "\n")
    os.replace(tmp, list_file)
    added = (len(new.peer_ids) + len(new.cert_ids)
             - (len(old.peer_ids) + len(old.cert_ids) if old else 0))
    click.echo(f"revocation list {list_file} for {network!r}: {added} added, "
               f"{len(new.peer_ids)} key(s) and {len(new.cert_ids)} certificate(s) revoked "
               f"(issued at {utc_time(new.issued_at)}); copy it to a node's --revocation-list "
               "path: the fabric passes it on to the other nodes")


def _attach_api_key_commands() -> None:
    for name in ("llmfabric.cli.apikeys", "llmfabric.cli.usage_export",
                 "llmfabric.cli.budgets"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for cmd in getattr(module, "API_KEY_COMMANDS", []):
            if cmd.name not in keys_group.commands:
                keys_group.add_command(cmd)


_attach_api_key_commands()

command = keys_group
