"""The dashboard in a real browser (Debian's chromium via Playwright) against a running fabric.

Order matters only for the node-killing test, which runs last in this module (it takes one
node of a model that still has another, so later tests would also still work).
"""

from __future__ import annotations

import re
from typing import Any

import openai
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LLAMA = "llama-3.1-8b"
QWEN = "qwen3-1.7b"


def test_catalog_lists_models_with_hardware_and_filters(page: Any, fabric: Any, shot: Any) -> None:
    page.goto(fabric.ui)
    table = page.locator("#catalog-table")
    table.wait_for()
    llama = table.locator(f'tr[data-model="{LLAMA}"]')
    qwen = table.locator(f'tr[data-model="{QWEN}"]')
    llama.wait_for()
    assert llama.get_attribute("data-status") == "serving"
    assert "Serving · 2" in llama.inner_text()
    for text in ("H100-SXM", "A100-80GB", "uni-a", "uni-b", "bf16", "128k"):
        assert text in llama.inner_text()
    assert "L40S" in qwen.inner_text() and "uni-b" in qwen.inner_text()
    # each serving node is listed with its GPU and links to its row on the nodes page
    chips = llama.locator("a.node-chip")
    assert chips.count() == 2
    assert {c.get_attribute("title") for c in chips.all()} == {
        fabric.sessions["h100"],
        fabric.sessions["a100"],
    }
    shot(page, "catalog")

    page.get_by_label("Search").fill("qwen")
    qwen.wait_for()
    llama.wait_for(state="detached")
    page.get_by_label("Search").fill("")
    page.get_by_label("GPU").select_option("H100-SXM")
    llama.wait_for()
    qwen.wait_for(state="detached")
    page.get_by_label("GPU").select_option("L40S")
    page.get_by_label("Provider").select_option("uni-a")
    page.get_by_text("No model matches these filters").wait_for()
    page.get_by_role("button", name="Clear filters").click()
    qwen.wait_for()
    llama.wait_for()


def test_nodes_page_shows_lifecycle_hardware_labels_and_path(
    page: Any, fabric: Any, shot: Any
) -> None:
    page.goto(f"{fabric.ui}#/nodes")
    rows = page.locator("#nodes-table tbody tr")
    rows.first.wait_for()
    assert rows.count() == len(fabric.sessions)
    for name in ("h100", "a100", "l40s"):
        row = page.locator(f'#nodes-table tr[data-session="{fabric.sessions[name]}"]')
        assert row.get_attribute("data-state") == "SERVING"
    h100 = page.locator(f'#nodes-table tr[data-session="{fabric.sessions["h100"]}"]')
    for text in (
        "1\u00d7 H100-SXM",
        "80 GB",
        "site=",
        "uni-a",
        "direct",
        "in flight",
        "sim",
        LLAMA,
    ):
        assert text in h100.inner_text(), text
    ingress = page.locator(f'#nodes-table tr[data-session="{fabric.sessions["ingress"]}"]')
    assert "ingress" in ingress.inner_text() and "bare node" in ingress.inner_text()
    assert page.locator('.stat[data-state="SERVING"] .stat-value').inner_text() == "3"
    shot(page, "nodes")


def test_key_created_in_ui_works_from_the_openai_sdk_and_revoking_it_fails_the_sdk(
    page: Any, fabric: Any, shot: Any, sign_in: Any
) -> None:
    sign_in(page)
    page.get_by_label("Name", exact=True).fill("sdk-test")
    page.get_by_role("button", name="Create key").click()
    secret = page.locator("#new-key-secret").input_value()
    assert re.fullmatch(r"lf-[0-9a-f]{16}-[A-Za-z0-9_-]{43}", secret)
    key_id = secret.split("-")[1]
    snippet = page.locator("pre.snippet").inner_text()
    assert f"OPENAI_BASE_URL={fabric.url}/v1" in snippet and secret in snippet
    row = page.locator(f'#keys-table tr[data-key-id="{key_id}"]')
    row.wait_for()
    assert "sdk-test" in row.inner_text() and secret not in row.inner_text()
    shot(page, "keys-created")

    client = openai.OpenAI(base_url=f"{fabric.url}/v1", api_key=secret, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=LLAMA, messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    assert raw.headers.get("x-fabric-node") in {fabric.sessions["h100"], fabric.sessions["a100"]}
    assert raw.parse().choices[0].message.content

    # The secret is shown once: after a reload the page no longer has it.
    page.reload()
    row.wait_for()
    assert page.locator("#new-key-secret").count() == 0
    assert secret not in page.content()

    row.get_by_role("button", name="Revoke key sdk-test").click()
    row.get_by_role("button", name="Confirm revoking key sdk-test").click()
    page.locator(f'#keys-table tr[data-key-id="{key_id}"]').wait_for(state="detached")
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(
            model=LLAMA, messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )
    page.get_by_label("Show revoked").check()
    assert "revoked" in page.locator(f'#keys-table tr[data-key-id="{key_id}"]').inner_text()


def test_non_admin_sees_only_own_keys_and_a_bad_key_is_refused(
    page: Any, fabric: Any, sign_in: Any
) -> None:
    client = openai.OpenAI(base_url=f"{fabric.url}/v1", api_key=fabric.admin_key)
    created = client.post(
        "/fabric/keys", body={"name": "alice-laptop", "owner": "alice"}, cast_to=object
    )
    assert isinstance(created, dict)
    page.goto(f"{fabric.ui}#/keys")
    page.get_by_label("API key", exact=True).fill("lf-0000000000000000-" + "x" * 43)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("alert").filter(has_text="not accepted").wait_for()

    sign_in(page, created["key"])
    rows = page.locator("#keys-table tbody tr")
    rows.first.wait_for()
    assert rows.count() == 1 and "alice-laptop" in rows.first.inner_text()
    assert page.locator("#session").inner_text().startswith("Signed in: alice")
    assert not page.get_by_label("Owner").first.is_visible()

    sign_in(page)  # the admin sees every owner's keys and can filter by owner
    page.locator("#keys-table tbody tr").nth(1).wait_for()
    page.get_by_role("combobox", name="Owner").select_option("alice")
    rows = page.locator("#keys-table tbody tr")
    rows.first.wait_for()
    assert rows.count() == 1 and "alice-laptop" in rows.first.inner_text()


def test_markup_in_data_is_shown_as_text(page: Any, fabric: Any, sign_in: Any) -> None:
    sign_in(page)
    evil = '<img src=x onerror="window.__pwned=1">'
    page.get_by_label("Name", exact=True).fill(evil)
    page.get_by_role("button", name="Create key").click()
    page.locator("#new-key-secret").wait_for()
    cell = page.locator("#keys-table tbody th", has_text="<img")
    cell.first.wait_for()
    assert page.locator("#keys-table img").count() == 0
    assert page.evaluate("window.__pwned") is None


def test_chat_streams_an_answer_and_names_the_serving_node(
    page: Any, fabric: Any, shot: Any, sign_in: Any
) -> None:
    sign_in(page)
    page.goto(f"{fabric.ui}#/chat?model={LLAMA}")
    page.get_by_label("Model").wait_for()
    page.locator(f'option[value="{QWEN}"]').wait_for(state="attached")
    page.get_by_label("Model").select_option(QWEN)
    page.get_by_label("Max tokens").fill("24")
    stop = page.get_by_role("button", name="Stop")
    assert not stop.is_visible(), "Stop shows only while an answer streams"

    # Count how often the answer's text changes while it streams in.
    page.evaluate("""() => {
        window.__updates = 0;
        new MutationObserver(() => { window.__updates += 1; })
          .observe(document.getElementById('transcript'),
                   {subtree: true, characterData: true, childList: true});
    }""")
    page.get_by_label("Message").fill("Tell me about GPUs")
    page.get_by_label("Message").press("Enter")
    answer = page.locator(".msg.assistant").last
    answer.locator(".served-by").wait_for()
    page.wait_for_function("() => !document.getElementById('transcript').hasAttribute('aria-busy')")
    text = answer.locator(".text").inner_text()
    assert text and text not in ("…", "(no answer)", "(empty answer)")
    assert page.evaluate("window.__updates") >= 5, "the answer did not arrive as a stream"
    assert answer.locator(".served-by").get_attribute("title") == fabric.sessions["l40s"]
    assert re.search(r"\d+ in · \d+ out", answer.locator(".meta").inner_text())
    shot(page, "chat")


def test_chat_provider_allowlist_restricts_the_serving_node(
    page: Any, fabric: Any, sign_in: Any
) -> None:
    sign_in(page)
    page.goto(f"{fabric.ui}#/chat?model={LLAMA}")
    page.get_by_label("uni-a").check()
    served = set()
    for i in range(3):
        page.get_by_label("Message").fill(f"question {i}")
        page.get_by_role("button", name="Send").click()
        page.locator(".msg.assistant .served-by").nth(i).wait_for()
        page.wait_for_function(
            "() => !document.getElementById('transcript').hasAttribute('aria-busy')"
        )
        served.add(page.locator(".msg.assistant .served-by").nth(i).get_attribute("title"))
    assert served == {fabric.sessions["h100"]}, served


def test_usage_page_draws_a_chart_and_a_table(
    page: Any, fabric: Any, shot: Any, sign_in: Any
) -> None:
    client = openai.OpenAI(base_url=f"{fabric.url}/v1", api_key=fabric.admin_key)
    for model in (LLAMA, QWEN):
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "count"}], max_tokens=6
        )
    sign_in(page)
    page.goto(f"{fabric.ui}#/usage")
    # The ledger flushes in the background: refresh until both models appear.
    table = page.locator("#usage-table")
    for _ in range(20):
        if table.count() and QWEN in table.inner_text() and LLAMA in table.inner_text():
            break
        page.wait_for_timeout(300)
        page.get_by_role("button", name="Refresh").click()
    assert QWEN in table.inner_text() and LLAMA in table.inner_text()
    assert page.locator("svg.chart rect.seg").count() >= 2
    series = set(
        page.locator("svg.chart rect.seg").evaluate_all("els => els.map(e => e.dataset.series)")
    )
    assert {LLAMA, QWEN} <= series
    page.locator("#usage-group").select_option("key")
    assert page.locator("svg.chart rect.seg").first.get_attribute("data-series") != LLAMA
    page.locator("#usage-group").select_option("model")
    shot(page, "usage")


def test_registry_inspector_shows_raw_records_read_only(page: Any, fabric: Any, shot: Any) -> None:
    page.goto(f"{fabric.ui}#/registry")
    records = page.locator("ul.records > li")
    records.first.wait_for()
    assert records.count() == len(fabric.sessions)
    sid = fabric.sessions["h100"]
    page.get_by_label("Search").fill(sid)
    records.first.wait_for()
    assert records.count() == 1
    summary = records.first.locator("summary")
    assert "SERVING" in summary.inner_text() and "uni-a" in summary.inner_text()
    summary.click()
    raw = records.first.locator("pre").inner_text()
    assert f'"session_id": "{sid}"' in raw and '"signature"' in raw
    assert page.locator("main button", has_text=re.compile("delete|edit", re.I)).count() == 0
    shot(page, "registry")


def test_every_page_labels_its_controls_and_fits_a_phone_in_dark_mode(
    browser: Any, fabric: Any, shot: Any
) -> None:
    ctx = browser.new_context(
        viewport={"width": 390, "height": 844}, is_mobile=True, color_scheme="dark"
    )
    page = ctx.new_page()
    page.goto(f"{fabric.ui}#/keys")
    page.get_by_label("API key", exact=True).fill(fabric.admin_key)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", name="Create a key").wait_for()
    try:
        for name in ("catalog", "nodes", "keys", "usage", "chat", "registry"):
            page.goto(f"{fabric.ui}#/{name}")
            page.wait_for_timeout(400)
            unlabeled = page.evaluate("""() => [...document.querySelectorAll(
                  'input, select, textarea, button')].filter(el => {
                if (el.type === 'hidden' || el.closest('[hidden]')) return false;
                const name = (el.labels && [...el.labels].map(l => l.textContent).join(''))
                  || el.getAttribute('aria-label') || el.getAttribute('aria-labelledby')
                  || (el.tagName === 'BUTTON' && el.textContent.trim());
                return !name;
              }).map(el => el.outerHTML.slice(0, 80))""")
            assert unlabeled == [], f"{name}: controls without a label: {unlabeled}"
            overflow = page.evaluate(
                "() => document.documentElement.scrollWidth - window.innerWidth"
            )
            assert overflow <= 1, f"{name}: the page is {overflow}px wider than a phone"
            current = page.locator(f'.nav a[data-page="{name}"]').get_attribute("aria-current")
            assert current == "page"
            shot(page, f"phone-{name}")
        page.goto(f"{fabric.ui}#/nodes")
        page.locator("#nodes-table").wait_for()
        shot(page, "phone-nodes")
    finally:
        ctx.close()


def test_keyboard_reaches_the_pages_and_the_chat_box(page: Any, fabric: Any) -> None:
    page.goto(fabric.ui)
    page.locator("#catalog-table").wait_for()
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    for _ in range(6):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == "Chat":
            break
    assert page.evaluate("document.activeElement.textContent") == "Chat"
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"#/chat"))
    page.locator("#chat-input").wait_for()
    assert page.evaluate("document.activeElement.id") == "chat-input"


def test_error_and_empty_states(page: Any, fabric: Any, shot: Any) -> None:
    page.route(
        "**/v1/fabric/models",
        lambda route: route.fulfill(
            status=503,
            content_type="application/json",
            body='{"error": {"message": "replica not ready", "type": "unavailable"}}',
        ),
    )
    page.goto(fabric.ui)
    alert = page.get_by_role("alert").filter(has_text="replica not ready")
    alert.wait_for()
    assert "HTTP 503" in alert.inner_text()
    shot(page, "catalog-error")
    page.unroute("**/v1/fabric/models")
    page.route(
        "**/v1/fabric/models",
        lambda route: route.fulfill(
            status=200, content_type="application/json", body='{"models": []}'
        ),
    )
    page.get_by_text("No models are served yet").wait_for()
    page.goto(f"{fabric.ui}#/usage")
    page.get_by_text("Sign in to see usage").wait_for()


def test_browser_side_helpers(page: Any, fabric: Any) -> None:
    page.goto(fabric.ui)
    result = page.evaluate("""async () => {
        const { SseParser } = await import('./js/sse.js');
        const { niceTicks } = await import('./js/chart.js');
        const { daysBetween } = await import('./js/pages/usage.js');
        const p = new SseParser();
        const events = [];
        for (const piece of ['data: {"a"', ':1}\\r', '\\n\\r\\ndata: x\\ndata: y\\n', '\\n: c\\n',
                             'event: e\\ndata: [DONE]']) events.push(...p.push(piece));
        events.push(...p.end());
        return { events, ticks: niceTicks(937), days: daysBetween('2026-02-27', '2026-03-02') };
    }""")
    assert result["events"] == [
        {"event": "message", "data": '{"a":1}'},
        {"event": "message", "data": "x\ny"},
        {"event": "e", "data": "[DONE]"},
    ]
    assert result["ticks"] == [0, 200, 400, 600, 800, 1000]
    assert result["days"] == ["2026-02-27", "2026-02-28", "2026-03-01", "2026-03-02"]


def test_zz_killing_a_node_changes_its_row_within_seconds(
    page: Any, fabric: Any, shot: Any
) -> None:
    page.goto(f"{fabric.ui}#/nodes")
    sid = fabric.sessions["h100"]
    row = page.locator(f'#nodes-table tr[data-session="{sid}"]')
    row.wait_for()
    assert row.get_attribute("data-state") == "SERVING"
    fabric.kill("h100")
    # the replica suspects the node within about a second, then evicts it (DOWN or LEFT)
    page.locator(f'#nodes-table tr[data-session="{sid}"]:not([data-state="SERVING"])').wait_for(
        timeout=15_000
    )
    shot(page, "nodes-after-kill-1")
    page.locator(
        f'#nodes-table tr[data-session="{sid}"]:is([data-state="DOWN"], [data-state="LEFT"])'
    ).wait_for(timeout=30_000)
    assert page.locator('.stat[data-state="SERVING"] .stat-value').inner_text() == "2"
    shot(page, "nodes-after-kill-2")
    page.goto(fabric.ui)
    llama = page.locator(f'#catalog-table tr[data-model="{LLAMA}"]')
    llama.wait_for()
    assert "Serving · 1" in llama.inner_text()


def test_chat_stop_aborts_a_streaming_answer(page: Any, fabric: Any, sign_in: Any) -> None:
    # The simulated engine ends an answer by itself after 16-79 tokens, which at the demo's
    # speed takes well under a second. Slow every llama engine still alive to ~0.4 s a token so
    # that Stop always lands mid-stream, however loaded the machine is.
    slowed = []
    for name in ("h100", "a100"):  # the fabric's llama nodes
        try:
            fabric.engine_control(name, {"action": "slow", "factor": 300})
        except (KeyError, OSError):
            continue  # killed by an earlier test
        slowed.append(name)
    assert slowed, "no llama engine left to answer"
    sign_in(page)
    page.goto(f"{fabric.ui}#/chat?model={LLAMA}")
    page.get_by_label("Max tokens").fill("20000")
    page.get_by_label("Message").fill("write a long essay")
    page.get_by_label("Message").press("Enter")
    answer = page.locator(".msg.assistant").last
    page.wait_for_function(
        "() => (document.querySelector('.msg.assistant:last-child .text')"
        "?.textContent || '').split(' ').length > 2"
    )
    page.get_by_role("button", name="Stop").click()
    page.wait_for_function("() => !document.getElementById('transcript').hasAttribute('aria-busy')")
    assert "stopped" in answer.locator(".meta").inner_text()
    assert len(answer.locator(".text").inner_text().split()) < 16  # the shortest natural answer
    assert not page.get_by_role("button", name="Stop").is_visible()
    for name in slowed:
        fabric.engine_control(name, {"action": "reset"})
    # the playground is usable again right away
    page.get_by_label("Max tokens").fill("8")
    page.get_by_label("Message").fill("short one")
    page.get_by_role("button", name="Send").click()
    page.locator(".msg.assistant").nth(1).locator(".served-by").wait_for()


def test_sse_parser_gives_the_same_events_for_any_chunking(page: Any, fabric: Any) -> None:
    page.goto(fabric.ui)
    mismatches = page.evaluate("""async () => {
        const { SseParser } = await import('./js/sse.js');
        const stream = 'data: {"id":1,"x":"a b"}\\r\\n\\r\\n: keep-alive\\n\\nevent: usage\\n'
          + 'data: {"usage":{"prompt_tokens":3}}\\n\\n'
          + 'data: line1\\ndata: line2\\r\\rdata: [DONE]\\n\\n';
        const parseAll = (pieces) => {
          const p = new SseParser();
          const out = [];
          for (const piece of pieces) out.push(...p.push(piece));
          out.push(...p.end());
          return JSON.stringify(out);
        };
        const whole = parseAll([stream]);
        let seed = 12345;
        const rand = () => {
          seed = (seed * 1103515245 + 12345) % 2147483648;
          return seed / 2147483648;
        };
        const bad = [];
        for (let trial = 0; trial < 300; trial++) {
          const pieces = [];
          let i = 0;
          while (i < stream.length) {
            const n = 1 + Math.floor(rand() * 12);
            pieces.push(stream.slice(i, i + n));
            i += n;
          }
          if (parseAll(pieces) !== whole) bad.push(pieces);
        }
        return { whole: JSON.parse(whole), bad: bad.slice(0, 2) };
    }""")
    assert mismatches["bad"] == []
    assert [e["data"] for e in mismatches["whole"]] == [
        '{"id":1,"x":"a b"}',
        '{"usage":{"prompt_tokens":3}}',
        "line1\nline2",
        "[DONE]",
    ]
    assert mismatches["whole"][1]["event"] == "usage"


def test_catalog_shows_the_demand_the_ingress_observed(page: Any, fabric: Any) -> None:
    # The chat tests above sent llama requests through the ingress; it publishes the rate it
    # observed in its record (every 2 s in the demo) and the catalog shows it.
    page.goto(fabric.ui)
    cell = page.locator(f'#catalog-table tr[data-model="{LLAMA}"] td.demand')
    cell.wait_for()
    page.wait_for_function(
        f"""() => (document.querySelector('#catalog-table tr[data-model="{LLAMA}"] td.demand')
            ?.textContent || '').endsWith('req/s')""",
        timeout=30_000,
    )
    rate = float(cell.inner_text().split()[0])
    assert rate > 0
