"""Model fallbacks (`models`, ingress/request_body.py) through a real ingress, on both fronts,
driven by the official SDKs: the openai SDK's `extra_body={"models": [...]}` and the
anthropic SDK's `fallbacks=[{"model": ...}]`. An unknown primary and a failing engine are
served by the next model (X-Fabric-Model names it, the usage row bills it); an engine's
client error and a bad list are answered at once."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from ._api_fabric import KEY, SIM, TOOLY, ApiFabric
from ._sdk_clients import tracked

pytestmark = pytest.mark.integration

MSGS: Any = [{"role": "user", "content": "hello fabric"}]


def oai(base: str) -> openai.OpenAI:
    return tracked(openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0,
                                 timeout=20))


def wait_usage(fab: ApiFabric, model: str, requests: int) -> list[int]:
    deadline = time.monotonic() + 30  # (the usage flush is asynchronous)
    while fab.usage(model)[2] < requests:
        assert time.monotonic() < deadline, "no usage row was recorded"
        time.sleep(0.01)
    return fab.usage(model)


def control(fab: ApiFabric, **body: Any) -> None:
    req = urllib.request.Request(fab.sim_url + "/sim/control", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


@pytest.fixture
def failing_sim(fab: ApiFabric) -> Iterator[Any]:
    """Makes the simulated engine answer every inference request with a status."""
    yield lambda status: control(fab, action="fail", status=status)
    control(fab, action="reset")


def test_an_unknown_primary_is_served_by_the_listed_model(fab: ApiFabric, base: str) -> None:
    before = fab.usage(SIM)[2]
    raw = oai(base).chat.completions.with_raw_response.create(
        model="llama-3.1-70b", messages=MSGS, max_tokens=5,
        extra_body={"models": ["llama-3.1-70b", SIM]})
    assert raw.headers["x-fabric-model"] == SIM and raw.headers["x-fabric-node"] == "nSim"
    done = raw.parse()
    assert done.choices[0].message.content and done.usage is not None
    assert done.usage.completion_tokens == 5
    assert wait_usage(fab, SIM, before + 1)[2] == before + 1  # billed as the model served
    assert fab.usage("llama-3.1-70b") == [0, 0, 0, 0]


def test_a_stream_says_its_model_and_a_plain_request_too(fab: ApiFabric, base: str) -> None:
    client = oai(base)
    raw = client.chat.completions.with_raw_response.create(
        model="gone", messages=MSGS, max_tokens=4, stream=True,
        extra_body={"models": [SIM]})
    assert raw.headers["x-fabric-model"] == SIM
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert text
    plain = client.chat.completions.with_raw_response.create(model=SIM, messages=MSGS,
                                                             max_tokens=2)
    assert plain.headers["x-fabric-model"] == SIM


def test_a_failing_engine_falls_back_and_a_client_error_does_not(
        fab: ApiFabric, base: str, failing_sim: Any) -> None:
    client = oai(base)
    failing_sim(503)
    asked = len(fab.scripted.bodies)
    raw = client.chat.completions.with_raw_response.create(
        model=SIM, messages=MSGS, max_tokens=5, extra_body={"models": [TOOLY]})
    assert raw.headers["x-fabric-model"] == TOOLY
    assert raw.parse().choices[0].message.content == '{"city": "Paris"}'
    sent = fab.scripted.last("/v1/chat/completions")
    assert sent["model"] == TOOLY and "models" not in sent
    assert len(fab.scripted.bodies) == asked + 1
    failing_sim(400)  # the request's fault: answered as is, the fallback never asked
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=SIM, messages=MSGS, max_tokens=5,
                                       extra_body={"models": [TOOLY]})
    assert len(fab.scripted.bodies) == asked + 1


def test_a_bad_list_is_refused(base: str) -> None:
    client = oai(base)
    for models in (["a", "b", "c", "d", "e"], [SIM, 5], ["x" * 600], "llama"):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="gone", messages=MSGS, max_tokens=5,
                                           extra_body={"models": models})
        assert e.value.code == "invalid_models" and e.value.param == "models"


def test_anthropic_fallbacks(fab: ApiFabric, base: str) -> None:
    client = tracked(anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0,
                                         timeout=20))
    before = fab.usage(SIM)[2]
    raw = client.beta.messages.with_raw_response.create(
        model="claude-gone", max_tokens=6, messages=MSGS, fallbacks=[{"model": SIM}])
    assert raw.headers["x-fabric-model"] == SIM
    m = raw.parse()
    assert m.type == "message" and m.content[0].type == "text" and m.content[0].text
    assert m.usage.output_tokens == 6
    assert wait_usage(fab, SIM, before + 1)[2] == before + 1
    with client.beta.messages.stream(model="claude-gone", max_tokens=4, messages=MSGS,
                                     fallbacks=[{"model": SIM}]) as s:
        assert "".join(s.text_stream)
        assert s.get_final_message().model == SIM
    with pytest.raises(anthropic.BadRequestError) as e:
        client.beta.messages.create(model="claude-gone", max_tokens=6, messages=MSGS,
                                    fallbacks=[{"model": SIM, "max_tokens": 9}])
    assert e.value.status_code == 400
