"""What a node answers on the peer protocol (requests from other admitted nodes).

  /_fabric/v1/forward-session  data-plane session exchange (node/dataplane_server.py)
  /v1/fabric/forward/v1/...    sealed forwarded inference requests -> the local engine
  /_fabric/v1/assign           engine assignments from the fleet controller
  /_fabric/v1/release          releases (stop the engine, become bare) from the controller
  /_fabric/v1/link-probe, /_fabric/v1/links   link measurements (node/link_service.py)
The peer protocol is authenticated (TLS + admission), but a request that came through a
relay names its origin only by the relay's word: forwarded requests carry their own
authorization, and control requests must be signed by the controller's key
(dataplane/control.py); the signer, not the connection, is the controller.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from llmfabric.dataplane.authz import AuthzError, ReplayCache
from llmfabric.dataplane.control import SIGNED_HEADER, verify_control
from llmfabric.dataplane.exchange import SESSION_PATH
from llmfabric.ingress.forward_http import FORWARD_PREFIX
from llmfabric.net import HandlerResponse, PeerRequest
from llmfabric.node.assignment import ASSIGN_PATH, RELEASE_PATH
from llmfabric.node.dataplane_server import DataPlaneServer
from llmfabric.node.engine_link import error_response
from llmfabric.node.link_service import LinkService

MAX_ASSIGNMENT_BYTES = 16 * 1024

Handler = Callable[[str, bytes], Awaitable[HandlerResponse]]  # (peer id, body) -> answer


class PeerApi:
    def __init__(
        self,
        dataplane: DataPlaneServer,
        assign: Handler,
        release: Handler | None = None,
        *,
        now: Callable[[], float] = time.time,
        links: LinkService | None = None,
    ) -> None:
        self._dataplane = dataplane
        self._assign = assign
        self._release = release
        self._now = now
        self._links = links
        self._control_replay = ReplayCache(max_entries=10_000)

    async def handle(self, request: PeerRequest) -> HandlerResponse:
        if request.path.startswith(FORWARD_PREFIX + "/v1/"):
            return await self._dataplane.handle_sealed(request)
        if request.path == SESSION_PATH:
            return await self._dataplane.handle_session(request)
        if request.path == ASSIGN_PATH:
            return await self._control(request, self._assign, "an assignment")
        if request.path == RELEASE_PATH and self._release is not None:
            return await self._control(request, self._release, "a release")
        if self._links is not None and self._links.handles(request.path):
            return await self._links.handle(request)
        return error_response(404, f"{request.path} is not served to peers", "not_found")

    async def _control(self, request: PeerRequest, handler: Handler, what: str
                       ) -> HandlerResponse:
        if request.method != "POST":
            return error_response(405, f"POST {what}", "method_not_allowed")
        body = await request.read()
        if len(body) > MAX_ASSIGNMENT_BYTES:
            return error_response(400, f"{what} is too large", "request_too_large")
        try:
            signer = verify_control(request.header(SIGNED_HEADER), request.path, body,
                                    self._now(), self._control_replay)
        except AuthzError as exc:
            return error_response(401, f"{what} refused: {exc}", exc.code)
        return await handler(signer, body)
