"""Budgets, fair queueing and usage export through a real ingress (SQLite accounts, real
sockets, the openai SDK): concurrent requests cannot overspend a budget, a flooding owner
cannot starve another, refusals are 429 with the real wait, usage exports as CSV/JSON."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from llmfabric.accounts.fairqueue import FairQueue
from llmfabric.accounts.ratelimit import RateLimiter
from llmfabric.accounts.store import AccountStore
from llmfabric.accounts.tenancy_http import add_tenancy_routes
from llmfabric.clock import SystemClock
from llmfabric.forward import HttpForwarder
from llmfabric.front.web_app import INGRESS_KEY, build_ingress_app
from llmfabric.ingress import IngressConfig, StaticCandidateSource
from llmfabric.ingress.app import Ingress
from llmfabric.net.ports import free_port
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing import Candidate
from llmfabric.tenancy.accounts_auth import AccountsAuth
from llmfabric.tenancy.attach import attach_tenancy
from llmfabric.tenancy.gate import TenancyGate, reservation, reservation_parts
from llmfabric.testing.poll import wait_until

from .test_ingress_support import Backend, serve

pytestmark = pytest.mark.integration

MSG: list[Any] = [{"role": "user", "content": "hi"}]


class GatedBackend(Backend):
    """The mock engine; requests wait for `open` and their order (by `user`) is kept."""

    def __init__(self) -> None:
        super().__init__("engine")
        self.open = asyncio.Event()
        self.arrived: list[str] = []

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.arrived.append(str(body.get("user", "")))
        await self.open.wait()
        return await super().chat(request)


@dataclass(frozen=True)
class Fabric:
    store: AccountStore
    engine: GatedBackend
    ingress: Ingress
    base: str  # http://127.0.0.1:PORT


# How a test equips the ingress before it serves (tenancy parts, routes, a gate).
Setup = Callable[[Ingress, web.Application, AccountStore], Awaitable[None]]


async def with_budgets(ingress: Ingress, app: web.Application, store: AccountStore) -> None:
    """Budgets enforced (attach_tenancy) and the tenancy routes over them."""
    parts = await attach_tenancy(ingress, store)
    add_tenancy_routes(app, store, parts.budgets)

    async def close(_app: web.Application) -> None:
        await parts.aclose()  # (its budget sync task)

    app.on_cleanup.append(close)


async def usage_routes_only(ingress: Ingress, app: web.Application, store: AccountStore) -> None:
    add_tenancy_routes(app, store, None)


@contextlib.asynccontextmanager
async def fabric(tmp_path: Path, setup: Setup, *, engine_open: bool = True,
                 limiter: RateLimiter | None = None) -> AsyncIterator[Fabric]:
    """An ingress (SQLite accounts; `limiter`: the keys' rate limits) in front of one gated
    mock engine (model "m", context 4096), torn down after."""
    store = await AccountStore.open(f"sqlite:///{tmp_path / 'acc.db'}", background=False)
    engine = GatedBackend()
    if engine_open:
        engine.open.set()
    e_port, i_port = free_port(), free_port()
    runners: list[web.AppRunner] = []
    try:
        runners.append(await serve(engine.app(), e_port))
        cand = Candidate("n1", "peer-n1", "p", f"127.0.0.1:{e_port}", (), Hardware("H100", 1),
                         ServedModel("m"), LoadHints())
        auth = AccountsAuth(store, limiter)
        app = build_ingress_app(IngressConfig(), StaticCandidateSource([cand]), HttpForwarder(),
                                auth=auth, usage_sink=auth)
        ingress: Ingress = app[INGRESS_KEY]
        await setup(ingress, app, store)
        runners.append(await serve(app, i_port))
        yield Fabric(store, engine, ingress, f"http://127.0.0.1:{i_port}")
    finally:
        for r in reversed(runners):
            await r.cleanup()
        await store.aclose()


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    content_type: str
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


async def call(http: aiohttp.ClientSession, method: str, url: str, key: str = "",
               **kwargs: Any) -> Reply:
    """One request (`key` as its bearer token when given), read whole."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with http.request(method, url, headers=headers, **kwargs) as r:
        return Reply(r.status, r.headers, r.content_type, await r.text())


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


async def test_concurrent_requests_cannot_overspend_a_budget(tmp_path: Path) -> None:
    async with fabric(tmp_path, with_budgets, engine_open=False) as f:
        _, admin = await f.store.create_key("root", "admin", admin=True)
        alice_key, alice = await f.store.create_key("app", "alice")
        _, bob = await f.store.create_key("app", "bob")
        budget = f"{f.base}/v1/fabric/budgets/owner/alice"
        per_request = reservation({"model": "m", "messages": MSG, "max_tokens": 100})
        async with aiohttp.ClientSession() as http:
            for token, status in ((alice, 403), (admin, 200)):
                r = await call(http, "PUT", budget, token,
                               json={"tokens": 5 * per_request, "period": "day"})
                assert r.status == status
            for bad in ({"tokens": -1}, {"tokens": 5, "period": "week"}, {"tokens": "x"},
                        {"tokens": 5, "extra": 1}):
                assert (await call(http, "PUT", budget, admin, json=bad)).status == 400
            r = await call(http, "PUT", f"{f.base}/v1/fabric/budgets/group/x", admin,
                           json={"tokens": 5})
            assert r.status == 400

        client = openai.AsyncOpenAI(base_url=f"{f.base}/v1", api_key=alice, max_retries=0)

        async def one() -> str:
            try:
                await client.chat.completions.create(model="m", messages=MSG, max_tokens=100)
            except openai.RateLimitError as e:
                assert e.code == "insufficient_quota"
                wait = int(e.response.headers["Retry-After"])
                assert 1 <= wait <= 86_400  # until the UTC day renews
                return "refused"
            return "ok"

        tasks = [asyncio.create_task(one()) for _ in range(20)]
        # 5 reserved and forwarded, 15 refused meanwhile
        await wait_until(
            lambda: len(f.engine.arrived) >= 5 and sum(t.done() for t in tasks) >= 15, 20.0)
        f.engine.open.set()
        results = await asyncio.gather(*tasks)
        assert results.count("ok") == 5 and results.count("refused") == 15
        # bob is not alice: no budget of his
        bob_client = openai.AsyncOpenAI(base_url=f"{f.base}/v1", api_key=bob, max_retries=0)
        await bob_client.chat.completions.create(model="m", messages=MSG)
        await bob_client.close()
        async with aiohttp.ClientSession() as http:
            [row] = (await call(http, "GET", f"{f.base}/v1/fabric/budgets", alice)).json()["data"]
            # settled to what the engine reported (7 + 4 tokens each), nothing held
            assert row["spent"] == 5 * 11 and row["held"] == 0 and row["name"] == "alice"
            m = _samples((await call(http, "GET", f"{f.base}/metrics")).text)
        assert m[("llmfabric_ingress_admission_refusals_total",
                  (("reason", "budget_exceeded"),))] == 15
        assert m[("llmfabric_ingress_tokens_total",
                  (("kind", "prompt"), ("model", "m"), ("owner", "alice")))] == 35
        assert m[("llmfabric_ingress_errors_total",
                  (("code", "insufficient_quota"), ("status", "429")))] == 15
        # loaded at start, synced every 2 s since: never far behind the database
        assert 0 <= m[("llmfabric_ingress_budget_sync_age_seconds", ())] < 30
        # freed budget: a smaller request fits again
        await client.chat.completions.create(model="m", messages=MSG, max_tokens=1)
        await client.close()
        rows = await f.store.usage(key_id=alice_key.id)
        assert sum(r.requests for r in rows) == 6


@pytest.mark.hostile
async def test_requests_without_max_tokens_reserve_the_models_context(tmp_path: Path) -> None:
    """A budgeted key sends 10 requests at once with no cap field; the engine would
    generate up to the model's context (4096, from its node's record) for each. Before,
    each reserved 512 completion tokens, so all 10 were admitted against a budget that pays
    for 2 such answers; now each reserves the context: 2 go, 8 are refused with a hint."""
    async with fabric(tmp_path, with_budgets, engine_open=False) as f:
        _, admin = await f.store.create_key("root", "admin", admin=True)
        alice_key, alice = await f.store.create_key("app", "alice")
        prompt, completion = reservation_parts({"messages": MSG})[0], 4096
        async with aiohttp.ClientSession() as http:
            r = await call(http, "PUT", f"{f.base}/v1/fabric/budgets/key/{alice_key.id}",
                           admin, json={"tokens": 2 * (prompt + completion) + 100,
                                        "period": "day"})
            assert r.status == 200
        client = openai.AsyncOpenAI(base_url=f"{f.base}/v1", api_key=alice, max_retries=0)
        hints: list[str] = []

        async def one() -> str:
            try:
                await client.chat.completions.create(model="m", messages=MSG)
            except openai.RateLimitError as e:
                hints.append(str(e))
                return "refused"
            return "ok"

        tasks = [asyncio.create_task(one()) for _ in range(10)]
        await wait_until(
            lambda: len(f.engine.arrived) >= 2 and sum(t.done() for t in tasks) >= 8, 20.0)
        f.engine.open.set()
        results = await asyncio.gather(*tasks)
        assert results.count("ok") == 2 and results.count("refused") == 8
        assert all("set max_tokens" in h and "4096" in h for h in hints)
        # what was used is settled: a request with a cap fits in what is left
        await client.chat.completions.create(model="m", messages=MSG, max_tokens=50)
        await client.close()


@pytest.mark.hostile
async def test_a_burst_cannot_pass_a_tokens_per_min_limit(tmp_path: Path) -> None:
    """A key limited to 1,000 tokens/min (and no requests/min limit) sends 10 requests of
    max_tokens 300 at once. Before, every one passed while its bucket was positive and was
    charged after (3,000+ tokens in the minute); now each holds its worst case at
    admission: 4 go (the bucket and the last one's excess), 6 are refused, and the holds
    are given back when they end (only what was used stays charged)."""
    async with fabric(tmp_path, with_budgets, engine_open=False,
                      limiter=RateLimiter(SystemClock())) as f:
        _, key = await f.store.create_key("app", "alice", tokens_per_min=1000)
        client = openai.AsyncOpenAI(base_url=f"{f.base}/v1", api_key=key, max_retries=0)

        async def one() -> str:
            try:
                await client.chat.completions.create(model="m", messages=MSG, max_tokens=300)
            except openai.RateLimitError as e:
                assert e.code == "rate_limit_exceeded"
                assert int(e.response.headers["Retry-After"]) >= 1
                return "refused"
            return "ok"

        tasks = [asyncio.create_task(one()) for _ in range(10)]
        await wait_until(
            lambda: len(f.engine.arrived) >= 4 and sum(t.done() for t in tasks) >= 6, 20.0)
        f.engine.open.set()
        results = await asyncio.gather(*tasks)
        assert results.count("ok") == 4 and results.count("refused") == 6
        # 4 x 11 tokens used: the bucket has room again at once
        await client.chat.completions.create(model="m", messages=MSG, max_tokens=300)
        await client.close()


async def test_a_flooding_owner_does_not_starve_another(tmp_path: Path) -> None:
    queue = FairQueue(1, max_waiting_per_owner=12, now=time.monotonic)

    async def fair_gate(ingress: Ingress, app: web.Application, store: AccountStore) -> None:
        ingress.use_gate(TenancyGate(None, queue, on_refused=ingress.metrics.observe_refusal))

    async with fabric(tmp_path, fair_gate, engine_open=False) as f:
        _, flood = await f.store.create_key("app", "flood")
        _, light = await f.store.create_key("app", "light")
        base = f"{f.base}/v1"
        fc = openai.AsyncOpenAI(base_url=base, api_key=flood, max_retries=0)
        lc = openai.AsyncOpenAI(base_url=base, api_key=light, max_retries=0)

        async def ask(c: openai.AsyncOpenAI, user: str) -> str:
            try:
                await c.chat.completions.create(model="m", messages=MSG, user=user)
            except openai.RateLimitError as e:
                assert e.code == "rate_limit_exceeded"
                assert int(e.response.headers["Retry-After"]) >= 1
                return "refused"
            return "ok"

        floods = [asyncio.create_task(ask(fc, "flood")) for _ in range(16)]
        # one in flight, 12 waiting, 3 refused at once (the owner's queue is full)
        await wait_until(
            lambda: queue.waiting("flood") >= 12 and sum(t.done() for t in floods) >= 3, 20.0)
        lt = asyncio.create_task(ask(lc, "light"))
        await wait_until(lambda: queue.waiting("light") >= 1, 20.0)
        f.engine.open.set()
        assert await lt == "ok"
        results = await asyncio.gather(*floods)
        assert results.count("refused") == 3 and results.count("ok") == 13
        # the light owner's request went right after the one flood request in flight
        assert f.engine.arrived[:2] == ["flood", "light"]
        await fc.close()
        await lc.close()


async def test_usage_export_csv_and_json_by_owner_and_range(tmp_path: Path) -> None:
    async with fabric(tmp_path, usage_routes_only) as f:
        _, admin = await f.store.create_key("root", "admin", admin=True)
        _, alice = await f.store.create_key("app", "alice")
        _, bob = await f.store.create_key("app", "bob")
        for key in (alice, alice, bob):
            c = openai.AsyncOpenAI(base_url=f"{f.base}/v1", api_key=key, max_retries=0)
            await c.chat.completions.create(model="m", messages=MSG)
            await c.close()
        url = f"{f.base}/v1/fabric/usage/export"
        async with aiohttp.ClientSession() as http:
            r = await call(http, "GET", url, admin, params={"format": "csv"})
            assert r.status == 200 and r.content_type == "text/csv"
            rows = list(csv.DictReader(io.StringIO(r.text)))
            assert sorted((x["owner"], x["requests"], x["total_tokens"]) for x in rows) == [
                ("alice", "2", "22"), ("bob", "1", "11")]
            # a non-admin key sees its owner's rows only, and may not ask for others'
            doc = (await call(http, "GET", url, alice)).json()
            assert {x["owner"] for x in doc["data"]} == {"alice"}
            assert doc["totals"] == {"requests": 2, "prompt_tokens": 14, "completion_tokens": 8}
            assert (await call(http, "GET", url, alice, params={"owner": "bob"})).status == 403
            for empty in ({"since": "2999-01-01"}, {"model": "other"}):
                assert (await call(http, "GET", url, admin, params=empty)).json()["data"] == []
            for bad in ({"format": "xml"}, {"since": "yesterday"}, {"until": "2020-13"},
                        {"since": "2026-02-02", "until": "2026-02-01"}):
                assert (await call(http, "GET", url, admin, params=bad)).status == 400, bad
            assert (await call(http, "GET", url)).status == 401


async def test_a_spend_budget_refuses_once_the_priced_usage_reaches_it(tmp_path: Path) -> None:
    async with fabric(tmp_path, with_budgets) as f:
        _, admin = await f.store.create_key("root", "admin", admin=True)
        _, bob = await f.store.create_key("app", "bob")
        base = f"{f.base}/v1/fabric"
        async with aiohttp.ClientSession() as http:
            # $1000 / $3000 per million: one request (7 + 4 tokens) costs 0.019 USD
            r = await call(http, "PUT", f"{base}/prices/m", admin, json={
                "prompt_usd_per_mtok": 1000, "completion_usd_per_mtok": 3000})
            assert r.status == 200
            for bad in ({"prompt_usd_per_mtok": -1, "completion_usd_per_mtok": 1},
                        {"prompt_usd_per_mtok": "NaN", "completion_usd_per_mtok": 1},
                        {"prompt_usd_per_mtok": 1}):
                assert (await call(http, "PUT", f"{base}/prices/m", admin, json=bad)).status == 400
            assert (await call(http, "PUT", f"{base}/prices/m", bob, json={})).status == 403
            r = await call(http, "PUT", f"{base}/budgets/owner/bob", admin,
                           json={"usd": 0.05, "period": "month"})
            assert r.status == 200 and r.json()["usd"] == 0.05
        client = openai.AsyncOpenAI(base_url=f"{f.base}/v1", api_key=bob, max_retries=0)
        ok = 0
        with pytest.raises(openai.RateLimitError) as e:
            for _ in range(10):
                await client.chat.completions.create(model="m", messages=MSG, max_tokens=4)
                ok += 1
        await client.close()
        assert ok == 2  # 0.019 + 0.019 spent; a third's reservation would pass 0.05
        assert e.value.code == "insufficient_quota" and "$0.05" in str(e.value)
        async with aiohttp.ClientSession() as http:
            [row] = (await call(http, "GET", f"{base}/budgets", admin)).json()["data"]
            assert row["unit"] == "usd" and row["spent"] == 2 * 19_000 and row["held"] == 0
            assert (await call(http, "GET", f"{base}/prices", admin)).json()["data"] == [
                {"model": "m", "prompt_usd_per_mtok": 1000.0, "completion_usd_per_mtok": 3000.0}]


async def test_a_team_budget_binds_every_owner_in_the_team(tmp_path: Path) -> None:
    async with fabric(tmp_path, with_budgets) as f:
        _, admin = await f.store.create_key("root", "admin", admin=True)
        _, alice = await f.store.create_key("app", "alice")
        _, bob = await f.store.create_key("app", "bob")
        _, carol = await f.store.create_key("app", "carol")
        base = f"{f.base}/v1/fabric"
        per_request = reservation({"model": "m", "messages": MSG, "max_tokens": 100})
        async with aiohttp.ClientSession() as http:
            for owner in ("alice", "bob"):
                r = await call(http, "PUT", f"{base}/teams/{owner}", admin, json={"team": "nlp"})
                assert r.status == 200 and r.json() == {"owner": owner, "team": "nlp"}
            for bad in ({"team": ""}, {"team": "x" * 201}, {"team": "a", "more": 1}, {}):
                assert (await call(http, "PUT", f"{base}/teams/carol", admin, json=bad)
                        ).status == 400
            r = await call(http, "PUT", f"{base}/teams/carol", carol, json={"team": "nlp"})
            assert r.status == 403  # only an admin groups owners
            r = await call(http, "PUT", f"{base}/budgets/team/nlp", admin,
                           json={"tokens": per_request + 11, "period": "day"})
            assert r.status == 200 and r.json()["scope"] == "team"
            # (a request reserves `per_request`, then settles to the 7 + 4 tokens it used:
            # the first two fit, the third's reservation would pass the budget)

            async def chat(key: str) -> int:
                r = await call(http, "POST", f"{f.base}/v1/chat/completions", key, json={
                    "model": "m", "messages": MSG, "max_tokens": 100})
                if r.status == 429:
                    body = r.json()
                    assert body["error"]["code"] == "insufficient_quota"
                    assert "team 'nlp'" in body["error"]["message"]
                    assert int(r.headers["Retry-After"]) >= 1
                return r.status

            # alice and bob share the team's budget: two requests in all, then refusals
            assert [await chat(alice), await chat(bob), await chat(alice), await chat(bob)] == [
                200, 200, 429, 429]
            assert await chat(carol) == 200  # not in the team
            [row] = (await call(http, "GET", f"{base}/budgets", bob)).json()["data"]
            assert row["scope"] == "team" and row["spent"] == 2 * 11  # bob sees his team's
            r = await call(http, "GET", f"{base}/teams", bob)
            assert r.json()["data"] == [{"owner": "bob", "team": "nlp"}]
            assert (await call(http, "DELETE", f"{base}/teams/bob", admin)).status == 200
            assert (await call(http, "DELETE", f"{base}/teams/bob", admin)).status == 404
            assert await chat(bob) == 200  # out of the team: its budget no longer binds him
            assert await chat(alice) == 429
