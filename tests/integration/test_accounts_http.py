"""The account routes on a real aiohttp server, called over loopback (on SQLite and on
Postgres: the `accounts_db` fixture)."""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from llmfabric.accounts import AccountStore, ensure_admin_key
from llmfabric.accounts.http import add_account_routes


@pytest.fixture
async def server(
    tmp_path: pathlib.Path, accounts_db: str
) -> AsyncIterator[tuple[str, AccountStore, str]]:
    store = await AccountStore.open(accounts_db)
    _, admin = await ensure_admin_key(store, tmp_path / "admin.key")
    app = web.Application()
    add_account_routes(app, store)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", store, admin
    await runner.cleanup()
    await store.aclose()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_key_lifecycle_and_permissions(server: tuple[str, AccountStore, str]) -> None:
    base, _, admin = server
    async with aiohttp.ClientSession() as http:
        r = await http.get(f"{base}/v1/fabric/keys")
        assert r.status == 401
        assert (await r.json())["error"]["code"] == "invalid_api_key"

        r = await http.post(f"{base}/v1/fabric/keys", headers=auth(admin),
                            json={"name": "app", "owner": "alice", "tokens_per_min": 1000})
        assert r.status == 201
        alice = await r.json()
        assert alice["owner"] == "alice" and alice["key"].startswith("lf-")

        # alice sees only her keys, cannot mint admin keys or keys for others
        r = await http.get(f"{base}/v1/fabric/keys", headers=auth(alice["key"]))
        assert [k["id"] for k in (await r.json())["data"]] == [alice["id"]]
        assert "key" not in (await r.json())["data"][0]
        r = await http.post(f"{base}/v1/fabric/keys", headers=auth(alice["key"]),
                            json={"name": "x", "admin": True})
        assert r.status == 403
        r = await http.post(f"{base}/v1/fabric/keys", headers=auth(alice["key"]),
                            json={"name": "second"})
        second = await r.json()
        assert r.status == 201 and second["owner"] == "alice"
        # a limited key's keys inherit its limits, never more
        assert second["tokens_per_min"] == 1000
        r = await http.post(f"{base}/v1/fabric/keys", headers=auth(alice["key"]),
                            json={"name": "greedy", "tokens_per_min": 10**6})
        assert r.status == 403 and "higher than" in (await r.json())["error"]["message"]

        # bad bodies -> 400 in OpenAI's shape (an admin must name the owner of a non-admin
        # key: its own owner, "admin", is reserved for admin keys)
        for body in (b"{", b'{"name": ""}', b'{"name": "a", "requests_per_min": -1}',
                     b'{"name": "a", "bogus": 1}', b'{"name": "a"}'):
            r = await http.post(f"{base}/v1/fabric/keys", headers=auth(admin), data=body)
            assert r.status == 400
            assert set((await r.json())["error"]) == {"message", "type", "param", "code"}

        r = await http.post(f"{base}/v1/fabric/keys", headers=auth(admin),
                            json={"name": "a", "owner": " ADMIN "})
        assert r.status == 403 and "reserved" in (await r.json())["error"]["message"]

        # admin lists all; alice cannot list bob's
        r = await http.get(f"{base}/v1/fabric/keys", headers=auth(admin))
        assert len((await r.json())["data"]) == 3
        r = await http.get(f"{base}/v1/fabric/keys?owner=bob", headers=auth(alice["key"]))
        assert r.status == 403

        r = await http.delete(f"{base}/v1/fabric/keys/{second['id']}", headers=auth(alice["key"]))
        assert r.status == 200 and (await r.json())["active"] is False
        r = await http.get(f"{base}/v1/fabric/keys", headers=auth(second["key"]))
        assert r.status == 401  # revoked keys stop working at once
        r = await http.delete(f"{base}/v1/fabric/keys/0000000000000000", headers=auth(admin))
        assert r.status == 404


async def test_usage_route_scoped_to_owner(server: tuple[str, AccountStore, str]) -> None:
    base, store, admin = server
    a, a_plain = await store.create_key("a", "alice")
    b, _ = await store.create_key("b", "bob")
    store.record_usage(a.id, "m", 10, 20)
    store.record_usage(b.id, "m", 1, 1)
    async with aiohttp.ClientSession() as http:
        r = await http.get(f"{base}/v1/fabric/usage", headers=auth(a_plain))
        rows = (await r.json())["data"]
        assert [(x["owner"], x["total_tokens"]) for x in rows] == [("alice", 30)]
        r = await http.get(f"{base}/v1/fabric/usage", headers=auth(admin))
        assert {x["owner"] for x in (await r.json())["data"]} == {"alice", "bob"}
        r = await http.get(f"{base}/v1/fabric/usage?since=yesterday", headers=auth(admin))
        assert r.status == 400
        r = await http.get(f"{base}/v1/fabric/usage?since=2024-13-01", headers=auth(admin))
        assert r.status == 400  # (no such day: was 200 with no rows)
        r = await http.get(f"{base}/v1/fabric/usage?owner=bob", headers=auth(a_plain))
        assert r.status == 403


@pytest.mark.hostile
async def test_limits_past_the_database_integer_are_refused_not_500(
        server: tuple[str, AccountStore, str]) -> None:
    """Found by tests/integration/test_api_fuzz.py: a limit of 2**63 reached the database
    (OverflowError, 500); any limit past MAX_RATE_LIMIT is a 400 now, and nothing is stored."""
    from llmfabric.accounts.policy import MAX_RATE_LIMIT

    base, store, admin = server
    async with aiohttp.ClientSession() as http:
        for huge in (2**63, MAX_RATE_LIMIT + 1):
            r = await http.put(f"{base}/v1/fabric/owners/bob/limits", headers=auth(admin),
                               json={"requests_per_min": huge})
            assert r.status == 400, await r.text()
            assert (await r.json())["error"]["type"] == "invalid_request_error"
            r = await http.post(f"{base}/v1/fabric/keys", headers=auth(admin),
                                json={"name": "big", "owner": "bob", "tokens_per_min": huge})
            assert r.status == 400, await r.text()
        assert store.owner_limits("bob") == (None, None)
        r = await http.put(f"{base}/v1/fabric/owners/bob/limits", headers=auth(admin),
                           json={"requests_per_min": MAX_RATE_LIMIT})
        assert r.status == 200
        assert store.owner_limits("bob") == (MAX_RATE_LIMIT, None)
        r = await http.get(f"{base}/v1/fabric/keys?owner=bob", headers=auth(admin))
        assert (await r.json())["data"] == []


@pytest.mark.hostile
async def test_expiry_and_models_over_http_and_keys_cannot_grow_them(
    server: tuple[str, AccountStore, str],
) -> None:
    base, store, admin = server
    async with aiohttp.ClientSession() as http:
        r = await http.post(f"{base}/v1/fabric/keys", headers=auth(admin), json={
            "name": "course", "owner": "cs101", "expires_at": "30d",
            "models": ["llama-8b", "qwen-7b"]})
        assert r.status == 201, await r.text()
        course = await r.json()
        assert course["models"] == ["llama-8b", "qwen-7b"]
        assert course["expires_at"] == pytest.approx(time.time() + 30 * 86_400, abs=60)
        # unset: the creator's expiry and models; narrower: fine
        r = await http.post(f"{base}/v1/fabric/keys", headers=auth(course["key"]),
                            json={"name": "student"})
        student = await r.json()
        assert r.status == 201
        assert (student["expires_at"], student["models"]) == (course["expires_at"],
                                                              course["models"])
        r = await http.post(f"{base}/v1/fabric/keys", headers=auth(course["key"]), json={
            "name": "s2", "expires_at": course["expires_at"] - 60, "models": ["qwen-7b"]})
        assert r.status == 201
        # hostile: a longer life, more models
        for body in ({"name": "x", "expires_at": course["expires_at"] + 1},
                     {"name": "x", "expires_at": "60d"},
                     {"name": "x", "models": ["llama-8b", "gpt-big"]}):
            r = await http.post(f"{base}/v1/fabric/keys", headers=auth(course["key"]),
                                json=body)
            assert r.status == 403, body
        for body in ({"name": "x", "expires_at": "soon"}, {"name": "x", "models": []},
                     {"name": "x", "expires_at": 1.0}, {"name": "x", "models": "llama-8b"}):
            r = await http.post(f"{base}/v1/fabric/keys", headers=auth(course["key"]),
                                json=body)
            assert r.status == 400, body
        r = await http.get(f"{base}/v1/fabric/keys", headers=auth(course["key"]))
        listed = (await r.json())["data"]
        assert sorted(k["models"] for k in listed) == [["llama-8b", "qwen-7b"]] * 2 + [
            ["qwen-7b"]]
        # an expired key: 401 saying so, on the admin API too
        _, short = await store.create_key("short", "cs101", expires_at=time.time() + 0.3)
        r = await http.get(f"{base}/v1/fabric/keys", headers=auth(short))
        assert r.status == 200
        await asyncio.sleep(0.4)
        r = await http.get(f"{base}/v1/fabric/keys", headers=auth(short))
        assert r.status == 401
        err = (await r.json())["error"]
        assert err["code"] == "expired_api_key" and "expired at" in err["message"]
