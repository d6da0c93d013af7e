"""The whole path with real processes: ingress node -> gossip replica -> routing -> forward over
the fabric -> node agent -> simulated engine, driven by the official openai SDK."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from llmfabric.launch.local import EngineSpec, LocalFabric
from llmfabric.net.ports import free_port

from ._sdk_clients import tracked

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFabric]:
    root: pathlib.Path = tmp_path_factory.mktemp("fabric")
    with LocalFabric(root) as fab:
        api_port = free_port()
        fab.start_ingress("--record-trace", str(root / "trace.jsonl"),
                          "--api-listen", f"127.0.0.1:{api_port}")
        fab.api_port = api_port  # type: ignore[attr-defined]
        fab.add_node(EngineSpec("llama-3.1-8b", "H100-SXM", provider="uni-a", speed=20))
        fab.add_node(EngineSpec("llama-3.1-8b", "A100-80GB", provider="uni-b", speed=20))
        fab.add_node(EngineSpec("qwen3-1.7b", "L40S", provider="uni-b", speed=20))
        fab.wait_serving({"llama-3.1-8b": 2, "qwen3-1.7b": 1}, timeout=90)
        yield fab


def _client(fabric: LocalFabric, key: str | None = None) -> openai.OpenAI:
    assert fabric.ingress is not None
    return tracked(openai.OpenAI(
        base_url=fabric.ingress.http_url + "/v1", api_key=key or fabric.admin_key(),
        max_retries=0,
    ))


def test_models_lists_the_fabric_catalog(fabric: LocalFabric) -> None:
    ids = {m.id for m in _client(fabric).models.list()}
    assert {"llama-3.1-8b", "qwen3-1.7b"} <= ids


def test_chat_completion_is_served_by_a_fabric_node(fabric: LocalFabric) -> None:
    raw = _client(fabric).chat.completions.with_raw_response.create(
        model="qwen3-1.7b", messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    reply = raw.parse()
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    served_by = raw.headers.get("x-fabric-node")
    # The node's HTTP port: the lean front answered; the fleet API below is handed to aiohttp.
    assert "aiohttp" not in raw.headers.get("server", "")
    nodes = fabric.ingress.get_json("/v1/fabric/nodes")["nodes"]  # type: ignore[union-attr]
    qwen_nodes = {n["session_id"] for n in nodes if any(m["id"] == "qwen3-1.7b"
                                                         for m in n["models"])}
    assert served_by in qwen_nodes


def test_streaming_passes_chunks_and_usage(fabric: LocalFabric) -> None:
    stream = _client(fabric).chat.completions.create(
        model="llama-3.1-8b", messages=[{"role": "user", "content": "count"}], max_tokens=12,
        stream=True, stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


def test_trusted_provider_filter_is_honoured(fabric: LocalFabric) -> None:
    nodes = fabric.ingress.get_json("/v1/fabric/nodes")["nodes"]  # type: ignore[union-attr]
    uni_a = {n["session_id"] for n in nodes if n["provider_id"] == "uni-a"}
    # On a PSK network a provider is its key fingerprint (the peer id): the allowlist names
    # keys, never the free-text provider name a record claims.
    uni_a_keys = ",".join(sorted({n["peer_id"] for n in nodes if n["provider_id"] == "uni-a"}))
    client = _client(fabric)
    for _ in range(6):
        raw = client.chat.completions.with_raw_response.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
            extra_headers={"X-Fabric-Providers": uni_a_keys},
        )
        assert raw.headers.get("x-fabric-node") in uni_a
    for model, allow in (("qwen3-1.7b", uni_a_keys), ("llama-3.1-8b", "uni-a")):
        with pytest.raises(openai.APIStatusError) as err:  # a claimed name matches nothing
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                extra_headers={"X-Fabric-Providers": allow},
            )
        assert err.value.status_code == 503


def test_bad_key_and_unknown_model(fabric: LocalFabric) -> None:
    with pytest.raises(openai.AuthenticationError):
        _client(fabric, key="lf-not-a-key").models.list()
    with pytest.raises(openai.NotFoundError):
        _client(fabric).chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}]
        )


def test_node_api_is_read_only(fabric: LocalFabric) -> None:
    import urllib.error
    import urllib.request

    assert fabric.ingress is not None
    for path in ("/v1/fabric/nodes", "/v1/fabric/models", "/v1/fabric/self"):
        req = urllib.request.Request(fabric.ingress.http_url + path, data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=5)
        assert err.value.code == 405
        err.value.close()  # (an HTTPError holds the response and its socket)
    providers = fabric.ingress.get_json("/v1/fabric/providers")["providers"]
    assert {"uni-a", "uni-b"} <= {p["id"] for p in providers}


def test_ingress_records_an_anonymized_trace_with_per_key_opt_out(fabric: LocalFabric) -> None:
    import json
    import time
    import urllib.request

    assert fabric.ingress is not None
    secret_prompt = "my secret prompt about the quarterly numbers " * 4
    def new_key(record: bool) -> str:
        assert fabric.ingress is not None
        req = urllib.request.Request(
            fabric.ingress.http_url + "/v1/fabric/keys",
            # owner "admin" is reserved for admin keys: name the user's owner
            data=json.dumps({"name": f"k{record}", "owner": "trace-user",
                             "record_trace": record}).encode(),
            headers={"Authorization": f"Bearer {fabric.admin_key()}",
                     "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            key: str = json.loads(resp.read())["key"]
            return key

    traced_key, private_key = new_key(True), new_key(False)
    trace = fabric.root / "trace.jsonl"
    before = trace.read_text().count("\n") if trace.exists() else 0
    _client(fabric, key=traced_key).chat.completions.create(
        model="qwen3-1.7b", messages=[{"role": "user", "content": secret_prompt}],
        max_tokens=3, temperature=0.5,
    )
    _client(fabric, key=private_key).chat.completions.create(
        model="qwen3-1.7b", messages=[{"role": "user", "content": "opted out"}], max_tokens=3,
    )
    # A row is written once the request finished, which may be after the client saw the
    # reply: a traced request sent after the opted-out one marks when its row would be there.
    _client(fabric, key=traced_key).chat.completions.create(
        model="qwen3-1.7b", messages=[{"role": "user", "content": "marker"}], max_tokens=1,
    )

    def new_rows() -> list[dict[str, Any]]:
        text = trace.read_text() if trace.exists() else ""
        return [json.loads(line) for line in text.splitlines()[before:]]

    deadline = time.monotonic() + 30
    while not any(r["output_tokens"] == 1 for r in new_rows()):
        assert time.monotonic() < deadline, f"the marker's trace row never came: {new_rows()}"
        time.sleep(0.05)
    rows = new_rows()
    assert len(rows) == 2, rows  # the traced request and the marker: the opted-out key left none
    [row] = [r for r in rows if r["output_tokens"] == 3]
    assert row["model"] == "qwen3-1.7b"
    assert row["output_tokens"] == 3 and row["input_tokens"] > 0
    assert row["hash_ids"], row
    assert row["sampling_params"].get("temperature") == 0.5
    assert "secret" not in trace.read_text() and "quarterly" not in trace.read_text()


def test_the_fast_api_port_serves_the_same_fabric(fabric: LocalFabric) -> None:
    port = fabric.api_port  # type: ignore[attr-defined]
    client = tracked(openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1",
                                   api_key=fabric.admin_key(), max_retries=0))
    stream = client.chat.completions.create(
        model="qwen3-1.7b", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        stream=True, stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    with pytest.raises(openai.AuthenticationError):
        tracked(openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="lf-bad",
                              max_retries=0)).models.list()
