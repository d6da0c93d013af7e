import time

import orjson
import pytest

from llmfabric.dataplane.control import SIGNED_HEADER, sign_control
from llmfabric.identity import NodeKey
from llmfabric.net import HandlerResponse, PeerRequest
from llmfabric.net.messages import BodyStream
from llmfabric.node.serve.dataplane_server import DataPlaneServer
from llmfabric.node.serve.peer_api import (
    ASSIGN_PATH,
    Assignment,
    AssignmentError,
    PeerApi,
    engine_command,
    parse_assignment,
)

GOOD = {"model": "qwen3-1.7b", "gpu_type": "L40S", "tp": 1, "dp": 1, "template": "sim",
        "gpu_ids": [0]}


def test_parse_and_render_a_valid_assignment() -> None:
    a = parse_assignment(orjson.dumps(GOOD))
    assert a == Assignment("qwen3-1.7b", "L40S", 1, 1, "sim", (0,))
    argv = engine_command(a, 9001)
    assert argv[-10:] == ["--model", "qwen3-1.7b", "--gpu", "L40S", "--tp", "1", "--dp", "1",
                          "--port", "9001"]
    assert parse_assignment(a.to_json()) == a


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model": "x; rm -rf /"}, "model"),
        ({"model": "--flag"}, "model"),
        ({"template": "bash"}, "template"),
        ({"tp": 3}, "tp"),
        ({"dp": 0}, "dp"),
        ({"gpu_ids": ["0"]}, "gpu_ids"),
        ({"gpu_type": "H100 SXM"}, "gpu_type"),
    ],
)
def test_malformed_assignments_are_refused_with_the_field(
    change: dict[str, object], field: str
) -> None:
    with pytest.raises(AssignmentError, match=field):
        parse_assignment(orjson.dumps({**GOOD, **change}))


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'"text"'])
def test_non_object_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(AssignmentError):
        parse_assignment(body)


CONTROLLER = NodeKey.generate()
NODE = NodeKey.generate()  # the node the requests are signed for


def _request(path: str, method: str = "POST", body: bytes = b"{}",
             signer: NodeKey | None = CONTROLLER) -> PeerRequest:
    stream = BodyStream(ack=lambda _n: None, on_abort=lambda: None)
    stream.push((body, len(body)))
    stream.push(None)
    headers = (((SIGNED_HEADER, sign_control(signer, NODE.peer_id, path, body, time.time())),)
               if signer is not None else ())
    return PeerRequest("peer-x", method, path, headers, stream)


async def test_peer_api_dispatches_and_refuses_unknown_paths() -> None:
    seen: list[tuple[str, bytes]] = []

    async def assign(peer: str, body: bytes) -> HandlerResponse:
        seen.append((peer, body))
        return HandlerResponse(202, (), b"ok")

    api = PeerApi(DataPlaneServer(NODE, lambda: None, lambda _p: False,
                                  max_body_bytes=1024), assign)
    assert (await api.handle(_request(ASSIGN_PATH, body=b'{"a": 1}'))).status == 202
    # The signer is the controller, whatever the connection (or a relay) says.
    assert seen == [(CONTROLLER.peer_id, b'{"a": 1}')]
    unsigned = await api.handle(_request(ASSIGN_PATH, body=b'{"a": 2}', signer=None))
    assert unsigned.status == 401 and len(seen) == 1
    assert (await api.handle(_request(ASSIGN_PATH, method="GET"))).status == 405
    assert (await api.handle(_request("/etc/passwd"))).status == 404
    no_engine = await api.handle(_request("/v1/fabric/forward/v1/chat/completions"))
    assert no_engine.status == 503
    big = await api.handle(_request(ASSIGN_PATH, body=b"x" * 20_000))
    assert big.status == 400
