"""The aiohttp side of a committed request: `WebSink`, a StreamSink over an aiohttp request
(the node's app and `build_ingress_app`), and `web_response`, a `Reply` as an aiohttp response."""

from __future__ import annotations

from aiohttp import web

from llmfabric.front.front_limits import safe_content_type, safe_header_value
from llmfabric.ingress.errors import MODEL_HEADER, Reply


class WebSink:
    """StreamSink over an aiohttp request (the node's app and `build_ingress_app`)."""

    __slots__ = ("headers", "request", "response")

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None
        self.headers: dict[str, str] | None = None  # extra response headers (X-Fabric-Trace)

    async def start(self, content_type: str, node: str, model: str = "") -> None:
        self.response = web.StreamResponse(
            status=200,
            headers={"Content-Type": safe_content_type(content_type),
                     "Cache-Control": "no-cache", "X-Fabric-Node": safe_header_value(node)},
        )
        if model:
            self.response.headers[MODEL_HEADER] = safe_header_value(model)
        if self.headers:
            self.response.headers.update(
                (k, safe_header_value(v)) for k, v in self.headers.items())
        await self.response.prepare(self.request)

    async def write(self, data: bytes) -> None:
        if self.response is not None:
            await self.response.write(data)

    async def end(self) -> None:
        if self.response is not None:
            await self.response.write_eof()

    def direct_writer(self) -> None:
        return None  # (aiohttp writes through its own coroutines)


def web_response(reply: Reply) -> web.Response:
    """A `Reply` as an aiohttp response."""
    headers = {"Content-Type": safe_content_type(reply.content_type)}
    if reply.node:
        headers["X-Fabric-Node"] = safe_header_value(reply.node)
    if reply.model:
        headers[MODEL_HEADER] = safe_header_value(reply.model)
    if reply.headers:
        headers.update((k, safe_header_value(v)) for k, v in reply.headers.items())
    return web.Response(body=reply.body, status=reply.status, headers=headers)
