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
from llmfabric.net.ports import free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.hostile]

# A member's names with bidi controls: U+202E reverses what follows it in its cell.
BIDI_MODEL = "evil\u202egpt-4\u202c-x"
BIDI_ALIASES = ["al\u2066ias\u202e", "second"]
BIDI_PROVIDER = "uni\u202eb"
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"

# A model name as a member (or a client's `models` list) can make it: markup and bidi controls.
MARKUP_MODEL = "<img src=x onerror=window.__pwned=1>m\u202eodel"

# Keys as a keys API could list them: a name and model ids with markup and bidi controls (an
# admin's or a member's), an expired key, one without expiry or allowlist, one with many models.
MARKUP_NAME = "<img src=x onerror=window.__pwned=2>k\u202eey"
KEYS = [
    {"id": "a" * 16, "name": MARKUP_NAME, "owner": "o", "created_at": 1_767_225_603,
     "active": True, "expires_at": 1_767_225_600, "models": [MARKUP_MODEL, BIDI_MODEL]},
    {"id": "b" * 16, "name": "plain", "owner": "o", "created_at": 1_767_225_602,
     "active": True, "expires_at": None, "models": None},
    {"id": "c" * 16, "name": "many", "owner": "o", "created_at": 1_767_225_601,
     "active": True, "expires_at": 4_102_444_800, "models": [f"m{i}" for i in range(10)]},
]

# One endless-looking answer: many tiny deltas, as a hostile node can stream them.
DELTAS = 120_000
DELTA = "spam " * 2


class _Fake:
    url = ""
    ui = ""


def _span(name: str, sid: str, parent: str, start: float, end: float, **attrs: Any
          ) -> dict[str, Any]:
    return {"name": name, "span_id": sid, "parent_id": parent, "start_ms": start,
            "end_ms": end, "attrs": attrs}


# A request that fell back from `small` (its engine answered 503) to a model served on the
# prefill/decode path, whose decode stream was cut and continued: four attempts.
TRACE = {
    "trace_id": "ab" * 16, "status": 200, "duration_ms": 40.0, "started_at": 1_767_225_600,
    "attrs": {"model": MARKUP_MODEL},
    "spans": [
        _span("ingress.request", "r", "", 0, 40, model=MARKUP_MODEL),
        _span("attempt", "a0", "r", 1, 5, node="s1" * 8, attempt=0, model="small",
              error="node s1 answered 503"),
        _span("attempt", "a1", "r", 6, 10, node="p1" * 8, attempt=1, model=MARKUP_MODEL,
              phase="prefill", status=200),
        _span("attempt", "a2", "r", 11, 30, node="d1" * 8, attempt=2, model=MARKUP_MODEL,
              phase="decode", error="the stream was cut"),
        _span("attempt", "a3", "r", 30, 39, node="d2" * 8, attempt=3, model=MARKUP_MODEL,
              continuation=True, status=200),
    ],
}


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

    async def keys(_: web.Request) -> web.Response:
        return web.json_response({"data": KEYS})

    async def traces(_: web.Request) -> web.Response:
        return web.json_response({"enabled": True, "data": [TRACE]})

    app.router.add_get("/v1/fabric/keys", keys)
    app.router.add_get("/v1/fabric/traces", traces)
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


def test_traces_show_each_attempt_s_model_and_phase_as_text(page: Any, fabric: Any) -> None:
    """The attempt spans' `model` (a fallback's model) and `phase` (prefill/decode) were not
    shown. They are, in the attempts table under the waterfall and in each attempt bar's
    title, as text with bidi controls escaped like every other name from the fabric."""
    page.goto(fabric.ui)
    page.evaluate("sessionStorage.setItem('llmfabric.apiKey', 'sk-admin')")
    page.goto(f"{fabric.ui}#/traces")
    page.reload()
    rows = page.locator("#attempts-table tbody tr")
    rows.first.wait_for()
    cells = rows.evaluate_all(
        "trs => trs.map(tr => [...tr.querySelectorAll('td')].map(td => td.textContent))")
    escaped = "<img src=x onerror=window.__pwned=1>m\\u202eodel"
    assert [c[:3] for c in cells] == [
        ["0", "small", "-"], ["1", escaped, "prefill"], ["2", escaped, "decode"],
        ["3", escaped, "continuation"]]
    assert cells[0][4] == "failed: node s1 answered 503" and cells[1][4] == "status 200"
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#attempts-table img").count() == 0
    titles = page.locator("#waterfall g.wf-row[data-span=attempt] title").all_text_contents()
    assert "for model small" in titles[0] and f"for model {escaped}, decode" in titles[2]
    shown = page.evaluate("document.body.innerText")
    assert not any(c in shown for c in BIDI_CONTROLS), ascii(shown)


def test_keys_show_expiry_and_allowlist_with_hostile_names_inert(page: Any, fabric: Any) -> None:
    page.goto(fabric.ui)
    page.evaluate("sessionStorage.setItem('llmfabric.apiKey', 'sk-admin')")
    page.goto(f"{fabric.ui}#/keys")
    page.reload()
    rows = page.locator("#keys-table tbody tr")
    rows.nth(2).wait_for()
    hostile, plain, many = (rows.nth(i) for i in range(3))
    cells = hostile.locator("td").all_text_contents()  # key, created, expires, models, ...
    assert hostile.locator("th").text_content() == "<img src=x onerror=window.__pwned=2>k\\u202eey"
    # created and expires in the one format of the page (expires was ISO 8601, created not)
    assert cells[1:3] == ["2026-01-01 00:00:03 UTC", "2026-01-01 00:00:00 UTC expired"]
    assert hostile.get_attribute("data-expired") == "true" and "expired" in cells[5]
    chips = hostile.locator("td .chip").all_text_contents()
    assert chips == ["<img src=x onerror=window.__pwned=1>m\\u202eodel",
                     "evil\\u202egpt-4\\u202c-x"]
    assert page.locator("#keys-table img").count() == 0
    assert page.evaluate("window.__pwned") is None
    shown = page.evaluate("document.body.innerText")
    assert not any(c in shown for c in BIDI_CONTROLS), ascii(shown)

    assert plain.locator("td").all_text_contents()[2:4] == ["never", "all models"]
    assert "active" in plain.inner_text()
    cells = many.locator("td").all_text_contents()
    assert cells[2] == "2100-01-01 00:00:00 UTC" and many.get_attribute("data-expired") == "false"
    summary = many.locator("summary")
    assert summary.text_content() == "10 models" and not many.locator(".chip").first.is_visible()
    summary.click()
    assert many.locator(".chip").all_inner_texts() == [f"m{i}" for i in range(10)]
