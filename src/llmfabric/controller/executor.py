"""The fleet controller's executor: sends each decision to its node over the peer protocol."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

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
# Control requests of one round in flight at once (each with its own timeout).
FAN_OUT = 16

_Outcome = tuple[str, int | None, str]  # (session id, status or None if not reached, answer)


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
    `apply(Release)` POSTs a release and waits until the node is bare again. `apply_all`
    carries out one round's decisions: every release at once, then every assignment at once
    (the nodes of one round are distinct; a release comes before the node's assignment),
    at most `fan_out` requests in flight.

    Requests go out concurrently, each with its own timeout, so k silent nodes cost a round
    one timeout, not k. A refusal or an unreachable node is logged and kept in `failures`,
    never raised: the other nodes still get theirs, and the controller re-plans on its next
    round. Results, failures and log lines are kept in the order of the decisions and their
    nodes, whatever order the answers arrive in. A node whose release failed is not sent its
    assignment (it still runs its engine: it would refuse, or hold the round again)."""

    def __init__(self, transport: TlsTransport, peer_of: Callable[[str], str | None],
                 fan_out: int = FAN_OUT) -> None:
        self._transport = transport
        self._peer_of = peer_of
        self._fan_out = asyncio.Semaphore(max(1, fan_out))
        self.results: list[tuple[str, int, str]] = []  # (session id, status, answer)
        self.failures: list[str] = []

    async def apply(self, decision: Decision) -> None:
        await self.apply_all([decision])

    async def apply_all(self, decisions: Sequence[Decision]) -> None:
        releases = [d for d in decisions if isinstance(d, Release)]
        released = await asyncio.gather(*(
            self._post(r.session_id, RELEASE_PATH,
                       ReleaseRequest(r.model, r.reason).to_json(), RELEASE_TIMEOUT_S)
            for r in releases))
        held: set[str] = set()  # nodes whose release failed: still running their engine
        for r, outcome in zip(releases, released, strict=True):
            status = self._record(outcome, f"release of {r.model}")
            if status is None:
                held.add(r.session_id)
            elif status == 200:
                log.info("released %s on %s (%s)", r.model, r.session_id, r.reason)
        sends: list[tuple[Assign, str]] = []
        for a in decisions:
            if not isinstance(a, Assign):
                continue
            for sid in a.session_ids:
                if sid in held:
                    self._fail(f"assignment of {a.model}", f"{sid}: not sent, its release "
                               "failed")
                else:
                    sends.append((a, sid))
        assigned = await asyncio.gather(*(
            self._post(sid, ASSIGN_PATH, Assignment.from_decision(a).to_json(),
                       ASSIGN_TIMEOUT_S) for a, sid in sends))
        for (a, sid), outcome in zip(sends, assigned, strict=True):
            if self._record(outcome, f"assignment of {a.model}") == 202:
                log.info("assigned %s (tp=%d) to %s", a.model, a.tp, sid)

    async def _post(self, sid: str, path: str, body: bytes, limit_s: float) -> _Outcome:
        """POST to the node of session `sid`: (sid, status, answer), or (sid, None, why) if it
        was not reached. Records and logs nothing (the caller does, in order)."""
        peer = self._peer_of(sid)
        if peer is None:
            return sid, None, "not in the registry"
        async with self._fan_out:
            try:
                status, answer = await post_signed_control(self._transport, peer, path, body,
                                                           limit_s)
            except NetError as exc:
                return sid, None, str(exc)
        return sid, status, answer

    def _record(self, outcome: _Outcome, what: str) -> int | None:
        """Keep one node's outcome: its status, or None if it failed (not reached, or
        anything but 200/202: logged and kept in `failures`)."""
        sid, status, answer = outcome
        if status is None:
            self._fail(what, f"{sid}: {answer}")
            return None
        self.results.append((sid, status, answer))
        if status not in (200, 202):
            self._fail(what, f"{sid}: {status} {answer[:200]}")
            return None
        return status

    def _fail(self, what: str, failure: str) -> None:
        log.error("%s failed: %s", what, failure)
        self.failures.append(failure)


__all__ = ["FAN_OUT", "Assign", "PeerExecutor", "post_signed_control"]
