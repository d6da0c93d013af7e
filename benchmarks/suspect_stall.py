"""Stall of a request whose first attempt went to a cut-off node, after the membership marked
that node suspected: before (the attempt waits out its connect or first-byte timeout) and
after (the ingress drops it at once and retries; ingress/attempt.py `AbandonIfDown`).

Real parts on loopback: the request core (`Ingress.serve`, streamed chat), the direct
upstream client (`RawHttpForwarder`, which enforces the timeouts itself), a registry replica
holding two SERVING nodes, a healthy node (an aiohttp SSE server) and a cut-off one, in one
of two phases of a cut:
- first_byte: the connection is made (pooled before the cut) and then nothing comes back;
- connect: SYNs are dropped (a listening socket whose accept queue is full).
The first attempt of every trial goes to the cut-off node (whichever the policy picked); a
SUSPECT fact for it reaches the replica `--detect` seconds after the request was sent.
"before" reads the same replica through `RecordsCandidateSource` (no liveness watch, the
code path before this change), "after" through `ReplicaCandidateSource`.

    python benchmarks/suspect_stall.py --trials 5 --json benchmarks/results/suspect_stall.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import pathlib
import socket
import statistics
import sys
import time
from typing import Any

import orjson
from aiohttp import web

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _common import write_results

from llmfabric.forward import RawHttpForwarder
from llmfabric.forward.raw import RawUpstream
from llmfabric.identity.keys import NodeKey
from llmfabric.ingress import FORWARD_PREFIX, IngressConfig, Timeouts
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.protocols import CandidateSource
from llmfabric.ingress.sources import RecordsCandidateSource
from llmfabric.registry.facts import FactKind, make_fact
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import Lifecycle, NodeMeta, ServedModel
from llmfabric.registry.replica import Replica
from llmfabric.registry.views import NodeRegistry
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.replica_source import ReplicaCandidateSource
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.sinks import MemorySink

CHAT = "/v1/chat/completions"
ANSWER = (
    b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}'
    b"\n\ndata: [DONE]\n\n"
)


async def _healthy_node() -> tuple[web.AppRunner, str]:
    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(ANSWER)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post(FORWARD_PREFIX + CHAT, chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"127.0.0.1:{port}"


async def _silent_node() -> tuple[asyncio.Server, str]:
    """Accepts and never answers (a site cut after the connection was made)."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    return server, f"127.0.0.1:{server.sockets[0].getsockname()[1]}"


def _syn_dropping_node() -> tuple[list[socket.socket], str]:
    """A listener that never accepts, its accept queue filled: further SYNs are dropped."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(0)
    addr = lsock.getsockname()
    fill = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):  # (non-blocking: in progress)
            s.connect(addr)
        fill.append(s)
    time.sleep(0.2)
    return [lsock, *fill], f"{addr[0]}:{addr[1]}"


class _CutFirst:
    """The direct upstream client; the first node a trial asks for is the cut-off one."""

    enforces_timeouts = True

    def __init__(self, raw: RawHttpForwarder, dead: str, live: str) -> None:
        self.raw, self.dead, self.live = raw, dead, live
        self.cut: str | None = None
        self.sent = asyncio.Event()

    async def open(
        self, candidate: Candidate, path: str, body: bytes, timeouts: Timeouts
    ) -> RawUpstream:
        if self.cut is None:
            self.cut = candidate.session_id
            self.sent.set()
        addr = self.dead if candidate.session_id == self.cut else self.live
        return await self.raw.open_to(addr, path, body, timeouts)

    async def aclose(self) -> None:
        await self.raw.aclose()


async def _trial(
    mode: str, dead: str, live: str, timeouts: Timeouts, detect: float
) -> dict[str, Any]:
    clock = FakeClock()
    keys = [NodeKey.generate() for _ in range(2)]
    replica = Replica(clock)
    owners = []
    for k in keys:
        o = RecordOwner(k, NodeMeta(http_addr="-", models=(ServedModel("m"),)), wall=clock.wall())
        replica.apply(o.set_state(Lifecycle.SERVING, wall=clock.wall()))
        owners.append(o)
    source: CandidateSource
    if mode == "after":
        source = ReplicaCandidateSource(lambda: replica)
    else:
        source = RecordsCandidateSource(
            lambda: [
                (dataclasses.replace(v.record, state=v.state), v.suspected)
                for v in NodeRegistry(replica).all(include_left=False)
            ]
        )
    fwd = _CutFirst(RawHttpForwarder(FORWARD_PREFIX), dead, live)
    config = IngressConfig(auth_enabled=False, timeouts=timeouts, max_retries=2)
    ing = Ingress(config, source, fwd)
    sink = MemorySink()
    body = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    )
    t0 = time.perf_counter()
    task = asyncio.ensure_future(ing.serve(CHAT, True, "", None, body, sink))
    await fwd.sent.wait()
    await asyncio.sleep(detect)  # SWIM's probes of the cut node fail meanwhile
    cut = next(o for o in owners if o.session_id == fwd.cut)
    prober = keys[1] if cut is owners[0] else keys[0]  # (facts count from members only)
    replica.apply(
        make_fact(prober, FactKind.SUSPECT, cut.session_id, cut.record.incarnation, clock.wall())
    )
    assert NodeRegistry(replica).get(cut.session_id).suspected  # type: ignore[union-attr]
    t_suspect = time.perf_counter()
    reply = await task
    t_end = time.perf_counter()
    await fwd.aclose()
    assert reply is None and sink.data.endswith(b"data: [DONE]\n\n"), (reply, sink.data)
    return {"e2e_s": t_end - t0, "after_suspicion_s": t_end - t_suspect}


async def _main(args: argparse.Namespace) -> list[dict[str, Any]]:
    timeouts = Timeouts(connect=args.connect_timeout, first_byte=args.first_byte_timeout)
    runner, live = await _healthy_node()
    silent, silent_addr = await _silent_node()
    dropping, dropping_addr = _syn_dropping_node()
    rows = []
    try:
        for phase, dead in (("first_byte", silent_addr), ("connect", dropping_addr)):
            for mode in ("before", "after"):
                got = [
                    await _trial(mode, dead, live, timeouts, args.detect)
                    for _ in range(args.trials)
                ]
                stall = [g["after_suspicion_s"] for g in got]
                e2e = [g["e2e_s"] for g in got]
                rows.append(
                    {
                        "phase": phase,
                        "mode": mode,
                        "trials": len(got),
                        "stall_after_suspicion_ms_median": statistics.median(stall) * 1000,
                        "stall_after_suspicion_ms_max": max(stall) * 1000,
                        "e2e_ms_median": statistics.median(e2e) * 1000,
                    }
                )
    finally:
        silent.close()
        for s in dropping:
            s.close()
        await runner.cleanup()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument(
        "--detect",
        type=float,
        default=0.3,
        help="seconds from sending the attempt to the node's suspicion",
    )
    ap.add_argument("--connect-timeout", type=float, default=2.0)
    ap.add_argument("--first-byte-timeout", type=float, default=3.0)
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args()
    rows = asyncio.run(_main(args))
    load = os.getloadavg()
    write_results(
        args.json,
        {"args": vars(args) | {"json": str(args.json)}, "rows": rows, "loadavg": load},
        "Stall of an attempt on a cut-off node after its suspicion",
        rows,
        notes=f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
        f"timeouts connect {args.connect_timeout} s, first byte "
        f"{args.first_byte_timeout} s; suspicion {args.detect} s after the "
        "attempt was sent.",
    )


if __name__ == "__main__":
    main()
