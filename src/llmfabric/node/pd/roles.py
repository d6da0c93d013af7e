"""Keep the record's prefill/decode roles current (ThunderServe's lightweight rescheduling).

A role flip (`POST /sim/role`, or the controller's SetRole) changes no process, so nothing
restarts and no new session begins: the node re-reads the engine's /v1/models every
`interval_s` while it serves a prefill or decode role (every `idle_interval_s` while all its
models are "both", the common case that never flips) and republishes its models only when a
role changed (each record change is gossiped to the whole fabric). Engines that report no
role stay "both".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, MutableMapping

from llmfabric.clock import Clock
from llmfabric.node.engine.link import EngineLink
from llmfabric.registry.records import ModelRole, ServedModel
from llmfabric.untrusted import get_logger

log = get_logger(__name__)


def with_roles(models: tuple[ServedModel, ...], roles: Mapping[str, ModelRole]
               ) -> tuple[ServedModel, ...]:
    """`models` with the roles the engine reports (models it does not list keep theirs)."""
    return tuple(dataclasses.replace(m, role=roles[m.id]) if m.id in roles and
                 roles[m.id] != m.role else m for m in models)


async def follow_roles(
    clock: Clock, engine: Callable[[], EngineLink | None],
    models: Callable[[], tuple[ServedModel, ...]],
    publish: Callable[[tuple[ServedModel, ...]], object], stopping: Callable[[], bool],
    interval_s: float = 2.0, idle_interval_s: float = 15.0,
    failures: MutableMapping[str, int] | None = None,
) -> None:
    """Loop: read the engine's roles, publish the models when one changed. A read that
    raises (a bug: an engine that does not answer reads as None) is logged and counted in
    `failures["engine-roles"]` (the node's task failures), and the loop goes on."""
    while not stopping():
        disaggregated = any(m.role != ModelRole.BOTH for m in models())
        await clock.sleep(interval_s if disaggregated else idle_interval_s)
        link = engine()
        if link is None or stopping():
            continue
        try:
            roles = await link.supervisor.model_roles()
        except Exception:
            if failures is not None:
                failures["engine-roles"] = failures.get("engine-roles", 0) + 1
            log.exception("reading the engine's roles failed")
            continue
        current = models()
        if roles is None or not current:
            continue
        fresh = with_roles(current, roles)
        if fresh != current and not stopping():
            log.info("engine roles changed: %s", ", ".join(f"{m.id}={m.role}" for m in fresh))
            publish(fresh)
