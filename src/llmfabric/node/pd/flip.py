"""The PD controller's role flip over the peer protocol (`/_fabric/v1/role`).

ThunderServe's lightweight rescheduling flips a running engine between prefill and decode
without a restart. The controller signs a `RoleRequest` (model, role, plan id) like an
assignment (node/serve/peer_api.py); the node accepts it only under the same rules (started with
`--accept-assignments`, from a listed `--controller` when any are listed), only while its
engine serves the named model, and asks its engine to flip through the engine adapter
(`EngineKind.role_path`, the simulated engine's `/sim/role`). It then republishes its models
with the roles the engine reports at once, instead of waiting for the role poll of
roles.py, so every ingress's PD routing follows within one gossip round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from llmfabric.agent.probe import ProbeError
from llmfabric.net import HandlerResponse
from llmfabric.node.engine.link import error_response
from llmfabric.node.engine.role import refuse_controller
from llmfabric.node.pd.roles import with_roles
from llmfabric.node.serve.peer_api import AssignmentError, parse_role_request
from llmfabric.registry.records import Lifecycle, ModelRole
from llmfabric.untrusted import get_logger

if TYPE_CHECKING:  # (the daemon wires the handler; no runtime import back)
    from llmfabric.node.daemon import Node

log = get_logger(__name__)


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
