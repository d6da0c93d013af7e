"""Signed control requests (assign, release, role) played by an attacker: a signature made
for one node does not work on another, junk signed by anybody never fills the replay cache,
malformed expiries are clean refusals, and bodies are read only up to their limit."""

from __future__ import annotations

import time

import pytest

from llmfabric.dataplane.authz import AuthzError
from llmfabric.dataplane.control import SIGNED_HEADER, sign_control, verify_control
from llmfabric.identity import NodeKey
from llmfabric.net.errors import BodyTooLarge
from llmfabric.net.messages import BodyStream, HandlerResponse, PeerRequest
from llmfabric.node.engine_link import error_response
from llmfabric.node.serve.dataplane_server import DataPlaneServer
from llmfabric.node.serve.peer_api import MAX_ASSIGNMENT_BYTES, RELEASE_PATH, PeerApi

pytestmark = [pytest.mark.unit, pytest.mark.hostile]

CONTROLLER, NODE, OTHER_NODE, MEMBER = (NodeKey.generate() for _ in range(4))


def _stream(*chunks: bytes) -> tuple[BodyStream, list[int], list[bool]]:
    acked: list[int] = []
    aborted: list[bool] = []
    stream = BodyStream(ack=acked.append, on_abort=lambda: aborted.append(True))
    for c in chunks:
        stream.push((c, len(c)))
    stream.push(None)
    return stream, acked, aborted


def _request(signer: NodeKey, target: str, body: bytes = b'{"model": "m"}') -> PeerRequest:
    stream, _, _ = _stream(body)
    signed = sign_control(signer, target, RELEASE_PATH, body, time.time())
    return PeerRequest("via-relay", "POST", RELEASE_PATH, ((SIGNED_HEADER, signed),), stream)


def _api(seen: list[str]) -> PeerApi:
    async def release(peer: str, body: bytes) -> HandlerResponse:
        seen.append(peer)
        return HandlerResponse(200, (), b"released")

    def refuse(signer: str) -> HandlerResponse | None:
        return None if signer == CONTROLLER.peer_id else error_response(
            403, f"peer {signer} is not an allowed controller", "not_a_controller")

    async def assign(peer: str, body: bytes) -> HandlerResponse:
        return HandlerResponse(403, (), b"")

    dp = DataPlaneServer(NODE, lambda: None, lambda _p: False, max_body_bytes=1024)
    return PeerApi(dp, assign, release, refuse=refuse)


async def test_a_signed_release_works_only_on_the_node_it_was_made_for() -> None:
    """A member that saw the controller's release for one node replayed the same bytes to
    every node of the model, and each released its engine: the target is signed now."""
    seen: list[str] = []
    api = _api(seen)
    stolen = await api.handle(_request(CONTROLLER, OTHER_NODE.peer_id))
    assert stolen.status == 401 and b"another node" in bytes(stolen.body)  # type: ignore[arg-type]
    assert seen == []
    assert (await api.handle(_request(CONTROLLER, NODE.peer_id))).status == 200
    assert seen == [CONTROLLER.peer_id]


async def test_junk_from_peers_that_may_not_control_never_fills_the_replay_cache() -> None:
    """10,000 self-signed flips from a non-controller each took a replay-cache slot, and the
    real controller's next request was refused (`replay_cache_full`) for two minutes."""
    seen: list[str] = []
    api = _api(seen)
    for i in range(300):
        body = b'{"model": "m", "reason": "%d"}' % i
        answer = await api.handle(_request(MEMBER, NODE.peer_id, body))
        assert answer.status == 403
    assert len(api._control_replay) == 0
    req = _request(CONTROLLER, NODE.peer_id)
    replay = PeerRequest(req.peer_id, req.method, req.path, req.headers,
                         _stream(b'{"model": "m"}')[0])
    assert (await api.handle(req)).status == 200
    again = await api.handle(replay)  # the same signature twice: refused
    assert again.status == 401 and b"replayed" in bytes(again.body)  # type: ignore[arg-type]


def test_malformed_expiries_are_clean_refusals() -> None:
    good = sign_control(CONTROLLER, NODE.peer_id, RELEASE_PATH, b"{}", time.time())
    pub, _, sig = good.split(".")
    for exp in ("9" * 400, "-5", "1e9", ""):
        with pytest.raises(AuthzError) as err:
            verify_control(f"{pub}.{exp}.{sig}", NODE.peer_id, RELEASE_PATH, b"{}",
                           time.time())
        assert err.value.code in ("bad_signature", "expired")


async def test_a_body_is_read_only_up_to_its_limit() -> None:
    """A peer handler read the whole body before checking its size (each chunk read returns
    flow-control credit, so the window bounded nothing: 256 MiB sent to /assign added 502 MB
    of memory). Past the limit the stream is reset; what was read stays under it."""
    chunk = b"x" * 65536
    stream, acked, aborted = _stream(*([chunk] * 64))  # 4 MiB offered
    with pytest.raises(BodyTooLarge):
        await stream.read(limit=100_000)
    assert aborted == [True] and sum(acked) <= 100_000 + len(chunk)
    seen: list[str] = []
    big = b"{" + b" " * (MAX_ASSIGNMENT_BYTES + 10) + b"}"
    answer = await _api(seen).handle(_request(CONTROLLER, NODE.peer_id, big))
    assert answer.status == 400 and seen == []
