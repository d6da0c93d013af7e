"""ChoosingForwarder: a direct HTTP address that cannot be connected to (a wrong or private
address in the node's record) does not make the node unreachable: the request goes through
the peer network, and the address is skipped for a while."""

from __future__ import annotations

import pytest

from llmfabric.forward import ChoosingForwarder
from llmfabric.ingress import Timeouts, UpstreamError
from llmfabric.ingress.errors import UpstreamBusyError, UpstreamConnectError
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing import Candidate

from ._fakes import OkUpstream


def cand(sid: str, addr: str = "10.0.0.9:8090") -> Candidate:
    return Candidate(sid, f"peer-{sid}", "p", addr, (), Hardware("A100", 1), ServedModel("m"),
                     LoadHints())


class _Fwd:
    enforces_timeouts = False

    def __init__(self, fail: type[Exception] | None = None) -> None:
        self.sent: list[str] = []
        self.fail = fail

    async def open(self, candidate: Candidate, path: str, body: bytes,
                   timeouts: Timeouts) -> OkUpstream:
        self.sent.append(candidate.session_id)
        if self.fail is not None:
            raise self.fail("boom")
        return OkUpstream()

    async def aclose(self) -> None:
        return None


async def test_a_direct_connect_failure_falls_back_to_the_peer_path_then_skips_direct() -> None:
    now = [0.0]
    direct, peer = _Fwd(UpstreamConnectError), _Fwd()
    fwd = ChoosingForwarder(direct, peer, direct_retry_after_s=30.0, now=lambda: now[0])
    up = await fwd.open(cand("a"), "/v1/chat/completions", b"{}", Timeouts())
    assert up.status == 200
    assert direct.sent == ["a"] and peer.sent == ["a"]
    await fwd.open(cand("a"), "/v1/chat/completions", b"{}", Timeouts())  # direct skipped
    assert direct.sent == ["a"] and peer.sent == ["a", "a"]
    now[0] = 31.0  # the address gets another chance
    await fwd.open(cand("a"), "/v1/chat/completions", b"{}", Timeouts())
    assert direct.sent == ["a", "a"] and peer.sent == ["a", "a", "a"]


async def test_other_direct_failures_are_not_resent() -> None:
    # A failure after the request may have been sent (timeout, reset) is the ingress's to
    # retry on another candidate: sending it again to the same node could run it twice.
    direct, peer = _Fwd(UpstreamError), _Fwd()
    fwd = ChoosingForwarder(direct, peer)
    with pytest.raises(UpstreamError):
        await fwd.open(cand("a"), "/v1/chat/completions", b"{}", Timeouts())
    assert peer.sent == []


async def test_a_busy_dial_gate_is_not_a_failed_address() -> None:
    # This ingress's own dial limit to the node was full: the address is fine, so the
    # request neither goes over the (slower, relayed) peer path nor marks the address failed
    direct, peer = _Fwd(UpstreamBusyError), _Fwd()
    fwd = ChoosingForwarder(direct, peer)
    with pytest.raises(UpstreamBusyError):
        await fwd.open(cand("a"), "/v1/chat/completions", b"{}", Timeouts())
    direct.fail = None
    await fwd.open(cand("a"), "/v1/chat/completions", b"{}", Timeouts())
    assert direct.sent == ["a", "a"] and peer.sent == []


async def test_both_paths_failing_is_one_upstream_error_naming_both() -> None:
    fwd = ChoosingForwarder(_Fwd(UpstreamConnectError), _Fwd(UpstreamError))
    with pytest.raises(UpstreamError, match=r"direct: .*peer network"):
        await fwd.open(cand("a"), "/v1/chat/completions", b"{}", Timeouts())


async def test_without_a_peer_forwarder_connect_errors_propagate() -> None:
    fwd = ChoosingForwarder(_Fwd(UpstreamConnectError), None)
    with pytest.raises(UpstreamConnectError):
        await fwd.open(cand("a"), "/v1/chat/completions", b"{}", Timeouts())
