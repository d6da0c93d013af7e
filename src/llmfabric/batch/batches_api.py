"""The Batches API routes (OpenAI's): POST /v1/batches, GET /v1/batches/{id},
GET /v1/batches (after, limit), POST /v1/batches/{id}/cancel.

A create checks what it can at once (the input file is the caller's, not expired and of
purpose "batch", the endpoint, the completion window, OpenAI's metadata limits, the
`output_expires_after` policy, the owner's active batches) and answers the batch as
`validating`; the runner validates the lines (a bad line fails the batch with its line
number) and runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from llmfabric.batch.http_common import (
    Caller,
    Identify,
    closing,
    fail,
    list_page,
    ok,
    page_args,
    refused_unread,
)
from llmfabric.batch.limits import (
    COMPLETION_WINDOWS,
    ENDPOINTS,
    FILE_PURPOSE,
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE_CHARS,
)
from llmfabric.batch.records import VALIDATING, BatchRecord
from llmfabric.batch.retention import expires_after_s
from llmfabric.batch.store import BATCH_ID, FILE_ID, BatchStore, NotCancellable
from llmfabric.clock import Clock

_MAX_CREATE_BODY = 64 * 1024


def metadata_error(meta: Any) -> str | None:
    """Why `meta` breaks OpenAI's metadata limits, or None."""
    if meta is None:
        return None
    if not isinstance(meta, dict):
        return "'metadata' must be an object of strings"
    if len(meta) > MAX_METADATA_PAIRS:
        return f"'metadata' has at most {MAX_METADATA_PAIRS} pairs"
    for k, v in meta.items():
        if not isinstance(v, str):
            return "'metadata' values must be strings"
        if len(k) > MAX_METADATA_KEY_CHARS or len(v) > MAX_METADATA_VALUE_CHARS:
            return (f"'metadata' keys have at most {MAX_METADATA_KEY_CHARS} characters, "
                    f"values at most {MAX_METADATA_VALUE_CHARS}")
    return None


class BatchesApi:
    def __init__(self, store: BatchStore, identify: Identify, clock: Clock,
                 wake: Callable[[str], None]) -> None:
        """`wake(batch_id)`: tells the runner a batch was created or cancelled."""
        self.store = store
        self.identify = identify
        self.clock = clock
        self.wake = wake

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/batches", self.create)
        app.router.add_get("/v1/batches", self.list)
        app.router.add_get("/v1/batches/{id}", self.retrieve)
        app.router.add_post("/v1/batches/{id}/cancel", self.cancel)

    async def create(self, request: web.Request) -> web.StreamResponse:
        who = await self.identify(request.headers.get("Authorization", ""))
        if not isinstance(who, Caller):  # (`refused_unread`: a big body is not read)
            return await refused_unread(request, who)
        if (request.content_length or 0) > _MAX_CREATE_BODY:
            return await refused_unread(request, fail(
                413, f"the body is larger than {_MAX_CREATE_BODY} bytes", "request_too_large"))
        raw = b""  # (read() returns what has arrived: read to the end, or past the cap)
        while len(raw) <= _MAX_CREATE_BODY and (
                more := await request.content.read(_MAX_CREATE_BODY + 1 - len(raw))):
            raw += more
        if len(raw) > _MAX_CREATE_BODY:
            return await closing(request, fail(
                413, f"the body is larger than {_MAX_CREATE_BODY} bytes", "request_too_large"))
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return fail(400, "the body is not valid JSON", "invalid_json")
        if not isinstance(doc, dict):
            return fail(400, "the body must be a JSON object", "invalid_request")
        file_id = doc.get("input_file_id")
        endpoint = doc.get("endpoint")
        window = doc.get("completion_window")
        if not isinstance(file_id, str):
            return fail(400, "'input_file_id' is required (a file id)",
                        "missing_required_parameter", "input_file_id")
        f = self.store.get_file(who.owner, file_id) if FILE_ID.fullmatch(file_id) else None
        if f is None:
            return fail(404, f"no file {file_id[:64]!r}", "file_not_found", "input_file_id")
        if f.purpose != FILE_PURPOSE:
            return fail(400, f"the input file's purpose must be {FILE_PURPOSE!r}",
                        "invalid_request", "input_file_id")
        if endpoint not in ENDPOINTS:
            return fail(400, f"'endpoint' is one of {', '.join(ENDPOINTS)}",
                        "invalid_request", "endpoint")
        if window not in COMPLETION_WINDOWS:
            return fail(400, "'completion_window' must be \"24h\"", "invalid_request",
                        "completion_window")
        meta = doc.get("metadata")
        if (why := metadata_error(meta)) is not None:
            return fail(400, why, "invalid_request", "metadata")
        keep: int | None = None  # (seconds its output and error files are kept)
        if (policy := doc.get("output_expires_after")) is not None:
            if isinstance(seconds := expires_after_s(policy, "output_expires_after"), str):
                return fail(400, seconds, "invalid_request", "output_expires_after")
            keep = seconds
        if (why := self.store.stored_refusal(who.owner)) is not None:
            return fail(400, why, "storage_limit_reached")
        cap = self.store.limits.max_active_batches_per_owner
        if len(self.store.active_batches(who.owner)) >= cap:
            return fail(400, f"you have {cap} batches running, the most this ingress runs "
                        "per owner; wait for one to end or cancel one",
                        "too_many_active_batches")
        now = int(self.clock.wall())
        batch = BatchRecord(self.store.new_batch_id(), who.owner, who.key_id, endpoint,
                            f.id, window, VALIDATING, now,
                            now + int(COMPLETION_WINDOWS[window]), metadata=meta,
                            output_expires_after=keep)
        self.store.add_batch(batch)
        self.wake(batch.id)
        return ok(batch.to_json())

    async def list(self, request: web.Request) -> web.StreamResponse:
        who = await self.identify(request.headers.get("Authorization", ""))
        if not isinstance(who, Caller):
            return who
        page = page_args(request.query, default_limit=20, max_limit=100)
        if isinstance(page, web.Response):
            return page
        rows, more = self.store.list_batches(who.owner, *page)
        return list_page([r.to_json() for r in rows], more)

    async def retrieve(self, request: web.Request) -> web.StreamResponse:
        who = await self.identify(request.headers.get("Authorization", ""))
        if not isinstance(who, Caller):
            return who
        batch_id = request.match_info["id"]
        b = self.store.get_batch(who.owner, batch_id) if BATCH_ID.fullmatch(batch_id) else None
        if b is None:
            return _no_batch(batch_id)
        return ok(b.to_json())

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        who = await self.identify(request.headers.get("Authorization", ""))
        if not isinstance(who, Caller):
            return who
        batch_id = request.match_info["id"]
        try:
            b = (self.store.request_cancel(who.owner, batch_id, int(self.clock.wall()))
                 if BATCH_ID.fullmatch(batch_id) else None)
        except NotCancellable as e:
            return fail(409, str(e), "batch_not_cancellable")
        if b is None:
            return _no_batch(batch_id)
        self.wake(b.id)  # (its lines waiting out a refusal end their waits now)
        return ok(b.to_json())


def _no_batch(batch_id: str) -> web.Response:
    return fail(404, f"no batch {batch_id[:64]!r}", "batch_not_found", "batch_id")
