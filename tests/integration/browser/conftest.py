"""Fixtures for the dashboard's browser tests: a running fabric and Debian's chromium.

The fabric is a subprocess: `standin_fabric.py` (the real ingress, accounts, node views and
dashboard in front of simulated-engine subprocesses). Screenshots go to
artifacts/screenshots/ at the repository root (gitignored).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
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


@dataclass
class Fabric:
    url: str
    admin_key: str
    nodes: dict[str, int]  # session id -> pid of the process that kills the node
    proc: subprocess.Popen[bytes]

    @property
    def ui(self) -> str:
        return f"{self.url}/ui/"


def _need_chromium() -> None:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"chromium not found at {CHROMIUM}: apt-get install -y chromium")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


def _start_standin(tmp: pathlib.Path) -> Fabric:
    for mod in ("llmfabric.ingress.app", "llmfabric.accounts.http", "llmfabric.engines.sim_server"):
        pytest.importorskip(mod, reason=f"{mod} is needed to assemble a fabric")
    log = open(tmp / "fabric.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "standin_fabric.py"), "--dir", str(tmp)],
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=10)
        raise RuntimeError(
            f"the fabric exited: see {tmp / 'fabric.log'}:\n"
            + (tmp / "fabric.log").read_text(errors="replace")[-3000:]
        )
    ready: dict[str, Any] = json.loads(line)
    return Fabric(ready["url"], ready["admin_key"], dict(ready["nodes"]), proc)


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabric]:
    _need_chromium()
    tmp = tmp_path_factory.mktemp("fabric")
    fab = _start_standin(tmp)
    try:
        yield fab
    finally:
        if fab.proc.poll() is None:
            fab.proc.send_signal(signal.SIGTERM)
            try:
                fab.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(fab.proc.pid, signal.SIGKILL)
                fab.proc.wait(timeout=5)


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
        page.get_by_label("API key", exact=True).fill(key or fabric.admin_key)
        page.get_by_role("button", name="Sign in").click()
        page.get_by_role("heading", name="Create a key").wait_for()

    return do
