"""The ingress's routing index on registry changes: full rebuild vs incremental update.

A real Replica holds N signed records (16 models, one alias each; every 8th node serves two).
Per change kind (a load hint, a join, a leave) it times, per change:
- rebuild: what `RecordsCandidateSource` did on the first lookup after every replica change:
  read every record out of the replica (`records_with_suspicion`, as node.serve.replica_reader) and
  `candidates_by_model` over them; also `candidates_by_model` alone (the index part);
- incremental: `CandidateIndex.update` for the one session (`incr_update_us`), then the next
  lookup of the changed model (copies that bucket's snapshot once); end to end,
  `Replica.apply` with the `ReplicaCandidateSource` listener (`apply_with_index_us`) against
  `Replica.apply` alone (`apply_us`) on the same pre-signed records.

    python benchmarks/routing_index.py --json benchmarks/results/routing_index.json
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _common import write_results

from llmfabric.identity.keys import NodeKey
from llmfabric.registry.codec import SignedRecord
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import Lifecycle, LoadHints, NodeMeta, NodeRecord, ServedModel
from llmfabric.registry.replica import Replica
from llmfabric.registry.views import NodeRegistry
from llmfabric.routing.candidates import candidates_by_model
from llmfabric.routing.index import CandidateIndex
from llmfabric.routing.replica_source import ReplicaCandidateSource
from llmfabric.testing.fake_clock import FakeClock

MODELS = [ServedModel(f"model-{i}", aliases=(f"alias-{i}",)) for i in range(16)]


def meta_for(i: int, load: int = 0) -> NodeMeta:
    models = (MODELS[i % 16],) + ((MODELS[(i + 5) % 16],) if i % 8 == 0 else ())
    return NodeMeta(provider_id=f"p{i % 7}", http_addr=f"10.0.{i // 250}.{i % 250}:8000",
                    models=models, load=LoadHints(inflight=load))


def records_with_suspicion(replica: Replica) -> list[tuple[NodeRecord, bool]]:
    return [(dataclasses.replace(v.record, state=v.state), v.suspected)
            for v in NodeRegistry(replica).all(include_left=False)]


def timed(fn: Callable[[], Any], reps: int) -> float:
    """Median seconds of `reps` calls."""
    xs = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t)
    xs.sort()
    return xs[len(xs) // 2]


def one_size(n: int, changes: int) -> list[dict[str, Any]]:
    clock = FakeClock()
    owners = []  # a key per node: a replica admits only a few sessions per peer
    for i in range(n):
        o = RecordOwner(NodeKey.generate(), meta_for(i), wall=clock.wall())
        o.set_state(Lifecycle.SERVING, wall=clock.wall())
        owners.append(o)
    initial = [o.current for o in owners]
    replica = Replica(clock)
    for it in initial:
        replica.apply(it)
    # pre-signed changes, applied in order to a replica with and without the index listener
    loads: list[SignedRecord] = [owners[(7 * k) % n].update_meta(
        meta_for((7 * k) % n, load=k + 1), wall=clock.wall()) for k in range(changes)]
    joins = [RecordOwner(NodeKey.generate(), meta_for(n + k), wall=clock.wall())
             for k in range(changes)]
    join_items = [o.set_state(Lifecycle.SERVING, wall=clock.wall()) for o in joins]
    leaves = [owners[(11 * k + 3) % n].set_state(Lifecycle.LEFT, wall=clock.wall())
              for k in range(changes)]
    base_initial = Replica(clock)
    for it in initial:
        base_initial.apply(it)
    rows = []
    for kind, items in (("load hint", loads), ("join", join_items), ("leave", leaves)):
        base = Replica(clock)
        for it in initial:
            base.apply(it)
        t = time.perf_counter()
        for it in items:
            base.apply(it)
        apply_s = (time.perf_counter() - t) / len(items)
        # old: every change makes the next lookup rebuild from all records
        reps = 3 if n > 2000 else 15
        read_s = timed(lambda: records_with_suspicion(replica), reps)
        recs = records_with_suspicion(replica)
        index_s = timed(lambda r=recs: candidates_by_model(r), reps)  # type: ignore[misc]
        # new: the listener updates one session; the lookup copies one bucket once
        fresh = Replica(clock)
        for it in initial:
            fresh.apply(it)
        source = ReplicaCandidateSource(lambda f=fresh: f)  # type: ignore[misc]
        t = time.perf_counter()
        source.candidates(MODELS[0].id)
        build_s = time.perf_counter() - t
        for name in source.index.names():
            source.candidates(name)  # warm every snapshot: each change then costs one copy
        t = time.perf_counter()
        for it in items:
            fresh.apply(it)
        total_s = (time.perf_counter() - t) / len(items)
        # the index update alone, on an index built from the same initial records
        index = CandidateIndex.from_records(records_with_suspicion(base_initial))
        t = time.perf_counter()
        for it in items:
            index.update(it.session_id, it.record, False)
        update_s = (time.perf_counter() - t) / len(items)
        t = time.perf_counter()
        for it in items:
            source.candidates(it.record.meta.models[0].id)
        lookup_s = (time.perf_counter() - t) / len(items)
        rows.append({
            "nodes": n, "change": kind,
            "rebuild_us": round((read_s + index_s) * 1e6, 1),
            "rebuild_index_only_us": round(index_s * 1e6, 1),
            "incr_update_us": round(update_s * 1e6, 2),
            "incr_lookup_after_us": round(lookup_s * 1e6, 2),
            "speedup": round((read_s + index_s) / max(update_s + lookup_s, 1e-9), 0),
            "apply_us": round(apply_s * 1e6, 2),
            "apply_with_index_us": round(total_s * 1e6, 2),
            "initial_build_ms": round(build_s * 1e3, 2),
        })
        print(rows[-1], file=sys.stderr)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="512,10000")
    ap.add_argument("--changes", type=int, default=200)
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args()
    rows = []
    for n in (int(x) for x in args.nodes.split(",")):
        rows.extend(one_size(n, args.changes))
    write_results(args.json, {"rows": rows}, "Routing index: rebuild vs incremental update",
                  rows, notes="Per registry change, medians/means on this machine (shared "
                  "cores: compare within a run). rebuild = read all records from the replica + "
                  "candidates_by_model (the old per-change cost); incr = the change listener's "
                  "index update + the next lookup of the changed model.")


if __name__ == "__main__":
    main()
