"""Releasing an assigned engine on the controller's request (`/_fabric/v1/release`).

A node that accepts assignments stops its engine when the fleet controller reclaims it, and
comes back as a bare node the controller can assign again:

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
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import orjson

from llmfabric.net import HandlerResponse
from llmfabric.node.assignment import AssignmentError, parse_release
from llmfabric.node.engine_link import error_response
from llmfabric.registry.records import Lifecycle, LoadHints

if TYPE_CHECKING:
    from llmfabric.node.daemon import Node

log = logging.getLogger(__name__)


def _ok(doc: dict[str, object]) -> HandlerResponse:
    return HandlerResponse(200, (("content-type", "application/json"),), orjson.dumps(doc))


async def release_engine(node: Node, peer: str, body: bytes) -> HandlerResponse:
    """Handle one release request from `peer` (see the module docstring)."""
    cfg = node.config
    if not cfg.accept_assignments:
        return error_response(403, "this node does not accept assignments (start it with "
                              "--accept-assignments)", "assignments_disabled")
    if cfg.controllers and peer not in cfg.controllers:
        return error_response(403, f"peer {peer} is not an allowed controller",
                              "not_a_controller")
    try:
        req = parse_release(body)
    except AssignmentError as exc:
        return error_response(400, str(exc), "invalid_release")
    agent, engine = node.agent, node.engine
    if agent is None or node.stopping:
        return error_response(409, "this node is stopping", "stopping")
    if engine is None:
        return _ok({"released": False, "session_id": agent.session_id})
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
    drained = await node.inflight.drained(cfg.drain_timeout_s)
    await engine.aclose()
    node.engine = None
    meta = dataclasses.replace(record.meta, engine="", models=(), load=LoadHints())
    await agent.leave()
    await agent.aclose()
    fresh = await node.new_session(meta)
    log.info("released %s; bare again as session %s (was %s)", req.model, fresh.session_id,
             old_session)
    return _ok({"released": True, "drained": drained, "previous_session_id": old_session,
                "session_id": fresh.session_id})
