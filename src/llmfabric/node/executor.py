"""The fleet controller's executor: sends each decision to its node over the peer protocol."""

from __future__ import annotations

import time
from collections.abc import Callable

from llmfabric.clock import with_timeout
from llmfabric.dataplane.control import SIGNED_HEADER, sign_control
from llmfabric.net import NetError, RequestFailed, TlsTransport
from llmfabric.node.serve.peer_api import ASSIGN_PATH, RELEASE_PATH, Assignment, ReleaseRequest
from llmfabric.scheduler.decisions import Assign, Decision, Release
from llmfabric.untrusted import get_logger

log = get_logger(__name__)

# A release drains the node's requests (20 s by default) and stops its engine (5 s) before it
# answers, so the next assignment finds the node bare.
RELEASE_TIMEOUT_S = 90.0
ASSIGN_TIMEOUT_S = 30.0
# Answers are a line of JSON; a node's answer is read up to this much, within the timeout.
MAX_ANSWER_BYTES = 64 * 1024


async def post_signed_control(transport: TlsTransport, peer: str, path: str, body: bytes,
                              timeout_s: float) -> tuple[int, str]:
    """POST a control request signed by this node's key (dataplane/control.py) to `peer`;
    (status, answer text). Raises NetError when the peer cannot be reached, or its answer
    does not end within `timeout_s` or is over MAX_ANSWER_BYTES: the transport's timeout
    stops at the headers, and a node that then sent nothing held the controller's round
    (and so all placement) for good."""
    signed = sign_control(transport.key, peer, path, body, time.time())

    async def exchange() -> tuple[int, str]:
        resp = await transport.request(
            peer, "POST", path, (("content-type", "application/json"), (SIGNED_HEADER, signed)),
            body, timeout=timeout_s)
        async with resp:
            return resp.status, (await resp.read(MAX_ANSWER_BYTES)).decode(errors="replace")

    try:
        return await with_timeout(transport.clock, exchange(), timeout_s)
    except TimeoutError:
        raise RequestFailed(f"no whole answer from {peer} within {timeout_s:g} s") from None


class PeerExecutor:
    """`apply(Assign)` POSTs the assignment to every node in it (by session -> peer id);
    `apply(Release)` POSTs a release and waits until the node is bare again.

    A refusal or an unreachable node is logged and kept in `failures`, never raised: the other
    nodes of the decision still get theirs, and the controller re-plans on its next round."""

    def __init__(self, transport: TlsTransport, peer_of: Callable[[str], str | None]) -> None:
        self._transport = transport
        self._peer_of = peer_of
        self.results: list[tuple[str, int, str]] = []  # (session id, status, answer)
        self.failures: list[str] = []

    async def apply(self, decision: Decision) -> None:
        if isinstance(decision, Release):
            body = ReleaseRequest(decision.model, decision.reason).to_json()
            status = await self._post(decision.session_id, RELEASE_PATH, body,
                                      RELEASE_TIMEOUT_S, f"release of {decision.model}")
            if status == 200:
                log.info("released %s on %s (%s)", decision.model, decision.session_id,
                         decision.reason)
            return
        body = Assignment.from_decision(decision).to_json()
        for sid in decision.session_ids:
            status = await self._post(sid, ASSIGN_PATH, body, ASSIGN_TIMEOUT_S,
                                      f"assignment of {decision.model}")
            if status == 202:
                log.info("assigned %s (tp=%d) to %s", decision.model, decision.tp, sid)

    async def _post(self, sid: str, path: str, body: bytes, limit_s: float, what: str
                    ) -> int | None:
        """POST to the node of session `sid`; its status, or None if it was not reached.
        Anything but 200/202 is a failure (logged and kept)."""
        peer = self._peer_of(sid)
        if peer is None:
            self._fail(what, f"{sid}: not in the registry")
            return None
        try:
            status, answer = await post_signed_control(self._transport, peer, path, body,
                                                       limit_s)
        except NetError as exc:
            self._fail(what, f"{sid}: {exc}")
            return None
        self.results.append((sid, status, answer))
        if status not in (200, 202):
            self._fail(what, f"{sid}: {status} {answer[:200]}")
        return status

    def _fail(self, what: str, failure: str) -> None:
        log.error("%s failed: %s", what, failure)
        self.failures.append(failure)


__all__ = ["Assign", "PeerExecutor", "post_signed_control"]
