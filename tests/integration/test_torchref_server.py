"""`llmfabric engine torch` as a process: the OpenAI routes through the official SDK, the
switch routes, and the fabric serving it behind an ingress while it switches."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest

pytest.importorskip("torch")

from llmfabric.launch.local import LocalFabric
from llmfabric.net.ports import free_port
from llmfabric.testing.poll import wait_for_value

from ._sdk_clients import tracked

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENGINE = [sys.executable, "-m", "llmfabric.cli.main", "engine", "torch", "--config",
          "tiny-llama", "--dp", "2", "--widths", "1,2"]


def _get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        body = resp.read()
    return orjson.loads(body) if path != "/metrics" else body.decode()


def _post(port: int, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=orjson.dumps(body),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, orjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def _wait_status(port: int, pred: Any, timeout: float = 20.0) -> dict[str, Any]:
    def matching() -> dict[str, Any] | None:
        st: dict[str, Any] = _get(port, "/dtp_status")
        return st if pred(st) else None

    st = wait_for_value(matching, timeout, "a /dtp_status that matches", interval=0.02)
    assert st is not None
    return st


@pytest.fixture(scope="module")
def engine_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    port = free_port()
    log = tmp_path_factory.mktemp("torch") / "engine.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*ENGINE, "--port", str(port)], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                _get(port, "/v1/models")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(log.read_text()) from None
                time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0, log.read_text()


def _sdk(port: int) -> openai.OpenAI:
    return tracked(openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                                 max_retries=0))


def test_openai_routes_and_streaming_usage(engine_port: int) -> None:
    client = _sdk(engine_port)
    assert [m.id for m in client.models.list()] == ["tiny-llama"]
    chat = client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
        extra_body={"ignore_eos": True})
    assert chat.usage is not None and chat.usage.completion_tokens == 6
    assert chat.choices[0].finish_reason == "length"
    stream = client.completions.create(model="tiny-llama", prompt="stream me", max_tokens=10,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == len("stream me") + 1  # BOS + bytes
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    plain = client.completions.create(model="tiny-llama", prompt="stream me", max_tokens=10,
                                      extra_body={"ignore_eos": True})
    assert plain.choices[0].text == text  # greedy: same tokens streamed or not


def test_bad_requests_get_openai_errors(engine_port: int) -> None:
    client = _sdk(engine_port)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.completions.create(model="tiny-llama", prompt="x", max_tokens=100_000)
    assert _post(engine_port, "/dtp_switch", {"width": 3})[0] == 400
    assert _post(engine_port, "/dtp_switch", {"width": 2, "method": "teleport"})[0] == 400
    assert _post(engine_port, "/v1/completions", {"model": "tiny-llama",
                                                  "prompt": [1, 99999]})[0] == 400


def test_switch_keeps_outputs_and_teacher_forced_logprobs(engine_port: int) -> None:
    client = _sdk(engine_port)

    def score() -> tuple[str, list[float]]:
        out = client.completions.create(model="tiny-llama", prompt="layouts agree",
                                        max_tokens=12, echo=True, logprobs=1,
                                        extra_body={"ignore_eos": True})
        lp = out.choices[0].logprobs
        assert lp is not None and lp.token_logprobs is not None
        return out.choices[0].text, [x for x in lp.token_logprobs if x is not None]

    text1, lp1 = score()
    assert _post(engine_port, "/dtp_switch", {"width": 2, "method": "hard-preempt"}) == \
        (200, {"ok": True, "width": 2, "method": "hard"})
    st = _wait_status(engine_port, lambda s: s["width"] == 2)
    text2, lp2 = score()
    _post(engine_port, "/dtp_switch", {"width": 1})
    _wait_status(engine_port, lambda s: s["width"] == 1)
    assert text1 == text2 and text1.startswith("layouts agree")
    assert max(abs(a - b) for a, b in zip(lp1, lp2, strict=True)) <= 1e-4
    assert st["last_switch"]["cutover_s"] >= 0  # recorded (benchmarks/ measures its size)
    for e in st["engines"]:
        assert e["process_groups_created"] == e["process_groups_at_start"]
    metrics = _get(engine_port, "/metrics")
    assert "llmfabric_torchref_kv_usage_ratio{engine=\"1\"}" in metrics
    assert "vllm:num_requests_waiting" in metrics


def test_fabric_serves_the_torch_engine_while_it_switches(tmp_path: pathlib.Path) -> None:
    with LocalFabric(tmp_path) as fab:
        api = free_port()
        fab.start_ingress("--api-listen", f"127.0.0.1:{api}")
        assert fab.ingress is not None
        eport = free_port()
        fab._spawn("torchnode", [
            "--bootstrap", fab.ingress.peer_addr, "--provider", "cpu-lab", "--gpu", "cpu",
            "--process", *ENGINE, "--port", str(eport)], engine_port=eport)
        fab.wait_serving({"tiny-llama": 1}, timeout=120)
        client = tracked(openai.OpenAI(base_url=fab.ingress.http_url + "/v1",
                                       api_key=fab.admin_key(), max_retries=0))
        long_prompt, short_prompt = "a long DP stream", "served under TP"

        def complete(prompt: str, n: int) -> str:
            out = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=n,
                                            extra_body={"ignore_eos": True})
            return out.choices[0].text

        ref_long, ref_short = complete(long_prompt, 600), complete(short_prompt, 40)
        stream = client.completions.create(
            model="tiny-llama", prompt=long_prompt, max_tokens=600, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        pieces: list[str] = []
        chunks = iter(stream)
        while len(pieces) < 5:
            c = next(chunks)
            pieces.append(c.choices[0].text if c.choices else "")
        _post(eport, "/dtp_switch", {"width": 2, "method": "hard-preempt"})
        st = _wait_status(eport, lambda s: s["width"] == 2)
        assert st["paused"] == 1  # the stream's DP request waits with its KV
        got: dict[str, str] = {}
        t = threading.Thread(target=lambda: got.update(short=complete(short_prompt, 40)))
        t.start()
        t.join(timeout=60)
        assert got["short"] == ref_short  # real tokens, computed under TP
        _post(eport, "/dtp_switch", {"width": 1, "method": "hard-preempt"})
        usage = None
        for c in chunks:
            if c.choices:
                pieces.append(c.choices[0].text)
            if c.usage is not None:
                usage = c.usage
        assert "".join(pieces) == ref_long  # resumed exactly where it paused
        assert usage is not None and usage.completion_tokens == 600
        st = _get(eport, "/dtp_status")
        assert st["width"] == 1 and st["switches"] >= 2


def test_concurrent_requests_survive_every_transition(engine_port: int) -> None:
    client = _sdk(engine_port)
    _post(engine_port, "/dtp_switch", {"width": 1})
    _wait_status(engine_port, lambda s: s["width"] == 1 and not s["pending"]["bind"])
    prompts = [f"request {i}: " + "abc" * i for i in range(8)]

    def complete(prompt: str) -> str:
        out = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=48,
                                        extra_body={"ignore_eos": True})
        return out.choices[0].text

    refs = [complete(p) for p in prompts]
    got: dict[int, str] = {}
    threads = [threading.Thread(target=lambda i=i: got.update({i: complete(prompts[i])}))
               for i in range(8)]
    for t in threads:
        t.start()
    for width, method in ((2, "sequential"), (1, "hard-preempt"), (2, "soft-preempt"),
                          (1, "soft-preempt"), (2, "hard-preempt"), (1, "sequential")):
        _post(engine_port, "/dtp_switch", {"width": width, "method": method})
        time.sleep(0.05)
    for t in threads:
        t.join(timeout=120)
    assert [got[i] for i in range(8)] == refs
    st = _wait_status(engine_port, lambda s: s["width"] == 1 and s["running"] == 0)
    assert st["paused"] == 0 and st["waiting"] == 0
    assert all(e["kv_pool"]["free_blocks"] == e["kv_pool"]["total_blocks"]
               for e in st["engines"])


def test_a_client_that_disconnects_frees_its_kv(engine_port: int) -> None:
    stream = _sdk(engine_port).completions.create(
        model="tiny-llama", prompt="abandoned", max_tokens=1500, stream=True,
        extra_body={"ignore_eos": True})
    chunks = iter(stream)
    for _ in range(3):
        next(chunks)
    assert _get(engine_port, "/dtp_status")["running"] == 1
    stream.close()
    st = _wait_status(engine_port, lambda s: s["running"] == 0)
    assert all(e["kv_pool"]["free_blocks"] == e["kv_pool"]["total_blocks"]
               for e in st["engines"])


def test_priority_policy_and_fail_stop_when_an_engine_dies(tmp_path: pathlib.Path) -> None:
    port = free_port()
    log = tmp_path / "engine.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*ENGINE, "--switch-policy", "priority", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        _ready(port, proc)
        client = _sdk(port)
        plain = client.completions.create(model="tiny-llama", prompt="p", max_tokens=4)
        assert _get(port, "/dtp_status")["switches"] == 0 and plain.choices[0].text is not None
        client.completions.create(model="tiny-llama", prompt="urgent", max_tokens=4,
                                  extra_body={"priority": 5})
        st = _wait_status(port, lambda s: s["switches"] >= 2 and s["width"] == 1)
        assert st["last_switch"]["after"] == [[0], [1]]  # bound for it, then released
        os.kill(st["engines"][1]["pid"], 9)
        assert proc.wait(timeout=30) == 1  # fail-stop: the node agent sees the exit
        assert "engine failure" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _ready(port: int, proc: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            _get(port, "/v1/models")
            return True
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError("engine exited while starting") from None
            time.sleep(0.2)
    raise RuntimeError("engine not ready")
