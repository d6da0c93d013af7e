"""Fleet decisions as data, the engine command templates, and the executor interface."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from llmfabric.scheduler.errors import SpecError
from llmfabric.untrusted import get_logger

log = get_logger("llmfabric.scheduler.controller")


@dataclass(frozen=True, slots=True)
class Assign:
    """Start one engine of `model` on each node in `session_ids`, on node-local `gpu_ids`,
    with `tp`-way tensor parallelism and `dp` data-parallel replicas (tp * dp == len(gpu_ids)),
    from the command template named `template`."""

    model: str
    gpu_type: str
    tp: int
    dp: int
    session_ids: tuple[str, ...]
    template: str
    gpu_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Release:
    """Stop the engine on a running node (only emitted when reclaiming is configured)."""

    session_id: str
    model: str
    reason: str


Decision = Assign | Release

# Placeholders: {model} {gpu} {tp} {dp} {port} {gpus} (comma-separated node-local GPU ids).
TEMPLATES: dict[str, str] = {
    "vllm": "vllm serve {model} --tensor-parallel-size {tp} --data-parallel-size {dp} "
            "--port {port}",
    "sglang": "python -m sglang.launch_server --model-path {model} --tp {tp} --dp {dp} "
              "--port {port}",
    "sim": "llmfabric engine sim --model {model} --gpu {gpu} --tp {tp} --dp {dp} --port {port}",
}


def render(decision: Assign, port: int, templates: dict[str, str] | None = None) -> list[str]:
    """The argv an agent runs for `decision` (CUDA_VISIBLE_DEVICES is the agent's business)."""
    table = TEMPLATES if templates is None else templates
    try:
        text = table[decision.template]
    except KeyError:
        raise SpecError(f"unknown command template {decision.template!r}; "
                        f"choose one of {sorted(table)}") from None
    return shlex.split(text.format(
        model=decision.model, gpu=decision.gpu_type, tp=decision.tp, dp=decision.dp, port=port,
        gpus=",".join(str(i) for i in decision.gpu_ids)))


class Executor(Protocol):
    async def apply(self, decision: Decision) -> None:
        """Carry out one decision (e.g. send it to the node agent over the peer protocol)."""
        ...

    async def apply_all(self, decisions: Sequence[Decision]) -> None:
        """Carry out one round's decisions, in order where it matters: a node's release
        before its assignment (controller/executor.py sends the rest concurrently)."""
        ...


class LoggingExecutor:
    """Dry run: logs each decision with the command it would start, and keeps them."""

    def __init__(self, port: int = 8000, templates: dict[str, str] | None = None) -> None:
        self.port = port
        self.templates = templates
        self.applied: list[Decision] = []

    async def apply(self, decision: Decision) -> None:
        self.applied.append(decision)
        if isinstance(decision, Assign):
            cmd = shlex.join(render(decision, self.port, self.templates))
            log.info("assign %s tp=%d dp=%d to %s gpus=%s: %s", decision.model, decision.tp,
                     decision.dp, ",".join(decision.session_ids), decision.gpu_ids, cmd)
        else:
            log.info("release %s (%s): %s", decision.session_id, decision.model, decision.reason)

    async def apply_all(self, decisions: Sequence[Decision]) -> None:
        for d in decisions:
            await self.apply(d)


@dataclass(frozen=True, slots=True)
class SetRole:
    """Flip the serving role of running engines (ThunderServe lightweight rescheduling: a
    routing change, no restart): `role` is "prefill", "decode" or "both". `gpu_ids` names the
    planner's GPUs when the sessions are not known yet (the controller maps them)."""

    session_ids: tuple[str, ...]
    role: str
    gpu_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SetRouting:
    """Publish a prefill/decode routing plan: X over prefill replicas, Y[i] over decode
    replicas for requests prefilled on i. `prefill_sessions`/`decode_sessions` name the
    session each replica is entered through when the controller knows them (routing/pd.py's
    PDPlanTable keys its weights by session)."""

    plan_id: str
    x: tuple[float, ...]
    y: tuple[tuple[float, ...], ...]
    prefill_sessions: tuple[str, ...] = ()
    decode_sessions: tuple[str, ...] = ()
