"""A budget holds across the worker processes of `llmfabric ingress --workers 2`, which share
one SQLite accounts database: set with `llmfabric keys budget set` while the ingress runs,
it reaches both workers, and what one worker spent counts in the other (each worker syncs
its book with the database every 2 s; docs/accounts.md "One database, several processes").
Before the sync, a budget set after start was never enforced, and each worker would have
admitted a whole budget's worth of its own. Every request opens a new connection, so the
kernel's SO_REUSEPORT hash spreads them over both workers."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from llmfabric.accounts import AccountStore
from llmfabric.net.ports import free_port

from .test_ingress_support import Backend, models_once_up, serve, stop_group

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MSG: list[Any] = [{"role": "user", "content": "hi"}]
CLI = [sys.executable, "-c", "from llmfabric.cli.main import main; main()"]
SETTLED_S = 5.0  # the worker's ledger flush (1 s) + the other's budget sync (2 s) + margin


async def test_a_budget_holds_across_two_ingress_workers(tmp_path: Path) -> None:
    db = str(tmp_path / "accounts.db")
    async with await AccountStore.open(db, background=False) as store:
        key, plain = await store.create_key("app", "frank")
    bport, iport = free_port(), free_port()
    runner = await serve(Backend("A").app(), bport)
    log = (tmp_path / "ingress.log").open("wb")
    proc = subprocess.Popen(  # noqa: ASYNC220 (starting is quick; we never block on it)
        [*CLI, "ingress", "--port", str(iport), "--backend", f"m=127.0.0.1:{bport}",
         "--db", db, "--workers", "2"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )

    async def one() -> str:
        """One request on a new connection: "ok" or "429"."""
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{iport}/v1",
                                      api_key=plain, max_retries=0, timeout=10) as c:
            try:
                r = await c.chat.completions.create(model="m", messages=MSG, max_tokens=4)
            except openai.RateLimitError as exc:
                assert "budget" in str(exc)
                return "429"
            assert r.usage is not None and r.usage.total_tokens == 11  # 7 + 4
            return "ok"

    try:
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{iport}/v1", api_key=plain,
                                      max_retries=0, timeout=10) as c:
            await models_once_up(c, proc)
        assert [await one() for _ in range(4)] == ["ok"] * 4  # no budget yet
        set_budget = subprocess.run(  # noqa: ASYNC221 (a short CLI call)
            [*CLI, "keys", "budget", "set", "owner", "frank", "--tokens", "66", "--period",
             "month", "--db", db],
            capture_output=True, text=True, timeout=60)
        assert set_budget.returncode == 0, set_budget.stderr
        await asyncio.sleep(SETTLED_S)
        # 44 of 66 tokens spent this month (the ledger at the workers' sync): room for 2 more.
        outcomes = []
        for _ in range(12):
            outcomes.append(await one())
            if outcomes[-1] == "ok":
                await asyncio.sleep(SETTLED_S)  # let the other worker see it
        assert outcomes.count("ok") == 2 and outcomes[:2] == ["ok", "ok"], outcomes
        listed = subprocess.run(  # noqa: ASYNC221
            [*CLI, "keys", "budget", "list", "--db", db], capture_output=True, text=True,
            timeout=60)
        assert "66 tokens per month, spent 66" in listed.stdout, listed.stdout
    finally:
        stop_group(proc)
        log.close()
        await runner.cleanup()
    assert proc.returncode == 0, (tmp_path / "ingress.log").read_text()
    async with await AccountStore.open(db, background=False) as store:
        (row,) = await store.usage(key_id=key.id)
        assert row.requests == 6 and row.prompt_tokens + row.completion_tokens == 66
