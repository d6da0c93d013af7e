"""OpenAI's Batch API through the official `openai` SDK against a real `llmfabric ingress
--batch-dir` (a subprocess, API keys in an accounts database) over a simulated engine:
upload, create, poll to completed, read the output; an ingress killed mid-batch resumes
without answering a line twice; another owner's key never sees a file or batch."""

from __future__ import annotations

import asyncio
import io
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import openai
import orjson
import pytest

from llmfabric.accounts.store import AccountStore
from llmfabric.net.ports import free_port

from ._sim_engine_proc import running_engine
from .test_ingress_support import models_once_up, stop_group

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODEL = "llama-3.1-8b"


def _jsonl(n: int, max_tokens: int = 8, prefix: str = "req") -> bytes:
    return b"".join(orjson.dumps({
        "custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": MODEL, "max_tokens": max_tokens,
                 "messages": [{"role": "user", "content": f"question {i}"}]}}) + b"\n"
        for i in range(n))


@contextmanager
def _engine(tmp: pathlib.Path) -> Iterator[str]:
    with running_engine(tmp / "engine.log") as (base, _):
        yield base.removeprefix("http://")


@asynccontextmanager
async def _ingress(tmp: pathlib.Path, engine: str, port: int, *extra: str
                   ) -> AsyncIterator[subprocess.Popen[bytes]]:
    log = (tmp / f"ingress-{port}.log").open("ab")
    proc = subprocess.Popen(  # noqa: ASYNC220 (starting is quick)
        [sys.executable, "-c", "from llmfabric.cli.main import main; main()", "ingress",
         "--port", str(port), "--backend", f"{MODEL}={engine}", "--db",
         str(tmp / "accounts.db"), "--batch-dir", str(tmp / "batch"), *extra],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            stop_group(proc)
        log.close()


async def _keys(tmp: pathlib.Path, *owners: str) -> list[str]:
    async with await AccountStore.open(str(tmp / "accounts.db"), background=False) as store:
        return [(await store.create_key(f"{o}-key", o))[1] for o in owners]


_OPEN: list[openai.AsyncOpenAI] = []


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    while _OPEN:
        await _OPEN.pop().close()


def _client(port: int, key: str) -> openai.AsyncOpenAI:
    c = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key,
                           max_retries=0, timeout=30)
    _OPEN.append(c)
    return c


async def _until_done(c: openai.AsyncOpenAI, batch_id: str, within: float = 90.0,
                      proc: subprocess.Popen[bytes] | None = None) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        b = await c.batches.retrieve(batch_id)
        if b.status in ("completed", "failed", "expired", "cancelled"):
            return b
        assert loop.time() < deadline, f"batch still {b.status}: {b.request_counts}"
        assert proc is None or proc.poll() is None, "the ingress exited"
        await asyncio.sleep(0.2)


async def _lines(c: openai.AsyncOpenAI, file_id: str) -> list[dict[str, Any]]:
    content = await c.files.content(file_id)
    return [orjson.loads(line) for line in content.read().splitlines() if line.strip()]


async def test_sdk_upload_create_poll_and_read_output(tmp_path: pathlib.Path) -> None:
    (key,) = await _keys(tmp_path, "alice")
    port = free_port()
    with _engine(tmp_path) as engine:
        async with _ingress(tmp_path, engine, port) as proc:
            c = _client(port, key)
            await models_once_up(c, proc)
            f = await c.files.create(file=("prompts.jsonl", io.BytesIO(_jsonl(12))),
                                     purpose="batch")
            assert f.object == "file" and f.id.startswith("file-") and f.purpose == "batch"
            assert f.filename == "prompts.jsonl" and f.bytes == len(_jsonl(12))
            assert [x.id for x in (await c.files.list()).data] == [f.id]
            b = await c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                       completion_window="24h", metadata={"job": "eval"})
            assert b.status in ("validating", "in_progress") and b.metadata == {"job": "eval"}
            b = await _until_done(c, b.id, proc=proc)
            assert b.status == "completed", b
            assert b.request_counts is not None
            assert (b.request_counts.total, b.request_counts.completed,
                    b.request_counts.failed) == (12, 12, 0)
            assert b.output_file_id and b.error_file_id is None
            out = await _lines(c, b.output_file_id)
            assert b.usage is not None  # (the sum of the lines' own usage)
            assert b.usage.input_tokens == sum(
                r["response"]["body"]["usage"]["prompt_tokens"] for r in out) > 0
            assert b.usage.output_tokens == sum(
                r["response"]["body"]["usage"]["completion_tokens"] for r in out) > 0
            assert b.usage.total_tokens == b.usage.input_tokens + b.usage.output_tokens
            assert sorted(r["custom_id"] for r in out) == sorted(f"req-{i}" for i in range(12))
            for r in out:
                assert r["error"] is None and r["response"]["status_code"] == 200
                assert r["response"]["body"]["choices"][0]["message"]["content"]
            assert [x.id for x in (await c.batches.list()).data] == [b.id]
            # a chat request on the same client still works (the kept-alive connection
            # may now be the batch app's)
            r = await c.chat.completions.create(model=MODEL, messages=[
                {"role": "user", "content": "hi"}], max_tokens=4)
            assert r.choices[0].message.content
            deleted = await c.files.delete(f.id)
            assert deleted.deleted
            with pytest.raises(openai.NotFoundError):
                await c.files.retrieve(f.id)


async def test_bad_input_fails_the_batch_with_line_numbers(tmp_path: pathlib.Path) -> None:
    (key,) = await _keys(tmp_path, "alice")
    port = free_port()
    bad = _jsonl(2) + b"not json\n" + _jsonl(1)  # line 3 malformed, line 4 repeats req-0
    with _engine(tmp_path) as engine:
        async with _ingress(tmp_path, engine, port) as proc:
            c = _client(port, key)
            await models_once_up(c, proc)
            f = await c.files.create(file=("bad.jsonl", io.BytesIO(bad)), purpose="batch")
            b = await c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                       completion_window="24h")
            b = await _until_done(c, b.id, proc=proc)
            assert b.status == "failed" and b.errors is not None
            assert [(e.line, e.code) for e in b.errors.data or []] == [
                (3, "invalid_json_line"), (4, "duplicate_custom_id")]
            with pytest.raises(openai.BadRequestError):
                await c.files.create(file=("x.jsonl", io.BytesIO(b"{}")), purpose="assistants")
            with pytest.raises(openai.BadRequestError):
                await c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                       completion_window="1h")  # type: ignore[arg-type]


async def test_a_killed_ingress_resumes_without_answering_a_line_twice(
        tmp_path: pathlib.Path) -> None:
    (key,) = await _keys(tmp_path, "alice")
    port = free_port()
    n = 24
    with _engine(tmp_path) as engine:
        async with _ingress(tmp_path, engine, port, "--batch-concurrency", "1") as proc:
            c = _client(port, key)
            await models_once_up(c, proc)
            f = await c.files.create(file=("p.jsonl", io.BytesIO(_jsonl(n, max_tokens=64))),
                                     purpose="batch")
            b = await c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                       completion_window="24h")
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while True:  # kill it part way
                got = await c.batches.retrieve(b.id)
                assert got.request_counts is not None
                if got.request_counts.completed >= 3:
                    break
                assert loop.time() < deadline
                await asyncio.sleep(0.05)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        assert got.request_counts.completed < n
        port2 = free_port()
        async with _ingress(tmp_path, engine, port2) as proc2:
            c2 = _client(port2, key)
            await models_once_up(c2, proc2)
            done = await _until_done(c2, b.id, proc=proc2)
            assert done.status == "completed", done
            assert done.request_counts is not None and done.request_counts.completed == n
            assert done.output_file_id is not None
            ids = [r["custom_id"] for r in await _lines(c2, done.output_file_id)]
            assert sorted(ids) == sorted(f"req-{i}" for i in range(n))  # each exactly once


async def test_another_owner_never_sees_files_or_batches(tmp_path: pathlib.Path) -> None:
    alice_key, bob_key = await _keys(tmp_path, "alice", "bob")
    port = free_port()
    with _engine(tmp_path) as engine:
        async with _ingress(tmp_path, engine, port) as proc:
            alice, bob = _client(port, alice_key), _client(port, bob_key)
            await models_once_up(alice, proc)
            f = await alice.files.create(file=("a.jsonl", io.BytesIO(_jsonl(2))),
                                         purpose="batch")
            b = await alice.batches.create(input_file_id=f.id,
                                           endpoint="/v1/chat/completions",
                                           completion_window="24h")
            for call in (lambda: bob.files.retrieve(f.id), lambda: bob.files.content(f.id),
                         lambda: bob.files.delete(f.id), lambda: bob.batches.retrieve(b.id),
                         lambda: bob.batches.cancel(b.id),
                         lambda: bob.batches.create(input_file_id=f.id,
                                                    endpoint="/v1/chat/completions",
                                                    completion_window="24h")):
                with pytest.raises(openai.NotFoundError):
                    await call()
            assert (await bob.files.list()).data == []
            assert (await bob.batches.list()).data == []
            done = await _until_done(alice, b.id, proc=proc)
            assert done.status == "completed" and done.output_file_id is not None
            with pytest.raises(openai.NotFoundError):
                await bob.files.content(done.output_file_id)
            with pytest.raises(openai.AuthenticationError):
                await _client(port, "lf-bogus").files.list()


async def test_a_fabric_ingress_node_serves_the_batch_api(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `llmfabric start --ingress --batch-dir` (node/ingress_link.py): the routes behind the
    # lean front's hand-over, the runner over the node's core. No provider serves the model,
    # so each line's answer is the core's 404, in the error file (at once: no grace for a
    # registry that gossip would fill, runner.MODEL_GRACE_S).
    from llmfabric.batch import runner
    from llmfabric.node.config import build_config
    from llmfabric.node.daemon import Node

    monkeypatch.setattr(runner, "MODEL_GRACE_S", 0.0)

    node = Node(build_config({}, {
        "home": tmp_path / "n", "listen": "127.0.0.1:0", "http_listen": "127.0.0.1:0",
        "preset": "local", "network_secret": "s" * 16, "gpu": "cpu", "ingress": True,
        "auth": False, "batch_dir": tmp_path / "batch", "batch_retention_s": "30d"}))
    await node.start()
    try:
        c = _client(int(node.http_addr.rsplit(":", 1)[1]), "x")
        f = await c.files.create(file=("p.jsonl", io.BytesIO(_jsonl(3))), purpose="batch")
        assert f.expires_at == f.created_at + 30 * 86_400  # (the node's retention)
        b = await c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")
        done = await _until_done(c, b.id, within=30)
        assert done.status == "completed" and done.output_file_id is None
        assert done.request_counts is not None and done.request_counts.failed == 3
        assert done.error_file_id is not None
        errs = await _lines(c, done.error_file_id)
        assert {r["response"]["status_code"] for r in errs} == {404}
    finally:
        await node.stop(drain=False)


async def test_sdk_expires_after_and_the_operator_s_retention(tmp_path: pathlib.Path) -> None:
    # The SDK sends expires_after as multipart fields expires_after[anchor] and [seconds],
    # and output_expires_after in the create's JSON; --batch-retention bounds both.
    (key,) = await _keys(tmp_path, "alice")
    port = free_port()
    with _engine(tmp_path) as engine:
        async with _ingress(tmp_path, engine, port, "--batch-retention", "2d") as proc:
            c = _client(port, key)
            await models_once_up(c, proc)
            f = await c.files.create(file=("p.jsonl", io.BytesIO(_jsonl(2))), purpose="batch",
                                     expires_after={"anchor": "created_at", "seconds": 3600})
            assert f.expires_at == f.created_at + 3600
            kept = await c.files.create(file=("q.jsonl", io.BytesIO(_jsonl(1))),
                                        purpose="batch")
            assert kept.expires_at == kept.created_at + 2 * 86_400  # (the retention)
            assert (await c.files.retrieve(kept.id)).expires_at == kept.expires_at
            with pytest.raises(openai.BadRequestError) as refused:
                await c.files.create(file=("r.jsonl", io.BytesIO(_jsonl(1))),
                                     purpose="batch",
                                     expires_after={"anchor": "created_at", "seconds": 60})
            assert refused.value.code == "invalid_request"
            assert refused.value.param == "expires_after"
            b = await c.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                output_expires_after={"anchor": "created_at", "seconds": 7200})
            b = await _until_done(c, b.id, proc=proc)
            assert b.status == "completed" and b.output_file_id is not None
            out = await c.files.retrieve(b.output_file_id)
            assert out.expires_at == out.created_at + 7200
            with pytest.raises(openai.BadRequestError):
                await c.batches.create(
                    input_file_id=f.id, endpoint="/v1/chat/completions",
                    completion_window="24h",
                    output_expires_after={"anchor": "created_at", "seconds": 10**8})


@pytest.mark.hostile
async def test_a_key_at_three_requests_a_minute_does_not_hold_up_another_owner(
        tmp_path: pathlib.Path) -> None:
    # Mallory's key allows 3 requests a minute (for her lines, and apart from them for her
    # Files and Batches calls: upload, create, retrieve); her 30-line batch starts first
    # and each of its lines is refused (429, Retry-After up to 20 s) after the third.
    # Alice's batch on the same runner (2 slots) still finishes in seconds.
    async with await AccountStore.open(str(tmp_path / "accounts.db"),
                                       background=False) as store:
        mallory = (await store.create_key("m", "mallory", requests_per_min=3))[1]
        alice = (await store.create_key("a", "alice"))[1]
    port = free_port()
    with _engine(tmp_path) as engine:
        async with _ingress(tmp_path, engine, port, "--batch-concurrency", "2") as proc:
            m, a = _client(port, mallory), _client(port, alice)
            await models_once_up(a, proc)
            fm = await m.files.create(file=("m.jsonl", io.BytesIO(_jsonl(30))),
                                      purpose="batch")
            bm = await m.batches.create(input_file_id=fm.id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
            await asyncio.sleep(3)  # (her lines now wait out their Retry-After)
            fa = await a.files.create(file=("a.jsonl", io.BytesIO(_jsonl(10))),
                                      purpose="batch")
            ba = await a.batches.create(input_file_id=fa.id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
            done = await _until_done(a, ba.id, within=20, proc=proc)
            assert done.status == "completed" and done.request_counts is not None
            assert done.request_counts.completed == 10
            slow = await m.batches.retrieve(bm.id)
            assert slow.status == "in_progress" and slow.request_counts is not None
            assert slow.request_counts.completed <= 4
