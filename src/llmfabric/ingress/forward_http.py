"""Direct forwarding through aiohttp's client (pooled keep-alive, TCP_NODELAY, bytes unparsed).

The default direct forwarder is the leaner `RawHttpForwarder` (forward_raw.py); this one is
kept for callers that want to share an aiohttp ClientSession (proxies, TLS, tracing).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from yarl import URL

from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.errors import UpstreamConnectError, UpstreamError
from llmfabric.ingress.paths import ENGINE_PATHS
from llmfabric.ingress.tracing import downstream_pairs
from llmfabric.routing.candidates import Candidate

# Path prefix under which a node accepts forwarded inference requests (see engine_proxy.py).
FORWARD_PREFIX = "/v1/fabric/forward"

_JSON_HEADERS = {"Content-Type": "application/json"}


class HttpUpstream:
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

    async def chunks(self) -> AsyncIterator[bytes]:
        # Raises aiohttp.ClientError / TimeoutError mid-stream; the ingress handles both.
        async for data in self._resp.content.iter_any():
            yield data

    async def aclose(self) -> None:
        self._resp.release()


class AiohttpForwarder:
    """POSTs to `http://{candidate.http_addr}{path_prefix}{path}`.

    `path_prefix` is "" when candidates are engines themselves (standalone ingress, benchmark)
    and FORWARD_PREFIX when they are llmfabric nodes that mount the engine proxy.
    """

    def __init__(
        self,
        path_prefix: str = "",
        *,
        session: aiohttp.ClientSession | None = None,
        keepalive_s: float = 60.0,
        extra_headers: dict[str, str] | None = None,
    ) -> None:
        self._prefix = path_prefix
        self._own_session = session is None
        self._session = session
        self._keepalive = keepalive_s
        self._headers = {**_JSON_HEADERS, **(extra_headers or {})}
        self._urls: dict[tuple[str, str], URL] = {}
        self._timeouts: dict[Timeouts, aiohttp.ClientTimeout] = {}

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=0, keepalive_timeout=self._keepalive, ttl_dns_cache=300
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return self._session

    def _url(self, addr: str, path: str) -> URL:
        key = (addr, path)
        url = self._urls.get(key)
        if url is None:
            if len(self._urls) > 4096:
                self._urls.clear()
            if not self._prefix:  # engines themselves: their own path for e.g. /v1/tokenize
                path = ENGINE_PATHS.get(path, path)
            url = URL(f"http://{addr}{self._prefix}{path}", encoded=True)
            self._urls[key] = url
        return url

    def _timeout(self, t: Timeouts) -> aiohttp.ClientTimeout:
        ct = self._timeouts.get(t)
        if ct is None:
            ct = aiohttp.ClientTimeout(total=t.total, sock_connect=t.connect, sock_read=t.idle)
            self._timeouts[t] = ct
        return ct

    async def open(
        self, candidate: Candidate, path: str, body: bytes, timeouts: Timeouts
    ) -> HttpUpstream:
        if not candidate.http_addr:
            raise UpstreamError(f"node {candidate.session_id} has no HTTP address")
        try:
            resp = await self._get_session().post(
                self._url(candidate.http_addr, path),
                data=body,
                headers={**self._headers, **dict(tp)} if (tp := downstream_pairs())
                else self._headers,
                timeout=self._timeout(timeouts),
                allow_redirects=False,
            )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
            raise UpstreamConnectError(f"{candidate.http_addr}: {e!r}") from e
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise UpstreamError(f"{candidate.http_addr}: {e!r}") from e
        return HttpUpstream(resp)

    async def aclose(self) -> None:
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None
