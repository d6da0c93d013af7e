"""Memory per peer connection: N TlsTransports in one process, connected as a full mesh.

    .venv/bin/python benchmarks/net_memory.py --nodes 24 --json artifacts/net_memory.json

Each pair exchanges datagrams both ways and one small request, so every connection end has
read and written through TLS and both h2 sessions (as with gossip + SWIM + registry sync).
RSS (VmRSS of this process) is read after start-up and after the mesh is up; the difference
divided by the number of connection ends (2 per connection) is the cost of one end, which is
what a node pays per peer. Also reports connections left after `idle_close_s` of silence.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from pathlib import Path

from _common import rss_kib, write_results

from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.net import HandlerResponse, PeerRequest, TlsTransport, TransportConfig


async def echo(req: PeerRequest) -> HandlerResponse:
    return HandlerResponse(200, (), await req.read())


async def amain(args: argparse.Namespace) -> None:
    adm = PskAdmission("bench", b"b" * 32)
    cfg = TransportConfig(**({} if args.idle_close is None else {"idle_close_s": args.idle_close}))
    nodes = [TlsTransport(NodeKey.generate(), adm, cfg) for _ in range(args.nodes)]
    for t in nodes:
        await t.start()
        t.set_handler(lambda p, m: None)
        t.set_request_handler(echo)
    for a in nodes:
        for b in nodes:
            if a is not b:
                a.add_peer(b.local_id, [b.listen_addr or ""])
    gc.collect()
    await asyncio.sleep(0.2)
    base = rss_kib()
    t0 = time.perf_counter()
    for i, a in enumerate(nodes):  # a dials every later node; the other side answers
        await asyncio.gather(*(a._ensure_conn(b.local_id) for b in nodes[i + 1 :]))
    for _ in range(3):
        for a in nodes:
            for b in nodes:
                if a is not b:
                    a.send(b.local_id, b"g" * 200)
        await asyncio.sleep(0.05)

    async def call(a: TlsTransport, b: TlsTransport) -> None:
        resp = await a.request(b.local_id, "POST", "/x", (), b"r" * 512)
        await resp.read()
        await resp.aclose()

    for a in nodes:
        await asyncio.gather(*(call(a, b) for b in nodes if b is not a))
    setup_s = time.perf_counter() - t0
    await asyncio.sleep(0.5)
    gc.collect()
    mesh = rss_kib()
    conns = sum(len(t.connected_peers()) for t in nodes)  # connection ends
    left = conns
    if args.idle_close is not None:
        await asyncio.sleep(args.idle_close + args.idle_close / 2 + 1)
        left = sum(len(t.connected_peers()) for t in nodes)
    for t in nodes:
        await t.aclose()
    per_end = (mesh - base) / max(conns, 1)
    payload = {
        "nodes": args.nodes,
        "connection_ends": conns,
        "rss_base_kib": base,
        "rss_mesh_kib": mesh,
        "kib_per_connection_end": per_end,
        "setup_s": setup_s,
        "idle_close_s": args.idle_close,
        "connection_ends_after_idle": left,
    }
    rows = [
        {"metric": "connection ends", "value": conns},
        {"metric": "RSS before mesh (MiB)", "value": base / 1024},
        {"metric": "RSS with full mesh (MiB)", "value": mesh / 1024},
        {"metric": "KiB per connection end", "value": per_end},
        {"metric": "connection ends left after idle", "value": left},
    ]
    notes = f"{args.nodes} transports in one process, full mesh on loopback."
    write_results(args.json, payload, "Peer connection memory", rows, notes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=24)
    ap.add_argument("--idle-close", type=float, default=None, help="idle_close_s to test")
    ap.add_argument("--json", type=Path, default=None)
    asyncio.run(amain(ap.parse_args()))


if __name__ == "__main__":
    main()
