"""Course keys through the official openai SDK: a standalone `llmfabric ingress --db` over
the simulated engine (llama-8b, pinned as "course" too) and a mock engine (qwen-7b). A key
limited to llama-8b is served by its id and by the pin, sees only llama-8b in
`models.list()`, gets PermissionDeniedError (403) for qwen-7b however it asks, fallbacks
included; a key past its expiry gets AuthenticationError (401 expired_api_key) on its next
request although the ingress remembered it."""

from __future__ import annotations

import asyncio
import pathlib
import subprocess
import sys
import time
from typing import Any

import openai
import pytest

from llmfabric.accounts import AccountStore
from llmfabric.net.ports import free_port

from ._sim_engine_proc import running_engine
from .test_ingress_support import Backend, models_once_up, serve, stop_group

MSG: list[Any] = [{"role": "user", "content": "hi"}]


async def test_course_keys_with_the_openai_sdk(tmp_path: pathlib.Path) -> None:
    db = str(tmp_path / "accounts.db")
    async with await AccountStore.open(db, background=False) as store:
        _, course = await store.create_key("course", "cs101", models=["llama-8b"],
                                           expires_at=time.time() + 86_400)
        _, free = await store.create_key("staff", "cs101")
    qport, iport = free_port(), free_port()
    qwen = await serve(Backend("Q").app(), qport)
    log_path = tmp_path / "ingress.log"
    with running_engine(tmp_path / "engine.log", model="llama-8b") as (sim, _), \
            log_path.open("wb") as log:
        proc = subprocess.Popen(  # noqa: ASYNC220 (starting is quick; we never block on it)
            [sys.executable, "-c", "from llmfabric.cli.main import main; main()", "ingress",
             "--port", str(iport), "--backend", f"llama-8b={sim.removeprefix('http://')}",
             "--backend", f"qwen-7b=127.0.0.1:{qport}", "--model-alias", "course=llama-8b",
             "--db", db],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        clients: list[openai.AsyncOpenAI] = []

        def client(key: str) -> openai.AsyncOpenAI:
            clients.append(openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{iport}/v1",
                                              api_key=key, max_retries=0, timeout=20))
            return clients[-1]

        try:
            c = client(course)
            assert [m.id for m in (await models_once_up(c, proc)).data] == ["llama-8b"]
            assert [m.id for m in (await client(free).models.list()).data] == [
                "llama-8b", "qwen-7b"]
            for name in ("llama-8b", "course"):
                r = await c.chat.completions.create(model=name, messages=MSG, max_tokens=4)
                assert r.usage is not None and r.usage.completion_tokens == 4
            stream = await c.chat.completions.create(model="llama-8b", messages=MSG,
                                                     max_tokens=3, stream=True)
            assert len([ch async for ch in stream if ch.choices]) >= 3
            for ask in ({"model": "qwen-7b"}, {"model": "nope", "extra_body": {
                    "models": ["qwen-7b"]}}):
                with pytest.raises(openai.PermissionDeniedError) as exc:
                    await c.chat.completions.create(messages=MSG, **ask)
                assert exc.value.code == "model_not_found"
                assert "llama" not in str(exc.value.message)
            # a disallowed primary moves on to the allowed fallback
            r = await c.chat.completions.create(model="qwen-7b", messages=MSG, max_tokens=2,
                                                extra_body={"models": ["course"]})
            assert r.usage is not None and r.usage.completion_tokens == 2
            r = await client(free).chat.completions.create(model="qwen-7b", messages=MSG)
            assert r.choices[0].message.content == "hello from Q"

            # expiry, on the ingress's cached path
            async with await AccountStore.open(db, background=False) as store:
                _, brief = await store.create_key("brief", "cs101",
                                                  expires_at=time.time() + 2)
            b = client(brief)
            await b.chat.completions.create(model="qwen-7b", messages=MSG)  # remembered
            await asyncio.sleep(2.1)
            with pytest.raises(openai.AuthenticationError) as auth:
                await b.chat.completions.create(model="qwen-7b", messages=MSG)
            assert auth.value.code == "expired_api_key"
            assert "expired at" in auth.value.message
        finally:
            for opened in clients:
                await opened.close()
            stop_group(proc)
            await qwen.cleanup()
    assert proc.returncode == 0, log_path.read_text()
