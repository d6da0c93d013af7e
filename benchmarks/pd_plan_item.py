"""The PD routing plan as a registry item (issue 14): how big it is, how many replicas fit in
a record, and what an ingress pays to read it, in ONE run.

    python benchmarks/pd_plan_item.py --json OUT.json

For m prefill x n decode sessions (real session ids from registry.signing, dense X/Y weights
as the routing LP writes them) it reports the item's bytes (the record carries at most 8 KiB
of it inside its 16 KiB body), the encode and decode+validate time per item, and the time of
`newest_plans` over a 200-record replica holding one controller's plan (what an ingress's
`PlanFeed` recomputes once per replica change, never per request).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_results

from llmfabric.identity import NodeKey
from llmfabric.registry.records import Lifecycle, NodeMeta, NodeRecord
from llmfabric.registry.signing import new_session_id
from llmfabric.routing.pd import PDPlanTable, PlanError
from llmfabric.routing.pd_plan import (
    MAX_PLAN_ITEM_BYTES,
    PlanItem,
    decode_plan,
    encode_plan,
    newest_plans,
)


def _table(m: int, n: int, rng: random.Random) -> PDPlanTable:
    sids = [new_session_id(NodeKey.generate().public_bytes) for _ in range(m + n)]
    x = [rng.random() for _ in range(m)]
    y = [[rng.random() for _ in range(n)] for _ in range(m)]
    return PDPlanTable("plan-" + "0" * 7, tuple(sids[:m]), tuple(sids[m:]),
                       tuple(v / sum(x) for v in x),
                       tuple(tuple(v / sum(r) for v in r) for r in y))


def _per_call_us(fn: Any, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--reps", type=int, default=300)
    args = ap.parse_args()
    rng = random.Random(0)
    rows = []
    for m, n in ((2, 2), (8, 4), (4, 8), (12, 12), (16, 16), (20, 20), (24, 24), (28, 28)):
        item = PlanItem("llama-30b", time.time(), _table(m, n, rng))
        try:
            data = encode_plan(item)
        except PlanError:
            rows.append({"prefill x decode": f"{m} x {n}", "bytes": "> 8192 (refused)",
                         "encode us": "", "decode us": "", "newest_plans over 200 records us": ""})
            continue
        ctl = NodeRecord("ctl", "peer-ctl", b"", Lifecycle.SERVING, 0, 1, 0.0,
                         NodeMeta(pd_plan=data))
        others = [dataclasses.replace(ctl, session_id=f"s{i}", peer_id=f"p{i}",
                                      meta=NodeMeta()) for i in range(199)]
        records = [*others, ctl]
        rows.append({
            "prefill x decode": f"{m} x {n}", "bytes": len(data),
            "encode us": round(_per_call_us(lambda i=item: encode_plan(i), args.reps), 1),
            "decode us": round(_per_call_us(lambda d=data: decode_plan(d), args.reps), 1),
            "newest_plans over 200 records us": round(_per_call_us(
                lambda r=records: newest_plans(r, {"peer-ctl"}), args.reps), 1),
        })
    load = os.getloadavg()
    write_results(args.json, {"rows": rows, "max_item_bytes": MAX_PLAN_ITEM_BYTES,
                              "loadavg": load},
                  "PD plan item size and cost", rows,
                  f"One process; load average {load[0]:.1f}. Item budget "
                  f"{MAX_PLAN_ITEM_BYTES} bytes (record body limit 16 KiB).")


if __name__ == "__main__":
    main()
