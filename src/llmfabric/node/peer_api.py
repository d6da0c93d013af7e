"""What a node answers on the peer protocol (requests from other admitted nodes).

  /v1/fabric/forward/v1/...  forwarded inference requests -> the local engine
  /_fabric/v1/assign         engine assignments from the fleet controller
The peer protocol is authenticated (TLS + admission), so `request.peer_id` is a member.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from llmfabric.ingress.forward_http import FORWARD_PREFIX
from llmfabric.net import HandlerResponse, PeerRequest
from llmfabric.node.assignment import ASSIGN_PATH
from llmfabric.node.engine_link import EngineLink, error_response

MAX_ASSIGNMENT_BYTES = 16 * 1024


class PeerApi:
    def __init__(
        self,
        engine: Callable[[], EngineLink | None],
        assign: Callable[[str, bytes], Awaitable[HandlerResponse]],
    ) -> None:
        self._engine = engine
        self._assign = assign

    async def handle(self, request: PeerRequest) -> HandlerResponse:
        if request.path.startswith(FORWARD_PREFIX + "/v1/"):
            engine = self._engine()
            if engine is None:
                return error_response(503, "this node serves no engine", "node_not_serving")
            return await engine.handle_peer_request(request)
        if request.path == ASSIGN_PATH:
            if request.method != "POST":
                return error_response(405, "POST an assignment", "method_not_allowed")
            body = await request.read()
            if len(body) > MAX_ASSIGNMENT_BYTES:
                return error_response(400, "assignment too large", "request_too_large")
            return await self._assign(request.peer_id, body)
        return error_response(404, f"{request.path} is not served to peers", "not_found")
