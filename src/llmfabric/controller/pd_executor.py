"""Carry out lightweight-rescheduling decisions (scheduler/phasesplit/controller.py).

Across the fabric (`PeerPDExecutor`, what `llmfabric controller --pd-plan` runs): SetRole is
a signed `RoleRequest` to each named session's node over the peer protocol (`flip_role` in
node/engine_role.py: the node flips its engine and republishes its role); SetRouting becomes
the plan item of the controller's own record (routing/pd_plan.py), which every ingress
trusting this controller installs in its PD router.

In one process (`RoleFlipExecutor`, tests and embedding): SetRole POSTs the new role to each
session's engine (`/sim/role`), SetRouting installs the table in in-process routers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import aiohttp

from llmfabric.agent.probe import error_text
from llmfabric.controller.executor import post_signed_control
from llmfabric.net import NetError, TlsTransport
from llmfabric.node.serve.peer_api import ROLE_PATH, RoleRequest
from llmfabric.routing.pd import PDPlanTable, PDRouter, PlanError
from llmfabric.routing.pd_plan import PlanItem, encode_plan
from llmfabric.scheduler.decisions import SetRole, SetRouting
from llmfabric.untrusted import get_logger

log = get_logger(__name__)


class PDExecutionError(RuntimeError):
    """An engine refused or could not be reached for a role flip."""


class RoleFlipExecutor:
    def __init__(self, role_urls: Mapping[str, str], routers: Sequence[PDRouter] = (),
                 timeout_s: float = 5.0) -> None:
        self.role_urls = dict(role_urls)  # session id -> engine base URL
        self.routers = list(routers)
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.applied: list[SetRole | SetRouting] = []

    async def apply(self, decision: SetRole | SetRouting) -> None:
        if isinstance(decision, SetRole):
            await self._flip(decision)
        else:
            if decision.prefill_sessions:
                table = PDPlanTable.from_routing(decision)
                for r in self.routers:
                    r.set_plan(table)
        self.applied.append(decision)

    async def _flip(self, d: SetRole) -> None:
        unknown = [s for s in d.session_ids if s not in self.role_urls]
        if unknown or not d.session_ids:
            raise PDExecutionError(f"no engine known for session(s) {unknown or '(none)'} "
                                   f"(GPUs {list(d.gpu_ids)})")
        async with aiohttp.ClientSession(timeout=self.timeout) as http:
            for sid in d.session_ids:
                url = self.role_urls[sid].rstrip("/") + "/sim/role"
                try:
                    async with http.post(url, json={"role": d.role}) as resp:
                        if resp.status != 200:
                            raise PDExecutionError(f"{url} answered {resp.status}: "
                                                   f"{await error_text(resp)}")
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise PDExecutionError(f"cannot flip {sid} at {url}: {exc!r}") from exc
                log.info("session %s now serves as %s", sid, d.role)


ROLE_TIMEOUT_S = 15.0


class PeerPDExecutor:
    """SetRole over the peer protocol, SetRouting into the controller's record.

    `publish(item_bytes)` writes the controller's record (NodeMeta.pd_plan). A refused or
    unreachable flip is logged and kept in `failures`, not raised: the other flips still go
    out, the routing is still published, and the controller's next loss or drift re-plans."""

    def __init__(self, transport: TlsTransport, peer_of: Callable[[str], str | None],
                 model: str, publish: Callable[[bytes], object],
                 wall: Callable[[], float] = time.time) -> None:
        self._transport = transport
        self._peer_of = peer_of
        self.model = model
        self._publish = publish
        self._wall = wall
        self.plan_id = ""
        self.applied: list[SetRole | SetRouting] = []
        self.results: list[tuple[str, int, str]] = []  # (session id, status, answer)
        self.failures: list[str] = []

    async def apply(self, decision: SetRole | SetRouting) -> None:
        if isinstance(decision, SetRole):
            if not decision.session_ids:
                self._fail(f"flip to {decision.role}", f"no session holds GPUs "
                           f"{list(decision.gpu_ids)}")
            body = RoleRequest(self.model, decision.role, self.plan_id).to_json()
            for sid in decision.session_ids:
                if await self._post(sid, body, f"flip to {decision.role}") == 200:
                    log.info("session %s now serves %s as %s", sid, self.model, decision.role)
        else:
            try:
                table = PDPlanTable.from_routing(decision)
                item = encode_plan(PlanItem(self.model, self._wall(), table))
            except PlanError as exc:
                self._fail(f"routing plan {decision.plan_id}", str(exc))
                return
            self.plan_id = table.plan_id
            self._publish(item)
            log.info("published routing plan %s (%d prefill x %d decode sessions)",
                     table.plan_id, len(table.prefill), len(table.decode))
        self.applied.append(decision)

    async def _post(self, sid: str, body: bytes, what: str) -> int | None:
        peer = self._peer_of(sid)
        if peer is None:
            self._fail(what, f"{sid}: not in the registry")
            return None
        try:
            status, answer = await post_signed_control(self._transport, peer, ROLE_PATH, body,
                                                       ROLE_TIMEOUT_S)
        except NetError as exc:
            self._fail(what, f"{sid}: {exc}")
            return None
        self.results.append((sid, status, answer))
        if status != 200:
            self._fail(what, f"{sid}: {status} {answer[:200]}")
        return status

    def _fail(self, what: str, failure: str) -> None:
        log.error("%s failed: %s", what, failure)
        self.failures.append(failure)
