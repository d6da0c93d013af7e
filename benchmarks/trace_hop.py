"""What the node's hop and X-Session-Id add to a request's CPU time at the ingress.

    python benchmarks/trace_hop.py --json OUT.json [--n 200000] [--rounds 5]

In-process, on the objects the request core uses (no sockets), CPU time per request:
- trace, no hop: one traced request's spans (auth, route, attempt, first byte, close) and its
  JSON (what GET /v1/fabric/traces pays), as before this change;
- trace + node hop: the same with the upstream's `X-Fabric-Node-Time` parsed and the clamped
  `node` span added (ingress/tracing.py, telemetry/node_hop.py);
- node header (node side): formatting the node's header value;
- X-Session-Id: validating a 36-character header (routing/prefix.py `session_header`), and the
  `session_key` lookup it replaces for a body with metadata.session_id.
Interleaved rounds, medians. JSON + markdown (benchmarks/_common.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from _common import write_results

from llmfabric.ingress.tracing import RequestTrace
from llmfabric.routing.prefix import session_header, session_key
from llmfabric.telemetry.node_hop import NodeHop, node_time_value, parse_node_time

SID = "6f1c2b1e-9a4f-4a57-8f5e-0d9c4b3a2e11"
DOC = {"model": "m", "user": "u1", "metadata": {"session_id": SID}}


def _trace(hop: NodeHop | None) -> None:
    tr = RequestTrace(None, 0.0)
    tr.phase("auth", key_id="k")
    tr.phase("route", policy="session", candidates=4)
    tr.open_attempt("node-1")
    if hop is not None:
        tr.upstream(hop)
    tr.first_byte()
    tr.close_attempt(200)
    tr.to_json(200)


def _cases() -> dict[str, Callable[[], object]]:
    return {
        "trace, no hop": lambda: _trace(None),
        "trace + node hop": lambda: _trace(NodeHop(parse_node_time(b"12.345"))),
        "node header (node side)": lambda: node_time_value(0.0),
        "X-Session-Id validate + key": lambda: session_key(DOC, session_header(SID)),
        "metadata.session_id key (before)": lambda: session_key(DOC),
    }


def _time(fn: Callable[[], object], n: int) -> float:
    t0 = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", dest="json_out", type=Path)
    ap.add_argument("--n", type=int, default=200_000, help="calls per case per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    cases = _cases()
    got: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.rounds):  # interleaved: the machine's load hits every case alike
        for name, fn in cases.items():
            got[name].append(_time(fn, args.n))
    rows = [{"case": k, "us_per_call_median": round(statistics.median(v), 3),
             "us_min": round(min(v), 3), "us_max": round(max(v), 3)} for k, v in got.items()]
    load = os.getloadavg()
    write_results(args.json_out, {"rounds": args.rounds, "n": args.n, "loadavg": load,
                                  "results": rows},
                  "Node hop and X-Session-Id: CPU per request at the ingress", rows,
                  notes=f"{args.rounds} interleaved rounds of {args.n} calls, CPU time "
                        f"(process_time); load average {load[0]:.1f}.")


if __name__ == "__main__":
    main()
