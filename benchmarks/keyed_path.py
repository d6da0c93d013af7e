"""What API keys add to one request, in CPU time: keyless vs keyed ingress in ONE process.

    python benchmarks/keyed_path.py --json OUT.json [--requests 2000] [--rounds 5]

The mock backend of ingress_overhead.py runs in the same event loop (so the numbers include
it; the keyed - keyless difference is the keyed path's own cost). Two ingresses share it, one
with `--no-auth`'s setup and one set up like `llmfabric ingress --db` (AccountStore +
RateLimiter + the tenancy gate with budgets loaded, no budget set, an unlimited key), each
measured two ways, alternated in rounds (medians):
- `serve`: `Ingress.serve` called directly, sequentially (the request path alone);
- `front`: through the lean front (FastFront) on loopback, 8 keep-alive connections from an
  in-process client (adds the front's per-request work: parsing, the pre-body key check).
CPU per request is process time (all threads) over the batch. Non-streamed requests.
To compare two trees, run it with each tree on PYTHONPATH. Writes JSON + a markdown table
(OUT.md beside OUT.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingress_overhead import MODEL, MockBackend, _request_bytes

from llmfabric.accounts.ratelimit import RateLimiter
from llmfabric.accounts.store import AccountStore
from llmfabric.cli.ingress import Backend, candidates
from llmfabric.clock import SystemClock
from llmfabric.forward import HttpForwarder
from llmfabric.front.fast_front import FastFront
from llmfabric.ingress import Ingress, StaticCandidateSource
from llmfabric.ingress.config import IngressConfig
from llmfabric.tenancy.accounts_auth import AccountsAuth
from llmfabric.tenancy.attach import attach_tenancy
from llmfabric.testing.sinks import NoSink

BODY = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                     "max_tokens": 8, "stream": False})
CONNS = 8


async def _serve_batch(ing: Ingress, header: str, n: int) -> float:
    sink = NoSink()
    t = time.process_time()
    for _ in range(n):
        r = await ing.serve("/v1/chat/completions", True, header, None, BODY, sink)
        if r is None or r.status != 200:
            raise RuntimeError(f"request failed: {r}")
    return (time.process_time() - t) / n * 1e6


async def _front_batch(port: int, token: str, n: int) -> float:
    req = _request_bytes(port, False, token)

    async def conn(k: int) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(k):
            w.write(req)
            head = await r.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.decode("latin-1"))
            i = head.lower().index(b"content-length:")
            await r.readexactly(int(head[i + 15:head.index(b"\r\n", i)]))
        w.close()

    t = time.process_time()
    await asyncio.gather(*(conn(n // CONNS) for _ in range(CONNS)))
    return (time.process_time() - t) / (n // CONNS * CONNS) * 1e6


async def run(requests: int, rounds: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    backend = await loop.create_server(MockBackend, "127.0.0.1", 0)
    bport = backend.sockets[0].getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        store = await AccountStore.open(os.path.join(d, "accounts.db"))
        _, key = await store.create_key("bench", "bench")
        ings: dict[str, Ingress] = {}
        fronts: dict[str, tuple[FastFront, int]] = {}
        cands = candidates((Backend(MODEL, f"127.0.0.1:{bport}", "local", "bench"),))
        for name, keyed in (("keyless", False), ("keyed", True)):
            auth = AccountsAuth(store, RateLimiter(SystemClock())) if keyed else None
            ing = Ingress(IngressConfig(max_retries=1, auth_enabled=keyed),
                          StaticCandidateSource(cands), HttpForwarder(""), auth=auth,
                          usage_sink=auth)
            if keyed:
                await attach_tenancy(ing, store)
            front = FastFront(ing)
            fronts[name] = (front, await front.start("127.0.0.1", 0))
            ings[name] = ing
        header = "Bearer " + key
        samples: dict[str, list[float]] = {f"{w}/{n}": [] for w in ("serve", "front")
                                           for n in ings}
        for name in ings:  # warm-up
            await _serve_batch(ings[name], header, requests // 5)
            await _front_batch(fronts[name][1], key, requests // 5)
        for _ in range(rounds):
            for name in ings:
                samples[f"serve/{name}"].append(await _serve_batch(ings[name], header,
                                                                   requests))
                samples[f"front/{name}"].append(await _front_batch(fronts[name][1], key,
                                                                   requests))
        for front, _ in fronts.values():
            await front.aclose()
        await store.aclose()
    backend.close()
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "load_average": list(os.getloadavg()), "requests": requests, "rounds": rounds,
        "cpu_us_per_request": {k: round(v, 2) for k, v in med.items()},
        "keys_add_us": {w: round(med[f"{w}/keyed"] - med[f"{w}/keyless"], 2)
                        for w in ("serve", "front")},
        "samples": {k: [round(x, 2) for x in v] for k, v in samples.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", dest="json_out", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=2000, help="requests per batch")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if args.requests < CONNS * 5 or args.rounds < 1:
        ap.error(f"--requests must be at least {CONNS * 5} and --rounds at least 1")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    out = asyncio.run(run(args.requests, args.rounds))
    args.json_out.write_text(json.dumps(out, indent=2))
    c, a = out["cpu_us_per_request"], out["keys_add_us"]
    md = ["| path | keyless (us/req) | keyed (us/req) | keys add (us) |", "|---|---|---|---|"]
    md += [f"| {w} | {c[f'{w}/keyless']:.1f} | {c[f'{w}/keyed']:.1f} | {a[w]:.1f} |"
           for w in ("serve", "front")]
    md.append(f"\nload average {out['load_average']}, {args.rounds} rounds of "
              f"{args.requests} requests, medians")
    args.json_out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
