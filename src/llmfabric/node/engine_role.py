"""The node's engine over its life: start, publish load, restart after a crash, take a
controller's assignment, release it on the controller's request, follow and flip its
prefill/decode role.

Every change of engine or session goes through the node's supervisor (node/supervisor.py),
one operation each; this module decides WHEN, the supervisor makes it so.

Release (`/_fabric/v1/release`): a node that accepts assignments stops its engine when the
fleet controller reclaims it and comes back as a bare node the controller can assign again:

1. refuse unless the node accepts assignments from this peer, is SERVING (an engine still
   starting is not released: its start-up would fail-stop the node) and serves the named
   model (a stale release must not stop another engine);
2. announce DOWN for the session, so ingresses stop routing to it, and wait for the requests
   in flight to finish (at most the node's drain timeout);
3. stop the engine (SIGTERM, then SIGKILL after the engine stop timeout);
4. announce LEFT and continue under a NEW session in JOIN with no engine and no models.
   The lifecycle only moves forward within a session (JOIN < SERVING < DOWN < LEFT), so a
   fresh session is how a node becomes bare again; its peer id, addresses and hardware stay.

The answer (200) comes when the node is bare, so the controller can send the next assignment
right after it. Releasing a node that is already bare answers 200 with released=false.

Prefill/decode roles (ThunderServe's lightweight rescheduling) flip a running engine between
prefill and decode without a restart, so no process restarts and no new session begins:

- the role poll (`follow_roles`) keeps the record's roles current after a flip (`POST
  /sim/role`, or the controller's SetRole): the node re-reads the engine's /v1/models every
  `interval_s` while it serves a prefill or decode role (every `idle_interval_s` while all its
  models are "both", the common case that never flips) and republishes its models only when a
  role changed (each record change is gossiped to the whole fabric). Engines that report no
  role stay "both".
- the PD controller's role flip (`flip_role`, `/_fabric/v1/role`): the controller signs a
  `RoleRequest` (model, role, plan id) like an assignment (node/serve/peer_api.py); the node
  accepts it only under the same rules (`refuse_controller`: started with
  `--accept-assignments`, from a listed `--controller` when any are listed), only while its
  engine serves the named model, and asks its engine to flip through the engine adapter
  (`EngineKind.role_path`, the simulated engine's `/sim/role`). It then republishes its models
  with the roles the engine reports at once, instead of waiting for the role poll, so every
  ingress's PD routing follows within one gossip round.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

import orjson

from llmfabric.agent import EngineEvent, EngineState
from llmfabric.agent.probe import ProbeError
from llmfabric.clock import Clock
from llmfabric.net import HandlerResponse
from llmfabric.net.ports import free_port
from llmfabric.node.engine_link import EngineLink, error_response, loopback_engine_command
from llmfabric.node.serve.peer_api import (
    AssignmentError,
    engine_command,
    parse_assignment,
    parse_release,
    parse_role_request,
)
from llmfabric.node.supervisor import ONE_SHOT, RestartPolicy, SessionChanged, SupervisorStopped
from llmfabric.registry.records import Lifecycle, LoadHints, ModelRole, ServedModel
from llmfabric.untrusted import get_logger

if TYPE_CHECKING:  # (the daemon builds the role; no runtime import back)
    from llmfabric.node.daemon import Node

log = get_logger(__name__)

# Exit statuses of a node whose engine failed (docs/node.md).
EXIT_NOT_READY, EXIT_FATAL, EXIT_GONE = 3, 4, 5


def _json(status: int, doc: dict[str, object]) -> HandlerResponse:
    return HandlerResponse(status, (("content-type", "application/json"),), orjson.dumps(doc))


def refuse_controller(node: Node, peer: str) -> HandlerResponse | None:
    cfg = node.config
    if not cfg.accept_assignments:
        return error_response(403, "this node does not accept assignments (start it with "
                              "--accept-assignments)", "assignments_disabled")
    if cfg.controllers and peer not in cfg.controllers:
        return error_response(403, f"peer {peer} is not an allowed controller",
                              "not_a_controller")
    return None


class EngineRole:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.restarts = 0

    def start(self, engine: EngineLink) -> None:
        """Install `engine` and start it in the background (SERVING once ready)."""
        self.node.supervisor.install_engine(engine)
        self.node.supervisor.loop("engine", lambda: self._run(engine), ONE_SHOT)

    async def _run(self, engine: EngineLink) -> None:
        node = self.node
        try:
            info = await engine.start()
        except Exception as exc:  # any reason: the node leaves with status 3 either way
            node.supervisor.failures["engine-start"] += 1
            log.error(
                "the engine did not become ready: %s (engine log: %s); announcing LEFT and "
                "exiting with status 3", exc, node.config.home / "logs" / "engine.log")
            node.shut_down(EXIT_NOT_READY)  # DOWN, LEFT, engine stopped, transport closed
            return
        agent = node.session
        agent.update_self(node.meta(engine=info.kind, models=info.models))
        agent.set_state(Lifecycle.SERVING)
        engine.supervisor.on_state_change(lambda ev: self._on_event(engine, ev))
        node.supervisor.loop("load", self._publish_load)
        node.supervisor.loop("roles", lambda: follow_roles(  # prefill/decode role flips
            node.clock, lambda: node.engine, lambda: node.session.record.meta.models,
            lambda models: node.session.update_self(node.meta(models=models)),
            lambda: node.stopping, failures=node.supervisor.failures))

    def _on_event(self, engine: EngineLink, event: EngineEvent) -> None:
        try:
            self._handle_event(engine, event)
        except Exception:  # (called by the engine supervisor, which would only log it)
            self.node.supervisor.failures["engine-events"] += 1
            log.exception("handling the engine event %s failed", event.state.value)

    def _handle_event(self, engine: EngineLink, event: EngineEvent) -> None:
        node = self.node
        if node.stopping or engine is not node.engine:
            return
        if event.state is EngineState.DOWN:
            log.error("engine down: %s", event.reason)
            if node.session.record.state < Lifecycle.DOWN:
                node.session.set_state(Lifecycle.DOWN)
            node.supervisor.loop("engine-down", lambda: self._after_down(engine), ONE_SHOT)
        elif event.state is EngineState.FATAL:
            log.error("fatal engine failure, fail-stop: %s", event.log_line or event.reason)
            node.shut_down(EXIT_FATAL, force=True)

    async def _after_down(self, engine: EngineLink) -> None:
        """The engine exited (its tree is already killed) or stopped answering: restart it
        under a new session with backoff, or leave (`on_engine_exit`, `engine_restarts`)."""
        node, cfg = self.node, self.node.config
        await node.supervisor.close_engine(engine, 2.0)  # a hung engine is killed
        policy = RestartPolicy(backoff_s=1.0, backoff_cap_s=30.0)
        while not node.stopping:
            if cfg.on_engine_exit == "leave" or self.restarts >= cfg.engine_restarts:
                log.error("the engine is gone and will not be restarted (%s); announcing LEFT "
                          "and exiting with status 5",
                          "--on-engine-exit leave" if cfg.on_engine_exit == "leave" else
                          f"{self.restarts} restarts used")
                node.shut_down(EXIT_GONE)
                return
            self.restarts += 1
            delay = policy.delay(self.restarts, node.rng)
            log.warning("restarting the engine in %.1f s (restart %d of %d)", delay,
                        self.restarts, cfg.engine_restarts)
            await node.clock.sleep(delay)
            if node.supervisor.stopping:  # (SIGTERM while we waited)
                return
            # Same command and environment (an assigned engine keeps its GPUs).
            env = engine.supervisor.config.env
            fresh = EngineLink(engine.config, node.clock, node.inflight,
                               env=dict(env) if env else None)
            node.supervisor.own_engine(fresh)  # stop() stops it even mid-start
            try:
                info = await fresh.start()
            except Exception as exc:  # any reason: counted, then the next attempt or leave
                node.supervisor.failures["engine-restart"] += 1
                log.error("engine restart failed: %s", exc)
                await node.supervisor.close_engine(fresh, 2.0)
                continue
            meta = node.meta(engine=info.kind, models=info.models)
            # The DOWN session ends; the engine serves under a new one.
            await node.change_session(meta, serving=True, leave_old=True, engine=fresh)
            fresh.supervisor.on_state_change(functools.partial(self._on_event, fresh))
            log.info("engine restarted; serving again as session %s", node.session_id)
            return

    async def _publish_load(self, interval_s: float = 10.0) -> None:
        """Refresh the load hint in the record when it changed, at most every `interval_s`:
        every record change is gossiped to the whole fabric, so load stays a coarse hint and
        routing policies track their own in-flight counts. The engine's own metrics (queue,
        running, KV-cache use, prefix hits; agent/engine_metrics.py) ride along, rounded so
        noise does not cause gossip."""
        node = self.node
        last: LoadHints | None = None
        while not node.stopping:
            await node.clock.sleep(interval_s)
            engine = node.engine
            if engine is None or node.session.record.state is not Lifecycle.SERVING:
                continue
            hints = node.inflight.load_hints()
            try:
                eload = await engine.supervisor.load()
            except Exception:  # a bug in a metrics parser must not stop the load hints
                node.supervisor.failures["engine-metrics"] += 1
                log.exception("reading the engine's metrics failed")
                eload = None
            node.metrics.observe_engine(eload)  # (llmfabric_engine_* on the node's /metrics)
            if eload is not None:
                hints = dataclasses.replace(
                    hints, queued=eload.waiting, running=eload.running,
                    kv_usage=round(eload.kv_usage, 2),
                    prefix_hit_rate=round(eload.prefix_hit_rate or 0.0, 2))
            changes: dict[str, Any] = {}
            if hints != last:
                changes["load"] = hints
            served = engine.served_prefixes  # the prefix-cache sketch (routing/cache_summary)
            if served.due(node.clock.now()):
                changes["prefix_cache"] = served.published(node.clock.now())
            if changes and not node.stopping:
                last = hints
                node.session.update_self(node.meta(**changes))

    # ---- the controller's requests ----------------------------------------------------------
    async def assign(self, peer: str, body: bytes) -> HandlerResponse:
        """Start an engine for a controller's assignment (bare nodes that accept them)."""
        node = self.node
        refused = refuse_controller(node, peer)
        if refused is not None:
            return refused
        if node.engine is not None or node.stopping:
            return error_response(409, "this node already runs an engine", "busy")
        try:
            assignment = parse_assignment(body)
        except AssignmentError as exc:
            return error_response(400, str(exc), "invalid_assignment")
        argv = loopback_engine_command(engine_command(assignment, free_port()),
                                       allow_public=node.config.allow_engine_public_bind)
        env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, assignment.gpu_ids))}
        config = node.config.model_copy(update={"process": tuple(argv), "engine_url": None})
        log.info("assignment from %s: %s", peer, " ".join(argv))
        self.start(EngineLink(config, node.clock, node.inflight,
                              env=env if assignment.gpu_ids else None))
        return _json(202, {"session_id": node.session_id, "command": argv})

    async def release(self, peer: str, body: bytes) -> HandlerResponse:
        return await release_engine(self.node, peer, body)


async def release_engine(node: Node, peer: str, body: bytes) -> HandlerResponse:
    """Handle one release request from `peer` (see the module docstring)."""
    refused = refuse_controller(node, peer)
    if refused is not None:
        return refused
    try:
        req = parse_release(body)
    except AssignmentError as exc:
        return error_response(400, str(exc), "invalid_release")
    agent, engine = node.agent, node.engine
    if agent is None or node.stopping:
        return error_response(409, "this node is stopping", "stopping")
    if engine is None:
        return _json(200, {"released": False, "session_id": agent.session_id})
    record = agent.record
    if record.state is not Lifecycle.SERVING:
        return error_response(409, f"the engine is not serving (session {record.state.name}); "
                              "retry when it is", "not_serving")
    names = {n for m in record.meta.models for n in (m.id, *m.aliases)}
    if req.model not in names:
        return error_response(409, f"this node serves {sorted(names)}, not {req.model!r}",
                              "model_mismatch")
    old_session = agent.session_id
    log.info("release of %s requested by %s (%s): draining", req.model, peer, req.reason)
    agent.set_state(Lifecycle.DOWN)  # ingresses stop routing here
    drained = await node.inflight.drained(node.config.drain_timeout_s)
    meta = dataclasses.replace(record.meta, engine="", models=(), load=LoadHints())
    try:  # one step: stop the engine, LEFT, a new bare session (unless it changed meanwhile)
        fresh = await node.change_session(meta, leave_old=True, engine=None, expect=agent,
                                          engine_stop_timeout_s=None)
    except SupervisorStopped:
        return error_response(409, "this node is stopping", "stopping")
    except SessionChanged:
        return error_response(409, "the node's session changed during the release; retry",
                              "session_changed")
    log.info("released %s; bare again as session %s (was %s)", req.model, fresh.session_id,
             old_session)
    return _json(200, {"released": True, "drained": drained,
                       "previous_session_id": old_session, "session_id": fresh.session_id})


# ---- prefill/decode roles --------------------------------------------------------------------
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
    """The role poll: read the engine's roles, publish the models when one changed. A read
    that raises (a bug: an engine that does not answer reads as None) is logged and counted
    in `failures["engine-roles"]` (the node's task failures), and the loop goes on."""
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


async def flip_role(node: Node, peer: str, body: bytes) -> HandlerResponse:
    """Handle one signed role request from `peer` (see the module docstring)."""
    refused = refuse_controller(node, peer)
    if refused is not None:
        return refused
    try:
        req = parse_role_request(body)
    except AssignmentError as exc:
        return error_response(400, str(exc), "invalid_role_request")
    agent, engine = node.agent, node.engine
    if agent is None or engine is None or node.stopping:
        return error_response(409, "this node runs no engine", "no_engine")
    record = agent.record
    if record.state is not Lifecycle.SERVING:
        return error_response(409, f"the engine is not serving (session {record.state.name})",
                              "not_serving")
    names = {n for m in record.meta.models for n in (m.id, *m.aliases)}
    if req.model not in names:
        return error_response(409, f"this node serves {sorted(names)}, not {req.model!r}",
                              "model_mismatch")
    role = ModelRole(req.role)
    try:
        await engine.supervisor.set_role(role)
    except ProbeError as exc:
        return error_response(502, f"the engine did not flip: {exc}", "engine_refused")
    reported = await engine.supervisor.model_roles()
    models = agent.record.meta.models
    fresh = with_roles(models, reported if reported is not None else
                       {m.id: role for m in models})
    if fresh != models and not node.stopping:
        node.session.update_self(node.meta(models=fresh))
    log.info("role flip from %s (plan %s): %s now serves as %s", peer, req.plan_id or "-",
             req.model, role)
    return HandlerResponse(200, (("content-type", "application/json"),), orjson.dumps({
        "session_id": node.session_id, "model": req.model, "role": str(role),
        "republished": fresh != models}))
