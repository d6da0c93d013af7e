"""Turn request outcomes into the result numbers, named as `vllm bench serve` names them.

Shared with vLLM: duration, completed, failed, total_input_tokens, total_output_tokens,
request_throughput, request_goodput, output_throughput, total_token_throughput, and for each of
ttft, tpot, itl, e2el: mean_<m>_ms, median_<m>_ms, std_<m>_ms, p<P>_<m>_ms (P from
`percentiles`, 99 by default). TPOT is per request (latency - TTFT) / (output tokens - 1) over
requests with >= 2 tokens; ITL pools every inter-chunk gap; e2el is end-to-end latency.
Ours: num_requests (sent), slo_attainment (share of SENT requests meeting every SLO set; failed
requests miss), errors_by_kind (count per kind; `errors` is the per-request list that
`detailed` adds, as in vLLM), error_samples (what the servers said: the first
`ERROR_SAMPLES` distinct kind + message pairs with their counts, each message escaped and
clipped to `ERROR_MESSAGE_CHARS`: another party wrote it), and the SLO thresholds themselves.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmfabric.bench.client import RequestOutcome
from llmfabric.bench.errors import BenchConfigError
from llmfabric.untrusted import clip, printable

ERROR_SAMPLES = 5
ERROR_MESSAGE_CHARS = 200


@dataclass(frozen=True, slots=True)
class SLO:
    """Per-request service level objectives in milliseconds; None = not checked."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2el_ms))

    def met(self, o: RequestOutcome) -> bool:
        if not o.ok or o.ttft_s is None or o.latency_s is None:
            return False
        if self.ttft_ms is not None and o.ttft_s * 1000 > self.ttft_ms:
            return False
        tpot = o.tpot_s
        if self.tpot_ms is not None and tpot is not None and tpot * 1000 > self.tpot_ms:
            return False
        return not (self.e2el_ms is not None and o.latency_s * 1000 > self.e2el_ms)


def _stats(name: str, values_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    data = np.asarray(values_s, dtype=np.float64) * 1000.0
    out: dict[str, float] = {}
    empty = data.size == 0
    out[f"mean_{name}_ms"] = 0.0 if empty else float(np.mean(data))
    out[f"median_{name}_ms"] = 0.0 if empty else float(np.median(data))
    out[f"std_{name}_ms"] = 0.0 if empty else float(np.std(data))
    for p in percentiles:
        key = f"p{p:g}_{name}_ms"
        out[key] = 0.0 if empty else float(np.percentile(data, p))
    return out


def summarize(
    outcomes: Sequence[RequestOutcome],
    *,
    duration_s: float,
    percentiles: Sequence[float] = (99.0,),
    slo: SLO | None = None,
) -> dict[str, Any]:
    """The result dict of a run (see the module docstring for every field)."""
    if duration_s <= 0:
        raise BenchConfigError("duration must be positive to compute throughputs")
    if any(not 0 <= p <= 100 for p in percentiles):
        raise BenchConfigError("percentiles must be within [0, 100]")
    ok = [o for o in outcomes if o.ok]
    total_in = sum(o.prompt_tokens for o in ok)
    total_out = sum(o.output_tokens for o in ok)
    result: dict[str, Any] = {
        "duration": duration_s,
        "num_requests": len(outcomes),
        "completed": len(ok),
        "failed": len(outcomes) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration_s,
        "output_throughput": total_out / duration_s,
        "total_token_throughput": (total_in + total_out) / duration_s,
    }
    slo = slo or SLO()
    if slo.active:
        good = sum(1 for o in outcomes if slo.met(o))
        result["request_goodput"] = good / duration_s
        result["slo_attainment"] = good / len(outcomes) if outcomes else 0.0
    else:
        result["request_goodput"] = None
        result["slo_attainment"] = None
    result["slo"] = {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2el_ms": slo.e2el_ms}
    result.update(_stats("ttft", [o.ttft_s for o in ok if o.ttft_s is not None], percentiles))
    result.update(_stats("tpot", [t for o in ok if (t := o.tpot_s) is not None], percentiles))
    result.update(_stats("itl", [x for o in ok for x in o.itls_s], percentiles))
    result.update(_stats("e2el", [o.latency_s for o in ok if o.latency_s is not None], percentiles))
    result["errors_by_kind"] = dict(
        sorted(Counter(o.error or "unknown" for o in outcomes if not o.ok).items())
    )
    result["error_samples"] = error_samples(outcomes)
    return result


def error_samples(outcomes: Sequence[RequestOutcome]) -> list[dict[str, Any]]:
    """The first `ERROR_SAMPLES` distinct (kind, message) pairs of the failures, in order,
    each with how many failures said it; a message escaped (controls as escapes) and clipped:
    a server's text is shown on a terminal and written to files."""
    counts: dict[tuple[str, str], int] = {}
    for o in outcomes:
        if o.ok:
            continue
        key = (o.error or "unknown", clip(printable(o.detail), ERROR_MESSAGE_CHARS))
        if key in counts:
            counts[key] += 1
        elif len(counts) < ERROR_SAMPLES:
            counts[key] = 1
    return [{"kind": kind, "message": message, "count": n}
            for (kind, message), n in counts.items()]


def detailed(outcomes: Sequence[RequestOutcome]) -> dict[str, list[Any]]:
    """Per-request lists, as `vllm bench serve --save-detailed` writes them."""
    return {
        "input_lens": [o.prompt_tokens or o.spec.input_len for o in outcomes],
        "output_lens": [o.output_tokens for o in outcomes],
        "ttfts": [o.ttft_s for o in outcomes],
        "itls": [list(o.itls_s) for o in outcomes],
        "e2els": [o.latency_s for o in outcomes],
        "errors": [o.error or "" for o in outcomes],
    }
