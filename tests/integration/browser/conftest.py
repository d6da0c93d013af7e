"""Fixtures for the dashboard's browser tests: a running fabric and Debian's chromium.

The fabric is `llmfabric.node.local_fabric.LocalFabric`: an
ingress node and serving nodes as real `llmfabric start` processes with simulated engines,
on loopback. Screenshots go to artifacts/screenshots/ at the repository root (gitignored).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

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

    local: Any  # llmfabric.node.local_fabric.LocalFabric
    url: str
    admin_key: str
    sessions: dict[str, str]  # node name ("ingress", "h100", ...) -> session id
    processes: dict[str, Any]  # node name -> NodeProcess

    @property
    def ui(self) -> str:
        return f"{self.url}/ui/"

    def kill(self, name: str) -> None:
        """SIGKILL a node and its engine, as a crashed host."""
        self.processes[name].kill_hard()


def _need_chromium() -> None:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"chromium not found at {CHROMIUM}: apt-get install -y chromium")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabric]:
    _need_chromium()
    from llmfabric.node.local_fabric import EngineSpec, LocalFabric

    root = tmp_path_factory.mktemp("fabric")
    with LocalFabric(root) as local:
        ingress = local.start_ingress()
        processes = {"ingress": ingress}
        for name, (model, gpu, provider) in NODES.items():
            spec = EngineSpec(model, gpu, provider=provider, site=f"site-{provider}", speed=8)
            processes[name] = local.add_node(spec, name)
        local.wait_serving({"llama-3.1-8b": 2, "qwen3-1.7b": 1}, timeout=90)
        sessions = {
            name: str(proc.get_json("/v1/fabric/self")["session_id"])
            for name, proc in processes.items()
        }
        yield Fabric(local, ingress.http_url, local.admin_key(), sessions, processes)


@pytest.fixture(scope="module")
def browser(fabric: Fabric) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh page (own sessionStorage) that fails the test on any JavaScript error."""
    context = browser.new_context(viewport={"width": 1360, "height": 860})
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
        context.close()


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
