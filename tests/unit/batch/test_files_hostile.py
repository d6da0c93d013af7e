"""The Files API against hostile key holders filling the disk: uploads raced past the
owner's caps (each under the file cap, held open so none is registered yet), multipart
bodies that never end in a field that is not the file, and uploads cut mid-body. Over a
real `Ingress` (static keys; each key its own owner) and the aiohttp test server."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmfabric.batch import BatchLimits, BatchService
from llmfabric.front.host_check import HostGuard
from llmfabric.ingress import IngressConfig, StaticCandidateSource
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.protocols import Principal
from llmfabric.tenancy.accounts_auth import StaticKeys
from llmfabric.testing.work import python_lines

pytestmark = [pytest.mark.unit, pytest.mark.hostile]
A = {"Authorization": "Bearer sk-a"}
Client = TestClient[web.Request, web.Application]
LINE = orjson.dumps({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
                     "body": {"model": "m", "messages": []}}) + b"\n"


class NoForwarder:
    enforces_timeouts = True

    async def open(self, *args: Any) -> Any:
        raise AssertionError("no request leaves in these tests")

    async def aclose(self) -> None:
        return None


@pytest.fixture
async def env(tmp_path: pathlib.Path) -> AsyncIterator[tuple[Client, BatchService]]:
    ingress = Ingress(IngressConfig(max_body_bytes=1000), StaticCandidateSource([]),
                      NoForwarder(), auth=StaticKeys({"sk-a": "ka", "sk-b": "kb"}))  # type: ignore[arg-type]

    async def principals(key_id: str) -> Principal | None:
        return None

    service = BatchService(ingress, tmp_path, principals=principals, limits=BatchLimits(
        max_file_bytes=50_000, max_line_bytes=1000, max_files_per_owner=100,
        max_bytes_per_owner=100_000))
    client: Client = TestClient(TestServer(service.app(HostGuard())))
    await client.start_server()
    yield client, service
    await client.close()
    await service.aclose()


def disk_bytes(service: BatchService) -> int:
    return sum(p.stat().st_size for p in service.store.files_dir.iterdir())


HEAD = (b'--XX\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--XX\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
        b'Content-Type: application/jsonl\r\n\r\n')
TAIL = b"\r\n--XX--\r\n"
MULTIPART = {**A, "Content-Type": "multipart/form-data; boundary=XX"}


async def test_uploads_raced_past_the_owner_s_byte_cap_are_refused_as_they_stream(
        env: tuple[Client, BatchService]) -> None:
    # 10 uploads of 45,000 bytes at once, each held open before its last bytes: 450,000
    # bytes on disk for an owner allowed 100,000 (and 1,000 such uploads: 45 GB), since the
    # cap was checked only before the body and when the file was registered.
    c, service = env
    release = asyncio.Event()
    body = LINE * (45_000 // len(LINE))

    async def held() -> AsyncIterator[bytes]:
        yield HEAD
        for i in range(0, len(body), 5_000):
            yield body[i:i + 5_000]
        await release.wait()
        yield TAIL

    posts = [asyncio.create_task(c.post("/v1/files", data=held(), headers=MULTIPART))
             for _ in range(10)]
    peak = 0
    for _ in range(100):
        await asyncio.sleep(0.02)
        peak = max(peak, disk_bytes(service))
        if all(p.done() for p in posts[2:]):
            break
    release.set()
    replies = [await p for p in posts]
    statuses = sorted(r.status for r in replies)
    for r in replies:
        r.release()
    assert peak <= 100_000 + 5_000, f"{peak} bytes on disk for an owner capped at 100,000"
    assert statuses.count(200) == 2 and statuses.count(400) == 8, statuses
    assert service.store.owner_usage("ka")[1] <= 100_000
    assert disk_bytes(service) <= 100_000


async def test_uploads_raced_past_the_owner_s_file_cap_are_refused(
        tmp_path: pathlib.Path) -> None:
    ingress = Ingress(IngressConfig(auth_enabled=False), StaticCandidateSource([]),
                      NoForwarder())  # type: ignore[arg-type]
    service = BatchService(ingress, tmp_path, limits=BatchLimits(max_files_per_owner=3))
    c: Client = TestClient(TestServer(service.app(HostGuard())))
    await c.start_server()
    release = asyncio.Event()

    async def held() -> AsyncIterator[bytes]:
        yield HEAD + LINE * 200  # (past the parser's look-ahead: the file part is open)
        await release.wait()
        yield TAIL

    try:
        posts = [asyncio.create_task(c.post("/v1/files", data=held(), headers={
            "Content-Type": "multipart/form-data; boundary=XX"})) for _ in range(20)]
        for _ in range(100):
            await asyncio.sleep(0.02)
            if sum(p.done() for p in posts) >= 17:
                break
        open_parts = len(list(service.store.files_dir.glob("*.part")))
        release.set()
        replies = [await p for p in posts]
        statuses = sorted(r.status for r in replies)
        for r in replies:
            r.release()
        assert open_parts <= 3, f"{open_parts} uploads streaming for an owner of 3 files"
        assert statuses.count(200) == 3, statuses
    finally:
        await c.close()
        await service.aclose()


async def test_a_field_that_never_ends_is_cut_off(env: tuple[Client, BatchService]) -> None:
    # No Content-Length (chunked): a `purpose` field of endless bytes was read and dropped
    # for as long as the client sent them (here 100 MB, for a 50 KB file cap). What the
    # client gets written past the refusal is what the sockets buffer (a few MB).
    c, service = env
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        yield b'--XX\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n'
        for _ in range(100_000):
            sent += 1024
            yield b"b" * 1024

    with contextlib.suppress(aiohttp.ClientError):  # (refused, then the connection closed)
        r = await c.post("/v1/files", data=endless(), headers=MULTIPART)
        assert r.status in (400, 413)
    assert sent < 16_000_000, f"{sent} bytes of one field read"
    assert list(service.store.files_dir.iterdir()) == []


async def test_many_small_fields_are_cut_off(env: tuple[Client, BatchService]) -> None:
    c, _ = env
    sent = 0

    async def fields() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(100_000):
            sent += 1
            yield b'--XX\r\nContent-Disposition: form-data; name="x"\r\n\r\n' + b"v" * 900 + b"\r\n"
        yield b"--XX--\r\n"

    with contextlib.suppress(aiohttp.ClientError):
        r = await c.post("/v1/files", data=fields(), headers=MULTIPART)
        assert r.status in (400, 413)
    assert sent < 16_000, f"{sent} fields read"


async def test_an_upload_cut_mid_body_leaves_nothing(env: tuple[Client, BatchService]) -> None:
    c, service = env

    async def cut() -> AsyncIterator[bytes]:
        yield HEAD + LINE * 20
        raise ConnectionResetError("the client is gone")

    with pytest.raises(Exception):  # noqa: B017 (whatever the client raises)
        await c.post("/v1/files", data=cut(), headers=MULTIPART)
    for _ in range(50):
        await asyncio.sleep(0.02)
        if not list(service.store.files_dir.iterdir()):
            break
    assert list(service.store.files_dir.iterdir()) == []
    assert service.store.owner_usage("ka") == (0, 0)


async def test_batch_outputs_count_when_a_batch_is_created(
        env: tuple[Client, BatchService]) -> None:
    # Outputs are never refused, but one input could be run again and again, each run's
    # answers kept forever: a new batch is refused while the owner's files, outputs
    # included, take the owner's byte cap.
    from llmfabric.batch.records import FileRecord

    c, service = env
    r = await c.post("/v1/files", data=HEAD + LINE + TAIL, headers=MULTIPART)
    f = await r.json()
    create = {"input_file_id": f["id"], "endpoint": "/v1/chat/completions",
              "completion_window": "24h"}
    store = service.store
    out = FileRecord(store.new_file_id(), "ka", "o.jsonl", "batch_output", 100_000, 1, 1)
    store.path_of(out.id).write_bytes(b"x")
    store.add_file(out, capped=False)
    r = await c.post("/v1/batches", data=orjson.dumps(create), headers=A)
    assert r.status == 400 and (await r.json())["error"]["code"] == "storage_limit_reached"
    assert (await c.delete(f"/v1/files/{out.id}", headers=A)).status == 200
    r = await c.post("/v1/batches", data=orjson.dumps(create), headers=A)
    assert r.status == 200


async def test_batch_output_files_are_bounded_in_number(
        env: tuple[Client, BatchService]) -> None:
    # Tiny batches (one line each, 10 at a time, one after another) left two tiny files each
    # (a few hundred bytes): the byte cap alone let an owner make millions of files
    # (inodes, rows). A new batch is refused once the owner keeps max_output_files_per_owner
    # batch outputs.
    from dataclasses import replace

    from llmfabric.batch.records import FileRecord

    c, service = env
    store = service.store
    store.limits = replace(store.limits, max_output_files_per_owner=5)
    r = await c.post("/v1/files", data=HEAD + LINE + TAIL, headers=MULTIPART)
    create = orjson.dumps({"input_file_id": (await r.json())["id"],
                           "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    outs = [FileRecord(store.new_file_id(), "ka", "o.jsonl", "batch_output", 300, 1, 1)
            for _ in range(5)]
    for out in outs:
        store.path_of(out.id).write_bytes(b"x")
        store.add_file(out, capped=False)
    r = await c.post("/v1/batches", data=create, headers=A)
    assert r.status == 400 and (await r.json())["error"]["code"] == "storage_limit_reached"
    assert (await c.delete(f"/v1/files/{outs[0].id}", headers=A)).status == 200
    assert (await c.post("/v1/batches", data=create, headers=A)).status == 200


@pytest.mark.parametrize("limit", ["%C2%B2", "9" * 5000, "%D9%A3"])
async def test_a_limit_that_is_no_ascii_number_is_a_400(env: tuple[Client, BatchService],
                                                        limit: str) -> None:
    # '²' is a digit to str.isdigit but not to int(): a 500; so were 5,000 digits (past
    # Python's limit on int() of a string). '٣' (Arabic-Indic 3) read as 3.
    c, _ = env
    for path in ("/v1/files", "/v1/batches"):
        r = await c.get(f"{path}?limit={limit}", headers=A)
        assert r.status == 400, (path, limit, r.status)


PURPOSE = b'--XX\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n'
KEY_A, MULTI = "Authorization: Bearer sk-a\r\n", "multipart/form-data; boundary=XX"


@pytest.mark.parametrize(("path", "first", "auth", "kind", "refusal"), [
    ("/v1/files", PURPOSE, KEY_A, MULTI, b"413"),
    ("/v1/batches", b"{", KEY_A, MULTI, b"413"),
    ("/v1/files", PURPOSE, "", MULTI, b"401"),  # (refused before a byte of the body)
    ("/v1/batches", b"{", "", MULTI, b"401"),
    ("/v1/files", b"x", KEY_A, "text/plain", b"400"),
])
async def test_a_refused_body_is_not_read_on(env: tuple[Client, BatchService], path: str,
                                             first: bytes, auth: str, kind: str,
                                             refusal: bytes) -> None:
    # A client that keeps sending a chunked body after its refusal (413: the fields beside
    # the file past 64 KiB, a create body past 64 KiB; 401 without a key; 400 not multipart):
    # aiohttp's lingering close read and dropped it for 10 s more (11.7 GB over loopback).
    # The connection closes after the reply.
    c, _ = env
    r, w = await asyncio.open_connection("127.0.0.1", c.port)
    w.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: {kind}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode())
    w.write(b"%x\r\n%s\r\n" % (len(first), first))
    reply = asyncio.create_task(r.read(65536))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    chunk = b"b" * 65536
    with contextlib.suppress(OSError, TimeoutError):
        while loop.time() - t0 < 5:
            w.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await asyncio.wait_for(w.drain(), 5)
    took = loop.time() - t0
    w.close()
    assert (await reply).startswith(b"HTTP/1.1 " + refusal)
    assert took < 3, f"the body was read on for {took:.1f} s after its refusal"


async def test_a_create_body_sent_in_pieces_is_read_whole(
        env: tuple[Client, BatchService]) -> None:
    # The create read one chunk of the body (StreamReader.read returns what has arrived):
    # a body in two pieces was "not valid JSON".
    c, _ = env
    r = await c.post("/v1/files", data=HEAD + LINE + TAIL, headers=MULTIPART)
    doc = orjson.dumps({"input_file_id": (await r.json())["id"],
                        "endpoint": "/v1/chat/completions", "completion_window": "24h"})

    async def pieces() -> AsyncIterator[bytes]:
        yield doc[:20]
        await asyncio.sleep(0.1)
        yield doc[20:]

    r = await c.post("/v1/batches", data=pieces(), headers=A)
    assert r.status == 200, await r.text()


def test_blank_lines_cannot_take_the_event_loop() -> None:
    # Blank lines were skipped but never capped, and each cost a turn of UploadCheck.feed's
    # Python loop on the event loop: 100 MiB of newlines took 40 s of its CPU (25 ms per
    # 64 KiB chunk). A file has at most twice max_lines physical lines, blank ones included:
    # the Python it runs is bounded by that count, not by the upload's size (counted, not
    # timed; it reads each physical line in about 13 lines of Python).
    from llmfabric.batch.validate import UploadCheck, UploadRefused

    limits = BatchLimits(max_file_bytes=100 * 1024 * 1024, max_lines=5_000)
    check = UploadCheck(limits)
    chunk = b"\n" * 65536

    def upload() -> None:
        for _ in range(1600):  # (100 MiB)
            check.feed(chunk)

    with pytest.raises(UploadRefused) as refused:
        python_lines(upload, limit=20 * 2 * limits.max_lines)
    assert refused.value.code == "too_many_lines"
    ok = UploadCheck(BatchLimits(max_lines=3))
    ok.feed(LINE + b"\n\n" + LINE + b"\n" + LINE)
    assert ok.finish() == 3


def test_an_upload_s_chunks_do_not_each_scan_the_owner_s_files(tmp_path: pathlib.Path) -> None:
    # Each 8 KiB chunk of an upload ran a query over all the owner's files (1,000 kept
    # batch outputs: 1.2 s of the event loop's CPU for one 90 MiB upload, on top of the
    # upload's own 1.3 s). The stored bytes only fall between registrations, so the last
    # count read is a bound: a chunk is looked up only when that bound may pass the cap.
    from llmfabric.batch.records import FileRecord
    from llmfabric.batch.store import BatchStore

    store = BatchStore(tmp_path, BatchLimits(max_bytes_per_owner=10_000_000))
    for _ in range(50):
        store.add_file(FileRecord(store.new_file_id(), "ka", "o.jsonl", "batch_output", 1,
                                  1, 1), capped=False)
    queries: list[str] = []
    store._db.set_trace_callback(queries.append)
    assert store.start_upload("ka") is None and store.start_upload("ka") is None
    for _ in range(1000):
        assert store.upload_grew("ka", 8192) is None  # 8,192,000 bytes: under the cap
    assert len(queries) < 20
    # another upload registered meanwhile counts at once; the cap still holds
    store.end_upload("ka", 0)
    store.add_file(FileRecord(store.new_file_id(), "ka", "a.jsonl", "batch", 1_800_000, 1, 1))
    assert store.upload_grew("ka", 8192) is not None
    store.end_upload("ka", 8_200_192)
    assert store._uploading == {}
