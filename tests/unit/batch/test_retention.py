"""Retention, as OpenAI's: a file's `expires_after` at upload, a batch's
`output_expires_after` for its outputs, the operator's retention; an expired file is a 404
from its expiry on, and the sweep deletes it (not while an active batch reads it) and the
batches that ended the retention ago, a bounded number of rows a sweep, on indexes. Over the
real routes (a real `Ingress`, the aiohttp test server) and a real SQLite store, on a
FakeClock."""

from __future__ import annotations

import asyncio
import pathlib
import sqlite3
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmfabric.batch import BatchService
from llmfabric.batch.limits import BatchLimits
from llmfabric.batch.records import (
    COMPLETED,
    FINALIZING,
    IN_PROGRESS,
    BatchRecord,
    FileRecord,
)
from llmfabric.batch.retention import (
    MAX_EXPIRES_AFTER_S,
    MIN_EXPIRES_AFTER_S,
    RetentionSweep,
    expires_after_s,
    parse_retention,
)
from llmfabric.batch.store import BatchStore, output_file_id
from llmfabric.front.host_check import HostGuard
from llmfabric.ingress import IngressConfig, StaticCandidateSource
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.errors import Reply
from llmfabric.ingress.protocols import Principal
from llmfabric.testing.fake_clock import FakeClock

pytestmark = pytest.mark.unit
Client = TestClient[web.Request, web.Application]
HOUR, DAY = 3600, 86_400
CHAT = "/v1/chat/completions"


@pytest.mark.parametrize(("policy", "seconds"), [
    ({"anchor": "created_at", "seconds": 3600}, 3600),
    ({"anchor": "created_at", "seconds": MAX_EXPIRES_AFTER_S}, MAX_EXPIRES_AFTER_S),
    ({"anchor": "created_at", "seconds": "7200"}, 7200),  # (a multipart field is text)
])
def test_openai_s_expiration_policy(policy: Any, seconds: int) -> None:
    assert expires_after_s(policy, "expires_after") == seconds


@pytest.mark.hostile
@pytest.mark.parametrize("policy", [
    None, "3600", [], {}, {"seconds": 3600}, {"anchor": "created_at"},
    {"anchor": "last_active_at", "seconds": 3600},
    {"anchor": "created_at", "seconds": MIN_EXPIRES_AFTER_S - 1},
    {"anchor": "created_at", "seconds": MAX_EXPIRES_AFTER_S + 1},
    {"anchor": "created_at", "seconds": -3600}, {"anchor": "created_at", "seconds": True},
    {"anchor": "created_at", "seconds": 3600.0}, {"anchor": "created_at", "seconds": "1h"},
    {"anchor": "created_at", "seconds": "٣٦٠٠"}, {"anchor": "created_at", "seconds": "9" * 5000},
    {"anchor": "created_at", "seconds": 3600, "extra": 1},
])
def test_what_is_no_expiration_policy(policy: Any) -> None:
    assert isinstance(expires_after_s(policy, "expires_after"), str)


def test_an_operator_s_retention() -> None:
    assert parse_retention("30d") == 30 * DAY and parse_retention("12h") == 12 * HOUR
    for bad in ("", "0d", "30", "forever", "-1d"):
        with pytest.raises(ValueError, match="duration"):
            parse_retention(bad)


class NoForwarder:
    enforces_timeouts = True

    async def aclose(self) -> None:
        return None


class Env:
    def __init__(self, client: Client, service: BatchService, clock: FakeClock) -> None:
        self.c, self.service, self.clock = client, service, clock
        self.store = service.store

    async def upload(self, data: bytes, **fields: str) -> tuple[int, dict[str, Any]]:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        for name, value in fields.items():
            form.add_field(name, value)
        form.add_field("file", data, filename="in.jsonl", content_type="application/jsonl")
        r = await self.c.post("/v1/files", data=form)
        return r.status, await r.json()

    async def status(self, method: str, path: str) -> int:
        return (await self.c.request(method, path)).status


def line(cid: str) -> bytes:
    return orjson.dumps({"custom_id": cid, "method": "POST", "url": CHAT,
                         "body": {"model": "m", "messages": []}}) + b"\n"


async def _answer(path: str, body: bytes, principal: Principal | None) -> Reply:
    return Reply(200, b'{"ok": true}')


@pytest.fixture(params=[None])
async def env(tmp_path: pathlib.Path, request: pytest.FixtureRequest
              ) -> AsyncIterator[Env]:
    clock = FakeClock()
    ingress = Ingress(IngressConfig(max_body_bytes=1000, auth_enabled=False),
                      StaticCandidateSource([]), NoForwarder())  # type: ignore[arg-type]
    service = BatchService(ingress, tmp_path, clock=clock, serve_line=_answer,
                           retention_s=request.param)
    client: Client = TestClient(TestServer(service.app(HostGuard())))
    await client.start_server()
    yield Env(client, service, clock)
    await client.close()
    await service.aclose()


async def test_an_upload_s_expires_after_sets_its_expiry(env: Env) -> None:
    status, f = await env.upload(line("a"), **{"expires_after[anchor]": "created_at",
                                               "expires_after[seconds]": "3600"})
    assert status == 200 and f["expires_at"] == f["created_at"] + HOUR
    status, g = await env.upload(line("b"), expires_after=orjson.dumps(
        {"anchor": "created_at", "seconds": 2 * HOUR}).decode())  # (its JSON, one field)
    assert status == 200 and g["expires_at"] == g["created_at"] + 2 * HOUR
    status, kept = await env.upload(line("c"))
    assert status == 200 and kept["expires_at"] is None
    await env.clock.advance(HOUR - 1)
    assert await env.status("GET", f"/v1/files/{f['id']}") == 200
    await env.clock.advance(1)
    for method, path in (("GET", f"/v1/files/{f['id']}"), ("GET", f"/v1/files/{f['id']}/content"),
                         ("DELETE", f"/v1/files/{f['id']}")):
        assert await env.status(method, path) == 404, path  # (as a deleted file)
    listed = await (await env.c.get("/v1/files")).json()
    assert [x["id"] for x in listed["data"]] == [kept["id"], g["id"]]
    r = await env.c.post("/v1/batches", data=orjson.dumps({
        "input_file_id": f["id"], "endpoint": CHAT, "completion_window": "24h"}))
    assert r.status == 404 and (await r.json())["error"]["code"] == "file_not_found"


@pytest.mark.hostile
@pytest.mark.parametrize("fields", [
    {"expires_after[anchor]": "created_at", "expires_after[seconds]": "3599"},
    {"expires_after[anchor]": "created_at", "expires_after[seconds]": "2592001"},
    {"expires_after[anchor]": "created_at"},
    {"expires_after[seconds]": "3600"},
    {"expires_after[anchor]": "now", "expires_after[seconds]": "3600"},
    {"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600",
     "expires_after[x]": "1"},
    {"expires_after": "{not json"},
    {"expires_after": '{"anchor": "created_at", "seconds": 3600}',
     "expires_after[seconds]": "3600"},
])
async def test_an_upload_s_bad_expires_after_is_a_400(env: Env, fields: dict[str, str]
                                                      ) -> None:
    status, body = await env.upload(line("a"), **fields)
    assert status == 400, body
    err = body["error"]
    assert err["code"] == "invalid_request" and err["param"] == "expires_after"
    assert err["type"] == "invalid_request_error" and "expires_after" in err["message"]
    assert list(env.store.files_dir.iterdir()) == []  # (nothing kept)


async def _created(env: Env, **doc: Any) -> tuple[int, dict[str, Any]]:
    _, f = await env.upload(line("a") + line("b"))
    r = await env.c.post("/v1/batches", data=orjson.dumps({
        "input_file_id": f["id"], "endpoint": CHAT, "completion_window": "24h", **doc}))
    return r.status, await r.json()


@pytest.mark.hostile
@pytest.mark.parametrize("policy", [
    {"anchor": "created_at", "seconds": 60}, {"anchor": "created_at"}, "3600", 3600,
    {"anchor": "created_at", "seconds": "3600.5"}])
async def test_a_bad_output_expires_after_is_a_400(env: Env, policy: Any) -> None:
    status, body = await _created(env, output_expires_after=policy)
    assert status == 400 and body["error"]["param"] == "output_expires_after"
    assert env.store.active_batches() == []


async def test_a_batch_s_outputs_expire_as_its_output_expires_after_says(env: Env) -> None:
    status, b = await _created(env, output_expires_after={"anchor": "created_at",
                                                           "seconds": 2 * HOUR})
    assert status == 200
    await env.clock.advance(HOUR)  # (anchored at the output's creation, not the batch's)
    await env.service.runner.run_batch(b["id"])
    done = await (await env.c.get(f"/v1/batches/{b['id']}")).json()
    assert done["status"] == COMPLETED
    out = await (await env.c.get(f"/v1/files/{done['output_file_id']}")).json()
    assert out["expires_at"] == out["created_at"] + 2 * HOUR == b["created_at"] + 3 * HOUR
    await env.clock.advance(2 * HOUR)
    assert await env.status("GET", f"/v1/files/{done['output_file_id']}/content") == 404
    assert await env.status("GET", f"/v1/files/{b['input_file_id']}") == 200
    assert await env.status("GET", f"/v1/batches/{b['id']}") == 200  # (the batch stays)
    await env.service.retention.sweep()
    assert not env.store.path_of(done["output_file_id"]).exists()
    assert env.store.path_of(b["input_file_id"]).exists()


@pytest.mark.parametrize("env", [30 * DAY], indirect=True)
async def test_the_operator_s_retention_deletes_old_files_and_ended_batches(env: Env) -> None:
    status, b = await _created(env)
    assert status == 200
    _, short = await env.upload(line("s"), **{"expires_after[anchor]": "created_at",
                                              "expires_after[seconds]": "3600"})
    _, long = await env.upload(line("l"), **{"expires_after[anchor]": "created_at",
                                             "expires_after[seconds]": str(30 * DAY)})
    assert short["expires_at"] == short["created_at"] + HOUR
    assert long["expires_at"] == long["created_at"] + 30 * DAY  # (the earlier of the two)
    _, plain = await env.upload(line("p"))
    assert plain["expires_at"] == plain["created_at"] + 30 * DAY
    await env.clock.advance(HOUR)
    await env.service.runner.run_batch(b["id"])  # (it ends an hour after its input's upload)
    done = await (await env.c.get(f"/v1/batches/{b['id']}")).json()
    out = done["output_file_id"]
    assert done["status"] == COMPLETED and out is not None
    await env.clock.advance(30 * DAY - HOUR)  # its input and the uploads are 30 days old now
    assert await env.status("GET", f"/v1/files/{b['input_file_id']}") == 404
    assert await env.status("GET", f"/v1/files/{out}") == 200
    assert await env.service.retention.sweep() is False
    assert env.service.retention.files == 4  # (short, long, plain and the input)
    assert not env.store.path_of(b["input_file_id"]).exists()
    assert await env.status("GET", f"/v1/batches/{b['id']}") == 200
    await env.clock.advance(HOUR)  # the batch ended 30 days ago
    await env.service.retention.sweep()
    assert await env.status("GET", f"/v1/batches/{b['id']}") == 404
    assert await env.status("GET", f"/v1/files/{out}") == 404
    assert not env.store.path_of(out).exists() and env.service.retention.batches == 1
    text = await (await env.c.get("/metrics")).text()
    assert "llmfabric_ingress_batch_expired_batches_total 1.0" in text
    assert "llmfabric_ingress_batch_expired_files_total 5.0" in text


def _add_file(store: BatchStore, created_at: int, expires_at: int | None = None) -> FileRecord:
    f = FileRecord(store.new_file_id(), "alice", "in.jsonl", "batch", 3, created_at, 1,
                   expires_at)
    store.path_of(f.id).write_bytes(b"{}\n")
    store.add_file(f, capped=False)
    return f


def _add_batch(store: BatchStore, file_id: str, status: str = IN_PROGRESS) -> BatchRecord:
    b = BatchRecord(store.new_batch_id(), "alice", "k1", CHAT, file_id, "24h", status, 1,
                    1 + DAY)
    store.add_batch(b)
    return b


def test_the_input_of_an_active_batch_is_kept_until_the_batch_ends(
        tmp_path: pathlib.Path) -> None:
    clock = FakeClock()
    store = BatchStore(tmp_path, BatchLimits(), wall=clock.wall)
    now = int(clock.wall())
    f = _add_file(store, now - 10, now - 1)
    b = _add_batch(store, f.id)
    assert store.get_file("alice", f.id) is None  # (expired: not found)
    assert store.forget_expired(clock.wall(), 100)[1:] == (0, 0)
    assert store.path_of(f.id).exists()
    store.set_status(b.id, COMPLETED, now)
    gone, files, batches = store.forget_expired(clock.wall(), 100)
    assert (gone, files, batches) == ([store.path_of(f.id)], 1, 0)
    assert store.get_batch("alice", b.id) is not None  # (no retention: batches stay)
    store.close()


@pytest.mark.hostile
async def test_a_sweep_takes_a_bounded_number_of_rows_on_indexes(
        tmp_path: pathlib.Path) -> None:
    # A sweep's work must not grow with what the store holds: it deletes at most `rows` of
    # each kind, and every look-up it makes is on an index (no scan of files or batches).
    clock = FakeClock()
    store = BatchStore(tmp_path, BatchLimits(), retention_s=DAY, wall=clock.wall)
    now = int(clock.wall())
    for _ in range(7):
        _add_file(store, now - 10, now - 1)
    for _ in range(5):
        b = _add_batch(store, _add_file(store, now).id)
        store.set_status(b.id, COMPLETED, now - 2 * DAY)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    sweep = RetentionSweep(store, clock, rows=3, interval_s=60)
    assert await sweep.sweep() is True  # (full: more is left)
    store._db.set_trace_callback(None)
    assert (sweep.files, sweep.batches) == (3, 3)
    selects = [s for s in statements if s.lstrip().startswith("SELECT")]
    assert selects
    for sql in selects:
        plan = " | ".join(r[3] for r in store._db.execute(f"EXPLAIN QUERY PLAN {sql}"))
        assert "SCAN files" not in plan and "SCAN batches" not in plan, (sql, plan)
    sweep.start()  # (the loop: a full sweep is followed by another a second later)
    await _until(lambda: (sweep.files, sweep.batches) == (6, 5))  # (bytes: in a thread)
    await clock.advance(0.5)
    assert sweep.files == 6
    await clock.advance(0.5)
    await _until(lambda: sweep.files == 7)
    assert {p.name for p in store.files_dir.iterdir()} == {
        f.id for f in store.list_files("alice", None, None, 100)[0]}
    await sweep.aclose()
    store.close()


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(300):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not in time")


def test_a_database_from_before_retention_gets_its_columns(tmp_path: pathlib.Path) -> None:
    db = sqlite3.connect(tmp_path / "batch.db")
    db.executescript("""
        CREATE TABLE files (
            id TEXT PRIMARY KEY, owner TEXT NOT NULL, filename TEXT NOT NULL,
            purpose TEXT NOT NULL, bytes INTEGER NOT NULL, created_at INTEGER NOT NULL,
            lines INTEGER NOT NULL);
        INSERT INTO files VALUES ('file-000000000000000000000001', 'alice', 'in.jsonl',
                                  'batch', 3, 100, 1);
    """)
    db.close()
    clock = FakeClock()
    store = BatchStore(tmp_path, BatchLimits(), wall=clock.wall)
    f = store.get_file("alice", "file-000000000000000000000001")
    assert f is not None and f.expires_at is None  # (kept, as before)
    store.close()
    store = BatchStore(tmp_path, BatchLimits(), retention_s=DAY, wall=clock.wall)
    assert store.get_file("alice", "file-000000000000000000000001") is None  # (too old)
    store.close()


async def test_a_failing_sweep_is_counted_and_the_loop_goes_on(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    store = BatchStore(tmp_path, BatchLimits(), wall=clock.wall)
    sweep = RetentionSweep(store, clock, interval_s=60)
    calls = []

    def broken(now: float, rows: int) -> Any:
        calls.append(now)
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(store, "forget_expired", broken)
    sweep.start()
    await clock.advance(0)
    await clock.advance(60)
    assert len(calls) == 2 and sweep.errors == 2
    await sweep.aclose()
    store.close()
    await asyncio.sleep(0)


def test_an_expired_output_of_a_finalization_being_redone_is_left_alone(
        tmp_path: pathlib.Path) -> None:
    # A restart redoes a cut finalization under the same output ids: the old output,
    # expired meanwhile, must not be unlinked under the one being written.
    clock = FakeClock()
    store = BatchStore(tmp_path, BatchLimits(), wall=clock.wall)
    now = int(clock.wall())
    b = _add_batch(store, _add_file(store, now).id, status=FINALIZING)
    old = FileRecord(output_file_id(b.id, "output"), "alice", "o.jsonl", "batch_output", 3,
                     now - 2 * HOUR, 1, now - HOUR)
    store.path_of(old.id).write_bytes(b"{}\n")
    store.add_file(old, capped=False)
    assert store.forget_expired(clock.wall(), 100)[1:] == (0, 0)
    store.set_status(b.id, COMPLETED, now)
    assert store.forget_expired(clock.wall(), 100)[1:] == (1, 0)
    store.close()
