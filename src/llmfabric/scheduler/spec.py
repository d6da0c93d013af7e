"""Cluster and workload files (YAML) -> Cluster / Workload. Pydantic only here, at the edge.

cluster.yaml:
    pools:
      - {gpu: A100-80GB, nodes: 3, gpus_per_node: 8}
      - {name: gh200, gpu: GH200, nodes: 8, gpus_per_node: 4, cost_per_gpu_hour: 1.5}
workload.yaml:
    models:
      - {model: Llama-2-13b, rate: 110, mean_in: 600, mean_out: 64, std_in: 200, std_out: 30}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmfabric.scheduler.errors import SpecError
from llmfabric.scheduler.problem import Cluster, ModelLoad, Pool, Workload
from llmfabric.yamlfile import YAMLFileError, read_yaml

# Bounds on what the planner is handed. Its tables hold a row per replica count of every
# (model, pool, TP) and round rates, costs and latencies to integers: a pool of 10**9 nodes
# raised MemoryError, 10**100 OverflowError, an inf rate or cost "cannot convert float
# infinity to integer" (tracebacks), and `.inf` token lengths or SLOs were taken as numbers.
# Every float is finite (allow_inf_nan=False); the caps are far above real clusters and loads.
MAX_NODES = 4096
MAX_CLUSTER_GPUS = 16_384
MAX_RATE = 1e6  # req/s
MAX_TOKENS = 10_000_000  # a request's mean or std length
MAX_SECONDS = 1e6
MAX_COST = 1e6  # $ per GPU-hour


class _PoolIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    name: str | None = None
    gpu: str
    nodes: int = Field(ge=0, le=MAX_NODES)
    gpus_per_node: int = Field(ge=1, le=64)
    interconnect: str = "nvlink"
    cost_per_gpu_hour: float = Field(default=0.0, ge=0, le=MAX_COST)
    exclusive_nodes: bool = False


class _ClusterIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pools: list[_PoolIn] = Field(min_length=1)  # (none: every model printed as unserved)


class _LoadIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    model: str
    rate: float = Field(ge=0, le=MAX_RATE)
    mean_in: float = Field(ge=0, le=MAX_TOKENS)
    mean_out: float = Field(ge=1, le=MAX_TOKENS)
    std_in: float = Field(default=0.0, ge=0, le=MAX_TOKENS)
    std_out: float = Field(default=0.0, ge=0, le=MAX_TOKENS)
    slo_e2e_s: float = Field(default=0.0, ge=0, le=MAX_SECONDS)


class _WorkloadIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: list[_LoadIn] = Field(min_length=1)


def _read(path: Path) -> Any:
    try:
        return read_yaml(path)
    except YAMLFileError as e:  # (binary file, syntax error, alias bomb: one line)
        raise SpecError(str(e)) from None


_CLUSTER_KEYS = ("pools: [{name, gpu, nodes, gpus_per_node, interconnect, cost_per_gpu_hour, "
                 "exclusive_nodes}]")
_WORKLOAD_KEYS = "models: [{model, rate, mean_in, mean_out, std_in, std_out, slo_e2e_s}]"


def _problems(exc: ValidationError, keys: str) -> str:
    """The errors on one line, each named by its field (pydantic's own text spans lines, names
    our private classes and links its website); an unknown key lists the keys."""
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "the file"
        if err["type"] == "extra_forbidden":
            what = f"unknown key (the keys: {keys})"
        elif err["type"] == "model_type":
            what = f"should be a mapping ({keys})"
        else:
            what = str(err["msg"]).lower()
        problems.append(f"{where}: {what}")
    # the first few: a list of 1000 bad entries made one line of 1000 problems
    more = f"; ... ({len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


def cluster_from_dict(data: Any, source: str = "cluster") -> Cluster:
    try:
        spec = _ClusterIn.model_validate(data)
    except ValidationError as e:
        raise SpecError(f"{source}: {_problems(e, _CLUSTER_KEYS)}") from None
    gpus = sum(p.nodes * p.gpus_per_node for p in spec.pools)
    if gpus > MAX_CLUSTER_GPUS:
        raise SpecError(f"{source}: {gpus} GPUs in all; the planner takes at most "
                        f"{MAX_CLUSTER_GPUS} (fewer nodes, or plan parts of the cluster)")
    return Cluster(tuple(Pool(p.name or p.gpu, p.gpu, p.nodes, p.gpus_per_node,
                              interconnect=p.interconnect, cost_per_gpu_hour=p.cost_per_gpu_hour,
                              exclusive_nodes=p.exclusive_nodes) for p in spec.pools))


def workload_from_dict(data: Any, source: str = "workload") -> Workload:
    try:
        spec = _WorkloadIn.model_validate(data)
    except ValidationError as e:
        raise SpecError(f"{source}: {_problems(e, _WORKLOAD_KEYS)}") from None
    return Workload(tuple(ModelLoad(m.model, m.rate, m.mean_in, m.mean_out, m.std_in, m.std_out,
                                    m.slo_e2e_s) for m in spec.models))


def load_cluster(path: str | Path) -> Cluster:
    p = Path(path)
    return cluster_from_dict(_read(p), str(p))


def load_workload(path: str | Path) -> Workload:
    p = Path(path)
    return workload_from_dict(_read(p), str(p))
