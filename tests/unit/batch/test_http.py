"""The Files and Batches routes, hostile: bodies that are no multipart upload, files past a
cap, file names that try to be paths, bogus and foreign ids (always 404), batch creates that
break OpenAI's limits, and the per-owner caps. The routes over a real `Ingress` (its static
keys say who calls; each key is its own owner) and a runner that is never started."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmfabric.batch import BatchLimits, BatchService
from llmfabric.batch.records import Usage
from llmfabric.front.host_check import HostGuard
from llmfabric.ingress import IngressConfig, StaticCandidateSource
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.errors import Reply, error_reply
from llmfabric.ingress.protocols import Principal
from llmfabric.tenancy.accounts_auth import StaticKeys
from llmfabric.testing.fake_clock import FakeClock

pytestmark = [pytest.mark.unit, pytest.mark.hostile]
A, B = {"Authorization": "Bearer sk-a"}, {"Authorization": "Bearer sk-b"}
Client = TestClient[web.Request, web.Application]


class NoForwarder:
    enforces_timeouts = True

    async def open(self, *args: Any) -> Any:
        raise AssertionError("no request leaves in these tests")

    async def aclose(self) -> None:
        return None


def line(cid: str) -> bytes:
    return orjson.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "m", "messages": []}}) + b"\n"


@pytest.fixture
async def env(tmp_path: pathlib.Path) -> AsyncIterator[tuple[Client, BatchService]]:
    keys = StaticKeys({"sk-a": "ka", "sk-b": "kb"})
    ingress = Ingress(IngressConfig(max_body_bytes=1000), StaticCandidateSource([]),
                      NoForwarder(), auth=keys)  # type: ignore[arg-type]

    async def principals(key_id: str) -> Principal | None:
        return None

    service = BatchService(ingress, tmp_path, principals=principals, limits=BatchLimits(
        max_file_bytes=5000, max_line_bytes=1000, max_files_per_owner=3,
        max_bytes_per_owner=20_000, max_active_batches_per_owner=2))
    client: Client = TestClient(TestServer(service.app(HostGuard())))
    await client.start_server()
    yield client, service
    await client.close()
    await service.aclose()


def form(data: bytes, name: str | None = "in.jsonl", purpose: str | None = "batch"
         ) -> aiohttp.FormData:
    f = aiohttp.FormData()
    if purpose is not None:
        f.add_field("purpose", purpose)
    f.add_field("file", data, filename=name, content_type="application/jsonl")
    return f


async def upload(c: Client, data: bytes, headers: dict[str, str] = A, **kw: Any
                 ) -> tuple[int, dict[str, Any]]:
    r = await c.post("/v1/files", data=form(data, **kw), headers=headers)
    return r.status, await r.json()


async def test_upload_retrieve_content_and_delete(env: tuple[Client, BatchService]) -> None:
    c, service = env
    data = line("a") + line("b")
    status, f = await raw_upload(c, data, "../../etc/passwd")
    assert status == 200 and f["object"] == "file" and f["filename"] == "passwd"
    assert f["bytes"] == len(data) and f["purpose"] == "batch"
    assert sorted(p.name for p in service.store.files_dir.iterdir()) == [f["id"]]
    r = await c.get(f"/v1/files/{f['id']}/content", headers=A)
    assert await r.read() == line("a") + line("b")
    assert (await (await c.get(f"/v1/files/{f['id']}", headers=A)).json()) == f
    listed = await (await c.get("/v1/files", headers=A)).json()
    assert [x["id"] for x in listed["data"]] == [f["id"]] and listed["has_more"] is False
    r = await c.delete(f"/v1/files/{f['id']}", headers=A)
    assert (await r.json())["deleted"] is True
    assert list(service.store.files_dir.iterdir()) == []


@pytest.mark.parametrize(("kw", "status", "code"), [
    ({"data": b"x" * 5001}, 413, "file_too_large"),
    ({"data": b"y" * 1001 + b"\n"}, 413, "line_too_large"),
    ({"data": b"\n\n"}, 400, "empty_file"),
    ({"data": line("a"), "purpose": "fine-tune"}, 400, "invalid_purpose"),
    ({"data": line("a"), "purpose": None}, 400, "invalid_purpose"),
])
async def test_uploads_refused_leave_nothing_behind(env: tuple[Client, BatchService],
                                                   kw: dict[str, Any], status: int,
                                                   code: str) -> None:
    c, service = env
    got, body = await upload(c, **kw)
    assert (got, body["error"]["code"]) == (status, code)
    assert list(service.store.files_dir.iterdir()) == []
    assert service.store.owner_usage("ka") == (0, 0)


async def test_a_body_that_is_no_multipart_upload(env: tuple[Client, BatchService]) -> None:
    c, _ = env
    r = await c.post("/v1/files", data=b'{"file": "x"}', headers={
        **A, "Content-Type": "application/json"})
    assert r.status == 400
    no_file = aiohttp.FormData(default_to_multipart=True)
    no_file.add_field("purpose", "batch")
    r = await c.post("/v1/files", data=no_file, headers=A)
    assert r.status == 400 and (await r.json())["error"]["param"] == "file"
    r = await c.post("/v1/files", data=form(line("a")))  # no key
    assert r.status == 401


async def test_the_owner_caps(env: tuple[Client, BatchService]) -> None:
    c, _ = env
    for _ in range(3):
        assert (await upload(c, line("a")))[0] == 200
    status, body = await upload(c, line("a"))
    assert (status, body["error"]["code"]) == (400, "storage_limit_reached")
    assert (await upload(c, line("a"), headers=B))[0] == 200  # another owner's own caps


@pytest.mark.parametrize("bogus", ["nope", "file-..%2F..%2Fbatch.db", "file-" + "a" * 24,
                                   "batch_" + "0" * 24, "%2e%2e"])
async def test_bogus_and_foreign_ids_are_not_found(env: tuple[Client, BatchService],
                                                   bogus: str) -> None:
    c, _ = env
    _, mine = await upload(c, line("a"))
    for path in (f"/v1/files/{bogus}", f"/v1/files/{bogus}/content",
                 f"/v1/batches/{bogus}"):
        assert (await c.get(path, headers=A)).status == 404, path
    assert (await c.delete(f"/v1/files/{bogus}", headers=A)).status == 404
    assert (await c.post(f"/v1/batches/{bogus}/cancel", headers=A)).status == 404
    for path in (f"/v1/files/{mine['id']}", f"/v1/files/{mine['id']}/content"):
        assert (await c.get(path, headers=B)).status == 404  # another owner's
    assert (await c.delete(f"/v1/files/{mine['id']}", headers=B)).status == 404


async def raw_upload(c: Client, data: bytes, filename: str) -> tuple[int, dict[str, Any]]:
    """A multipart upload with the file name as given (aiohttp's client would quote it)."""
    body = (b'--XX\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--XX\r\nContent-Disposition: form-data; name="file"; filename="'
            + filename.encode() + b'"\r\nContent-Type: application/jsonl\r\n\r\n' + data
            + b"\r\n--XX--\r\n")
    r = await c.post("/v1/files", data=body, headers={
        **A, "Content-Type": "multipart/form-data; boundary=XX"})
    return r.status, await r.json()


async def test_a_windows_path_and_a_control_character(env: tuple[Client, BatchService]) -> None:
    c, _ = env
    status, f = await raw_upload(c, line("a"), "..\\..\\x.jsonl")
    # (a quoted-string: the parser reads each backslash as an escape; never a path)
    assert status == 200 and "/" not in f["filename"] and "\\" not in f["filename"]
    status, f = await raw_upload(c, line("a"), "x\x07.jsonl")  # (refused by the parser)
    assert status == 400 and f["error"]["code"] == "invalid_request"


async def create(c: Client, headers: dict[str, str] = A, **doc: Any
                 ) -> tuple[int, dict[str, Any]]:
    r = await c.post("/v1/batches", data=orjson.dumps(doc), headers=headers)
    return r.status, await r.json()


async def test_batch_create_checks(env: tuple[Client, BatchService]) -> None:
    c, _ = env
    _, f = await upload(c, line("a"))
    ok = {"input_file_id": f["id"], "endpoint": "/v1/chat/completions",
          "completion_window": "24h"}
    for bad, code in (({"endpoint": "/v1/responses"}, 400), ({"endpoint": None}, 400),
                      ({"completion_window": "1h"}, 400), ({"input_file_id": 3}, 400),
                      ({"input_file_id": "file-" + "b" * 24}, 404),
                      ({"metadata": {f"k{i}": "v" for i in range(17)}}, 400),
                      ({"metadata": {"k" * 65: "v"}}, 400), ({"metadata": {"k": "v" * 513}}, 400),
                      ({"metadata": {"k": 1}}, 400), ({"metadata": ["k"]}, 400)):
        status, body = await create(c, **{**ok, **bad})
        assert status == code, (bad, body)
    r = await c.post("/v1/batches", data=b"[1]", headers=A)
    assert r.status == 400
    r = await c.post("/v1/batches", data=b"x" * 70_000, headers=A)
    assert r.status == 413
    assert (await create(c, B, **ok))[0] == 404  # another owner's file
    status, b = await create(c, **ok, metadata={"k": "v" * 512})
    assert status == 200 and b["status"] == "validating" and b["object"] == "batch"
    assert b["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert b["expires_at"] - b["created_at"] == 24 * 3600
    assert (await create(c, **ok))[0] == 200
    status, body = await create(c, **ok)  # a third active batch
    assert (status, body["error"]["code"]) == (400, "too_many_active_batches")
    assert (await c.delete(f"/v1/files/{f['id']}", headers=A)).status == 409  # in use
    assert (await (await c.get(f"/v1/batches/{b['id']}", headers=B)).json())["error"]
    listed = await (await c.get("/v1/batches?limit=1", headers=A)).json()
    assert len(listed["data"]) == 1 and listed["has_more"] is True
    assert (await c.get("/v1/batches?limit=0", headers=A)).status == 400
    assert (await c.get("/v1/batches?limit=x", headers=A)).status == 400
    assert (await (await c.get("/v1/batches", headers=B)).json())["data"] == []
    r = await c.post(f"/v1/batches/{b['id']}/cancel", headers=A)
    assert r.status == 200 and (await r.json())["status"] == "cancelling"


def test_the_openapi_paths_describe_every_batch_route(tmp_path: pathlib.Path) -> None:
    import re

    from llmfabric.batch.openapi import batch_paths, openapi_document

    app = web.Application()
    keys = StaticKeys({})
    ingress = Ingress(IngressConfig(), StaticCandidateSource([]), NoForwarder(),  # type: ignore[arg-type]
                      auth=keys)

    async def principals(key_id: str) -> Principal | None:
        return None

    service = BatchService(ingress, tmp_path, principals=principals)
    service.add_routes(app)
    routes = {(r.method.lower(), re.sub(r"\{[^}]+\}", "{id}", r.resource.canonical))
              for r in app.router.routes() if r.resource is not None and r.method != "HEAD"}
    described = {(m, p) for p, ops in batch_paths().items() for m in ops}
    assert routes == described
    doc = openapi_document()
    assert "/v1/batches" in doc["paths"] and "/v1/chat/completions" in doc["paths"]
    service.store.close()


async def test_an_ingress_with_the_batch_api_lists_its_routes_in_its_openapi_json(
        tmp_path: pathlib.Path) -> None:
    """Both fronts serve the `openapi_body` they are given: the lean front's route() and the
    aiohttp app's /openapi.json (the batch app's here); the Batch API's
    (`BatchService.openapi_body`) adds its paths there, and only there."""
    from llmfabric.apis.openapi import OPENAPI_BODY
    from llmfabric.front.fast_front import FastFront
    from llmfabric.front.fast_routes import route

    ingress = Ingress(IngressConfig(auth_enabled=False), StaticCandidateSource([]),
                      NoForwarder())  # type: ignore[arg-type]
    service = BatchService(ingress, tmp_path)
    client: Client = TestClient(TestServer(service.app(HostGuard())))
    try:
        front = FastFront(ingress, openapi_body=service.openapi_body)
        served = route(b"/openapi.json", b"GET", False, front.openapi_body)
        assert isinstance(served, Reply)
        paths = orjson.loads(served.body)["paths"]
        assert {"/v1/files", "/v1/batches/{id}/cancel", "/v1/chat/completions"} <= set(paths)
        await client.start_server()
        got = await client.get("/openapi.json")
        assert got.status == 200 and await got.read() == served.body
        assert FastFront(ingress).openapi_body == OPENAPI_BODY  # (a front without it)
        assert "/v1/files" not in orjson.loads(OPENAPI_BODY)["paths"]
    finally:
        await client.close()
        service.store.close()


@dataclass(frozen=True)
class Granted:
    """A principal as accounts.models.ApiKey gives it: `issuer` set for a key accepted
    through another ingress's grant."""
    id: str
    owner: str
    issuer: str = ""


class OwnersAuth:
    KEYS = {"sk-local": Granted("k1", "alice"), "sk-granted": Granted("k2", "alice", "peerX")}

    async def authenticate(self, token: str) -> Granted | None:
        return self.KEYS.get(token)

    def cached(self, token: str) -> Granted | None:
        return self.KEYS.get(token)

    def check_rate(self, principal: Principal) -> float | None:
        return None

    def expired_at(self, token: str) -> float | None:
        return None


@contextlib.asynccontextmanager
async def served(tmp_path: pathlib.Path, auth: Any) -> AsyncIterator[Client]:
    """The Files and Batches routes of an ingress with `auth` (its runner never started)."""
    ingress = Ingress(IngressConfig(), StaticCandidateSource([]), NoForwarder(),  # type: ignore[arg-type]
                      auth=auth)

    async def principals(key_id: str) -> Principal | None:
        return None

    service = BatchService(ingress, tmp_path, principals=principals)
    client: Client = TestClient(TestServer(service.app(HostGuard())))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()
        await service.aclose()


async def test_a_granted_key_does_not_share_a_local_owner_s_namespace(
        tmp_path: pathlib.Path) -> None:
    # Owner "alice" of another ingress (its key accepted through --key-issuer) listed,
    # downloaded and deleted local alice's files and batches: the owner was all that scoped.
    async with served(tmp_path, OwnersAuth()) as c:
        local, granted = ({"Authorization": f"Bearer {k}"} for k in OwnersAuth.KEYS)
        r = await c.post("/v1/files", data=form(line("a")), headers=local)
        assert r.status == 200
        fid = (await r.json())["id"]
        assert (await (await c.get("/v1/files", headers=granted)).json())["data"] == []
        for path in (f"/v1/files/{fid}", f"/v1/files/{fid}/content"):
            assert (await c.get(path, headers=granted)).status == 404
        assert (await c.delete(f"/v1/files/{fid}", headers=granted)).status == 404
        assert (await c.get(f"/v1/files/{fid}", headers=local)).status == 200


async def test_retrieve_and_list_return_the_batch_s_usage(
        env: tuple[Client, BatchService]) -> None:
    c, service = env
    _, f = await upload(c, line("a") + line("b"))
    status, b = await create(c, input_file_id=f["id"], endpoint="/v1/chat/completions",
                             completion_window="24h")
    zero = {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0}
    assert status == 200 and b["usage"] == zero
    service.store.record_result(b["id"], 0, True, b"{}", Usage(12, 2, 30, 7))
    service.store.record_result(b["id"], 1, True, b"{}", Usage(3, 0, 5, 0))
    want = {"input_tokens": 15, "input_tokens_details": {"cached_tokens": 2},
            "output_tokens": 35, "output_tokens_details": {"reasoning_tokens": 7},
            "total_tokens": 50}
    got = await (await c.get(f"/v1/batches/{b['id']}", headers=A)).json()
    assert got["usage"] == want
    listed = await (await c.get("/v1/batches", headers=A)).json()
    assert [x["usage"] for x in listed["data"]] == [want]


async def test_the_runner_s_line_errors_are_on_the_metrics(tmp_path: pathlib.Path) -> None:
    ingress = Ingress(IngressConfig(max_body_bytes=1000), StaticCandidateSource([]),
                      NoForwarder(), auth=StaticKeys({"sk-a": "ka"}))  # type: ignore[arg-type]

    async def broken(key_id: str) -> Principal | None:
        raise ConnectionError("accounts database unreachable")

    service = BatchService(ingress, tmp_path, principals=broken)
    c: Client = TestClient(TestServer(service.app(HostGuard())))
    await c.start_server()
    name = "llmfabric_ingress_batch_line_errors_total"

    async def scraped() -> list[str]:
        text = await (await c.get("/metrics")).text()
        return [x for x in text.splitlines() if x.startswith(f"{name} ")]

    try:
        assert await scraped() == [f"{name} 0.0"]
        _, f = await upload(c, line("a") + line("b"))
        _, b = await create(c, input_file_id=f["id"], endpoint="/v1/chat/completions",
                            completion_window="24h")
        await service.runner.run_batch(b["id"])
        assert await scraped() == [f"{name} 2.0"]
    finally:
        await c.close()
        await service.aclose()


async def test_a_cancel_through_the_route_ends_a_batch_whose_lines_wait(
        tmp_path: pathlib.Path) -> None:
    # Its lines waited out a Retry-After of 60 s before the batch could end cancelled.
    clock = FakeClock()
    ingress = Ingress(IngressConfig(max_body_bytes=1000, auth_enabled=False),
                      StaticCandidateSource([]), NoForwarder())  # type: ignore[arg-type]
    sent: list[bytes] = []

    async def refused(path: str, body: bytes, principal: Principal | None) -> Reply:
        sent.append(body)
        return error_reply(503, "no node", "no_candidates", headers={"Retry-After": "60"})

    service = BatchService(ingress, tmp_path, clock=clock, serve_line=refused)
    c: Client = TestClient(TestServer(service.app(HostGuard())))
    await c.start_server()
    service.start()
    try:
        _, f = await upload(c, line("a") + line("b"), headers={})
        _, b = await create(c, {}, input_file_id=f["id"], endpoint="/v1/chat/completions",
                            completion_window="24h")
        for _ in range(300):
            await asyncio.sleep(0.01)
            if len(sent) == 2:
                break
        r = await c.post(f"/v1/batches/{b['id']}/cancel")
        assert r.status == 200 and (await r.json())["status"] == "cancelling"
        for _ in range(300):
            got = await (await c.get(f"/v1/batches/{b['id']}")).json()
            if got["status"] == "cancelled":
                break
            await asyncio.sleep(0.01)
        assert got["status"] == "cancelled" and clock.now() == 0  # (no time passed)
        assert got["request_counts"] == {"total": 2, "completed": 0, "failed": 2}
        assert len(sent) == 2
    finally:
        await c.close()
        await service.aclose()


async def test_files_and_batches_calls_are_requests_of_the_key(tmp_path: pathlib.Path) -> None:
    # The Files and Batches routes took no part in a key's requests/min: a key limited to
    # 2 a minute could list, poll or be refused as fast as the front took requests. And an
    # expired key read 'invalid or revoked' there, not expired_api_key as elsewhere.
    # They have an allowance of their own, the key's requests/min.
    from llmfabric.accounts import AccountStore
    from llmfabric.accounts.ratelimit import RateLimiter
    from llmfabric.tenancy.accounts_auth import AccountsAuth

    clock = FakeClock(wall_start=1_800_000_000.0)
    store = await AccountStore.open(":memory:", clock=clock, background=False)
    _, limited = await store.create_key("poller", "alice", requests_per_min=2)
    _, free = await store.create_key("other", "bob")
    _, brief = await store.create_key("brief", "carol", expires_at=clock.wall() + 60)
    accounts = AccountsAuth(store, RateLimiter(clock))
    try:
        async with served(tmp_path, accounts) as client:
            def auth(key: str) -> dict[str, str]:
                return {"Authorization": f"Bearer {key}"}

            for path in ("/v1/files", "/v1/batches"):
                assert (await client.get(path, headers=auth(limited))).status == 200
            r = await client.get("/v1/batches/batch_" + "0" * 24, headers=auth(limited))
            assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
            assert (await r.json())["error"]["code"] == "rate_limit_exceeded"
            r = await client.post("/v1/files", data=form(line("a")), headers=auth(limited))
            assert r.status == 429
            # A large upload too gets its 429 (read after the body, up to the file cap): cut off
            # mid-body, an SDK client saw a connection error and retried blind.
            big = form(b"x" * (3 << 20))
            r = await client.post("/v1/files", data=big, headers=auth(limited))
            assert r.status == 429 and "Retry-After" in r.headers
            # An allowance of their own: the key's lines (its requests on the inference
            # routes) still have all of theirs, and do not take from the polling's.
            key = await store.authenticate(limited)
            assert key is not None
            assert accounts.check_rate(key) is None and accounts.check_rate(key) is None
            assert accounts.check_rate(key) is not None
            for _ in range(5):  # (another key's calls are its own)
                assert (await client.get("/v1/files", headers=auth(free))).status == 200
            await clock.advance(30)  # (one request back)
            assert (await client.get("/v1/files", headers=auth(limited))).status == 200
            await clock.advance(60)
            r = await client.get("/v1/files", headers=auth(brief))
            assert r.status == 401 and (await r.json())["error"]["code"] == "expired_api_key"
    finally:
        await store.aclose()
