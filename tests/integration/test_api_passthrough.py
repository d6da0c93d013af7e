"""Generic pass-through routes (rerank, tokenize) and the capability catalog through a real
ingress: routed by the body's model, authenticated, metered by request when the engine
returns no usage; `GET /v1/models` says per model which APIs it is served through."""

from __future__ import annotations

import time

import openai
import orjson
import pytest

from ._api_fabric import KEY, NATIVE, SIM, TOOLY, ApiFabric
from .test_ingress_support import raw_request

pytestmark = pytest.mark.integration


AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


def test_rerank_and_tokenize_pass_through_and_are_metered_by_request(fab: ApiFabric,
                                                                     base: str) -> None:
    before = fab.usage(TOOLY)
    body = {"model": TOOLY, "query": "q", "documents": ["a", "b", "c"], "extra": {"x": 1}}
    r = raw_request("POST", base + "/v1/rerank", orjson.dumps(body), AUTH)
    assert r.status_code == 200 and r.headers["X-Fabric-Node"] == "nScr"
    assert [x["index"] for x in r.json()["results"]] == [0, 1, 2]
    assert fab.scripted.last("/v1/rerank") == body  # unchanged
    t = raw_request("POST", base + "/tokenize", orjson.dumps({"model": TOOLY, "prompt": "x"}),
                    AUTH)
    assert t.status_code == 200 and t.json()["count"] == 3
    deadline = time.monotonic() + 30  # a loaded CI machine: the flush is asynchronous
    while fab.usage(TOOLY)[2] < before[2] + 2:
        assert time.monotonic() < deadline, "pass-through requests were not metered"
        time.sleep(0.01)
    after = fab.usage(TOOLY)
    assert after[:2] == before[:2]  # no tokens billed: the engine reported none
    assert after[2] == before[2] + 2 and after[3] == before[3] + 2  # two estimated rows


def test_pass_through_needs_a_key_and_a_known_model(base: str) -> None:
    body = orjson.dumps({"model": TOOLY, "prompt": "x"})
    assert raw_request("POST", base + "/tokenize", body,
                       {"Content-Type": "application/json"}).status_code == 401
    r = raw_request("POST", base + "/v1/score", orjson.dumps({"model": "nope"}), AUTH)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    bad = raw_request("POST", base + "/v1/rerank", b"{oops", AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"


def test_an_engine_without_the_route_answers_its_own_404(base: str) -> None:
    # The simulated engine serves no /v1/score: its 404 is relayed, not turned into a 5xx.
    r = raw_request("POST", base + "/v1/score", orjson.dumps({"model": SIM}), AUTH)
    assert r.status_code == 404


def test_models_list_capabilities(base: str) -> None:
    c = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=20)
    models = {m.id: m.model_extra or {} for m in c.models.list()}
    assert set(models) == {SIM, TOOLY, NATIVE}
    sim = models[SIM]
    assert sim["capabilities"]["responses"] == "translated"
    assert sim["capabilities"]["messages"] == "translated"
    assert "/v1/rerank" in sim["capabilities"]["passthrough"]
    assert sim["max_model_len"] == sim["max_context"] > 0
    assert sim["quantizations"] == ["bf16"] and sim["nodes"] == ["nSim"]  # kept fields
    assert models[NATIVE]["capabilities"]["responses"] == "native"
