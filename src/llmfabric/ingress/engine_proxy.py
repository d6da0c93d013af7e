"""Node side: accept a forwarded inference request and proxy it to the local engine, streaming.

The node mounts `add_engine_proxy_routes(app, proxy)`, which serves
`POST /v1/fabric/forward/<path>` for the paths in paths.FORWARDABLE_PATHS; the peer request handler
(requests arriving over the peer network / relays) calls `proxy.open(path, body)` and relays
the returned Upstream's chunks itself.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncGenerator

import aiohttp
from aiohttp import web
from yarl import URL

from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.errors import UpstreamError, error_response
from llmfabric.ingress.paths import ENGINE_PATHS, FORWARD_PREFIX, FORWARDABLE_PATHS
from llmfabric.ingress.protocols import read_chunks_capped

FORWARD_TOKEN_HEADER = "X-Fabric-Forward-Token"


class HttpUpstream:
    """The local engine's response (an `Upstream` over aiohttp's client)."""

    __slots__ = ("_resp",)

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp

    @property
    def status(self) -> int:
        return self._resp.status

    @property
    def content_type(self) -> str:
        return self._resp.headers.get("Content-Type", "application/json")

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise UpstreamError(f"reading the response failed: {e!r}") from e

    async def read_capped(self, limit: int) -> bytes:
        return await read_chunks_capped(self.chunks(), limit)

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        # Raises aiohttp.ClientError / TimeoutError mid-stream; callers handle both.
        async for data in self._resp.content.iter_any():
            yield data

    def socket_relay(self) -> None:
        return None

    async def aclose(self) -> None:
        self._resp.release()


class EngineProxy:
    def __init__(
        self,
        engine_base_url: str,
        *,
        timeouts: Timeouts | None = None,
        max_body_bytes: int = 8 * 1024 * 1024,
        forward_token: str | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        """`engine_base_url` like "http://127.0.0.1:8000" (without /v1). If `forward_token` is
        set, HTTP callers must send it in X-Fabric-Forward-Token."""
        self._base = engine_base_url.rstrip("/")
        self._t = timeouts or Timeouts()
        self._max_body = max_body_bytes
        self._token = forward_token
        self._own = session is None
        self._session = session
        self._urls = {p: URL(self._base + ENGINE_PATHS.get(p, p)) for p in FORWARDABLE_PATHS}

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60.0),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return self._session

    async def open(self, path: str, body: bytes) -> HttpUpstream:
        """POST to the engine; raises UpstreamError if the engine cannot be reached."""
        url = self._urls.get(path)
        if url is None:
            raise UpstreamError(f"path {path!r} cannot be forwarded to an engine")
        t = self._t
        try:
            resp = await self._get_session().post(
                url, data=body, headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=t.total, sock_connect=t.connect,
                                              sock_read=t.idle),
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise UpstreamError(f"the local engine at {self._base} is unreachable: {e!r}") from e
        return HttpUpstream(resp)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self._token is not None:
            got = request.headers.get(FORWARD_TOKEN_HEADER, "")
            if not hmac.compare_digest(got.encode(), self._token.encode()):
                return error_response(401, "missing or wrong forward token", "invalid_api_key")
        path = request.path[len(FORWARD_PREFIX):]
        if path not in FORWARDABLE_PATHS:
            return error_response(404, f"{path} is not forwarded to engines", "not_found")
        if request.content_length is not None and request.content_length > self._max_body:
            return error_response(400, "request body too large", "request_too_large")
        body = await request.read()
        if len(body) > self._max_body:
            return error_response(400, "request body too large", "request_too_large")
        try:
            up = await self.open(path, body)
        except UpstreamError as e:
            return error_response(502, str(e), "engine_unreachable")
        try:
            if not up.content_type.startswith("text/event-stream"):
                data = await up.read()
                return web.Response(body=data, status=up.status,
                                    headers={"Content-Type": up.content_type})
            resp = web.StreamResponse(
                status=up.status,
                headers={"Content-Type": up.content_type, "Cache-Control": "no-cache"},
            )
            await resp.prepare(request)
            try:
                async for chunk in up.chunks():
                    await resp.write(chunk)
            except (aiohttp.ClientError, TimeoutError):
                # Cut the stream short: the ingress sees a broken stream and reports it.
                if request.transport is not None:
                    request.transport.close()
                return resp
            await resp.write_eof()
            return resp
        except UpstreamError as e:
            return error_response(502, str(e), "engine_failed")
        finally:
            await up.aclose()

    async def aclose(self) -> None:
        if self._session is not None and self._own:
            await self._session.close()
        self._session = None


def add_engine_proxy_routes(app: web.Application, proxy: EngineProxy) -> None:
    app.router.add_post(FORWARD_PREFIX + "/v1/{tail:.+}", proxy.handle)
