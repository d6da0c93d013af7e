"""What a node answers on the peer protocol (requests from other admitted nodes).

  /_fabric/v1/forward-session  data-plane session exchange (node/serve/dataplane_server.py)
  /v1/fabric/forward/v1/...    sealed forwarded inference requests -> the local engine
  /_fabric/v1/assign           engine assignments from the fleet controller
  /_fabric/v1/release          releases (stop the engine, become bare) from the controller
  /_fabric/v1/role             prefill/decode role flips from the PD controller
                               (node/engine_role.py)
  /_fabric/v1/link-probe, /_fabric/v1/links   link measurements (net/link_service.py)
  /_fabric/v1/revocations      the operator revocation list this node holds
                               (node/revocations.py; certificate networks)
The peer protocol is authenticated (TLS + admission), but a request that came through a
relay names its origin only by the relay's word: forwarded requests carry their own
authorization, and control requests must be signed by the controller's key
(dataplane/control.py); the signer, not the connection, is the controller.

Assignments and releases (their bodies are parsed and built here, for both sides): the
controller sends data (model, template name, parallelism, GPU ids), never a command line:
the node renders the command from its own template table, so an admitted peer cannot make a
node run arbitrary programs. A release names the model the controller believes the node
serves (so a stale release cannot stop a different engine). Nodes accept either only when
started with `--accept-assignments`, optionally only from listed controller peer ids.
"""

from __future__ import annotations

import re
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from llmfabric.dataplane.authz import AuthzError, ReplayCache
from llmfabric.dataplane.control import SIGNED_HEADER, remember, verify_control
from llmfabric.dataplane.exchange import SESSION_PATH
from llmfabric.ingress.paths import FORWARD_PREFIX
from llmfabric.net import HandlerResponse, PeerRequest
from llmfabric.net.errors import BodyTooLarge
from llmfabric.net.link_service import LinkService
from llmfabric.node.engine_link import error_response
from llmfabric.node.revocations import RevocationSync
from llmfabric.node.serve.dataplane_server import DataPlaneServer
from llmfabric.scheduler.decisions import TEMPLATES, Assign, render

ASSIGN_PATH = "/_fabric/v1/assign"
RELEASE_PATH = "/_fabric/v1/release"
ROLE_PATH = "/_fabric/v1/role"
_ROLES = ("prefill", "decode", "both")
_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}\Z")
_GPU_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


class AssignmentError(ValueError):
    """The assignment is malformed; the message says which field."""


@dataclass(frozen=True, slots=True)
class Assignment:
    model: str
    gpu_type: str
    tp: int
    dp: int
    template: str
    gpu_ids: tuple[int, ...]

    @classmethod
    def from_decision(cls, decision: Assign) -> Assignment:
        return cls(decision.model, decision.gpu_type, decision.tp, decision.dp,
                   decision.template, decision.gpu_ids)

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))


def parse_assignment(body: bytes) -> Assignment:
    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise AssignmentError("the assignment body is not JSON") from None
    if not isinstance(data, dict):
        raise AssignmentError("the assignment must be a JSON object")
    model, gpu, template = data.get("model"), data.get("gpu_type"), data.get("template")
    tp, dp, gpu_ids = data.get("tp"), data.get("dp", 1), data.get("gpu_ids", [])
    if not isinstance(model, str) or not _MODEL_RE.match(model):
        raise AssignmentError("model must be a model id (letters, digits, . _ : / @ + -)")
    if not isinstance(gpu, str) or not _GPU_RE.match(gpu):
        raise AssignmentError("gpu_type must be a GPU name like H100-SXM")
    if template not in TEMPLATES:
        raise AssignmentError(f"template must be one of {sorted(TEMPLATES)}")
    if not isinstance(tp, int) or tp not in (1, 2, 4, 8):
        raise AssignmentError("tp must be 1, 2, 4 or 8")
    if not isinstance(dp, int) or not 1 <= dp <= 64:
        raise AssignmentError("dp must be an integer in 1..64")
    if not isinstance(gpu_ids, list) or not all(
        isinstance(i, int) and 0 <= i < 64 for i in gpu_ids
    ):
        raise AssignmentError("gpu_ids must be a list of GPU indexes")
    return Assignment(model, gpu, tp, dp, str(template), tuple(gpu_ids))


def engine_command(assignment: Assignment, port: int) -> list[str]:
    """The argv this node runs for `assignment`, from its own template table."""
    decision = Assign(assignment.model, assignment.gpu_type, assignment.tp, assignment.dp, (),
                      assignment.template, assignment.gpu_ids)
    argv = render(decision, port)
    if argv and argv[0] == "llmfabric" and shutil.which("llmfabric") is None:
        argv = [sys.executable, "-m", "llmfabric", *argv[1:]]
    return argv


@dataclass(frozen=True, slots=True)
class ReleaseRequest:
    """Stop the engine serving `model` and return to a bare (assignable) node."""

    model: str
    reason: str = ""

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))


def parse_release(body: bytes) -> ReleaseRequest:
    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise AssignmentError("the release body is not JSON") from None
    if not isinstance(data, dict):
        raise AssignmentError("the release must be a JSON object")
    model, reason = data.get("model"), data.get("reason", "")
    if not isinstance(model, str) or not _MODEL_RE.match(model):
        raise AssignmentError("model must be a model id (letters, digits, . _ : / @ + -)")
    if not isinstance(reason, str):
        raise AssignmentError("reason must be a string")
    return ReleaseRequest(model, reason[:200])


@dataclass(frozen=True, slots=True)
class RoleRequest:
    """Serve `model` in `role` from now on (a routing change: the engine keeps running)."""

    model: str
    role: str
    plan_id: str = ""

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))


def parse_role_request(body: bytes) -> RoleRequest:
    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise AssignmentError("the role request body is not JSON") from None
    if not isinstance(data, dict):
        raise AssignmentError("the role request must be a JSON object")
    model, role, plan_id = data.get("model"), data.get("role"), data.get("plan_id", "")
    if not isinstance(model, str) or not _MODEL_RE.match(model):
        raise AssignmentError("model must be a model id (letters, digits, . _ : / @ + -)")
    if role not in _ROLES:
        raise AssignmentError(f"role must be one of {', '.join(_ROLES)}")
    if not isinstance(plan_id, str) or len(plan_id) > 128:
        raise AssignmentError("plan_id must be a string of at most 128 characters")
    return RoleRequest(model, str(role), plan_id)


MAX_ASSIGNMENT_BYTES = 16 * 1024

Handler = Callable[[str, bytes], Awaitable[HandlerResponse]]  # (peer id, body) -> answer


class PeerApi:
    def __init__(
        self,
        dataplane: DataPlaneServer,
        assign: Handler,
        release: Handler | None = None,
        role: Handler | None = None,
        *,
        now: Callable[[], float] = time.time,
        links: LinkService | None = None,
        refuse: Callable[[str], HandlerResponse | None] | None = None,
        revocations: RevocationSync | None = None,
    ) -> None:
        """`refuse(signer)`: the answer to a control request from a peer that may not
        control this node (None: it may), asked before its signature is remembered."""
        self._dataplane = dataplane
        self._self_id = dataplane.key.peer_id  # what a control request must be signed for
        self._refuse = refuse or (lambda _signer: None)
        self._assign = assign
        self._release = release
        self._role = role
        self._now = now
        self._links = links
        self._revocations = revocations
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
        if request.path == ROLE_PATH and self._role is not None:
            return await self._control(request, self._role, "a role flip")
        if self._links is not None and self._links.handles(request.path):
            return await self._links.handle(request)
        if self._revocations is not None and self._revocations.handles(request.path):
            return await self._revocations.handle(request)
        return error_response(404, f"{request.path} is not served to peers", "not_found")

    async def _control(self, request: PeerRequest, handler: Handler, what: str
                       ) -> HandlerResponse:
        if request.method != "POST":
            return error_response(405, f"POST {what}", "method_not_allowed")
        try:
            body = await request.read(MAX_ASSIGNMENT_BYTES)
        except BodyTooLarge:  # (the stream is reset: the sender stops at its window)
            return error_response(400, f"{what} is too large", "request_too_large")
        now = self._now()
        try:
            signed = verify_control(request.header(SIGNED_HEADER), self._self_id,
                                    request.path, body, now)
        except AuthzError as exc:
            return error_response(401, f"{what} refused: {exc}", exc.code)
        refused = self._refuse(signed.signer)  # before the replay cache: junk stays out
        if refused is not None:
            return refused
        try:
            remember(self._control_replay, signed, now)
        except AuthzError as exc:
            return error_response(401, f"{what} refused: {exc}", exc.code)
        return await handler(signed.signer, body)
