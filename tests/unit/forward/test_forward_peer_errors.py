"""PeerForwarder turns the transport's own failures (NetError: unreachable peer, relay gone,
stream reset) into UpstreamError, which the ingress retries on another node; a programming
error is no such failure and propagates as itself instead of becoming a retryable 502."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import pytest

from llmfabric.forward.peer import PeerForwarder
from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.errors import UpstreamError
from llmfabric.net.errors import PeerUnreachable, RequestFailed
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate


@dataclass
class Resp:
    fail_with: BaseException

    status: int = 200
    headers: Sequence[tuple[str, str]] = (("content-type", "text/event-stream"),)
    via: str | None = None

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        raise self.fail_with

    async def aclose(self) -> None:
        return None


@dataclass
class Requester:
    raise_on_request: BaseException | None = None
    fail_body_with: BaseException = field(
        default_factory=lambda: RequestFailed("stream reset by peer"))

    async def request(self, peer_id: str, method: str, path: str,
                      headers: Sequence[tuple[str, str]], body: bytes, *,
                      timeout: float = 30.0) -> Resp:  # noqa: ASYNC109
        if self.raise_on_request is not None:
            raise self.raise_on_request
        return Resp(self.fail_body_with)


@pytest.fixture
def cand() -> Candidate:
    return Candidate("s1", "peer-x", "p", "", ("relay-1",), Hardware("A100", 1),
                     ServedModel("m"), LoadHints())


async def test_transport_failures_become_upstream_errors(cand: Candidate) -> None:
    fwd = PeerForwarder(Requester(PeerUnreachable("no route")))
    with pytest.raises(UpstreamError, match=r"peer-x.*no route"):
        await fwd.open(cand, "/v1/completions", b"{}", Timeouts())
    up = await PeerForwarder(Requester()).open(cand, "/v1/completions", b"{}", Timeouts())
    with pytest.raises(UpstreamError, match="broke off"):
        await up.read()


async def test_a_bug_is_not_a_retryable_upstream_error(cand: Candidate) -> None:
    fwd = PeerForwarder(Requester(KeyError("bug in the transport")))
    with pytest.raises(KeyError):
        await fwd.open(cand, "/v1/completions", b"{}", Timeouts())
    up = await PeerForwarder(Requester(fail_body_with=AttributeError("bug"))).open(
        cand, "/v1/completions", b"{}", Timeouts())
    with pytest.raises(AttributeError):
        await up.read()
