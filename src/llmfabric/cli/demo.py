"""`llmfabric demo`: a local fabric on this machine, until Ctrl-C.

One bootstrap + ingress + relay node with the dashboard, and serving nodes whose simulated
engines stand in for vLLM on different GPUs (timing from the roofline simulator). Every
node is a real `llmfabric start` process; only the GPUs are simulated.
"""

from __future__ import annotations

import asyncio
import pathlib
import shutil
import signal
import socket
import sys
import tempfile
import time
from types import FrameType

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn

from llmfabric.launch.local import EngineSpec, LocalFabric

DEFAULT_NODES: tuple[EngineSpec, ...] = (
    EngineSpec("llama-3.1-8b", "H100-SXM", provider="uni-zurich", site="zurich"),
    EngineSpec("llama-3.1-8b", "A100-80GB", provider="uni-lugano", site="lugano"),
    EngineSpec("qwen3-1.7b", "L40S", provider="uni-lugano", site="lugano"),
    EngineSpec("qwen3-32b", "H200", provider="uni-geneva", site="geneva"),
)


def _spec(text: str) -> EngineSpec:
    """MODEL@GPU[@PROVIDER]"""
    parts = text.split("@")
    if len(parts) not in (2, 3) or not all(parts):
        raise click.BadParameter(f"{text!r} is not MODEL@GPU or MODEL@GPU@PROVIDER")
    return EngineSpec(parts[0], parts[1], provider=parts[2] if len(parts) == 3 else "demo")


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as the ingress binds)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


async def _create_user_key(db: pathlib.Path) -> str:
    from llmfabric.accounts.store import AccountStore

    store = await AccountStore.open(str(db), background=False)
    try:
        _, plaintext = await store.create_key("demo", "demo-user")
    finally:
        await store.aclose()
    return plaintext


@click.command("demo")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True,
              help="HTTP port of the ingress (OpenAI API + dashboard)")
@click.option("--node", "nodes", multiple=True, metavar="MODEL@GPU[@PROVIDER]",
              help="serving nodes to start instead of the default four (repeatable)")
@click.option("--dir", "state_dir", type=click.Path(file_okay=False, path_type=pathlib.Path),
              help="keep node state here (default: a temporary directory, removed on exit)")
@click.option("--no-auth", is_flag=True, help="no API keys (this local demo only)")
@click.option("--speed", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True,
              help="run the simulated engines this many times faster than real GPUs")
@click.option("--duration", type=click.FloatRange(min=0), default=0.0,
              help="stop after this many seconds (0: run until Ctrl-C)")
def command(
    port: int, nodes: tuple[str, ...], state_dir: pathlib.Path | None, no_auth: bool,
    speed: float, duration: float,
) -> None:
    """Start a local fabric with simulated engines, an ingress and the dashboard."""
    specs = [_spec(n) for n in nodes] or list(DEFAULT_NODES)
    if _port_in_use(port):
        # (else whatever answers there, e.g. another demo, passed for our ingress: the demo
        # printed that one's address, then failed with a traceback on a missing admin key)
        raise click.ClickException(f"port {port} is in use (another demo?): stop what "
                                   "listens there or pass --port N")
    specs = [EngineSpec(s.model, s.gpu, s.provider, s.site, speed) for s in specs]
    console = Console(stderr=True)
    root = state_dir or pathlib.Path(tempfile.mkdtemp(prefix="llmfabric-demo-"))
    fabric = LocalFabric(root, auth=not no_auth, ingress_http_port=port)
    stop = {"now": False}
    keep_state = state_dir is not None

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), console=console,
                      transient=True) as progress:
            task = progress.add_task("starting the ingress node", total=None)
            # A small local fabric: show the observed demand in the catalog within seconds;
            # the fleet views (printed below) are public on this loopback-only demo.
            ingress = fabric.start_ingress("--demand-interval", "2", "--public-fleet-info")
            for spec in specs:
                progress.update(task, description=f"starting {spec.model} on {spec.gpu}")
                fabric.add_node(spec)
            progress.update(task, description="waiting for the engines to serve")
            want: dict[str, int] = {}
            for spec in specs:
                want[spec.model] = want.get(spec.model, 0) + 1
            try:
                fabric.wait_serving(want, timeout=120)
            except (RuntimeError, TimeoutError) as exc:  # (were tracebacks)
                keep_state = True  # (the logs say why: not removed with the fabric)
                raise click.ClickException(f"the demo fabric did not come up: {exc}\nthe "
                                           f"nodes' logs are kept under {root}") from None
        key = "none-needed"
        if not no_auth:
            key = asyncio.run(_create_user_key(ingress.home / "accounts.db"))
        _print_howto(console, ingress.http_url, key, fabric, specs[0].model, no_auth)
        deadline = time.monotonic() + duration if duration > 0 else None
        while not stop["now"] and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.2)
            if not ingress.alive():
                console.print("[red]the ingress node exited[/]\n" + fabric.tail(ingress))
                raise SystemExit(1)
    finally:
        console.print("stopping the fabric ...")
        fabric.close()
        if not keep_state:
            shutil.rmtree(root, ignore_errors=True)


def _print_howto(
    console: Console, url: str, key: str, fabric: LocalFabric, model: str, no_auth: bool
) -> None:
    serving = len(fabric.nodes) - 1
    console.print(f"\n[bold green]llmfabric demo is running[/] (ingress + {serving} "
                  f"node{'' if serving == 1 else 's'})")
    console.print(f"  OpenAI API:  {url}/v1")
    console.print(f"  dashboard:   {url}/ui/")
    console.print(f"  node API:    {url}/v1/fabric/nodes")
    if not no_auth:
        console.print(f"  API key:     {key}")
        console.print(f"  admin key:   {fabric.admin_key()}")
    console.print("\n[bold]curl[/]")
    console.print(
        f"  curl {url}/v1/chat/completions -H 'Authorization: Bearer {key}' "
        f"-H 'Content-Type: application/json' "
        f"-d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", "
        f"\"content\": \"Hello\"}}]}}'",
        soft_wrap=True,
    )
    console.print("\n[bold]openai SDK[/]")
    console.print(
        "  from openai import OpenAI\n"
        f"  client = OpenAI(base_url='{url}/v1', api_key='{key}')\n"
        f"  print(client.chat.completions.create(model='{model}', messages=[{{'role': 'user', "
        "'content': 'Hello'}]).choices[0].message.content)",
        soft_wrap=True,
    )
    console.print(f"\n  llmfabric status --node {url}")
    console.print("\nCtrl-C stops the fabric.")
    if shutil.which("llmfabric") is None:  # (it said .venv/bin, wherever the command was)
        console.print(f"[dim](llmfabric is not on PATH: run it as {_cli_hint()})[/]")


def _cli_hint() -> str:
    """How to run `llmfabric` when it is not on PATH: the script beside this Python, else
    `python -m llmfabric`."""
    script = pathlib.Path(sys.executable).parent / "llmfabric"
    return str(script) if script.exists() else f"{sys.executable} -m llmfabric"
