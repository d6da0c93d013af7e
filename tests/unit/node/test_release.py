"""The release request (`/_fabric/v1/release`): parsing, dispatch and the node's refusals.
The full drain -> stop -> new bare session path runs against real nodes in
tests/integration/test_controller_assigns.py."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from llmfabric.dataplane.control import SIGNED_HEADER, sign_control
from llmfabric.identity import NodeKey
from llmfabric.net import HandlerResponse, PeerRequest
from llmfabric.net.messages import BodyStream
from llmfabric.node.engine_role import release_engine
from llmfabric.node.serve.dataplane_server import DataPlaneServer
from llmfabric.node.serve.peer_api import (
    RELEASE_PATH,
    AssignmentError,
    PeerApi,
    ReleaseRequest,
    parse_release,
)
from llmfabric.registry.records import Lifecycle, NodeMeta, ServedModel

CONTROLLER = NodeKey.generate()


NODE = NodeKey.generate()  # the node the requests are signed for


def _dataplane() -> DataPlaneServer:
    return DataPlaneServer(NODE, lambda: None, lambda _p: False, max_body_bytes=1024)


def _request(path: str, method: str = "POST", body: bytes = b"{}") -> PeerRequest:
    """A control request signed by CONTROLLER, as the fleet controller's executor sends it."""
    stream = BodyStream(ack=lambda _n: None, on_abort=lambda: None)
    stream.push((body, len(body)))
    stream.push(None)
    signed = sign_control(CONTROLLER, NODE.peer_id, path, body, time.time())
    return PeerRequest("peer-x", method, path, ((SIGNED_HEADER, signed),), stream)


def test_parse_release() -> None:
    r = parse_release(b'{"model": "qwen3-1.7b", "reason": "reclaimed"}')
    assert r == ReleaseRequest("qwen3-1.7b", "reclaimed")
    assert parse_release(r.to_json()) == r
    for bad in (b"nope", b"[]", b'{"model": "--all"}', b'{"model": "m", "reason": 3}'):
        with pytest.raises(AssignmentError):
            parse_release(bad)


async def test_peer_api_routes_releases_only_when_a_handler_is_given() -> None:
    async def assign(peer: str, body: bytes) -> HandlerResponse:
        return HandlerResponse(202, (), b"")

    async def release(peer: str, body: bytes) -> HandlerResponse:
        return HandlerResponse(200, (), peer.encode() + body)

    without = PeerApi(_dataplane(), assign)
    assert (await without.handle(_request(RELEASE_PATH))).status == 404
    api = PeerApi(_dataplane(), assign, release)
    ok = await api.handle(_request(RELEASE_PATH, body=b'{"model": "m"}'))
    assert ok.status == 200 and ok.body == CONTROLLER.peer_id.encode() + b'{"model": "m"}'
    assert (await api.handle(_request(RELEASE_PATH, method="GET"))).status == 405


_ENGINE = object()


def _node(state: Lifecycle = Lifecycle.SERVING, models: tuple[str, ...] = ("qwen3-1.7b",),
          accept: bool = True, controllers: tuple[str, ...] = (), engine: Any = _ENGINE,
          ) -> Any:
    meta = NodeMeta(engine="sim", models=tuple(ServedModel(m, ("alias",)) for m in models))
    agent = SimpleNamespace(session_id="s1", record=SimpleNamespace(state=state, meta=meta))
    config = SimpleNamespace(accept_assignments=accept, controllers=controllers,
                             drain_timeout_s=1.0)
    return SimpleNamespace(config=config, agent=agent, engine=engine, stopping=False)


async def _status(node: Any, body: dict[str, Any], peer: str = "ctl") -> tuple[int, Any]:
    resp = await release_engine(node, peer, orjson.dumps(body))
    assert isinstance(resp.body, bytes)
    return resp.status, orjson.loads(resp.body)


@pytest.mark.parametrize(
    ("node", "status", "code"),
    [
        (_node(accept=False), 403, "assignments_disabled"),
        (_node(controllers=("other",)), 403, "not_a_controller"),
        (_node(state=Lifecycle.JOIN), 409, "not_serving"),  # engine still starting
        (_node(models=("llama-2-7b",)), 409, "model_mismatch"),  # a stale release
    ],
)
async def test_refusals_leave_the_engine_running(node: Any, status: int, code: str) -> None:
    engine = node.engine
    got, doc = await _status(node, {"model": "qwen3-1.7b"})
    assert got == status and doc["error"]["code"] == code
    assert node.engine is engine and node.agent.record.state in (Lifecycle.SERVING,
                                                                  Lifecycle.JOIN)


async def test_bad_body_and_bare_node() -> None:
    got, doc = await _status(_node(), {"reason": "no model"})
    assert got == 400 and doc["error"]["code"] == "invalid_release"
    got, doc = await _status(_node(engine=None), {"model": "qwen3-1.7b"})
    assert got == 200 and doc == {"released": False, "session_id": "s1"}


class _Agent:
    """A session as release_engine and the supervisor use it."""

    def __init__(self, sid: str, meta: NodeMeta) -> None:
        self.session_id = sid
        self.record = SimpleNamespace(state=Lifecycle.SERVING, meta=meta)
        self.closed = False

    def set_state(self, state: Lifecycle) -> None:
        self.record.state = state

    async def start(self) -> None: ...

    async def leave(self) -> None:
        self.record.state = Lifecycle.LEFT

    async def aclose(self) -> None:
        self.closed = True


class _Engine:
    def __init__(self) -> None:
        self.stopped = False

    async def aclose(self, stop_timeout_s: float | None = None) -> None:
        self.stopped = True


async def _supervised_node(*, race: bool = False) -> Any:
    """A node whose sessions and engine a real NodeSupervisor owns; with `race`, another
    session change lands while the release drains."""
    import random

    from llmfabric.node.supervisor import NodeSupervisor
    from llmfabric.testing.fake_clock import FakeClock

    meta = NodeMeta(engine="sim", models=(ServedModel("qwen3-1.7b", ()),))
    sup: NodeSupervisor[_Agent, _Engine] = NodeSupervisor(
        FakeClock(), random.Random(0), take_down=lambda name, exc: None)
    await sup.change_session(lambda: _Agent("s1", meta))
    sup.install_engine(_Engine())
    count = iter(range(2, 10))

    async def change_session(meta: NodeMeta, **kw: Any) -> _Agent:
        return await sup.change_session(lambda: _Agent(f"s{next(count)}", meta), **kw)

    async def drained(_timeout: float) -> bool:
        if race:  # e.g. an eviction's rejoin while the release waited for requests
            await change_session(meta)
        return True

    config = SimpleNamespace(accept_assignments=True, controllers=(), drain_timeout_s=1.0)
    return SimpleNamespace(
        config=config, supervisor=sup, stopping=False, change_session=change_session,
        inflight=SimpleNamespace(drained=drained))


async def test_a_release_is_one_session_change_and_leaves_a_bare_node() -> None:
    node = await _supervised_node()
    node.agent, node.engine = node.supervisor.session, node.supervisor.engine
    old, engine = node.agent, node.engine
    got, doc = await _status(node, {"model": "qwen3-1.7b"})
    assert got == 200 and doc["released"] and doc["previous_session_id"] == "s1"
    assert node.supervisor.engine is None and engine.stopped
    fresh = node.supervisor.session
    assert doc["session_id"] == fresh.session_id == "s2" and fresh.record.meta.models == ()
    assert old.record.state is Lifecycle.LEFT and old.closed and not fresh.closed


async def test_a_release_racing_another_session_change_is_refused_not_misapplied() -> None:
    node = await _supervised_node(race=True)
    node.agent, node.engine = node.supervisor.session, node.supervisor.engine
    got, doc = await _status(node, {"model": "qwen3-1.7b"})
    assert got == 409 and doc["error"]["code"] == "session_changed"
    assert node.supervisor.session.session_id == "s2"  # the other change stands
    assert not node.supervisor.engine.stopped  # and its engine was not stopped under it
