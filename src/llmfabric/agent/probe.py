"""HTTP probes of an engine's OpenAI server: readiness (/v1/models), health (/health), and
plain GETs for its metrics (/metrics, /slots, /props).

vLLM, SGLang, llama-server, TGI and the sim engine answer /health; servers without it
(llama-cpp-python) answer 404, which proves their HTTP server is up (their /v1/models may
wait for the model, see `health`). /v1/models gives the
served model ids and, on vLLM and the sim engine, `max_model_len`. Answers are capped in
size (`MAX_BODY`): an engine is not trusted to be small.
"""

from __future__ import annotations

from typing import Any, Protocol

import aiohttp
import orjson

MAX_BODY = 4 << 20


async def error_text(resp: aiohttp.ClientResponse, limit: int = 200) -> str:
    """The first `limit` characters of an error answer, for a message (and the log): read
    up to 4 x `limit` bytes and no more (the whole body of a broken or hostile engine may be
    megabytes, or never end), controls left to the log's escaping."""
    parts: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_any():
        parts.append(chunk)
        size += len(chunk)
        if size >= 4 * limit:
            break
    return b"".join(parts)[:4 * limit].decode(errors="replace")[:limit]


async def read_capped(resp: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The whole body, or None past `limit` bytes. (`resp.content.read(n)` returns what is
    buffered, up to n: a 424 KB /metrics came back cut at 128 KB, its load lost.)"""
    parts: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)

class ProbeError(Exception):
    """The engine did not answer as a ready OpenAI server."""


class EngineProbe(Protocol):
    async def models(self, base_url: str, timeout_s: float) -> list[dict[str, Any]]:
        """The /v1/models `data` list; raises ProbeError."""
        ...

    async def health(self, base_url: str, timeout_s: float) -> bool: ...

    async def get_text(self, base_url: str, path: str, timeout_s: float) -> str | None:
        """The body of a 200 answer to GET `path`, else None (never raises)."""
        ...

    async def get_json(self, base_url: str, path: str, timeout_s: float) -> Any:
        """The JSON of a 200 answer to GET `path`, else None (never raises)."""
        ...

    async def aclose(self) -> None: ...


class HttpProbe:
    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=4, force_close=True)
            )
        return self._session

    async def models(self, base_url: str, timeout_s: float) -> list[dict[str, Any]]:
        try:
            async with self._http().get(
                f"{base_url}/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as r:
                if r.status != 200:
                    raise ProbeError(f"/v1/models answered {r.status}")
                raw = await read_capped(r, MAX_BODY)
                if raw is None:
                    raise ProbeError(f"/v1/models answered over {MAX_BODY} bytes")
                body = orjson.loads(raw)
        except TimeoutError as exc:
            raise ProbeError(f"/v1/models: no answer in {timeout_s:g} s") from exc
        except (aiohttp.ClientError, ValueError) as exc:
            # (its repr was ClientConnectorError(ConnectionKey(host=..., ...), ...))
            raise ProbeError(f"/v1/models: {str(exc) or type(exc).__name__}") from exc
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise ProbeError("/v1/models answered without a data list")
        return [d for d in data if isinstance(d, dict) and isinstance(d.get("id"), str)]

    async def health(self, base_url: str, timeout_s: float) -> bool:
        try:
            async with self._http().get(
                f"{base_url}/health", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as r:
                # 404: a server without /health (llama-cpp-python) answered, so it is up.
                # Not /v1/models instead: llama-cpp-python serves it under its model lock,
                # so a check cuts a running stream short (its default interrupt_requests)
                # or waits for the whole generation (and times out).
                return r.status in (200, 404)
        except (aiohttp.ClientError, TimeoutError, ProbeError):
            return False

    async def get_text(self, base_url: str, path: str, timeout_s: float) -> str | None:
        try:
            async with self._http().get(
                f"{base_url}{path}", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as r:
                if r.status != 200:
                    return None
                data = await read_capped(r, MAX_BODY)
        except (aiohttp.ClientError, TimeoutError):
            return None
        return data.decode("utf-8", errors="replace") if data is not None else None

    async def get_json(self, base_url: str, path: str, timeout_s: float) -> Any:
        text = await self.get_text(base_url, path, timeout_s)
        if text is None:
            return None
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            return None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
