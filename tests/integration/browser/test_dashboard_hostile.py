"""The dashboard in a real browser against a hostile fabric: a small aiohttp app serving the
dashboard bundle and fake API answers the way a hostile member could make them look.

It overrides the `fabric` fixture of conftest.py (no demo fabric is started), so the
`browser` and `page` fixtures there run against it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from llmfabric.dashboard import add_dashboard_routes
from llmfabric.node.ports import free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.hostile]

# A member's names with bidi controls: U+202E reverses what follows it in its cell.
BIDI_MODEL = "evil\u202egpt-4\u202c-x"
BIDI_ALIASES = ["al\u2066ias\u202e", "second"]
BIDI_PROVIDER = "uni\u202eb"
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"

# One endless-looking answer: many tiny deltas, as a hostile node can stream them.
DELTAS = 120_000
DELTA = "spam " * 2


class _Fake:
    url = ""
    ui = ""


def _app() -> web.Application:
    app = web.Application()
    add_dashboard_routes(app)

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"models": [
            {"id": "m", "serving": 1},
            {"id": BIDI_MODEL, "serving": 1, "aliases": BIDI_ALIASES,
             "providers": [BIDI_PROVIDER], "gpus": ["H100"], "max_context": 4096}]})

    async def providers(_: web.Request) -> web.Response:
        return web.json_response({"providers": []})

    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "X-Fabric-Node": "evil"})
        await resp.prepare(request)
        event = b"data: " + orjson.dumps(
            {"choices": [{"index": 0, "delta": {"content": DELTA}}]}) + b"\n\n"
        batch = event * 1000
        try:
            for _ in range(DELTAS // 1000):
                await resp.write(batch)
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionError:  # the page stopped reading
            pass
        return resp

    app.router.add_get("/v1/fabric/models", models)
    app.router.add_get("/v1/fabric/providers", providers)
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.fixture(scope="module")
def fabric() -> Iterator[_Fake]:
    chromium = os.environ.get("LLMFABRIC_CHROMIUM", "/usr/bin/chromium")  # as conftest.py
    if not os.path.exists(chromium):
        pytest.skip(f"chromium not found at {chromium}: apt-get install -y chromium")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    port = free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_app())
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    fake = _Fake()
    fake.url = f"http://127.0.0.1:{port}"
    fake.ui = f"{fake.url}/ui/"
    try:
        yield fake
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_an_endless_answer_does_not_freeze_the_chat(page: Any, fabric: Any) -> None:
    page.goto(f"{fabric.ui}#/chat")
    page.locator('option[value="m"]').wait_for(state="attached")
    page.get_by_label("Message").fill("hi")
    t0 = time.monotonic()
    page.get_by_label("Message").press("Enter")
    page.wait_for_function(
        "() => !document.getElementById('transcript').hasAttribute('aria-busy')",
        timeout=30_000)
    took = time.monotonic() - t0
    answer = page.locator(".msg.assistant").last
    shown = len(answer.locator(".text").text_content() or "")
    # The playground shows a bounded part of an answer, says so, and stops reading.
    assert shown <= 256 * 1024, shown
    assert "cut" in answer.locator(".meta").inner_text()
    assert took < 15, f"the tab was busy {took:.1f} s with one answer"
    # and the page still answers
    assert page.evaluate("1 + 1") == 2


def test_bidi_controls_in_names_are_shown_escaped(page: Any, fabric: Any) -> None:
    page.goto(f"{fabric.ui}#/catalog")
    row = page.locator("#catalog-table tbody tr").filter(has_text="evil")
    row.wait_for()
    shown = page.evaluate("document.body.innerText")
    # no control reaches the page's text (or a title), so none can reorder a cell
    assert not any(c in shown for c in BIDI_CONTROLS), ascii(shown)
    titles = page.evaluate(
        "[...document.querySelectorAll('[title],[aria-label]')]"
        ".map(e => (e.title || '') + (e.getAttribute('aria-label') || '')).join(' ')")
    assert not any(c in titles for c in BIDI_CONTROLS), ascii(titles)
    # they are written as the terminal writes them, in their logical order
    cell = row.locator("th").inner_text()
    assert "evil\\u202egpt-4\\u202c-x" in cell, ascii(cell)
    assert "aka al\\u2066ias\\u202e, second" in cell, ascii(cell)
    assert "uni\\u202eb" in row.inner_text()
    # and the chat playground's model list shows it escaped too, while its value is the id
    page.goto(f"{fabric.ui}#/chat")
    option = page.locator("option").filter(has_text="evil")
    option.wait_for(state="attached")
    assert option.get_attribute("value") == BIDI_MODEL
    assert "\\u202e" in (option.text_content() or "")
