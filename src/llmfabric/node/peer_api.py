"""What a node answers on the peer protocol (requests from other admitted nodes).

  /v1/fabric/forward/v1/...  forwarded inference requests -> the local engine
  /_fabric/v1/assign         engine assignments from the fleet controller
  /_fabric/v1/release        releases (stop the engine, become bare) from the controller
The peer protocol is authenticated (TLS + admission), so `request.peer_id` is a member.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from llmfabric.ingress.forward_http import FORWARD_PREFIX
from llmfabric.net import HandlerResponse, PeerRequest
from llmfabric.node.assignment import ASSIGN_PATH, RELEASE_PATH
from llmfabric.node.engine_link import EngineLink, error_response

MAX_ASSIGNMENT_BYTES = 16 * 1024

Handler = Callable[[str, bytes], Awaitable[HandlerResponse]]  # (peer id, body) -> answer


class PeerApi:
    def __init__(
        self,
        engine: Callable[[], EngineLink | None],
        assign: Handler,
        release: Handler | None = None,
    ) -> None:
        self._engine = engine
        self._assign = assign
        self._release = release

    async def handle(self, request: PeerRequest) -> HandlerResponse:
        if request.path.startswith(FORWARD_PREFIX + "/v1/"):
            engine = self._engine()
            if engine is None:
                return error_response(503, "this node serves no engine", "node_not_serving")
            return await engine.handle_peer_request(request)
        if request.path == ASSIGN_PATH:
            return await self._control(request, self._assign, "an assignment")
        if request.path == RELEASE_PATH and self._release is not None:
            return await self._control(request, self._release, "a release")
        return error_response(404, f"{request.path} is not served to peers", "not_found")

    async def _control(self, request: PeerRequest, handler: Handler, what: str
                       ) -> HandlerResponse:
        if request.method != "POST":
            return error_response(405, f"POST {what}", "method_not_allowed")
        body = await request.read()
        if len(body) > MAX_ASSIGNMENT_BYTES:
            return error_response(400, f"{what} is too large", "request_too_large")
        return await handler(request.peer_id, body)
