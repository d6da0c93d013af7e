"""The fleet controller's executor: sends each decision to its node over the peer protocol."""

from __future__ import annotations

import logging
from collections.abc import Callable

from llmfabric.net import NetError, TlsTransport
from llmfabric.node.assignment import ASSIGN_PATH, Assignment
from llmfabric.scheduler.decisions import Assign, Decision

log = logging.getLogger(__name__)


class PeerExecutor:
    """`apply(Assign)` POSTs the assignment to every node in it (by session -> peer id).

    A refusal or an unreachable node is logged and kept in `failures`, never raised: the other
    nodes of the decision still get theirs, and the controller re-plans on its next round."""

    def __init__(self, transport: TlsTransport, peer_of: Callable[[str], str | None]) -> None:
        self._transport = transport
        self._peer_of = peer_of
        self.results: list[tuple[str, int, str]] = []  # (session id, status, answer)
        self.failures: list[str] = []

    async def apply(self, decision: Decision) -> None:
        if not isinstance(decision, Assign):
            log.warning("release of %s is not carried out: engines are stopped through the "
                        "cluster manager (%s)", decision.session_id, decision.reason)
            return
        body = Assignment.from_decision(decision).to_json()
        failures: list[str] = []
        for sid in decision.session_ids:
            peer = self._peer_of(sid)
            if peer is None:
                failures.append(f"{sid}: not in the registry")
                continue
            try:
                resp = await self._transport.request(
                    peer, "POST", ASSIGN_PATH, (("content-type", "application/json"),), body,
                    timeout=30.0,
                )
                async with resp:
                    answer = (await resp.read()).decode(errors="replace")
            except NetError as exc:
                failures.append(f"{sid}: {exc}")
                continue
            self.results.append((sid, resp.status, answer))
            if resp.status != 202:
                failures.append(f"{sid}: {resp.status} {answer[:200]}")
            else:
                log.info("assigned %s (tp=%d) to %s", decision.model, decision.tp, sid)
        for failure in failures:
            log.error("assignment of %s failed: %s", decision.model, failure)
        self.failures.extend(failures)
