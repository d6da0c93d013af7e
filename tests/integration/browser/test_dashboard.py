"""The dashboard in a real browser (Debian's chromium via Playwright) against a running fabric.

Tests run in file order and share one fabric. The node-killing test is the last one in this
module: it SIGKILLs one of the two llama nodes, so nothing after it could rely on that node.
"""

from __future__ import annotations

import calendar
import http.server
import itertools
import re
import threading
import time
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
    # a PSK fabric: a provider name is the node's claim, never shown as verified
    assert "claimed" in h100.inner_text() and "verified" not in h100.inner_text()
    ingress = page.locator(f'#nodes-table tr[data-session="{fabric.sessions["ingress"]}"]')
    assert "ingress" in ingress.inner_text() and "bare node" in ingress.inner_text()
    assert page.locator('.stat[data-state="SERVING"] .stat-value').inner_text() == "3"
    shot(page, "nodes")


def test_key_created_in_ui_works_from_the_openai_sdk_and_revoking_it_fails_the_sdk(
    page: Any, fabric: Any, shot: Any, sign_in: Any
) -> None:
    sign_in(page)
    page.get_by_label("Name", exact=True).fill("sdk-test")
    page.get_by_role("textbox", name="Owner", exact=True).fill("alice")  # an admin names the owner
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
    page.get_by_role("textbox", name="Owner", exact=True).fill("alice")  # an admin names the owner
    page.get_by_role("button", name="Create key").click()
    page.locator("#new-key-secret").wait_for()
    cell = page.locator("#keys-table tbody th", has_text="<img")
    cell.first.wait_for()
    assert page.locator("#keys-table img").count() == 0
    assert page.evaluate("window.__pwned") is None


def test_key_expiry_and_model_allowlist_are_set_in_the_form_and_listed(
    page: Any, fabric: Any, sign_in: Any, shot: Any
) -> None:
    """The form sends the expiry as typed (the API parses it as `keys create --expires`) and
    the model list split at commas; the list shows both, and an expired key is marked."""
    sign_in(page)
    name, owner = page.get_by_label("Name", exact=True), page.get_by_role(
        "textbox", name="Owner", exact=True)
    expires, models = page.get_by_label("Expires", exact=True), page.get_by_label(
        "Models", exact=True)
    create = page.get_by_role("button", name="Create key")

    # an expiry the API cannot read: its 400 is shown as the page shows other API errors
    name.fill("course-bad")
    owner.fill("cs101")
    expires.fill("next tuesday")
    create.click()
    alert = page.get_by_role("alert").filter(has_text="cannot read expiry")
    alert.wait_for()
    assert "HTTP 400" in alert.inner_text()

    expires.fill("30d")
    models.fill(f" {LLAMA} ,, ")
    t0 = time.time()
    create.click()
    secret = page.locator("#new-key-secret").input_value()
    row = page.locator(f'#keys-table tr[data-key-id="{secret.split("-")[1]}"]')
    row.wait_for()
    cells = row.locator("td").all_inner_texts()
    # created, then expires: both in the page's one format
    created, shown = [c for c in cells if re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", c)]
    when = calendar.timegm(time.strptime(shown, "%Y-%m-%d %H:%M:%S UTC"))
    assert abs(calendar.timegm(time.strptime(created, "%Y-%m-%d %H:%M:%S UTC")) - t0) < 60
    assert abs(when - (t0 + 30 * 86400)) < 60, shown
    assert LLAMA in [c.strip() for c in cells] and row.get_attribute("data-expired") == "false"
    assert "expired" not in row.inner_text() and "active" in row.inner_text()
    # the allowlist reached the key: the other model is refused
    client = openai.OpenAI(base_url=f"{fabric.url}/v1", api_key=secret, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(
            model=QWEN, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    shot(page, "keys-expiry-models")

    # a key that expires in a few seconds: listed with its time, marked once it has passed
    soon = time.time() + 5
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(soon))
    name.fill("course-ending")
    owner.fill("cs101")
    expires.fill(iso)
    models.fill("")
    create.click()
    # (the first key's secret is still shown until the answer comes: wait for this one's)
    page.locator("#secret-title", has_text="course-ending").wait_for()
    secret = page.locator("#new-key-secret").input_value()
    row = page.locator(f'#keys-table tr[data-key-id="{secret.split("-")[1]}"]')
    row.wait_for()
    assert time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(soon)) in row.inner_text()
    assert "all models" in row.inner_text()
    time.sleep(max(0.0, soon + 1 - time.time()))
    page.reload()
    row.wait_for()
    assert row.get_attribute("data-expired") == "true"
    assert row.locator(".badge.bad", has_text="expired").count() == 2  # expiry and status
    with pytest.raises(openai.AuthenticationError, match="expired"):
        openai.OpenAI(base_url=f"{fabric.url}/v1", api_key=secret, max_retries=0).models.list()


def test_a_restricted_key_cannot_mint_a_broader_one_and_is_told_why(
    page: Any, fabric: Any, sign_in: Any
) -> None:
    admin = openai.OpenAI(base_url=f"{fabric.url}/v1", api_key=fabric.admin_key)
    created = admin.post("/fabric/keys", cast_to=object, body={
        "name": "ta-key", "owner": "cs102", "models": [LLAMA], "expires_at": "30d"})
    assert isinstance(created, dict)
    sign_in(page, created["key"])
    row = page.locator(f'#keys-table tr[data-key-id="{created["id"]}"]')
    row.wait_for()
    assert LLAMA in row.inner_text() and "never" not in row.inner_text()
    page.get_by_label("Name", exact=True).fill("student")
    page.get_by_label("Models", exact=True).fill(f"{LLAMA}, {QWEN}")
    page.get_by_role("button", name="Create key").click()
    alert = page.get_by_role("alert").filter(has_text="not among the creating key")
    alert.wait_for()
    assert "HTTP 403" in alert.inner_text() and QWEN in alert.inner_text()
    # unset fields inherit the creator's own expiry and allowlist
    page.get_by_label("Models", exact=True).fill("")
    page.get_by_role("button", name="Create key").click()
    secret = page.locator("#new-key-secret").input_value()
    child = page.locator(f'#keys-table tr[data-key-id="{secret.split("-")[1]}"]')
    child.wait_for()
    assert child.locator("td").all_inner_texts()[2:4] == row.locator("td").all_inner_texts()[2:4]


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

    # Record every distinct length of the answer's text, and whether the log was still busy
    # (streaming) then: a stream shows several growing partial answers before the last one.
    page.evaluate("""() => {
        window.__lengths = [];
        const log = document.getElementById('transcript');
        const sample = () => {
          const el = log.querySelector('.msg.assistant:last-child .text');
          if (!el || el.textContent === '\u2026') return;
          const len = el.textContent.length;
          const last = window.__lengths[window.__lengths.length - 1];
          if (!last || last.len !== len) {
            window.__lengths.push({len, busy: log.getAttribute('aria-busy') === 'true'});
          }
        };
        new MutationObserver(sample).observe(log, {subtree: true, characterData: true,
                                                   childList: true});
    }""")
    # ~25 ms a token (the demo's engines are much faster), so that a loaded machine cannot
    # coalesce the whole answer into one network read and hide whether the page streams
    fabric.engine_control("l40s", {"action": "slow", "factor": 20})
    try:
        page.get_by_label("Message").fill("Tell me about GPUs")
        page.get_by_label("Message").press("Enter")
        answer = page.locator(".msg.assistant").last
        answer.locator(".served-by").wait_for()
        page.wait_for_function(
            "() => !document.getElementById('transcript').hasAttribute('aria-busy')"
        )
    finally:
        fabric.engine_control("l40s", {"action": "reset"})
    text = answer.locator(".text").inner_text()
    assert text and text not in ("\u2026", "(no answer)", "(empty answer)")
    samples = page.evaluate("window.__lengths")
    lengths = [s["len"] for s in samples]
    assert lengths == sorted(set(lengths)), f"the answer's text shrank or repeated: {lengths}"
    assert lengths[-1] == len(answer.locator(".text").text_content() or "")
    partial = [s for s in samples if s["len"] < lengths[-1]]
    assert len(partial) >= 4, f"the answer did not arrive as a stream: lengths {lengths}"
    # the log is a polite live region, busy while the answer streams (read out once, whole)
    assert all(s["busy"] for s in partial), samples
    transcript = page.locator("#transcript")
    assert transcript.get_attribute("aria-live") == "polite"
    assert transcript.get_attribute("role") == "log"
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


def test_traces_page_draws_the_waterfall_of_a_request(
    page: Any, fabric: Any, shot: Any, sign_in: Any
) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    client = openai.OpenAI(base_url=f"{fabric.url}/v1", api_key=fabric.admin_key,
                           default_headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
    raw = client.chat.completions.with_raw_response.create(
        model=LLAMA, messages=[{"role": "user", "content": "trace me"}], max_tokens=6)
    assert raw.headers["X-Fabric-Trace"] == trace_id
    plain = openai.OpenAI(base_url=f"{fabric.url}/v1", api_key=fabric.admin_key)
    for _ in plain.chat.completions.create(
            model=QWEN, messages=[{"role": "user", "content": "stream"}], max_tokens=6,
            stream=True):
        pass
    sign_in(page)
    page.goto(f"{fabric.ui}#/traces")
    row = page.locator(f'#traces-table tr[data-trace="{trace_id}"]')
    row.wait_for()
    assert LLAMA in row.inner_text() and row.get_attribute("data-status") == "200"
    row.get_by_role("button").click()
    assert page.locator("#trace-id").inner_text() == trace_id
    wf = page.locator("#waterfall")
    names = wf.locator("g.wf-row").evaluate_all("els => els.map(e => e.dataset.span)")
    assert names[0] == "ingress.request"
    assert {"auth", "route", "attempt", "forward", "node"} <= set(names)
    assert "serving" not in names and "stream" not in names  # not a stream
    # the node's own hop (X-Fabric-Node-Time) is drawn right under its attempt's forward
    assert names.index("node") == names.index("forward") + 1
    # bars lie on one axis: every span starts at or after the root and ends within it
    boxes = wf.locator("rect.wf-bar").evaluate_all(
        "els => els.map(e => [e.x.baseVal.value, e.x.baseVal.value + e.width.baseVal.value])")
    root_start, root_end = boxes[0]
    assert all(root_start - 0.01 <= a <= b <= root_end + 1.01 for a, b in boxes)
    assert "attempt 0" in (wf.text_content() or "")
    # the attempts table says which model each attempt was for (no phase: colocated)
    [attempt] = page.locator("#attempts-table tbody tr").evaluate_all(
        "trs => trs.map(tr => [...tr.querySelectorAll('td')].map(td => td.textContent))")
    assert attempt[:3] == ["0", LLAMA, "-"] and attempt[4] == "status 200"
    shot(page, "traces")
    # the newest trace, the stream, is first and has a stream phase
    first = page.locator("#traces-table tbody tr").first
    assert QWEN in first.inner_text()
    first.get_by_role("button").click()
    names = page.locator("#waterfall g.wf-row").evaluate_all("els => els.map(e => e.dataset.span)")
    assert "stream" in names


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


# What each page shows once its data arrived: its table, or its empty or error state.
READY = {
    "catalog": "#catalog-table, main .notice",
    "nodes": "#nodes-table, main .notice",
    "keys": "#keys-table, main .results .notice",
    "usage": "#usage-table, main .notice",
    "chat": ".providers input[type=checkbox], .providers .muted:not(:has-text('Loading'))",
    "registry": "ul.records, main .notice",
    "traces": "#traces-table, main .notice",
}


def test_every_page_labels_its_controls_and_fits_a_phone_in_dark_mode(
    phone_page: Any, fabric: Any, shot: Any
) -> None:
    page = phone_page
    page.goto(f"{fabric.ui}#/keys")
    page.get_by_label("API key", exact=True).fill(fabric.admin_key)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", name="Create a key").wait_for()
    for name, ready in READY.items():
        page.goto(f"{fabric.ui}#/{name}")
        page.locator(ready).first.wait_for()
        unlabeled = page.evaluate("""() => [...document.querySelectorAll(
              'input, select, textarea, button')].filter(el => {
            if (el.type === 'hidden' || el.closest('[hidden]')) return false;
            const name = (el.labels && [...el.labels].map(l => l.textContent).join(''))
              || el.getAttribute('aria-label') || el.getAttribute('aria-labelledby')
              || (el.tagName === 'BUTTON' && el.textContent.trim());
            return !name;
          }).map(el => el.outerHTML.slice(0, 80))""")
        assert unlabeled == [], f"{name}: controls without a label: {unlabeled}"
        overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"{name}: the page is {overflow}px wider than a phone"
        current = page.locator(f'.nav a[data-page="{name}"]').get_attribute("aria-current")
        assert current == "page"
        shot(page, f"phone-{name}")
    # the navigation does not wrap on a phone: it is one row that scrolls sideways
    nav = page.evaluate("""() => {
        const nav = document.querySelector('.nav');
        const tops = [...nav.querySelectorAll('a')].map(a => a.getBoundingClientRect().top);
        return {rows: new Set(tops).size, scrolls: getComputedStyle(nav).overflowX};
    }""")
    assert nav == {"rows": 1, "scrolls": "auto"}, nav


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


def test_a_message_sent_before_the_model_list_arrives_waits_for_it(
    page: Any, fabric: Any, sign_in: Any
) -> None:
    # Enter right after opening the playground (as a loaded machine makes the tests do) used
    # to say "No model to talk to" while the model list was still on its way.
    sign_in(page)
    held: list[Any] = []
    page.route("**/v1/fabric/models", lambda route: held.append(route))  # released below
    try:
        page.goto(f"{fabric.ui}#/chat?model={QWEN}")
        for _ in range(1000):  # Playwright's own waits run the handlers; time.sleep would not
            if held:
                break
            page.wait_for_timeout(10)
        assert held, "the playground never asked for the model list"
        page.get_by_label("Max tokens").fill("8")
        page.get_by_label("Message").fill("hello before the list")
        page.get_by_label("Message").press("Enter")
        page.get_by_label("Message").press("Enter")  # twice: still one message
        assert page.locator(".msg").count() == 0, "sent before the model was known"
    finally:
        for route in held:
            route.continue_()
        page.unroute("**/v1/fabric/models")
    answer = page.locator(".msg.assistant")
    answer.locator(".served-by").wait_for()
    page.wait_for_function("() => !document.getElementById('transcript').hasAttribute('aria-busy')")
    assert answer.count() == 1
    assert answer.locator(".who").text_content() == QWEN
    assert not page.get_by_role("alert").filter(has_text="No model").count()
    assert page.get_by_label("Message").input_value() == ""


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


def settle(page: Any) -> None:
    """Let the page run what a keypress queued (a hashchange, a re-render) before asserting."""
    page.evaluate(
        "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r())))"
    )


@pytest.mark.parametrize("name", ["keys", "chat"])
def test_skip_link_moves_focus_to_the_page_and_keeps_it(page: Any, fabric: Any, name: str) -> None:
    heading = {"keys": "API keys", "chat": "Chat playground"}[name]
    page.goto(f"{fabric.ui}#/{name}")
    page.get_by_role("heading", name=heading, level=1).wait_for()
    if name == "chat":  # a draft must survive: the page is not drawn again
        page.get_by_label("Message").fill("a draft")
        page.locator(".skip-link").focus()
    else:
        page.keyboard.press("Tab")  # the first stop on a freshly loaded page
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Enter")
    settle(page)
    assert page.url.endswith(f"#/{name}")
    assert page.get_by_role("heading", name=heading, level=1).is_visible()
    assert page.locator(f'.nav a[data-page="{name}"]').get_attribute("aria-current") == "page"
    assert page.evaluate("document.activeElement.id") == "view"
    if name == "chat":
        assert page.get_by_label("Message").input_value() == "a draft"
    page.keyboard.press("Tab")  # the next stop is inside the page, not back in the header
    assert page.evaluate("Boolean(document.activeElement.closest('main'))")


def test_only_route_hashes_route(page: Any, fabric: Any) -> None:
    page.goto(f"{fabric.ui}#/nodes")
    page.locator("#nodes-table").wait_for()
    parsed = page.evaluate("""async () => {
        const { parseHash } = await import('./js/app.js');
        const name = (h) => { const r = parseHash(h); return r && r.name; };
        return ['', '#', '#/', '#/chat?model=x', '#keys', '#/nope', '#view', '#nope']
          .map((h) => [h, name(h)]);
    }""")
    assert parsed == [
        ["", "catalog"],
        ["#", "catalog"],
        ["#/", "catalog"],
        ["#/chat?model=x", "chat"],
        ["#keys", "keys"],
        ["#/nope", "catalog"],
        ["#view", None],
        ["#nope", None],
    ]
    # an in-page anchor followed by hand (no click handler) keeps the page and its address
    page.evaluate("window.location.hash = '#view'")
    page.wait_for_function("() => window.location.hash === '#/nodes'")
    assert page.locator("#nodes-table").is_visible()
    assert page.evaluate("document.activeElement.id") == "view"


def test_live_status_announces_state_changes_not_every_poll(page: Any, fabric: Any) -> None:
    page.goto(f"{fabric.ui}#/nodes")
    page.locator("#nodes-table").wait_for()
    state = page.locator(".live-status [role=status]")
    state.wait_for()
    assert state.inner_text() == "Live"
    # the visible time of the last update is not inside any live region
    assert page.evaluate("""() => document.querySelector('.live-time')
        .closest('[role=status], [role=alert], [role=log], [aria-live]') === null""")
    # count changes inside the page's live regions while successful polls go by
    page.evaluate("""() => {
        window.__spoken = [];
        const regions = document.querySelectorAll(
          'main [role=status], main [role=alert], main [role=log], main [aria-live]');
        const obs = new MutationObserver((records) => {
          for (const r of records) window.__spoken.push(r.target.textContent);
        });
        for (const el of regions) {
          obs.observe(el, {subtree: true, childList: true, characterData: true});
        }
        window.__time = document.querySelector('.live-time').textContent;
    }""")
    page.wait_for_function(
        "() => document.querySelector('.live-time').textContent !== window.__time", timeout=5000
    )
    page.wait_for_timeout(1200)  # one more poll (every second)
    assert page.evaluate("window.__spoken") == [], "a successful poll changed a live region"

    # a failed poll is announced once, and so is the recovery
    page.route("**/v1/fabric/nodes", lambda route: route.abort())
    page.wait_for_function(
        "() => document.querySelector('.live-status [role=status]').textContent"
        ".startsWith('Update failed')"
    )
    failed = state.inner_text()
    assert "Cannot reach the ingress" in failed and "retrying" in failed
    assert "last update" in page.locator(".live-time").inner_text()
    page.wait_for_timeout(2200)  # two more failed polls say nothing new
    page.unroute("**/v1/fabric/nodes")
    page.wait_for_function(
        "() => document.querySelector('.live-status [role=status]').textContent === 'Live again'"
    )
    spoken = page.evaluate("window.__spoken")
    assert spoken == [failed, "Live again"], spoken


def bump_on_every_poll(page: Any, url: str, field: str, mutate: Any) -> None:
    """Serve `url` from the fabric with `mutate(item, n)` applied to every item of `field`,
    n counting up on each request: a load (or demand) change on every poll."""
    counter = itertools.count(1)

    def handle(route: Any) -> None:
        resp = route.fetch()
        body = resp.json()
        n = next(counter)
        for item in body[field]:
            mutate(item, n)
        route.fulfill(response=resp, json=body)

    page.route(url, handle)


def test_nodes_redraws_keep_keyboard_focus_and_scroll(page: Any, fabric: Any) -> None:
    page.set_viewport_size({"width": 700, "height": 800})  # the table scrolls sideways
    bump_on_every_poll(
        page,
        "**/v1/fabric/nodes",
        "nodes",
        lambda node, n: node.update(load={**node.get("load", {}), "inflight": n, "queued": n % 3}),
    )
    page.goto(f"{fabric.ui}#/nodes")
    sid = fabric.sessions["l40s"]
    load = f'#nodes-table tr[data-session="{sid}"] td.load'
    page.locator(load).wait_for()
    link = page.locator(f'#nodes-table tr[data-session="{sid}"]').get_by_role(
        "link", name=f"{QWEN} in the catalog"
    )
    link.focus()
    wrap = page.locator("#nodes-table").locator("xpath=..")
    assert wrap.evaluate("el => el.scrollWidth > el.clientWidth")
    wrap.evaluate("el => { el.scrollLeft = 120; }")
    page.evaluate(f"""() => {{
        document.activeElement.__mark = 'kept';
        window.__first = parseInt(document.querySelector('{load}').textContent, 10);
    }}""")
    # two redraws because the load changed
    page.wait_for_function(
        f"() => parseInt(document.querySelector('{load}').textContent, 10) >= window.__first + 2"
    )
    assert page.evaluate("document.activeElement.__mark") == "kept", "focus was lost"
    assert page.evaluate("document.activeElement.isConnected")
    assert wrap.evaluate("el => el.scrollLeft") == 120, "the table's scroll was reset"
    page.keyboard.press("Enter")  # still usable from the keyboard: follows the link
    page.wait_for_url(re.compile(r"#/catalog\?q="))


def test_catalog_redraws_keep_keyboard_focus(page: Any, fabric: Any) -> None:
    bump_on_every_poll(
        page,
        "**/v1/fabric/models",
        "models",
        lambda model, n: model.update(demand_rps=n),
    )
    page.goto(fabric.ui)
    demand = f'#catalog-table tr[data-model="{QWEN}"] td.demand'
    page.locator(demand).wait_for()
    page.get_by_role("link", name=f"Try {QWEN} in the chat playground").focus()
    page.evaluate(f"""() => {{
        document.activeElement.__mark = 'kept';
        window.__first = parseFloat(document.querySelector('{demand}').textContent);
    }}""")
    page.wait_for_function(
        f"() => parseFloat(document.querySelector('{demand}').textContent) >= window.__first + 2"
    )
    assert page.evaluate("document.activeElement.__mark") == "kept", "focus was lost"


class _SlowJson(http.server.BaseHTTPRequestHandler):
    """Answers every GET with a JSON object, 0.3 s late: a route.fetch() that stays in flight."""

    def do_GET(self) -> None:
        time.sleep(0.3)
        body = b'{"nodes": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_closing_a_page_lets_its_route_handlers_in_flight_finish(
    browser: Any, fabric: Any, routes_finisher: Any
) -> None:
    # A handler still in route.fetch() when its context closed used to fail ("Response has
    # been disposed") and Playwright raised that at the next API call: the setup of the next
    # test. The page fixtures' teardown (routes_finisher, then close) must let it finish.
    slow = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowJson)
    threading.Thread(target=slow.serve_forever, daemon=True).start()
    started: list[str] = []
    finished: list[str] = []

    def handle(route: Any) -> None:
        started.append(route.request.url)
        resp = route.fetch(url=f"http://127.0.0.1:{slow.server_address[1]}/")
        route.fulfill(response=resp, json=resp.json())
        finished.append(route.request.url)

    try:
        context = browser.new_context()
        pg = context.new_page()
        pg.route("**/v1/fabric/nodes", handle)
        pg.goto(f"{fabric.ui}#/nodes")  # the nodes page polls every second
        for _ in range(1000):  # Playwright's own waits run the handlers; time.sleep would not
            if started:
                break
            pg.wait_for_timeout(10)
        assert started, "the page never asked for the nodes"
        routes_finisher(pg, context)  # the handler is now in its 0.3 s fetch
        context.close()
        assert finished == started, "a route handler was cut off by the close"
        # and the connection holds no handler error for whoever calls next
        other = browser.new_context()
        other.new_page().evaluate("1 + 1")
        other.close()
    finally:
        slow.shutdown()
        slow.server_close()


def test_reloading_the_keys_page_as_admin_shows_the_admin_view(
    page: Any, fabric: Any, sign_in: Any
) -> None:
    sign_in(page)
    page.locator("#keys-table").wait_for()
    # After a reload the page draws the keys before it knows the key is an admin's: hold
    # that second answer (the sign-in check) back so it surely comes last.
    seen: list[str] = []

    def hold_second(route: Any) -> None:
        seen.append(route.request.method)
        if len(seen) == 2:
            time.sleep(1.0)
        route.continue_()

    page.route("**/v1/fabric/keys", hold_second)
    page.reload()
    page.locator("#keys-table thead th", has_text="Owner").wait_for()
    assert len(seen) >= 2
    assert page.locator("#new-key-admin").is_visible()
    assert page.get_by_role("combobox", name="Owner").is_visible()
    assert "You are an admin" in page.locator("main .page-header").inner_text()
    assert "(admin)" in page.locator("#session").inner_text()


def test_one_shot_actions_say_what_failed_without_promising_a_retry(
    page: Any, fabric: Any, sign_in: Any
) -> None:
    sign_in(page)
    page.route(
        "**/v1/fabric/keys",
        lambda route: route.abort() if route.request.method == "POST" else route.continue_(),
    )
    page.get_by_label("Name", exact=True).fill("offline")
    page.get_by_role("textbox", name="Owner", exact=True).fill("alice")  # an admin names the owner
    page.get_by_role("button", name="Create key").click()
    alert = page.get_by_role("alert").filter(has_text="Could not create the key")
    alert.wait_for()
    assert "Cannot reach the ingress" in alert.inner_text()
    assert "Retrying" not in alert.inner_text() and "retrying" not in alert.inner_text()
    assert page.get_by_role("button", name="Create key").is_enabled()


def test_killing_a_node_turns_its_row_suspected_then_down_or_left(
    page: Any, fabric: Any, shot: Any
) -> None:
    page.goto(f"{fabric.ui}#/nodes")
    sid = fabric.sessions["h100"]
    row = page.locator(f'#nodes-table tr[data-session="{sid}"]')
    row.wait_for()
    assert row.get_attribute("data-state") == "SERVING"
    # The row element stays (rows are patched in place): record each state it shows, and when.
    row.evaluate("""row => {
        window.__states = [];
        const t0 = performance.now();
        new MutationObserver(() => window.__states.push(
            [row.dataset.state, (performance.now() - t0) / 1000]))
          .observe(row, {attributes: true, attributeFilter: ['data-state']});
    }""")
    fabric.kill("h100")
    # SWIM suspects a silent node within a few probe rounds; 8 s leaves room for a loaded box
    page.wait_for_function("() => window.__states.length > 0", timeout=8_000)
    shot(page, "nodes-after-kill-1")
    first, after = page.evaluate("window.__states[0]")
    assert first in ("suspected", "DOWN"), page.evaluate("window.__states")
    print(f"kill -> {first} after {after:.1f} s")
    page.locator(
        f'#nodes-table tr[data-session="{sid}"]:is([data-state="DOWN"], [data-state="LEFT"])'
    ).wait_for(timeout=30_000)
    print(f"states after the kill: {page.evaluate('window.__states')}")
    assert page.locator('.stat[data-state="SERVING"] .stat-value').inner_text() == "2"
    shot(page, "nodes-after-kill-2")
    page.goto(fabric.ui)
    llama = page.locator(f'#catalog-table tr[data-model="{LLAMA}"]')
    llama.wait_for()
    assert "Serving · 1" in llama.inner_text()
