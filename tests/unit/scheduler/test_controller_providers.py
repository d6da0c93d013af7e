"""`llmfabric controller --provider P`: the assigning controller counts and assigns only the
nodes of verified, allowed providers, and reads demand only from their ingresses. Capacity
and demand are claims; without the option a certified member of another provider took
assignments and its records counted as replicas (the honest model was left unplaced)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

import llmfabric.cli.controller as ctl_cli
from llmfabric.cli.controller import fleet_of, provider_filter
from llmfabric.identity.admission import sign_membership
from llmfabric.identity.keys import NodeKey
from llmfabric.registry.provider import ProviderVerifier
from llmfabric.registry.records import (
    Hardware,
    Lifecycle,
    ModelDemand,
    NodeMeta,
    NodeRecord,
    ServedModel,
)
from llmfabric.scheduler.controller import INLINE, ControllerConfig, FleetController
from llmfabric.scheduler.decisions import Assign, LoggingExecutor
from llmfabric.scheduler.observed import observed_workload
from llmfabric.scheduler.options import PlacementOptions
from llmfabric.scheduler.standin import AnalyticStandIn
from llmfabric.testing.fake_clock import FakeClock

pytestmark = pytest.mark.hostile

OPERATOR = NodeKey.generate()
NET = "lab-net"
CFG = ControllerConfig(policy="greedy", options=PlacementOptions(workers=2, time_limit_s=10))


def _rec(sid: str, key: NodeKey, clock: FakeClock, provider: str, *, count: int = 4,
         state: Lifecycle = Lifecycle.JOIN, models: tuple[str, ...] = (),
         roles: tuple[str, ...] = ("assignable",),
         demand: tuple[ModelDemand, ...] = ()) -> NodeRecord:
    cert = sign_membership(OPERATOR, key.peer_id, NET, clock.wall() + 3600,
                           provider=provider).to_json()
    meta = NodeMeta(provider_id="uni-a",  # everyone claims the honest name: never trusted
                    hardware=Hardware("A100-80GB", count, 80.0, "nvlink"),
                    engine="sim" if models else "", models=tuple(ServedModel(m) for m in models),
                    roles=roles, demand=demand, cert=cert)
    return NodeRecord(sid, key.peer_id, key.public_bytes, state, 0, 1, 0.0, meta)


async def test_the_assigning_controller_plans_only_for_allowed_verified_providers() -> None:
    clock = FakeClock()
    verifier = ProviderVerifier(OPERATOR.public_bytes, NET, clock.wall)
    ours, evil = NodeKey.generate(), NodeKey.generate()
    records = [
        _rec("a", ours, clock, "uni-a"), _rec("b", ours, clock, "uni-a"),
        _rec("ing", ours, clock, "uni-a", count=0, state=Lifecycle.SERVING, roles=("ingress",),
             demand=(ModelDemand("Llama-2-13b", 4, 600, 128),
                     ModelDemand("Llama-2-7b", 2, 300, 100))),
        # certified, but as another provider: a big bare node, a serving record listing the
        # models (one replica of the first), and an ingress claiming demand for its own model
        _rec("evil-bare", evil, clock, "evil-corp", count=8),
        _rec("evil-busy", evil, clock, "evil-corp", count=8, state=Lifecycle.SERVING,
             models=("Llama-2-13b",)),
        _rec("evil-ing", evil, clock, "evil-corp", count=0, state=Lifecycle.SERVING,
             roles=("ingress",), demand=(ModelDemand("Qwen3-1.7B", 10_000, 10, 10),)),
    ]
    trusted = provider_filter(verifier.identity, ["uni-a"])
    assert trusted is not None and provider_filter(verifier.identity, []) is None
    assert [r.session_id for r in fleet_of(records, trusted)] == ["a", "b"]

    async def one_round(trust: Any) -> dict[str, set[str]]:
        ex = LoggingExecutor()
        ctl = FleetController(lambda: fleet_of(records, trust),
                              lambda: observed_workload(records, trusted=trust or (
                                  lambda _r: True))[0],
                              ex, AnalyticStandIn(), clock, CFG, offload=INLINE)
        await ctl.step()
        out: dict[str, set[str]] = {}
        for d in ex.applied:
            if isinstance(d, Assign):
                out.setdefault(d.model, set()).update(d.session_ids)
        return out

    placed = await one_round(trusted)
    assert {s for sids in placed.values() for s in sids} <= {"a", "b"}
    assert set(placed) == {"Llama-2-13b", "Llama-2-7b"}  # the hostile replica counted for none
    # without --provider (as before) the other provider's records steer the plan
    unfiltered = await one_round(None)
    assert "evil-bare" in {s for sids in unfiltered.values() for s in sids}
    assert "Llama-2-13b" not in unfiltered  # (its "replica" counted)
    assert "Qwen3-1.7B" in unfiltered  # (its ingress's demand counted)


def test_the_dry_run_filters_by_the_verified_provider_the_node_reports(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    def view(sid: str, verified: str) -> dict[str, Any]:
        return {"session_id": sid, "peer_id": f"p-{sid}", "state": "JOIN", "suspected": False,
                "provider_id": "uni-a", "verified_provider": verified,
                "hardware": {"gpu_model": "A100-80GB", "gpu_count": 4, "gpu_memory_gb": 80.0,
                             "interconnect": "nvlink"}, "engine": "", "roles": ["assignable"],
                "models": []}

    views = [view("ours", "uni-a"), view("theirs", "evil-corp"), view("unverified", "")]

    async def fake_fetch(url: str) -> list[Any]:
        return [(ctl_cli.record_from_view(v), v["verified_provider"]) for v in views]

    monkeypatch.setattr(ctl_cli, "_fetch", fake_fetch)
    workload = tmp_path / "w.yaml"
    workload.write_text("models:\n  - {model: llama-2-7b, rate: 4, mean_in: 256, mean_out: 64}\n"
                        "  - {model: llama-3.1-8b, rate: 4, mean_in: 256, mean_out: 64}\n"
                        "  - {model: llama-2-13b, rate: 4, mean_in: 256, mean_out: 64}\n")
    args = ["--node", "http://n:8080", "--workload", str(workload), "--policy", "greedy",
            "--once"]
    res = CliRunner().invoke(ctl_cli.command, [*args, "--provider", "uni-a"])
    assert res.exit_code == 0, res.output
    decisions = json.loads(res.output[res.output.index("["):])
    assert {s for d in decisions for s in d["session_ids"]} == {"ours"}
    res = CliRunner().invoke(ctl_cli.command, args)  # every member, as before
    decisions = json.loads(res.output[res.output.index("["):])
    assert {s for d in decisions for s in d["session_ids"]} == {"ours", "theirs", "unverified"}
    bad = CliRunner().invoke(ctl_cli.command, ["--launcher", "slurm", "--provider", "x"])
    assert bad.exit_code == 2 and "fabric.provider" in bad.output
