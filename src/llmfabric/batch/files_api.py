"""The Files API routes (OpenAI's, for batch inputs and outputs): POST /v1/files
(multipart `file` + `purpose` "batch" [+ `expires_after`]), GET /v1/files, GET /v1/files/{id},
GET /v1/files/{id}/content, DELETE /v1/files/{id}.

An upload streams to disk through `UploadCheck` (size, lines, line length: 413/400 at the
first cap passed, nothing kept); it counts against the owner's caps (files, bytes) from its
start and as its bytes arrive, with the owner's other uploads under way, and again when the
file is registered. The fields beside the file are bounded (_MAX_PARTS, _MULTIPART_SLACK),
and a body refused before its end closes the connection (no more of it is read). Another
owner's id, a bogus one, an unknown one and an expired one are all the same 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import unicodedata
from typing import Any

import orjson
from aiohttp import BodyPartReader, MultipartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from llmfabric.batch.http_common import (
    DRAINED_BYTES,
    Caller,
    Identify,
    closing,
    fail,
    list_page,
    ok,
    page_args,
    refused_unread,
)
from llmfabric.batch.limits import FILE_PURPOSE, MAX_FILENAME_CHARS
from llmfabric.batch.records import FileRecord
from llmfabric.batch.retention import expires_after_s
from llmfabric.batch.store import FILE_ID, BatchStore, OverCap, fsync_file
from llmfabric.batch.validate import UploadCheck, UploadRefused
from llmfabric.clock import Clock

_SMALL_PART = 1024  # the most read of a multipart field that is not the file (`purpose`)
_MULTIPART_SLACK = 64 * 1024  # headers and fields around the file in a multipart body
_MAX_PARTS = 16  # fields of an upload (file, purpose, and a few an SDK may add)
_EXPIRES_AFTER = "expires_after"


def _expires_after(fields: dict[str, str]) -> int | str:
    """The seconds of an upload's `expires_after`, or why it is none: the fields
    `expires_after[anchor]` and `expires_after[seconds]`, as the openai SDK and curl's
    `-F` send it, or one field `expires_after` holding its JSON."""
    if _EXPIRES_AFTER in fields:
        try:
            policy: Any = orjson.loads(fields.pop(_EXPIRES_AFTER))
        except orjson.JSONDecodeError:
            policy = None
        if fields:
            policy = None  # (both forms at once)
    else:
        policy = {k[len(_EXPIRES_AFTER) + 1:-1]: v for k, v in fields.items()
                  if k.startswith(f"{_EXPIRES_AFTER}[") and k.endswith("]")}
        if len(policy) != len(fields):
            policy = None  # (a field such as expires_after_x, or expires_after[a)
    return expires_after_s(policy, _EXPIRES_AFTER)


def safe_filename(name: str | None) -> str:
    """The name a client gave its file, as shown back: its last path component, without
    control characters, at most MAX_FILENAME_CHARS (never used as a path)."""
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(c for c in base if unicodedata.category(c)[0] != "C").strip()
    if base in ("", ".", ".."):
        base = "upload.jsonl"
    return base[:MAX_FILENAME_CHARS]


class FilesApi:
    def __init__(self, store: BatchStore, identify: Identify, clock: Clock) -> None:
        self.store = store
        self.identify = identify
        self.clock = clock

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/files", self.upload)
        app.router.add_get("/v1/files", self.list)
        app.router.add_get("/v1/files/{id}", self.retrieve)
        app.router.add_get("/v1/files/{id}/content", self.content)
        app.router.add_delete("/v1/files/{id}", self.delete)

    async def upload(self, request: web.Request) -> web.StreamResponse:
        # (a refusal before the body is read: `refused_unread`)
        who = await self.identify(request.headers.get("Authorization", ""))
        lim = self.store.limits
        if not isinstance(who, Caller):
            # A key past its rate limit gets its 429 after the body it sends (up to the file
            # cap, as it would have been read when allowed): an SDK client cut off mid-upload
            # sees a connection error and retries blind, not the Retry-After. (A request
            # without a valid key is not read.)
            return await refused_unread(request, who, lim.max_file_bytes + _MULTIPART_SLACK
                                        if who.status == 429 else DRAINED_BYTES)
        if (request.content_length or 0) > lim.max_file_bytes + _MULTIPART_SLACK:
            return await refused_unread(request, fail(
                413, f"the file is larger than this ingress's limit of {lim.max_file_bytes} "
                "bytes", "file_too_large", "file"))
        try:
            reader = await request.multipart()
        except (AssertionError, ValueError, KeyError):  # (aiohttp: not a multipart body)
            return await refused_unread(request, fail(
                400, "send the file as multipart/form-data with fields 'file' and 'purpose'",
                "invalid_request"))
        if (why := self.store.start_upload(who.owner)) is not None:
            return await refused_unread(request, fail(400, why, "storage_limit_reached"))
        upload = _Upload(self.store, who.owner)
        try:
            reply = await self._receive(reader, upload)
        except UploadRefused as e:
            reply = fail(e.status, str(e), e.code, "file")
        except (ValueError, HttpProcessingError) as e:  # (aiohttp: a malformed multipart body)
            reply = fail(400, f"malformed multipart body: {str(e)[:200]}", "invalid_request")
        finally:
            upload.end()
            with contextlib.suppress(OSError):
                os.unlink(upload.part_path)
        return await closing(request, reply)

    async def _receive(self, reader: MultipartReader, upload: _Upload) -> web.Response:
        """Stream the file to its .part path (caps checked as it arrives), then register it."""
        purpose: str | None = None
        policy: dict[str, str] = {}  # the expires_after fields
        got: tuple[str, int, int] | None = None  # (filename, bytes, lines)
        parts = 0
        while (part := await reader.next()) is not None:
            parts += 1
            if parts > _MAX_PARTS:
                raise UploadRefused(400, f"the multipart body has more than {_MAX_PARTS} "
                                    "fields", "invalid_request")
            if not isinstance(part, BodyPartReader):
                return fail(400, "nested multipart bodies are not taken", "invalid_request")
            if part.name == "file" and got is None:
                check = UploadCheck(self.store.limits)
                with upload.part_path.open("wb") as f:
                    while chunk := await part.read_chunk():
                        check.feed(chunk)
                        upload.grew(len(chunk))
                        f.write(chunk)
                got = (safe_filename(part.filename), check.size, check.finish())
            else:
                value = await upload.small(part)
                if part.name == "purpose":
                    purpose = value
                elif part.name is not None and part.name.startswith(_EXPIRES_AFTER):
                    policy[part.name] = value
        if got is None:
            return fail(400, "the multipart body has no 'file' field", "invalid_request",
                        "file")
        if purpose != FILE_PURPOSE:
            return fail(400, f"'purpose' must be {FILE_PURPOSE!r} (this ingress stores "
                        "files for the Batch API only)", "invalid_purpose", "purpose")
        keep = _expires_after(policy) if policy else None
        if isinstance(keep, str):
            return fail(400, keep, "invalid_request", _EXPIRES_AFTER)
        await asyncio.to_thread(fsync_file, upload.part_path)  # (100 MiB: 0.1 s to seconds)
        upload.end()  # (registered below: counted as stored from now on)
        upload.part_path.replace(upload.final)
        now = int(self.clock.wall())
        record = FileRecord(upload.file_id, upload.owner, got[0], FILE_PURPOSE, got[1],
                            now, got[2], now + keep if keep is not None else None)
        try:
            self.store.add_file(record)
        except OverCap as e:
            upload.final.unlink(missing_ok=True)
            return fail(400, str(e), "storage_limit_reached")
        return ok(self.store.shown(record).to_json())

    async def list(self, request: web.Request) -> web.StreamResponse:
        who = await self.identify(request.headers.get("Authorization", ""))
        if not isinstance(who, Caller):
            return who
        q = request.query
        page = page_args(q, default_limit=10_000, max_limit=10_000)
        if isinstance(page, web.Response):
            return page
        order = q.get("order", "desc")
        if order not in ("asc", "desc"):
            return fail(400, "'order' is 'asc' or 'desc'", "invalid_request", "order")
        rows, more = self.store.list_files(who.owner, q.get("purpose") or None, page[0],
                                           page[1], newest_first=order == "desc")
        return list_page([r.to_json() for r in rows], more)

    def _mine(self, who: Caller, request: web.Request) -> FileRecord | None:
        file_id = request.match_info["id"]
        return (self.store.get_file(who.owner, file_id) if FILE_ID.fullmatch(file_id)
                else None)

    async def retrieve(self, request: web.Request) -> web.StreamResponse:
        who = await self.identify(request.headers.get("Authorization", ""))
        if not isinstance(who, Caller):
            return who
        if (f := self._mine(who, request)) is None:
            return _no_file(request)
        return ok(f.to_json())

    async def content(self, request: web.Request) -> web.StreamResponse:
        who = await self.identify(request.headers.get("Authorization", ""))
        if not isinstance(who, Caller):
            return who
        if (f := self._mine(who, request)) is None:
            return _no_file(request)
        return web.FileResponse(self.store.path_of(f.id), headers={
            "Content-Type": "application/octet-stream"})

    async def delete(self, request: web.Request) -> web.StreamResponse:
        who = await self.identify(request.headers.get("Authorization", ""))
        if not isinstance(who, Caller):
            return who
        if (f := self._mine(who, request)) is None:
            return _no_file(request)
        if self.store.file_in_use(f.id):
            return fail(409, "an active batch reads this file; cancel it or wait for its "
                        "end", "file_in_use")
        self.store.delete_file(who.owner, f.id)
        return ok({"id": f.id, "object": "file", "deleted": True})


class _Upload:
    """One upload under way: its id and .part path, its bytes counted against the owner's
    caps as they arrive (BatchStore.start_upload), and the fields read beside the file."""

    def __init__(self, store: BatchStore, owner: str) -> None:
        self.store, self.owner = store, owner
        self.file_id = store.new_file_id()
        self.final = store.path_of(self.file_id)
        self.part_path = self.final.with_suffix(".part")
        self.streamed = 0  # the file's bytes so far
        self.other = 0  # bytes of the fields that are not the file
        self._ended = False

    def grew(self, n: int) -> None:
        self.streamed += n
        if (why := self.store.upload_grew(self.owner, n)) is not None:
            raise UploadRefused(400, why, "storage_limit_reached")

    def end(self) -> None:
        if not self._ended:
            self._ended = True
            self.store.end_upload(self.owner, self.streamed)

    async def small(self, part: BodyPartReader) -> str:
        """A short field (`purpose`): its first _SMALL_PART bytes; all the fields beside
        the file together may take _MULTIPART_SLACK bytes (a field without end is cut)."""
        data = b""
        while chunk := await part.read_chunk(_SMALL_PART):
            self.other += len(chunk)
            if self.other > _MULTIPART_SLACK:
                raise UploadRefused(413, f"the fields beside 'file' take more than "
                                    f"{_MULTIPART_SLACK} bytes", "request_too_large")
            if len(data) < _SMALL_PART:
                data += chunk
        return data[:_SMALL_PART].decode("utf-8", "replace").strip()


def _no_file(request: web.Request) -> web.Response:
    shown = request.match_info["id"][:64]
    return fail(404, f"no file {shown!r}", "file_not_found", "file_id")

