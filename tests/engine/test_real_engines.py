"""Real engines behind a real ingress and nodes, driven by the official openai SDK.

Per engine (vLLM CPU, llama.cpp's Python server): two providers serve the tiny model; the
SDK lists models, chats, streams with and without usage, completes; usage lands in the
ledger (estimated where the engine reports none); the node publishes the engine's real
context, precision and pid; then the engine of provider A is SIGKILLed under load (its
children are gone within 2 s, no request fails, A leaves), provider B is SIGTERMed (drains,
LEFT, engine gone), and with no provider left the ingress answers 503 with Retry-After.
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest

from llmfabric.agent.proctree import alive, descendants
from llmfabric.launch.local import LocalFabric, NodeProcess
from llmfabric.net.ports import free_port

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _engines import install, tiny_model

# The first test of a module pays the engine install on a fresh machine (vLLM ~5 min, the
# llama.cpp build ~5.5 min on 2 idle cores, much longer on a loaded one) and two engine
# starts: the suite's 300 s per-test limit does not fit that.
pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(3000)]
CTX = 1024


def vllm_command(venv: pathlib.Path, model: pathlib.Path, port: int) -> list[str]:
    return [str(venv / "bin" / "vllm"), "serve", str(model), "--port", str(port),
            "--max-model-len", str(CTX), "--dtype", "float32", "--served-model-name", "tiny",
            "--max-num-seqs", "8"]


def llamacpp_command(venv: pathlib.Path, model: pathlib.Path, port: int) -> list[str]:
    return [str(venv / "bin" / "python"), "-m", "llama_cpp.server", "--model", str(model),
            "--port", str(port), "--n_ctx", str(CTX), "--model_alias", "tiny",
            "--embedding", "True"]  # (it serves /v1/embeddings next to generation)


def http(method: str, url: str, key: str, body: Any = None) -> tuple[int, Any, Any]:
    """(status, JSON body, headers) of one plain HTTP request."""
    data = orjson.dumps(body) if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, orjson.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, orjson.loads(e.read() or b"null"), e.headers


ENGINES = {"vllm": (vllm_command, False, "vllm"),
           "llamacpp": (llamacpp_command, True, "llama-cpp-python")}


class Setup:
    def __init__(self, fab: LocalFabric, a: NodeProcess, b: NodeProcess, kind: str) -> None:
        self.fab, self.a, self.b, self.kind = fab, a, b, kind
        self.requests = 0

    def client(self) -> openai.OpenAI:
        assert self.fab.ingress is not None
        return openai.OpenAI(base_url=self.fab.ingress.http_url + "/v1",
                             api_key=self.fab.admin_key(), max_retries=0, timeout=120)


@pytest.fixture(scope="module", params=list(ENGINES))
def real(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Setup]:
    engine = request.param
    command, gguf, kind = ENGINES[engine]
    venv = install(engine)
    root = tmp_path_factory.mktemp(engine)
    model = tiny_model(venv, root / "model", gguf)
    saved = dict(os.environ)
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB per vLLM engine
    try:
        with LocalFabric(root) as fab:
            fab.start_ingress()
            nodes = []
            # A leaves when its engine dies; B restarts its engine once.
            for name, policy in (("a", "leave"), ("b", "restart")):
                port = free_port()
                nodes.append(fab.add_process_node(
                    command(venv, model, port), f"prov-{name}", "--on-engine-exit", policy,
                    "--engine-restarts", "1", "--health-interval", "1", engine_port=port))
            fab.wait_serving({"tiny": 2}, timeout=600)
            yield Setup(fab, nodes[0], nodes[1], kind)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_node_publishes_the_engines_facts(real: Setup) -> None:
    me = real.a.get_json("/v1/fabric/self")
    assert me["engine"] == real.kind
    assert me["engine_process"]["pid"] > 0 and alive(me["engine_process"]["pid"])
    [model] = me["models"]
    assert model["id"] == "tiny"
    assert model["max_context"] == CTX  # what the engine runs, not a default
    assert model["quantization"] == "fp32"


def test_models_chat_completions(real: Setup) -> None:
    client = real.client()
    assert "tiny" in [m.id for m in client.models.list().data]
    reply = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello fabric"}], max_tokens=8)
    assert isinstance(reply.choices[0].message.content, str)
    assert reply.usage is not None and reply.usage.completion_tokens >= 1
    done = client.completions.create(model="tiny", prompt="the quick brown", max_tokens=6)
    assert isinstance(done.choices[0].text, str)
    real.requests += 2


def test_embeddings_where_the_engine_serves_them(real: Setup) -> None:
    """llama-cpp-python (`--embedding True`) serves embeddings through the fabric; vLLM runs
    the model for generation: it serves them or refuses with a 4xx that reaches the client
    with the engine's message (never a 5xx, a hang or a retry on every provider)."""
    assert real.fab.ingress is not None
    if real.kind == "llama-cpp-python":
        got = real.client().embeddings.create(model="tiny", input="hello fabric",
                                              encoding_format="float")
        assert len(got.data) == 1 and got.data[0].embedding
        real.requests += 1
        return
    status, doc, _ = http("POST", real.fab.ingress.http_url + "/v1/embeddings",
                          real.fab.admin_key(), {"model": "tiny", "input": "hello fabric"})
    if status == 200:
        assert doc["data"][0]["embedding"], doc
        real.requests += 1
        return
    # vLLM's generate runner mounts no /v1/embeddings: its own 404 {"detail": "Not Found"}
    # passes through (the fabric does not know which routes an engine mounts)
    assert 400 <= status < 500, (status, doc)
    error = doc.get("error") if isinstance(doc.get("error"), dict) else doc
    assert error.get("message") or error.get("detail"), doc


def test_streams_with_and_without_usage(real: Setup) -> None:
    client = real.client()
    msgs: list[Any] = [{"role": "user", "content": "stream please"}]
    plain = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8,
                                                stream=True))
    assert plain and all(ch.usage is None for ch in plain)
    assert all(ch.choices for ch in plain)  # no usage-only chunk the client did not ask for
    with_usage = list(client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=8, stream=True,
        stream_options={"include_usage": True}))
    last = with_usage[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.prompt_tokens > 0 and last.usage.completion_tokens >= 1
    real.requests += 2


def test_usage_is_never_missing(real: Setup) -> None:
    assert real.fab.ingress is not None
    deadline = time.monotonic() + 30  # (the usage ledger flushes asynchronously)
    while True:
        _, doc, _ = http("GET", real.fab.ingress.http_url + "/v1/fabric/usage",
                         real.fab.admin_key())
        rows = [row for row in doc["data"] if row["model"] == "tiny"]
        got = sum(row["requests"] for row in rows)
        if got >= real.requests or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert got == real.requests, rows
    assert sum(row["completion_tokens"] for row in rows) > 0
    if real.kind == "llama-cpp-python":  # its streams carry no usage: the ingress counted
        assert sum(row["estimated_requests"] for row in rows) >= 1


def test_stream_usage_is_the_engines_own_count(real: Setup) -> None:
    """A stream's usage, in the client's usage chunk and in the ledger, equals what the
    engine reports for the same request unstreamed. llama.cpp's server reports none in
    streams: the node counts the prompt with the engine's tokenizer and the completion from
    its token events (not characters / 4, not the non-empty pieces), marked estimated."""
    assert real.fab.ingress is not None
    base, admin = real.fab.ingress.http_url, real.fab.admin_key()
    status, created, _ = http("POST", base + "/v1/fabric/keys", admin,
                              {"name": "usage-check", "owner": "usage-check"})
    assert status == 201, created
    client = openai.OpenAI(base_url=base + "/v1", api_key=created["key"], max_retries=0,
                           timeout=120)
    prompt = "hello fabric, how are you today? the quick brown fox"
    kw: dict[str, Any] = {"model": "tiny", "prompt": prompt, "max_tokens": 20,
                          "temperature": 0, "seed": 1}
    whole = client.completions.create(**kw)
    assert whole.usage is not None
    truth = (whole.usage.prompt_tokens, whole.usage.completion_tokens)
    assert truth[0] != -(-len(prompt) // 4)  # (the old estimate would not pass this test)
    chunks = list(client.completions.create(**kw, stream=True,
                                            stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == truth
    plain = list(client.completions.create(**kw, stream=True))  # usage injected, stripped
    assert all(ch.usage is None for ch in plain)
    real.requests += 3
    deadline = time.monotonic() + 30
    while True:
        _, doc, _ = http("GET", f"{base}/v1/fabric/usage?key_id={created['id']}", admin)
        rows = doc["data"]
        if sum(r["requests"] for r in rows) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    [row] = rows
    assert (row["requests"], row["prompt_tokens"], row["completion_tokens"]) == (
        3, 3 * truth[0], 3 * truth[1])
    assert row["estimated_requests"] == (2 if real.kind == "llama-cpp-python" else 0)


PF_EXITING = 0x4  # (include/linux/sched.h: the task is exiting)
SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


def killed(pid: int) -> bool:
    """Gone, a zombie, exiting, or with a SIGKILL pending: a process the reaper has killed,
    even while the kernel still tears it down (a process with GBs mapped can stay in state
    R for over a second after SIGKILL, longer on a loaded machine)."""
    if not alive(pid):
        return True
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    if int(stat.rsplit(")", 1)[1].split()[6]) & PF_EXITING:
        return True
    pending = [int(line.split()[1], 16) for line in status.splitlines()
               if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(mask & SIGKILL_BIT for mask in pending)


def test_engine_killed_children_reaped_no_failed_request(real: Setup) -> None:
    pid = real.a.get_json("/v1/fabric/self")["engine_process"]["pid"]
    tree = (pid, *descendants(pid))
    client = real.client()

    def one(i: int) -> str:
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"load {i}"}], max_tokens=4)
        return r.choices[0].finish_reason or ""

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(one, i) for i in range(24)]
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        while any(not killed(p) for p in tree) and time.monotonic() - t0 < 2.0:
            time.sleep(0.05)
        assert not [p for p in tree if not killed(p)], "engine children not killed within 2 s"
        # (a killed vLLM EngineCore may take seconds to free its memory and go)
        while any(alive(p) for p in tree) and time.monotonic() - t0 < 30.0:
            time.sleep(0.05)
        assert not [p for p in tree if alive(p)], "killed engine children still there after 30 s"
        results = [f.result() for f in futures]  # raises if any request failed
    assert len(results) == 24
    assert real.a.proc.wait(60) == 5  # --on-engine-exit leave


def test_no_provider_left_is_503_with_retry_after_then_restart(real: Setup) -> None:
    """B's engine dies: while it restarts the model has no provider (A left): 503 with
    Retry-After, never a hang; then B serves again under a new session with a new engine."""
    assert real.fab.ingress is not None
    before = real.b.get_json("/v1/fabric/self")
    os.kill(before["engine_process"]["pid"], signal.SIGKILL)
    url, key = real.fab.ingress.http_url + "/v1/chat/completions", real.fab.admin_key()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    seen: list[int] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, _, headers = http("POST", url, key, body)
        seen.append(status)
        if status == 503:
            assert headers.get("Retry-After")
            break
        time.sleep(0.05)
    assert 503 in seen, seen
    # (until the ingress learns B is DOWN, a request may still reach B and fail with 502)
    assert set(seen) <= {200, 502, 503}, seen
    deadline = time.monotonic() + 300  # (fab.wait_serving would object to A's exit 5)
    while True:  # B shows its new session, and the ingress routes to it
        assert time.monotonic() < deadline and real.b.alive(), real.fab.tail(real.b)
        after = real.b.get_json("/v1/fabric/self")
        if (after["session_id"] != before["session_id"]
                and real.fab.serving_models().get("tiny", 0) >= 1):
            break
        time.sleep(0.5)
    assert after["engine_restarts"] == 1 and after["session_id"] != before["session_id"]
    assert after["engine_process"]["pid"] != before["engine_process"]["pid"]


def test_sigterm_drains_leaves_and_stops_the_engine(real: Setup) -> None:
    pid = real.b.get_json("/v1/fabric/self")["engine_process"]["pid"]
    tree = (pid, *descendants(pid))
    real.b.signal(signal.SIGTERM)
    assert real.b.proc.wait(60) == 0
    assert not [p for p in tree if alive(p)]
    assert real.fab.ingress is not None
    deadline = time.monotonic() + 30  # (the LEFT reaches the ingress by gossip)
    while real.fab.serving_models().get("tiny", 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    # Every provider LEFT: the fabric no longer knows the model (docs/ingress.md).
    status, doc, _ = http(
        "POST", real.fab.ingress.http_url + "/v1/chat/completions", real.fab.admin_key(),
        {"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
    assert status == 404 and doc["error"]["code"] == "model_not_found"
