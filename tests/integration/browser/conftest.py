"""Fixtures for the dashboard's browser tests: a running fabric and Debian's chromium.

The fabric is a running `llmfabric demo` subprocess (or, in a checkout without it,
`llmfabric.launch.local.LocalFabric`): an ingress node and three serving nodes as real
`llmfabric start` processes with simulated engines, on loopback. Screenshots go to
artifacts/screenshots/ at the repository root (gitignored): the ones the tests take, and
FAILED-<test>.png of the page of every test that fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from llmfabric.net.ports import free_port

CHROMIUM = os.environ.get("LLMFABRIC_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REPO = pathlib.Path(__file__).resolve().parents[3]
SCREENSHOTS = REPO / "artifacts" / "screenshots"
HERE = pathlib.Path(__file__).resolve().parent


# name -> (model, gpu, provider); "ingress" is the bootstrap/ingress node (no engine).
NODES = {
    "h100": ("llama-3.1-8b", "H100-SXM", "uni-a"),
    "a100": ("llama-3.1-8b", "A100-80GB", "uni-b"),
    "l40s": ("qwen3-1.7b", "L40S", "uni-b"),
}


@dataclass
class Fabric:
    """A running local fabric: one ingress node and three serving nodes, real processes."""

    url: str
    admin_key: str
    sessions: dict[str, str]  # node name ("ingress", "h100", ...) -> session id
    kill: Callable[[str], None]  # SIGKILL a node by name, as a crashed host
    engine_port: Callable[[str], int]  # the simulated engine's port of a serving node, by name

    def engine_control(self, name: str, command: dict[str, Any]) -> None:
        """POST a fault/speed command to a node's simulated engine (/sim/control)."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.engine_port(name)}/sim/control",
            data=json.dumps(command).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200

    @property
    def ui(self) -> str:
        return f"{self.url}/ui/"


def _need_chromium() -> None:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"chromium not found at {CHROMIUM}: apt-get install -y chromium")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return json.loads(resp.read())


def _sessions_by_name(url: str) -> dict[str, str]:
    """Name the fabric's nodes the way the tests do, from the ingress's node view."""
    out: dict[str, str] = {}
    for n in _get_json(f"{url}/v1/fabric/nodes")["nodes"]:
        if "ingress" in n["roles"]:
            out["ingress"] = n["session_id"]
        for name, (model, gpu, provider) in NODES.items():
            if (n["provider_id"], n["hardware"]["gpu_model"]) == (provider, gpu) and any(
                m["id"] == model for m in n["models"]
            ):
                out[name] = n["session_id"]
    return out


def _node_processes(state_dir: pathlib.Path) -> dict[str, tuple[int, list[str]]]:
    """http address -> (pid, argv) of every `llmfabric start` whose --home is under state_dir."""
    found: dict[str, tuple[int, list[str]]] = {}
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "start" in args and "--home" in args and "--http-listen" in args:
            home = args[args.index("--home") + 1]
            if home.startswith(str(state_dir)):
                found[args[args.index("--http-listen") + 1]] = (int(proc.name), args)
    return found


def _demo_fabric(tmp: pathlib.Path) -> Iterator[Fabric]:
    """`llmfabric demo` as a subprocess, with the tests' three serving nodes."""
    port = free_port()  # below the ephemeral range: the demo binds it later (net/ports.py)
    url = f"http://127.0.0.1:{port}"
    state = tmp / "state"
    nodes = [f"--node={model}@{gpu}@{provider}" for model, gpu, provider in NODES.values()]
    log_path = tmp / "demo.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llmfabric.cli.main",
                "demo",
                "--port",
                str(port),
                "--dir",
                str(state),
                "--speed",
                "8",
                *nodes,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 150
        while "demo is running" not in log_path.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "llmfabric demo did not start:\n" + log_path.read_text(errors="replace")[-3000:]
                )
            time.sleep(0.2)
        admin_key = (state / "ingress" / "admin.key").read_text().strip()
        sessions = _sessions_by_name(url)
        addrs = {
            n["session_id"]: n["http_addr"] for n in _get_json(f"{url}/v1/fabric/nodes")["nodes"]
        }

        def kill(name: str) -> None:
            pid, _ = _node_processes(state)[addrs[sessions[name]]]
            os.kill(pid, signal.SIGKILL)

        def engine_port(name: str) -> int:
            _, args = _node_processes(state)[addrs[sessions[name]]]
            engine = args[args.index("--process") :]
            return int(engine[engine.index("--port") + 1])

        yield Fabric(url, admin_key, sessions, kill, engine_port)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # the demo stops every node and engine it started
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def _local_fabric(tmp: pathlib.Path) -> Iterator[Fabric]:
    """The same fabric through LocalFabric, for checkouts without `llmfabric demo`."""
    from llmfabric.launch.local import EngineSpec, LocalFabric

    with LocalFabric(tmp) as local:
        ingress = local.start_ingress("--public-fleet-info")  # as `llmfabric demo` does
        processes = {"ingress": ingress}
        for name, (model, gpu, provider) in NODES.items():
            spec = EngineSpec(model, gpu, provider=provider, speed=8)
            processes[name] = local.add_node(spec, name)
        local.wait_serving({"llama-3.1-8b": 2, "qwen3-1.7b": 1}, timeout=90)

        def kill(name: str) -> None:
            processes[name].kill_hard()

        def engine_port(name: str) -> int:
            port = processes[name].engine_port
            assert port is not None, f"{name} runs no engine"
            return port

        sessions = _sessions_by_name(ingress.http_url)
        yield Fabric(ingress.http_url, local.admin_key(), sessions, kill, engine_port)


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabric]:
    """`llmfabric demo` when this checkout has it (LLMFABRIC_DASHBOARD_FABRIC=local: no)."""
    _need_chromium()
    tmp = tmp_path_factory.mktemp("fabric")
    use_demo = importlib.util.find_spec("llmfabric.cli.demo") is not None
    if os.environ.get("LLMFABRIC_DASHBOARD_FABRIC", "") == "local":
        use_demo = False
    yield from (_demo_fabric(tmp) if use_demo else _local_fabric(tmp))


@pytest.fixture(scope="module")
def browser(fabric: Fabric) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


# Set on a test item when its call phase failed, so page fixtures can screenshot the page.
FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call" and report.failed:
        item.stash[FAILED] = True


def failure_shot_path(nodeid: str) -> pathlib.Path:
    """artifacts/screenshots/FAILED-<test name and parameters>.png for a test's node id."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", nodeid.split("::")[-1]).strip("-")
    return SCREENSHOTS / f"FAILED-{name}.png"


def _open_page(browser: Any, request: pytest.FixtureRequest, **context_args: Any) -> Iterator[Any]:
    """A page in a fresh context (own sessionStorage) that fails the test on any JavaScript
    error and, when the test failed, leaves a screenshot of itself in artifacts/screenshots/."""
    failure_shot_path(request.node.nodeid).unlink(missing_ok=True)  # from an earlier run
    context = browser.new_context(**context_args)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    pg.set_default_timeout(10_000)
    try:
        yield pg
        # 401s the test provokes on purpose show up as console errors of failed fetches
        real = [e for e in errors if "401" not in e and "Failed to load resource" not in e]
        assert not real, f"JavaScript errors on the page: {real}"
    finally:
        try:
            finish_routes(pg, context, wait=not request.node.stash.get(FAILED, False))
        finally:
            if request.node.stash.get(FAILED, False):
                SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                try:
                    pg.screenshot(path=str(failure_shot_path(request.node.nodeid)), full_page=True)
                except Exception as exc:  # the page may be what broke; keep the real failure
                    print(f"no failure screenshot: {exc}", file=sys.stderr)
            context.close()


def finish_routes(pg: Any, context: Any, wait: bool = True) -> None:
    """Remove the page's and context's route handlers once those still running have finished.

    The dashboard polls every second, so a test's route handler (say one in `route.fetch()`)
    may still be running when the test ends. Closing the context first disposes the context's
    fetched responses, and the handler then fails ("Response has been disposed"); Playwright's
    sync API raises a handler's error at the next API call on the connection, which is the
    next test's `browser.new_context()`: an error at the setup of an innocent test. Waiting
    here lets the handler finish against a live context, and a handler's own error (a real
    one) is raised now, in the teardown of the test that routed. After a failed test
    (`wait=False`) a route it held back may never be answered, so nothing is waited for and
    the errors of handlers cut off by the close are dropped: the failure is reported already.
    """
    behavior = "wait" if wait else "ignoreErrors"
    pg.unroute_all(behavior=behavior)
    context.unroute_all(behavior=behavior)


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A desktop-sized page; see _open_page."""
    yield from _open_page(browser, request, viewport={"width": 1360, "height": 860})


@pytest.fixture
def phone_page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A 390 px wide phone page in dark mode; see _open_page."""
    yield from _open_page(
        browser,
        request,
        viewport={"width": 390, "height": 844},
        is_mobile=True,
        color_scheme="dark",
    )


@pytest.fixture
def shot() -> Callable[..., pathlib.Path]:
    """Save a screenshot of a page as artifacts/screenshots/NAME.png."""

    def take(page: Any, name: str, full_page: bool = True) -> pathlib.Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=full_page)
        return path

    return take


@pytest.fixture
def sign_in(fabric: Fabric) -> Callable[..., None]:
    """Sign a page in through the Keys page's form (the admin key by default)."""

    def do(page: Any, key: str | None = None) -> None:
        page.goto(f"{fabric.ui}#/keys")
        page.evaluate("sessionStorage.clear()")  # sign out whoever was signed in
        page.reload()
        page.get_by_label("API key", exact=True).fill(key or fabric.admin_key)
        page.get_by_role("button", name="Sign in").click()
        page.get_by_role("heading", name="Create a key").wait_for()

    return do


@pytest.fixture
def routes_finisher() -> Callable[[Any, Any], None]:
    """finish_routes, the page fixtures' last step before closing the context."""
    return finish_routes
