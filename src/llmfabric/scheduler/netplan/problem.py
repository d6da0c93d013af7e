"""What a network plan is asked for: topology, model, GPU sets, workload and SLAs."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmfabric.scheduler.netplan.commcost import NET_COLLECTIVE_S
from llmfabric.sim.errors import SpecError
from llmfabric.sim.models import ModelSpec, get_model
from llmfabric.sim.topology import NodeId, Topology
from llmfabric.yamlfile import YAMLFileError, read_yaml, unknown_key

# The share of a link's capacity H may fill. 1.0 is the stability bound; the KV hand-off's
# wait is modelled (linkload.KvQueue) but the step's all-reduce and PP transfers are priced
# alone, and near rho = 1 every wait grows as 1 / (1 - rho) (an M/D/1 queue at 0.9 already
# waits 4.5 service times on average), so H keeps 10 % of each link in reserve.
LINK_UTIL = 0.9
KV_TPOT = ("per_token", "amortized")
MAX_RATE = 1e6  # req/s, in a workload file
MAX_TOKENS = 1e7  # mean prompt or output tokens, in a workload file


@dataclass(frozen=True, slots=True)
class NetWorkload:
    """Poisson arrivals at `rate` req/s with mean prompt/output lengths (K_in, K_out)."""

    rate: float
    mean_in: float
    mean_out: float

    def __post_init__(self) -> None:
        for v in (self.rate, self.mean_in, self.mean_out):
            if not math.isfinite(v) or v < 0:
                raise SpecError("a workload needs finite rate, mean_in, mean_out >= 0")
        if self.mean_in < 1 or self.mean_out < 1:
            raise SpecError("mean_in and mean_out must be >= 1 token")

    @classmethod
    def from_yaml(cls, path: str | Path) -> NetWorkload:
        """`{rate, mean_in, mean_out}` (YAML)."""
        try:
            doc = read_yaml(path)
        except YAMLFileError as exc:  # (binary file, syntax error, alias bomb: one line)
            raise SpecError(f"bad workload: {exc}") from None
        form = "a plan net workload is {rate, mean_in, mean_out}"
        if not isinstance(doc, dict):
            raise SpecError(f"bad workload {path}: {form}")
        values = []
        # Each a finite number in range, named: the errors were Python reprs
        # (ValueError("could not convert string to float: 'fast'")), and a 10**100 mean_out
        # was planned with.
        for key, default, top in (("rate", 1.0, MAX_RATE), ("mean_in", None, MAX_TOKENS),
                                  ("mean_out", None, MAX_TOKENS)):
            v = doc.get(key, default)
            if v is None:
                raise SpecError(f"bad workload {path}: no {key} ({form})")
            if isinstance(v, bool) or not isinstance(v, int | float) or not -1 < v <= top:
                raise SpecError(f"bad workload {path}: {key} must be a number in 0..{top:g}, "
                                f"got {str(v)[:40]!r}")
            values.append(float(v))
        # (a typo, `rat: 5`, was ignored: planned at the default rate 1)
        if (unknown := unknown_key(doc, ("rate", "mean_in", "mean_out"))) is not None:
            raise SpecError(f"bad workload {path}: unknown key {unknown!r} ({form})")
        try:
            return cls(*values)
        except SpecError as exc:
            raise SpecError(f"bad workload {path}: {exc}") from None


@dataclass(frozen=True)
class NetProblem:
    """HeroServe's planning problem (Table I). `hop_latency`: None = the edges' own latencies,
    a number per hop, 0 = the paper's pure-bandwidth form. `m_ina`: aggregator slots one INA
    group holds at its switch. `nominal_decode_batch`: the batch whose all-reduce message
    (batch x hidden x 2 B) decides a decode group's scheme. `net_collective_s`: the fixed
    cost of an all-reduce through the NICs (`commcost.NET_COLLECTIVE_S`, measured; 0 with
    hop_latency=0 gives the paper's form). `link_util`: the share of each link's capacity the
    plan's steady-state bytes may fill (linkload.py; `LINK_UTIL`). `kv_tpot`: how the KV
    hand-off (T_f and its wait) enters TPOT: "per_token", eq. 4 as printed (every output
    token pays it), or "amortized", once per request spread over its mean output (what a
    measured mean TPOT sees; a sensitivity, docs/benchmarks.md)."""

    topology: Topology
    model: ModelSpec
    prefill_gpus: tuple[NodeId, ...]
    decode_gpus: tuple[NodeId, ...]
    workload: NetWorkload
    sla_pre: float
    sla_dec: float
    r_frac: float = 0.8
    max_candi: int = 20
    m_ina: int = 1
    hop_latency: float | None = None
    seed: int = 0
    nominal_decode_batch: int = 16
    max_sweeps: int = 5
    restarts: int = 10
    net_collective_s: float = NET_COLLECTIVE_S
    link_util: float = LINK_UTIL
    kv_tpot: str = "per_token"

    def __post_init__(self) -> None:
        if not self.prefill_gpus or not self.decode_gpus:
            raise SpecError("a network plan needs prefill and decode GPUs")
        if set(self.prefill_gpus) & set(self.decode_gpus):
            raise SpecError("prefill and decode GPU sets overlap")
        for g in (*self.prefill_gpus, *self.decode_gpus):
            self.topology.gpu(g)
        if not 0 < self.r_frac <= 1 or self.sla_pre <= 0 or self.sla_dec <= 0:
            raise SpecError("need 0 < r_frac <= 1 and positive SLAs")
        if self.max_candi < 1 or self.m_ina < 1 or self.nominal_decode_batch < 1:
            raise SpecError("max_candi, m_ina and nominal_decode_batch must be >= 1")
        if not 0 <= self.net_collective_s < math.inf:
            raise SpecError("net_collective_s must be a finite number of seconds >= 0")
        if not 0 < self.link_util <= 1:
            raise SpecError("link_util must be in (0, 1]")
        if self.kv_tpot not in KV_TPOT:
            raise SpecError(f"kv_tpot must be one of {KV_TPOT}")

    def kv_in_tpot(self, seconds: float) -> float:
        """What `seconds` of KV hand-off (transfer + wait) adds to TPOT (`kv_tpot`)."""
        return seconds if self.kv_tpot == "per_token" else seconds / self.workload.mean_out

    @staticmethod
    def of(topology: Topology, model: str | ModelSpec, prefill: Sequence[str] | str,
           decode: Sequence[str] | str, workload: NetWorkload, sla_pre: float,
           sla_dec: float, **kw: Any) -> NetProblem:
        """Build from GPU id lists or glob patterns (`gpu[0-7]`, `a100-*` matched
        case-insensitively against GPU ids and GPU types)."""
        return NetProblem(topology, get_model(model), select_gpus(topology, prefill),
                          select_gpus(topology, decode), workload, sla_pre, sla_dec, **kw)


def select_gpus(topology: Topology, spec: Sequence[str] | str) -> tuple[NodeId, ...]:
    """GPUs named by a comma list or a sequence of ids / globs over ids and GPU types."""
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    out: list[NodeId] = []
    for g in topology.gpus():
        node = topology.gpu(g)
        for pat in items:
            p = str(pat).lower()
            if fnmatch.fnmatch(str(g).lower(), p) or fnmatch.fnmatch(node.gpu_type.lower(), p):
                out.append(g)
                break
    if not out:
        raise SpecError(f"no GPU matches {spec!r}")
    return tuple(out)
