"""PDPlan: ThunderServe's deployment plan (groups, phases, configs, X/Y routing) with JSON
output and simulator hand-off."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llmfabric.scheduler.phasesplit.config import GroupConfig, ReplicaConfig
from llmfabric.scheduler.phasesplit.evaluate import PlanScore, replica_links, simulate
from llmfabric.scheduler.phasesplit.groups import Group
from llmfabric.scheduler.phasesplit.orchestrate import Routing
from llmfabric.scheduler.phasesplit.problem import CloudCluster, PDWorkload
from llmfabric.sim.engine import EngineConfig
from llmfabric.sim.linkmatrix import LinkMatrix
from llmfabric.sim.models import ModelSpec
from llmfabric.sim.pdrouting import PDRouting
from llmfabric.sim.serving import ReplicaSpec


@dataclass(frozen=True, eq=False)
class PDPlan:
    groups: tuple[Group, ...]
    configs: tuple[GroupConfig, ...]
    routing: Routing
    attainment: float          # analytic, at plan time
    est_throughput: float      # req/s served (analytic)
    cluster: CloudCluster
    model: ModelSpec
    workload: PDWorkload
    kv_bits: int | None = 4
    kv_group: int = 64
    pipelined_pp: bool = True
    search_trace: tuple[float, ...] = ()
    solve_s: float = 0.0
    plan_id: str = ""
    notes: tuple[str, ...] = field(default=())

    def replicas(self, phase: str) -> tuple[ReplicaConfig, ...]:
        return tuple(r for g, c in zip(self.groups, self.configs, strict=True)
                     if g.phase == phase for r in c.replica_configs)

    @property
    def n_prefill(self) -> int:
        return len(self.replicas("prefill"))

    @property
    def n_decode(self) -> int:
        return len(self.replicas("decode"))

    def to_replica_specs(self) -> tuple[list[ReplicaSpec], list[ReplicaSpec], PDRouting,
                                        LinkMatrix]:
        cfg = EngineConfig(pp_microbatch=self.pipelined_pp)
        pre, dec = self.replicas("prefill"), self.replicas("decode")
        x = list(self.routing.x) if self.routing.x.sum() > 0 else [1.0] * len(pre)
        return ([ReplicaSpec(r.deployment, cfg, None, "prefill") for r in pre],
                [ReplicaSpec(r.deployment, cfg, None, "decode") for r in dec],
                PDRouting(x, self.routing.y.tolist()), replica_links(pre, dec, self.cluster))

    def evaluate(self, workload: PDWorkload | None = None, *, evaluator: str = "sim",
                 duration_s: float = 300.0, seed: int = 0,
                 link_contention: bool = False) -> PlanScore:
        """Score this plan (same groups, configs and routing) under `workload`."""
        wl = workload or self.workload
        if evaluator == "sim":
            return simulate(self.replicas("prefill"), self.replicas("decode"), self.routing,
                            self.cluster, wl, kv_bits=self.kv_bits, kv_group=self.kv_group,
                            pipelined_pp=self.pipelined_pp, duration_s=duration_s, seed=seed,
                            link_contention=link_contention)
        from llmfabric.scheduler.phasesplit.orchestrate import PairModel

        pm = PairModel(self.replicas("prefill"), self.replicas("decode"), self.cluster,
                       self.model, wl, self.kv_bits, self.kv_group)
        lam_pre = wl.rate * self.routing.z.sum(axis=1)
        lam_dec = wl.rate * self.routing.z.sum(axis=0)
        d = pm.attainment(lam_pre, lam_dec)
        att = float((self.routing.z * d).sum())
        return PlanScore(att, wl.rate * (1 - self.routing.unserved), float("nan"),
                         float("nan"))

    def _loads(self) -> dict[str, list[float | None]]:
        """Predicted utilisation per replica (stability.py), when the plan carries it; None
        for a loaded replica with no capacity (infinite)."""
        r = self.routing
        if r.load_prefill is None or r.load_decode is None:
            return {}
        return {k: [float(v) if math.isfinite(v) else None for v in vals]
                for k, vals in (("load_prefill", r.load_prefill),
                                ("load_decode", r.load_decode))}

    def to_json(self) -> dict[str, Any]:
        groups = []
        for k, (g, c) in enumerate(zip(self.groups, self.configs, strict=True)):
            types: dict[str, int] = {}
            for gid in sorted(g.gpus):
                t = self.cluster.gpus[gid].type
                types[t] = types.get(t, 0) + 1
            groups.append({
                "group": k, "phase": g.phase, "gpus": sorted(g.gpus), "types": types,
                "hosts": sorted({self.cluster.gpus[i].host for i in g.gpus}),
                "tp": c.tp, "pp": c.pp, "replicas": c.replicas,
                "stages": [[{"gpus": list(s.gpus), "type": s.type, "layers": s.layers}
                            for s in r.stages] for r in c.replica_configs],
                "latency_s": c.latency_s, "throughput_tps": c.throughput_tps,
            })
        return {
            "plan_id": self.plan_id, "model": self.model.name,
            "rate": self.workload.rate, "mean_in": self.workload.mean_in,
            "mean_out": self.workload.mean_out,
            "slo": {"ttft_s": self.workload.slo.ttft_s, "tpot_s": self.workload.slo.tpot_s,
                    "e2e_s": self.workload.slo.e2e_s},
            "kv_bits": self.kv_bits, "kv_group": self.kv_group,
            "groups": groups, "n_prefill": self.n_prefill, "n_decode": self.n_decode,
            "routing": {"x": [float(v) for v in self.routing.x],
                        "y": [[float(v) for v in row] for row in self.routing.y],
                        "unserved": self.routing.unserved,
                        "overload": self.routing.overload, **self._loads()},
            "attainment": self.attainment, "est_throughput_rps": self.est_throughput,
            "solve_s": self.solve_s, "search_trace": list(self.search_trace),
            "notes": list(self.notes),
        }


def group_label(cluster: CloudCluster, gpus: Sequence[int]) -> str:
    types: dict[str, int] = {}
    for gid in sorted(gpus):
        types[cluster.gpus[gid].type] = types.get(cluster.gpus[gid].type, 0) + 1
    hosts = sorted({cluster.gpus[i].host for i in gpus})
    return " + ".join(f"{n}x{t}" for t, n in types.items()) + " @ " + ",".join(hosts)


def plan_from_json(doc: Any, cluster: CloudCluster, *,
                   workload: PDWorkload | None = None) -> PDPlan:
    """A saved plan (`to_json`) on its cluster: groups, configs (rebuilt from the stages)
    and routing; the workload is re-drawn from the saved means unless given."""
    import numpy as np

    from llmfabric.scheduler.errors import SpecError
    from llmfabric.scheduler.phasesplit.config import StageConfig, replica_from_stages
    from llmfabric.sim.models import get_model
    from llmfabric.sim.results import SLO

    try:
        model = get_model(doc["model"])
        wl = workload or PDWorkload.from_means(
            float(doc["rate"]), float(doc["mean_in"]), float(doc["mean_out"]),
            slo=SLO(**{k: v for k, v in doc["slo"].items() if v is not None}))
        groups, configs = [], []
        seen: set[int] = set()
        for g in doc["groups"]:
            gpus = frozenset(int(i) for i in g["gpus"])
            if g["phase"] not in ("prefill", "decode") or gpus & seen:
                raise SpecError("groups need a phase prefill|decode and disjoint GPUs")
            seen |= gpus
            tp = int(g["tp"])
            reps = tuple(replica_from_stages(
                model, cluster, wl, tp,
                [StageConfig(tuple(int(i) for i in s["gpus"]), str(s["type"]),
                             int(s["layers"])) for s in stages])
                for stages in g["stages"])
            if any(set(r.gpus) - gpus for r in reps):
                raise SpecError("a replica uses GPUs outside its group")
            groups.append(Group(gpus, str(g["phase"])))
            configs.append(GroupConfig(tp, int(g["pp"]), reps))
        r = doc["routing"]
        x = np.asarray(r["x"], dtype=np.float64)
        y = np.asarray(r["y"], dtype=np.float64)
        unserved = float(r["unserved"])
        routing = Routing(x, y, (1 - unserved) * x[:, None] * y, unserved,
                          float(doc["attainment"]))
        plan = PDPlan(tuple(groups), tuple(configs), routing, float(doc["attainment"]),
                      float(doc["est_throughput_rps"]), cluster, model, wl,
                      doc.get("kv_bits"), int(doc.get("kv_group", 64)),
                      plan_id=str(doc.get("plan_id", "")))
    except SpecError:
        raise  # (already says what is wrong: e.g. the plan's GPUs are not this cluster's)
    except KeyError as e:  # (was the repr, "not a saved PD plan: KeyError('model')")
        raise SpecError(f"not a saved PD plan: no {e.args[0]!r} (save one with `llmfabric "
                        "plan pd --json`)") from None
    except (TypeError, ValueError) as e:
        raise SpecError(f"not a saved PD plan (save one with `llmfabric plan pd --json`): "
                        f"{str(e)[:200]}") from None
    if routing.y.shape != (plan.n_prefill, plan.n_decode) or \
            routing.x.shape != (plan.n_prefill,):
        raise SpecError("the routing does not match the plan's replicas")
    return plan
