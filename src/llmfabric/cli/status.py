"""`llmfabric status --node URL`: the fabric as one node's replica sees it (rich tables; names
shown whole, folded onto more lines when a column is narrow; every record string escaped)."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from llmfabric.cli.console import cell, table_console

_STATE_STYLE = {"JOIN": "cyan", "SERVING": "green", "DOWN": "red", "LEFT": "dim"}


UNREACHABLE = ("is a node's HTTP API there? give its address with --node URL, e.g. "
               "http://127.0.0.1:8080 for the demo")


def node_url(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """A `--node` value: a node's HTTP URL. `host:port` alone is refused with the URL to give
    (urllib said 'unknown url type' and asked whether a node was there; aiohttp raised)."""
    if value is None or value.startswith(("http://", "https://")):
        return value
    example = f"http://{value}" if "://" not in value else "http://127.0.0.1:8090"
    raise click.BadParameter(f"{value!r} is no HTTP URL: give the node's HTTP address with "
                             f"http:// or https://, e.g. {example}")


NEEDS_KEY = ("its fleet views need an API key of that ingress: pass --api-key or set "
             "$LLMFABRIC_API_KEY (the ingress's admin key is in <its home>/admin.key), or "
             "start the ingress with --public-fleet-info")


def fleet_get(base: str, path: str, timeout: float = 10.0, api_key: str | None = None) -> Any:
    """GET a node's JSON view. An ingress's fleet views need an API key (unless
    --public-fleet-info): `api_key`, else $LLMFABRIC_API_KEY."""
    key = api_key or os.environ.get("LLMFABRIC_API_KEY")
    req = urllib.request.Request(base.rstrip("/") + path,
                                 headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 401:  # (what a user first meets on a secured ingress)
            what = "refused the API key" if key else "needs an API key"
            raise click.ClickException(
                f"{base}{path} {what} (HTTP 401): {NEEDS_KEY}") from exc
        raise click.ClickException(f"cannot read {base}{path}: {exc}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise click.ClickException(f"cannot reach {base}{path}: {exc} ({UNREACHABLE})") from exc
    except ValueError as exc:
        raise click.ClickException(f"cannot read {base}{path}: {exc}") from exc


def _ago(ts: float) -> str:
    secs = max(0.0, time.time() - ts)
    return f"{secs:.0f}s" if secs < 120 else f"{secs / 60:.0f}m"


def _cells(*values: str) -> list[Text]:
    """Plain cells: every string here comes from some node's record, so none is read as
    rich markup ("[/]" in a hostile node's label would otherwise stop the table) and none
    reaches the terminal with its control characters."""
    return [cell(v) for v in values]


# As the dashboard's badges: a provider name is the node's own claim; routing allowlists
# (X-Fabric-Providers) match its verified identity (the certificate's provider, or the peer
# id on shared-secret networks), so only a name equal to that identity is marked verified.
VERIFIED, CLAIMED = " (verified)", " (claimed)"
PROVIDER_NOTE = ("(verified): X-Fabric-Providers matches the name; (claimed): the node's own "
                 "word, an allowlist must name its verified identity instead (verified_provider "
                 "in --json)")


def _provider(node: dict[str, Any]) -> str:
    """The claimed provider name and whether it is the node's verified identity (nothing
    added for a node whose view predates `verified_provider`)."""
    name = node["provider_id"]
    shown = name or "-"
    if "verified_provider" not in node:
        return shown
    return shown + (VERIFIED if name and node["verified_provider"] == name else CLAIMED)


# Columns of a few characters that always fit: kept on one line. The others (names, lists)
# wrap, and a name longer than its column folds onto the next line: shown whole, never cut
# to "meta-llama/…" (two names that share a prefix would look the same).
_SHORT_COLUMNS = frozenset({"session", "state", "load", "seen", "serving", "nodes", "context"})


def _add_columns(table: Table, names: tuple[str, ...]) -> None:
    for name in names:
        if name in _SHORT_COLUMNS:
            table.add_column(name, no_wrap=True)
        else:
            table.add_column(name, overflow="fold")


def nodes_table(nodes: list[dict[str, Any]]) -> Table:
    marked = any("verified_provider" in n for n in nodes)
    table = Table(title=f"Nodes ({len(nodes)})", caption=Text(PROVIDER_NOTE) if marked else None)
    _add_columns(table, ("session", "state", "roles", "provider", "hardware", "engine",
                         "models", "load", "labels", "reach", "seen"))
    for n in nodes:
        state = n["state"] + (" (suspected)" if n["suspected"] else "")
        hw = n["hardware"]
        gpus = (f"{hw['gpu_count']}x {hw['gpu_model']}" if hw["gpu_count"] else hw["gpu_model"])
        reach = "relay " + ",".join(r[:10] for r in n["relays"]) if n["relays"] else (
            ",".join(n["peer_addrs"]) or "-")
        session, *rest = _cells(
            n["session_id"][:8],
            # (a bare ingress or relay stays JOIN: its roles say what it is for)
            ",".join(n.get("roles", ())) or "-",
            _provider(n),
            gpus,
            n["engine"] or "-",
            ", ".join(m["id"] for m in n["models"]) or "-",
            str(n["load"]["inflight"]),
            ",".join(f"{k}={v}" for k, v in n["labels"].items()) or "-",
            reach,
            _ago(n["last_seen"]),
        )
        table.add_row(session, cell(state, style=_STATE_STYLE.get(n["state"], "")), *rest)
    return table


def _model_provider(model: dict[str, Any], name: str) -> str:
    """A provider of a model, marked claimed when some node claims the name without being
    it (as the dashboard's catalog)."""
    if "unverified_providers" not in model:
        return name
    return name + (CLAIMED if name in model["unverified_providers"] else VERIFIED)


def models_table(models: list[dict[str, Any]]) -> Table:
    marked = any("unverified_providers" in m for m in models)
    table = Table(title=f"Models ({len(models)})",
                  caption=Text(PROVIDER_NOTE) if marked else None)
    _add_columns(table, ("model", "serving", "nodes", "providers", "gpus", "quantization",
                         "context"))
    for m in models:
        table.add_row(*_cells(
            m["id"], str(m["serving"]), str(len(m["nodes"])),
            ", ".join(_model_provider(m, p) for p in m["providers"]),
            ", ".join(m["gpus"]), ", ".join(m["quantizations"]), str(m["max_context"]),
        ))
    return table


@click.command("status")
@click.option("--node", "node_url", default="http://127.0.0.1:8090", show_default=True,
              envvar="LLMFABRIC_NODE", callback=node_url,
              help="HTTP URL of any node [env LLMFABRIC_NODE]")
@click.option("--json", "as_json", is_flag=True, help="print the raw JSON views")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=5.0,
              show_default=True,
              help="seconds to wait for each answer")
@click.option("--api-key", envvar="LLMFABRIC_API_KEY", default=None,
              help="a key of the ingress, whose fleet views need one (unless started with "
              "--public-fleet-info) [env LLMFABRIC_API_KEY]")
def command(node_url: str, as_json: bool, timeout: float, api_key: str | None) -> None:
    """Show nodes and models from one node's local replica."""
    nodes = fleet_get(node_url, "/v1/fabric/nodes", timeout, api_key)["nodes"]
    models = fleet_get(node_url, "/v1/fabric/models", timeout, api_key)["models"]
    if as_json:
        click.echo(json.dumps({"nodes": nodes, "models": models}, indent=2))
        return
    console = table_console()
    console.print(nodes_table(nodes))
    console.print(models_table(models))
