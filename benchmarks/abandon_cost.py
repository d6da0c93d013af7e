"""CPU cost of the liveness watch around one attempt (`AbandonIfDown` enter + exit), against an
empty loop: a static source (standalone ingress: no membership, nothing registered) and a
`ReplicaCandidateSource` (a node: one watch registered and removed).

    python benchmarks/abandon_cost.py
"""

from __future__ import annotations

import asyncio
import time

from llmfabric.ingress.attempt import AbandonIfDown
from llmfabric.ingress.protocols import CandidateSource
from llmfabric.ingress.sources import StaticCandidateSource
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.registry.replica import Replica
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.replica_source import ReplicaCandidateSource
from llmfabric.testing.fake_clock import FakeClock

c = Candidate("s", "peer-s", "p", "a:1", (), Hardware("A100", 1), ServedModel("m"), LoadHints())


async def run(src: CandidateSource | None, n: int = 300000) -> float:
    t = time.perf_counter()
    if src is None:
        for _ in range(n):
            pass
    else:
        for _ in range(n):
            with AbandonIfDown(src, c):
                pass
    return (time.perf_counter() - t) / n * 1e6


async def main() -> None:
    rep = Replica(FakeClock())
    replica = ReplicaCandidateSource(lambda: rep)
    replica.candidates("m")  # (follows the replica, as after a node's first lookup)
    sources: list[tuple[str, CandidateSource | None]] = [
        ("empty loop", None),
        ("static", StaticCandidateSource([c])),
        ("replica", replica),
    ]
    for name, src in sources:
        xs = [round(await run(src), 3) for _ in range(5)]
        print(name, sorted(xs)[2], "us per attempt (median of 5)")


if __name__ == "__main__":
    asyncio.run(main())
