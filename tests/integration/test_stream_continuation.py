"""Mid-stream continuation with real processes: an ingress and three serving nodes
(`llmfabric start` + simulated engine each) on loopback, the official openai SDK as client.

A node is SIGKILLed (with its engine) while it streams an answer; the client's one stream goes
on from another node and ends with exactly the text an uninterrupted run of the deterministic
simulated engine gives for the same prompt, no piece lost or repeated, and usage counting
both parts (the prompt as the continuation's less the relayed tokens). The same holds for a
legacy `/v1/completions` stream (continued with the relayed text appended to the prompt). With
`metadata.continuation: false` the same cut ends the stream with an error. Nodes export their
engine's prefix-cache counters on /metrics.
"""

from __future__ import annotations

import itertools
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from llmfabric.engines import text
from llmfabric.launch.local import EngineSpec, LocalFabric, NodeProcess
from llmfabric.testing.poll import wait_for_value

from ._sdk_clients import tracked

pytestmark = pytest.mark.slow

MODEL = "llama-3.1-8b"
TOKENS = 120
CUT = re.compile(r"a stream cut after (\d+) tokens continued on node (\S+)")
SPEED = 1.0  # ~16 ms a token: time to kill the node mid-stream


@dataclass(slots=True)
class Serving:
    node: NodeProcess
    session_id: str


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalFabric, list[Serving]]]:
    with LocalFabric(tmp_path_factory.mktemp("continuation")) as fab:
        fab.start_ingress()
        nodes = [fab.add_node(EngineSpec(MODEL, "H100-SXM", provider=f"p{i}", speed=SPEED))
                 for i in range(4)]
        fab.wait_serving({MODEL: 4}, timeout=120)
        yield fab, [Serving(n, n.get_json("/v1/fabric/self")["session_id"]) for n in nodes]


def _client(fab: LocalFabric) -> openai.OpenAI:
    assert fab.ingress is not None
    return tracked(openai.OpenAI(base_url=fab.ingress.http_url + "/v1",
                                 api_key=fab.admin_key(), max_retries=0, timeout=60))


def _create(client: openai.OpenAI, prompt: str, **extra: object) -> object:
    return client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=TOKENS,
        stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, **extra})


def _kill_serving(raw: object, serving: list[Serving]) -> tuple[list[str], Serving]:
    """Read a few pieces, SIGKILL the node that serves the stream; (pieces so far, victim)."""
    node = raw.headers.get("x-fabric-node")  # type: ignore[attr-defined]
    [victim] = [s for s in serving if s.session_id == node]
    stream = raw.parse()  # type: ignore[attr-defined]
    pieces: list[str] = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if len(pieces) >= 10:
            break
    victim.node.kill_hard()
    return pieces, victim


def test_a_stream_survives_its_node_being_killed(
        fabric: tuple[LocalFabric, list[Serving]]) -> None:
    fab, serving = fabric
    client = _client(fab)
    prompt = "tell me a long story about otters"
    raw = _create(client, prompt)
    pieces, victim = _kill_serving(raw, serving)
    t_cut = time.monotonic()  # the node and its engine are dead
    arrivals = [t_cut]
    stream = raw.parse()  # type: ignore[attr-defined]
    usage = None
    finish = None
    ids = set()
    for chunk in stream:
        arrivals.append(time.monotonic())
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices:
            if chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            finish = chunk.choices[0].finish_reason or finish
    elapsed = time.monotonic() - t_cut
    # The cut's added latency: the longest wait between two chunks after the kill (the
    # client drains what it had buffered first) over the median one.
    gaps = sorted(b - a for a, b in itertools.pairwise(arrivals))
    gap = gaps[-1] - gaps[len(gaps) // 2]
    got = "".join(pieces)

    # The same prompt, uninterrupted, on a node that is alive (the engine is deterministic).
    whole = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=TOKENS,
        extra_body={"ignore_eos": True})
    assert fab.ingress is not None
    [logged] = [line for line in fab.ingress.log_path.read_text().splitlines()
                if "continued on node" in line]
    print(f"\ncontinued after killing {victim.session_id}: {len(pieces)} pieces, "
          f"the client waited {gap * 1000:.0f} ms more than between two chunks, "
          f"{elapsed:.2f} s from the kill to the end; ingress: {logged.split(': ')[-1]}")
    assert got == whole.choices[0].message.content
    assert len(got.split()) == TOKENS
    assert finish == "length"
    assert usage is not None and usage.completion_tokens == TOKENS
    # Prompt usage: the continuation's prompt less the relayed tokens. The sim counts a
    # message as chars / 4 + 4 and its answer one word a token, so the added assistant
    # message (the relayed words) costs its chars / 4 + 4 less the `relayed` tokens, wherever
    # the cut fell (a slow client lets it fall late).
    assert whole.usage is not None
    [(relayed_s, _)] = CUT.findall(logged)
    relayed = int(relayed_s)
    assert 1 <= relayed < TOKENS
    said = " ".join(got.split()[:relayed])
    extra = text.count_tokens(said) + text.CHAT_MESSAGE_OVERHEAD - relayed
    assert usage.prompt_tokens == whole.usage.prompt_tokens + extra, (relayed, said)
    assert len(ids) == 1  # one response id for both parts
    serving.remove(victim)


def test_a_completions_stream_survives_its_node_being_killed(
        fabric: tuple[LocalFabric, list[Serving]]) -> None:
    fab, serving = fabric
    if len(serving) < 2:
        pytest.skip("needs two live nodes")
    client = _client(fab)
    prompt = "Once upon a time, by the river,"
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt=prompt, max_tokens=TOKENS, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    node = raw.headers.get("x-fabric-node")
    [victim] = [s for s in serving if s.session_id == node]
    pieces: list[str] = []
    ids = set()
    usage = None
    finish = None
    for chunk in raw.parse():
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        if len(pieces) == 10:
            victim.node.kill_hard()
    serving.remove(victim)
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=TOKENS,
                                      extra_body={"ignore_eos": True})
    got = "".join(pieces)
    assert got == whole.choices[0].text
    assert len(got.split()) == TOKENS and finish == "length" and len(ids) == 1
    assert usage is not None and whole.usage is not None
    assert usage.completion_tokens == TOKENS
    assert usage.prompt_tokens == whole.usage.prompt_tokens  # (the sim counts its own words)
    assert fab.ingress is not None
    logged = [line for line in fab.ingress.log_path.read_text().splitlines()
              if "continued on node" in line]
    assert len(logged) == 2
    print(f"\ncompletions stream continued: ingress: {logged[-1].split(': ')[-1]}")
    # The trace shows both attempts: the cut one (with its error), then the continuation on
    # another node (a span of its own, whose traceparent the continuing node received).
    trace_id = raw.headers["x-fabric-trace"]
    req = urllib.request.Request(fab.ingress.http_url + "/v1/fabric/traces?limit=20",
                                 headers={"Authorization": f"Bearer {fab.admin_key()}"})

    def the_trace() -> list[dict[str, Any]]:
        with urllib.request.urlopen(req, timeout=5) as r:
            return [t for t in json.loads(r.read())["data"] if t["trace_id"] == trace_id]

    # (kept when the stream's handler returns, after its last byte went out)
    [trace] = wait_for_value(the_trace, 30.0, f"the trace {trace_id} at the ingress")
    attempts = sorted((sp for sp in trace["spans"] if sp["name"] == "attempt"),
                      key=lambda sp: sp["start_ms"])
    assert [a["attrs"]["node"] == victim.session_id for a in attempts] == [True, False]
    assert "failed mid-stream" in attempts[0]["attrs"]["error"]
    assert attempts[1]["attrs"]["continuation"] is True
    assert attempts[1]["attrs"]["status"] == 200
    assert attempts[0]["end_ms"] <= attempts[1]["start_ms"]


def test_opting_out_ends_the_cut_stream_with_an_error(
        fabric: tuple[LocalFabric, list[Serving]]) -> None:
    fab, serving = fabric
    if len(serving) < 2:
        pytest.skip("needs two live nodes")
    client = _client(fab)
    raw = _create(client, "another story, please", metadata={"continuation": "false"})
    pieces, victim = _kill_serving(raw, serving)
    serving.remove(victim)
    with pytest.raises(openai.APIError, match="failed mid-stream"):
        for chunk in raw.parse():  # type: ignore[attr-defined]
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
    assert len(pieces) < TOKENS


def test_nodes_publish_a_sketch_of_the_prompts_they_served(
        fabric: tuple[LocalFabric, list[Serving]]) -> None:
    """Real processes: after serving prompts, a node's record (as the ingress sees it) carries
    a prefix-cache sketch (republished with the load hint, every 10 s at most)."""
    fab, serving = fabric
    client = _client(fab)
    for i in range(6):
        client.chat.completions.create(
            model=MODEL, max_tokens=2,
            messages=[{"role": "user", "content": f"document {i}: " + "lantern " * 200}])
    assert fab.ingress is not None
    ingress = fab.ingress
    live = {s.session_id for s in serving}

    def sketches() -> dict[str, int]:
        nodes = ingress.get_json("/v1/fabric/nodes")["nodes"]
        return {n["session_id"]: n["prefix_cache"]["bytes"] for n in nodes
                if n["session_id"] in live}

    deadline = time.monotonic() + 30
    while not any(sketches().values()):
        assert time.monotonic() < deadline, sketches()
        time.sleep(0.5)
    assert set(sketches().values()) <= {0, 512}



def test_nodes_export_their_engines_prefix_cache_hits(
        fabric: tuple[LocalFabric, list[Serving]]) -> None:
    """Real processes: the node scrapes its engine's /metrics (the simulated engine speaks
    vLLM's names) and exports the prefix-cache counters and hit rate under llmfabric_engine_*
    (read with the load hint, every 10 s)."""
    fab, serving = fabric
    client = _client(fab)
    for _ in range(4):
        client.chat.completions.create(
            model=MODEL, max_tokens=2,
            messages=[{"role": "user", "content": "shared preamble " + "harbor " * 200}])
    live = [s for s in serving if s.node.alive()]

    def samples() -> dict[str, float]:
        got: dict[str, float] = {}
        for s in live:
            with urllib.request.urlopen(s.node.http_url + "/metrics", timeout=5) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith("llmfabric_engine_prefix_cache_"):
                        name, _, value = line.partition(" ")
                        got[name] = got.get(name, 0.0) + float(value)
        return got

    deadline = time.monotonic() + 30
    while samples().get("llmfabric_engine_prefix_cache_hits_total", 0.0) <= 0:
        assert time.monotonic() < deadline, samples()
        time.sleep(1.0)
    got = samples()
    assert got["llmfabric_engine_prefix_cache_queries_total"] >= (
        got["llmfabric_engine_prefix_cache_hits_total"])
    assert "llmfabric_engine_prefix_cache_hit_ratio" in got
