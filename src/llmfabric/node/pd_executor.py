"""Carry out lightweight-rescheduling decisions (scheduler/phasesplit/controller.py).

SetRole: POST the new role to each named session's engine (`/sim/role` of the simulated
engine; a routing change, nothing restarts); the node then republishes its role
(pd_roles.py) and every ingress's pd routing follows. SetRouting: the plan's X/Y, keyed by
session, installed in the PD routers of in-process ingresses (`routing.pd.PDRouter`).
Missing: carrying SetRole over the peer protocol and SetRouting as a signed registry fact, so
a controller on another host reaches engines and ingresses it cannot dial directly; until then
the controller must reach the engines' role endpoints (`role_urls`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import aiohttp

from llmfabric.routing.pd import PDPlanTable, PDRouter
from llmfabric.scheduler.decisions import SetRole, SetRouting

log = logging.getLogger(__name__)


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
                                                   f"{(await resp.text())[:200]}")
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise PDExecutionError(f"cannot flip {sid} at {url}: {exc!r}") from exc
                log.info("session %s now serves as %s", sid, d.role)
