"""A workload from a request trace: per-model arrival rate and token-length distributions.

Streams the trace with `llmfabric.traces.iter_batches` (any format it reads: the native
JSONL/CSV/Parquet, BurstGPT, Azure, Mooncake) and keeps, per model, the request count and the
sums of lengths and squared lengths. A model's arrival rate is its requests over the trace's
whole span (first to last timestamp of any model), times `rate_scale` (to replay a trace at a
different load). Lengths become the mean and standard deviation the placement tables use.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from llmfabric.scheduler.errors import SpecError
from llmfabric.scheduler.problem import ModelLoad, Workload
from llmfabric.sim.errors import naming_file


@dataclass(slots=True)
class _Acc:
    n: int = 0
    s_in: float = 0.0
    q_in: float = 0.0
    s_out: float = 0.0
    q_out: float = 0.0

    def add(self, inp: int, out: int) -> None:
        self.n += 1
        self.s_in += inp
        self.q_in += inp * inp
        self.s_out += out
        self.q_out += out * out

    def stats(self) -> tuple[float, float, float, float]:
        """(mean in, std in, mean out, std out)."""
        mi, mo = self.s_in / self.n, self.s_out / self.n
        si = math.sqrt(max(0.0, self.q_in / self.n - mi * mi))
        so = math.sqrt(max(0.0, self.q_out / self.n - mo * mo))
        return mi, si, mo, so


def workload_from_trace(path: str | os.PathLike[str], fmt: str = "auto", *,
                        rate_scale: float = 1.0, model: str | None = None) -> Workload:
    """The trace's workload, one ModelLoad per model, busiest first. `model` renames every
    record's model (traces without a model column are named after the file otherwise)."""
    from llmfabric.traces import TraceError, iter_batches

    if rate_scale <= 0:
        raise SpecError("rate_scale must be > 0")
    acc: dict[str, _Acc] = {}
    first, last = math.inf, -math.inf
    try:
        for batch in iter_batches(path, fmt, model=model):
            for rec in batch:
                acc.setdefault(rec.model, _Acc()).add(rec.input_tokens, rec.output_tokens)
                first = min(first, rec.timestamp)
                last = max(last, rec.timestamp)
    except (TraceError, OSError, ValueError) as e:
        raise SpecError(naming_file(os.fspath(path), str(e), "trace ")) from None
    if not acc:
        raise SpecError(f"trace {os.fspath(path)} has no requests")
    span = last - first
    if not span > 0:
        raise SpecError(f"trace {os.fspath(path)}: all requests share one timestamp, so no "
                        "arrival rate can be derived; use a workload YAML")
    loads = []
    for name, a in sorted(acc.items(), key=lambda kv: (-kv[1].n, kv[0])):
        mi, si, mo, so = a.stats()
        loads.append(ModelLoad(name, a.n / span * rate_scale, mi, max(1.0, mo), si, so))
    return Workload(tuple(loads))
