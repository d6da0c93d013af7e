"""The PD controller's role flip over the peer protocol (`/_fabric/v1/role`): parsing, the
signed dispatch, the node's refusals (non-controllers, hostile bodies, wrong model) and a
flip that reaches the engine and republishes the node's roles. The real processes run in
tests/integration/test_fabric_pd.py."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from llmfabric.agent.probe import ProbeError
from llmfabric.dataplane.control import SIGNED_HEADER, sign_control
from llmfabric.identity import NodeKey
from llmfabric.net import HandlerResponse, PeerRequest
from llmfabric.net.messages import BodyStream
from llmfabric.node.engine_role import flip_role
from llmfabric.node.serve.dataplane_server import DataPlaneServer
from llmfabric.node.serve.peer_api import (
    ROLE_PATH,
    AssignmentError,
    PeerApi,
    RoleRequest,
    parse_role_request,
)
from llmfabric.registry.records import Lifecycle, ModelRole, NodeMeta, ServedModel

CONTROLLER = NodeKey.generate()
NODE = NodeKey.generate()  # the node the requests are signed for
MODEL = "llama-3.1-8b"


def _dataplane(key: NodeKey = NODE) -> DataPlaneServer:
    return DataPlaneServer(key, lambda: None, lambda _p: False, max_body_bytes=1024)


def _request(body: bytes, signer: NodeKey | None = CONTROLLER, path: str = ROLE_PATH,
             sign_path: str = ROLE_PATH) -> PeerRequest:
    stream = BodyStream(ack=lambda _n: None, on_abort=lambda: None)
    stream.push((body, len(body)))
    stream.push(None)
    headers = ((SIGNED_HEADER, sign_control(signer, NODE.peer_id, sign_path, body, time.time())),) \
        if signer is not None else ()
    return PeerRequest("peer-x", "POST", path, headers, stream)


def test_parse_role_request_round_trip_and_hostile_bodies() -> None:
    r = parse_role_request(b'{"model": "llama-3.1-8b", "role": "decode", "plan_id": "p1"}')
    assert r == RoleRequest(MODEL, "decode", "p1")
    assert parse_role_request(r.to_json()) == r
    for bad, field in ((b"nope", "JSON"), (b"[]", "object"),
                       (b'{"model": "--all", "role": "decode"}', "model"),
                       (b'{"model": "m", "role": "root"}', "role"),
                       (b'{"model": "m", "role": "decode", "plan_id": 7}', "plan_id"),
                       (orjson.dumps({"model": "m", "role": "both", "plan_id": "x" * 129}),
                        "plan_id")):
        with pytest.raises(AssignmentError, match=field):
            parse_role_request(bad)


async def test_peer_api_needs_the_controllers_signature_for_a_flip() -> None:
    seen: list[tuple[str, bytes]] = []

    async def assign(peer: str, body: bytes) -> HandlerResponse:
        return HandlerResponse(202, (), b"")

    async def role(peer: str, body: bytes) -> HandlerResponse:
        seen.append((peer, body))
        return HandlerResponse(200, (), b"")

    body = RoleRequest(MODEL, "decode").to_json()
    assert (await PeerApi(_dataplane(), assign).handle(_request(body))).status == 404
    api = PeerApi(_dataplane(), assign, None, role)
    assert (await api.handle(_request(body))).status == 200
    assert seen == [(CONTROLLER.peer_id, body)]  # the signer, not the connection, is who
    assert (await api.handle(_request(body, signer=None))).status == 401  # unsigned
    # a signature for another path (a captured assignment) does not flip roles
    assert (await api.handle(_request(body, sign_path="/_fabric/v1/assign"))).status == 401
    assert (await api.handle(_request(b"x" * 20_000))).status == 400  # oversized
    assert len(seen) == 1


class _Supervisor:
    def __init__(self, fail: bool = False) -> None:
        self.role = ModelRole.PREFILL
        self.fail = fail

    async def set_role(self, role: ModelRole) -> None:
        if self.fail:
            raise ProbeError("a vllm engine cannot flip roles")
        self.role = role

    async def model_roles(self) -> dict[str, ModelRole]:
        return {MODEL: self.role}


class _Node:
    """The parts of a Node the flip uses; update_self records what it republished."""

    def __init__(self, accept: bool = True, controllers: tuple[str, ...] = (),
                 state: Lifecycle = Lifecycle.SERVING, fail: bool = False) -> None:
        meta = NodeMeta(engine="sim", models=(ServedModel(MODEL, ("alias",),
                                                          role=ModelRole.PREFILL),))
        self.agent = SimpleNamespace(session_id="s1",
                                     record=SimpleNamespace(state=state, meta=meta))
        self.session = self
        self.session_id = "s1"
        self.config = SimpleNamespace(accept_assignments=accept, controllers=controllers)
        self.engine: Any = SimpleNamespace(supervisor=_Supervisor(fail))
        self.stopping = False
        self.published: list[NodeMeta] = []

    def meta(self, **changes: Any) -> NodeMeta:
        import dataclasses

        meta: NodeMeta = self.agent.record.meta
        return dataclasses.replace(meta, **changes)

    def update_self(self, meta: NodeMeta) -> None:
        self.published.append(meta)
        self.agent.record.meta = meta


async def _flip(node: Any, body: Any, peer: str = "ctl") -> tuple[int, Any]:
    resp = await flip_role(node, peer, body if isinstance(body, bytes) else orjson.dumps(body))
    assert isinstance(resp.body, bytes)
    return resp.status, orjson.loads(resp.body)


async def test_a_flip_reaches_the_engine_and_republishes_the_role() -> None:
    node = _Node(controllers=("ctl",))
    status, doc = await _flip(node, {"model": "alias", "role": "decode", "plan_id": "p2"})
    assert status == 200 and doc["role"] == "decode" and doc["republished"] is True
    assert node.engine.supervisor.role is ModelRole.DECODE
    assert [m.role for m in node.published[-1].models] == [ModelRole.DECODE]
    status, doc = await _flip(node, {"model": MODEL, "role": "decode"})  # already decode
    assert status == 200 and doc["republished"] is False and len(node.published) == 1


@pytest.mark.parametrize(
    ("node", "body", "peer", "status", "code"),
    [
        (_Node(accept=False), {"model": MODEL, "role": "decode"}, "ctl", 403,
         "assignments_disabled"),
        (_Node(controllers=("ctl",)), {"model": MODEL, "role": "decode"}, "intruder", 403,
         "not_a_controller"),
        (_Node(), {"model": MODEL, "role": "admin"}, "ctl", 400, "invalid_role_request"),
        (_Node(), b"\xff\xfe", "ctl", 400, "invalid_role_request"),
        (_Node(), {"model": "other-model", "role": "decode"}, "ctl", 409, "model_mismatch"),
        (_Node(state=Lifecycle.JOIN), {"model": MODEL, "role": "decode"}, "ctl", 409,
         "not_serving"),
        (_Node(fail=True), {"model": MODEL, "role": "decode"}, "ctl", 502, "engine_refused"),
    ],
)
async def test_refused_flips_change_nothing(node: _Node, body: Any, peer: str, status: int,
                                            code: str) -> None:
    got, doc = await _flip(node, body, peer)
    assert got == status and doc["error"]["code"] == code
    assert node.engine.supervisor.role is ModelRole.PREFILL and node.published == []


async def test_a_node_without_an_engine_refuses() -> None:
    node = _Node()
    node.engine = None
    got, doc = await _flip(node, {"model": MODEL, "role": "decode"})
    assert got == 409 and doc["error"]["code"] == "no_engine"
