"""Budgets, fair queueing and usage export through a real ingress (SQLite accounts, real
sockets, the openai SDK): concurrent requests cannot overspend a budget, a flooding owner
cannot starve another, refusals are 429 with the real wait, usage exports as CSV/JSON."""

from __future__ import annotations

import asyncio
import csv
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from llmfabric.accounts.fairqueue import FairQueue
from llmfabric.accounts.store import AccountStore
from llmfabric.accounts.tenancy_http import add_tenancy_routes
from llmfabric.ingress import HttpForwarder, IngressConfig, StaticCandidateSource
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.front.web_app import INGRESS_KEY, build_ingress_app
from llmfabric.ingress.tenancy.accounts_auth import AccountsAuth
from llmfabric.ingress.tenancy.attach import attach_tenancy
from llmfabric.ingress.tenancy.gate import TenancyGate, reservation
from llmfabric.node.ports import free_port
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing import Candidate

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


async def _fabric(tmp_path: Path) -> tuple[AccountStore, GatedBackend, web.Application, int,
                                           list[web.AppRunner]]:
    store = await AccountStore.open(f"sqlite:///{tmp_path / 'acc.db'}", background=False)
    engine = GatedBackend()
    e_port, i_port = free_port(), free_port()
    runners = [await serve(engine.app(), e_port)]
    cand = Candidate("n1", "peer-n1", "p", f"127.0.0.1:{e_port}", (), Hardware("H100", 1),
                     ServedModel("m"), LoadHints())
    auth = AccountsAuth(store)
    app = build_ingress_app(IngressConfig(), StaticCandidateSource([cand]), HttpForwarder(),
                            auth=auth, usage_sink=auth)
    return store, engine, app, i_port, runners


async def until(cond: Callable[[], bool], within_s: float = 20.0) -> None:
    for _ in range(int(within_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


async def test_concurrent_requests_cannot_overspend_a_budget(tmp_path: Path) -> None:
    store, engine, app, port, runners = await _fabric(tmp_path)
    try:
        _, admin = await store.create_key("root", "admin", admin=True)
        alice_key, alice = await store.create_key("app", "alice")
        _, bob = await store.create_key("app", "bob")
        ingress: Ingress = app[INGRESS_KEY]
        parts = await attach_tenancy(ingress, store)
        add_tenancy_routes(app, store, parts.budgets)
        runners.append(await serve(app, port))
        base = f"http://127.0.0.1:{port}"
        per_request = reservation({"model": "m", "messages": MSG, "max_tokens": 100})
        async with aiohttp.ClientSession() as http:
            for token, status in ((alice, 403), (admin, 200)):
                async with http.put(f"{base}/v1/fabric/budgets/owner/alice",
                                    json={"tokens": 5 * per_request, "period": "day"},
                                    headers={"Authorization": f"Bearer {token}"}) as r:
                    assert r.status == status
            for bad in ({"tokens": -1}, {"tokens": 5, "period": "week"}, {"tokens": "x"},
                        {"tokens": 5, "extra": 1}):
                async with http.put(f"{base}/v1/fabric/budgets/owner/alice", json=bad,
                                    headers={"Authorization": f"Bearer {admin}"}) as r:
                    assert r.status == 400
            async with http.put(f"{base}/v1/fabric/budgets/group/x", json={"tokens": 5},
                                headers={"Authorization": f"Bearer {admin}"}) as r:
                assert r.status == 400

        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=alice, max_retries=0)

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
        await until(lambda: len(engine.arrived) >= 5 and sum(t.done() for t in tasks) >= 15)
        engine.open.set()
        results = await asyncio.gather(*tasks)
        assert results.count("ok") == 5 and results.count("refused") == 15
        # bob is not alice: no budget of his
        bob_client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=bob, max_retries=0)
        await bob_client.chat.completions.create(model="m", messages=MSG)
        await bob_client.close()
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/v1/fabric/budgets",
                                headers={"Authorization": f"Bearer {alice}"}) as r:
                [row] = (await r.json())["data"]
            # settled to what the engine reported (7 + 4 tokens each), nothing held
            assert row["spent"] == 5 * 11 and row["held"] == 0 and row["name"] == "alice"
            async with http.get(f"{base}/metrics") as r:
                m = _samples(await r.text())
        assert m[("llmfabric_ingress_admission_refusals_total",
                  (("reason", "budget_exceeded"),))] == 15
        assert m[("llmfabric_ingress_tokens_total",
                  (("kind", "prompt"), ("model", "m"), ("owner", "alice")))] == 35
        assert m[("llmfabric_ingress_errors_total",
                  (("code", "insufficient_quota"), ("status", "429")))] == 15
        # freed budget: a smaller request fits again
        await client.chat.completions.create(model="m", messages=MSG, max_tokens=1)
        await client.close()
        rows = await store.usage(key_id=alice_key.id)
        assert sum(r.requests for r in rows) == 6
    finally:
        for r in reversed(runners):
            await r.cleanup()
        await store.aclose()


async def test_a_flooding_owner_does_not_starve_another(tmp_path: Path) -> None:
    store, engine, app, port, runners = await _fabric(tmp_path)
    try:
        _, flood = await store.create_key("app", "flood")
        _, light = await store.create_key("app", "light")
        ingress: Ingress = app[INGRESS_KEY]
        queue = FairQueue(1, max_waiting_per_owner=12, now=time.monotonic)
        ingress.use_gate(TenancyGate(None, queue, on_refused=ingress.metrics.observe_refusal))
        runners.append(await serve(app, port))
        base = f"http://127.0.0.1:{port}/v1"
        fc = openai.AsyncOpenAI(base_url=base, api_key=flood, max_retries=0)
        lc = openai.AsyncOpenAI(base_url=base, api_key=light, max_retries=0)

        async def call(c: openai.AsyncOpenAI, user: str) -> str:
            try:
                await c.chat.completions.create(model="m", messages=MSG, user=user)
            except openai.RateLimitError as e:
                assert e.code == "rate_limit_exceeded"
                assert int(e.response.headers["Retry-After"]) >= 1
                return "refused"
            return "ok"

        floods = [asyncio.create_task(call(fc, "flood")) for _ in range(16)]
        # one in flight, 12 waiting, 3 refused at once (the owner's queue is full)
        await until(lambda: queue.waiting("flood") >= 12 and sum(t.done() for t in floods) >= 3)
        lt = asyncio.create_task(call(lc, "light"))
        await until(lambda: queue.waiting("light") >= 1)
        engine.open.set()
        assert await lt == "ok"
        results = await asyncio.gather(*floods)
        assert results.count("refused") == 3 and results.count("ok") == 13
        # the light owner's request went right after the one flood request in flight
        assert engine.arrived[:2] == ["flood", "light"]
        await fc.close()
        await lc.close()
    finally:
        for r in reversed(runners):
            await r.cleanup()
        await store.aclose()


async def test_usage_export_csv_and_json_by_owner_and_range(tmp_path: Path) -> None:
    store, engine, app, port, runners = await _fabric(tmp_path)
    engine.open.set()
    try:
        _, admin = await store.create_key("root", "admin", admin=True)
        _, alice = await store.create_key("app", "alice")
        _, bob = await store.create_key("app", "bob")
        add_tenancy_routes(app, store, None)
        runners.append(await serve(app, port))
        base = f"http://127.0.0.1:{port}"
        for key in (alice, alice, bob):
            c = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
            await c.chat.completions.create(model="m", messages=MSG)
            await c.close()
        url = f"{base}/v1/fabric/usage/export"
        async with aiohttp.ClientSession() as http:
            async with http.get(url, params={"format": "csv"},
                                headers={"Authorization": f"Bearer {admin}"}) as r:
                assert r.status == 200 and r.content_type == "text/csv"
                rows = list(csv.DictReader(io.StringIO(await r.text())))
            assert sorted((x["owner"], x["requests"], x["total_tokens"]) for x in rows) == [
                ("alice", "2", "22"), ("bob", "1", "11")]
            # a non-admin key sees its owner's rows only, and may not ask for others'
            async with http.get(url, headers={"Authorization": f"Bearer {alice}"}) as r:
                doc = await r.json()
            assert {x["owner"] for x in doc["data"]} == {"alice"}
            assert doc["totals"] == {"requests": 2, "prompt_tokens": 14, "completion_tokens": 8}
            async with http.get(url, params={"owner": "bob"},
                                headers={"Authorization": f"Bearer {alice}"}) as r:
                assert r.status == 403
            async with http.get(url, params={"since": "2999-01-01"},
                                headers={"Authorization": f"Bearer {admin}"}) as r:
                assert (await r.json())["data"] == []
            async with http.get(url, params={"model": "other"},
                                headers={"Authorization": f"Bearer {admin}"}) as r:
                assert (await r.json())["data"] == []
            for bad in ({"format": "xml"}, {"since": "yesterday"}, {"until": "2020-13"},
                        {"since": "2026-02-02", "until": "2026-02-01"}):
                async with http.get(url, params=bad,
                                    headers={"Authorization": f"Bearer {admin}"}) as r:
                    assert r.status == 400, bad
            async with http.get(url) as r:
                assert r.status == 401
    finally:
        for r in reversed(runners):
            await r.cleanup()
        await store.aclose()


async def test_a_spend_budget_refuses_once_the_priced_usage_reaches_it(tmp_path: Path) -> None:
    store, engine, app, port, runners = await _fabric(tmp_path)
    engine.open.set()
    try:
        _, admin = await store.create_key("root", "admin", admin=True)
        _, bob = await store.create_key("app", "bob")
        ingress: Ingress = app[INGRESS_KEY]
        parts = await attach_tenancy(ingress, store)
        add_tenancy_routes(app, store, parts.budgets)
        runners.append(await serve(app, port))
        base = f"http://127.0.0.1:{port}/v1/fabric"
        adm = {"Authorization": f"Bearer {admin}"}
        async with aiohttp.ClientSession() as http:
            # $1000 / $3000 per million: one request (7 + 4 tokens) costs 0.019 USD
            async with http.put(f"{base}/prices/m", headers=adm, json={
                    "prompt_usd_per_mtok": 1000, "completion_usd_per_mtok": 3000}) as r:
                assert r.status == 200
            for bad in ({"prompt_usd_per_mtok": -1, "completion_usd_per_mtok": 1},
                        {"prompt_usd_per_mtok": "NaN", "completion_usd_per_mtok": 1},
                        {"prompt_usd_per_mtok": 1}):
                async with http.put(f"{base}/prices/m", headers=adm, json=bad) as r:
                    assert r.status == 400
            async with http.put(f"{base}/prices/m", json={}, headers={
                    "Authorization": f"Bearer {bob}"}) as r:
                assert r.status == 403
            async with http.put(f"{base}/budgets/owner/bob", headers=adm,
                                json={"usd": 0.05, "period": "month"}) as r:
                assert r.status == 200 and (await r.json())["usd"] == 0.05
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=bob,
                                    max_retries=0)
        ok = 0
        with pytest.raises(openai.RateLimitError) as e:
            for _ in range(10):
                await client.chat.completions.create(model="m", messages=MSG, max_tokens=4)
                ok += 1
        await client.close()
        assert ok == 2  # 0.019 + 0.019 spent; a third's reservation would pass 0.05
        assert e.value.code == "insufficient_quota" and "$0.05" in str(e.value)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/budgets", headers=adm) as r:
                [row] = (await r.json())["data"]
            assert row["unit"] == "usd" and row["spent"] == 2 * 19_000 and row["held"] == 0
            async with http.get(f"{base}/prices", headers=adm) as r:
                assert (await r.json())["data"] == [
                    {"model": "m", "prompt_usd_per_mtok": 1000.0,
                     "completion_usd_per_mtok": 3000.0}]
    finally:
        for r in reversed(runners):
            await r.cleanup()
        await store.aclose()


async def test_a_team_budget_binds_every_owner_in_the_team(tmp_path: Path) -> None:
    store, engine, app, port, runners = await _fabric(tmp_path)
    engine.open.set()
    try:
        _, admin = await store.create_key("root", "admin", admin=True)
        _, alice = await store.create_key("app", "alice")
        _, bob = await store.create_key("app", "bob")
        _, carol = await store.create_key("app", "carol")
        ingress: Ingress = app[INGRESS_KEY]
        parts = await attach_tenancy(ingress, store)
        add_tenancy_routes(app, store, parts.budgets)
        runners.append(await serve(app, port))
        base = f"http://127.0.0.1:{port}"
        adm = {"Authorization": f"Bearer {admin}"}
        per_request = reservation({"model": "m", "messages": MSG, "max_tokens": 100})
        async with aiohttp.ClientSession() as http:
            for owner in ("alice", "bob"):
                async with http.put(f"{base}/v1/fabric/teams/{owner}", headers=adm,
                                    json={"team": "nlp"}) as r:
                    assert r.status == 200 and await r.json() == {"owner": owner, "team": "nlp"}
            for bad in ({"team": ""}, {"team": "x" * 201}, {"team": "a", "more": 1}, {}):
                async with http.put(f"{base}/v1/fabric/teams/carol", headers=adm,
                                    json=bad) as r:
                    assert r.status == 400
            async with http.put(f"{base}/v1/fabric/teams/carol", json={"team": "nlp"},
                                headers={"Authorization": f"Bearer {carol}"}) as r:
                assert r.status == 403  # only an admin groups owners
            async with http.put(f"{base}/v1/fabric/budgets/team/nlp", headers=adm,
                                json={"tokens": per_request + 11, "period": "day"}) as r:
                assert r.status == 200 and (await r.json())["scope"] == "team"
            # (a request reserves `per_request`, then settles to the 7 + 4 tokens it used:
            # the first two fit, the third's reservation would pass the budget)

            async def chat(key: str) -> int:
                async with http.post(f"{base}/v1/chat/completions", json={
                        "model": "m", "messages": MSG, "max_tokens": 100},
                        headers={"Authorization": f"Bearer {key}"}) as r:
                    body = await r.json()
                    if r.status == 429:
                        assert body["error"]["code"] == "insufficient_quota"
                        assert "team 'nlp'" in body["error"]["message"]
                        assert int(r.headers["Retry-After"]) >= 1
                    return r.status

            # alice and bob share the team's budget: two requests in all, then refusals
            assert [await chat(alice), await chat(bob), await chat(alice), await chat(bob)] == [
                200, 200, 429, 429]
            assert await chat(carol) == 200  # not in the team
            async with http.get(f"{base}/v1/fabric/budgets",
                                headers={"Authorization": f"Bearer {bob}"}) as r:
                [row] = (await r.json())["data"]  # bob sees his team's budget
            assert row["scope"] == "team" and row["spent"] == 2 * 11
            async with http.get(f"{base}/v1/fabric/teams",
                                headers={"Authorization": f"Bearer {bob}"}) as r:
                assert (await r.json())["data"] == [{"owner": "bob", "team": "nlp"}]
            async with http.delete(f"{base}/v1/fabric/teams/bob", headers=adm) as r:
                assert r.status == 200
            async with http.delete(f"{base}/v1/fabric/teams/bob", headers=adm) as r:
                assert r.status == 404
            assert await chat(bob) == 200  # out of the team: its budget no longer binds him
            assert await chat(alice) == 429
    finally:
        for r in reversed(runners):
            await r.cleanup()
        await store.aclose()
