"""A flood of silent connections against a node's peer listener, with and without the caps on
connections mid-handshake (`TransportConfig.max_handshakes`, `max_handshakes_per_ip`).

    .venv/bin/python benchmarks/peer_handshake_flood.py --conns 2000 --json artifacts/flood.json

The listener (a `TlsTransport`) runs in a child process, so the attacker's own sockets are
not counted. The parent opens `--conns` TCP connections from 127.0.0.1, each sending the
first bytes of a ClientHello and then nothing (the handshake limit, 20 s, is longer than the
run). It then reads the child's RSS, open file descriptors and slots held, and times an
honest TLS handshake from another address (127.0.0.2) during the flood. Variants, measured
in the same run: `capped` (the defaults) and `uncapped` (both caps off: the node before).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

from _common import rss_kib, write_results

from llmfabric.net.fd_limit import raise_open_file_limit

HALF_HELLO = bytes([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC, 0x03, 0x03])


async def serve(variant: str) -> None:
    """The child: a peer listener; prints its address, then (RSS KiB, fds, slots held,
    refused busy) whenever asked (a line on stdin)."""
    from llmfabric.identity import NodeKey, PskAdmission
    from llmfabric.net import TlsTransport, TransportConfig

    caps = {} if variant == "capped" else {"max_handshakes": None, "max_handshakes_per_ip": None}
    t = TlsTransport(NodeKey.generate(), PskAdmission("bench", b"s" * 32),
                     TransportConfig(host="127.0.0.1", **caps))  # type: ignore[arg-type]
    await t.start()
    print(t.listen_addr, flush=True)
    loop = asyncio.get_running_loop()
    while await loop.run_in_executor(None, sys.stdin.readline):
        print(rss_kib(), len(os.listdir("/proc/self/fd")), t.handshaking.total,
              t.stats.handshakes_refused["busy"], flush=True)
    await t.aclose()


async def honest_tls_ms(port: int) -> float | None:
    """Milliseconds for a TLS handshake from 127.0.0.2 (None: refused or timed out)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    started = time.perf_counter()
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(
            "127.0.0.1", port, ssl=ctx, server_hostname="", local_addr=("127.0.0.2", 0)), 10)
    except (OSError, TimeoutError, ssl.SSLError):
        return None
    took = (time.perf_counter() - started) * 1e3
    writer.close()
    return took


async def measure(variant: str, conns: int) -> dict[str, float | int | None]:
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve", variant,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None

    async def ask() -> list[int]:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(b"\n")
        await child.stdin.drain()
        return [int(x) for x in (await child.stdout.readline()).split()]

    port = int((await child.stdout.readline()).decode().rsplit(":", 1)[1])
    rss0, fds0, _, _ = await ask()
    flood: list[asyncio.StreamWriter] = []
    for _ in range(conns):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(HALF_HELLO)
        flood.append(writer)
    await asyncio.sleep(1.0)  # every accept (or refusal) done
    rss1, fds1, held, refused = await ask()
    honest = await honest_tls_ms(port)
    for writer in flood:
        writer.close()
    child.stdin.close()
    await child.wait()
    return {"rss_growth_kib": rss1 - rss0, "fds_growth": fds1 - fds0, "held_mid_handshake": held,
            "refused_busy": refused, "honest_tls_handshake_ms": honest}


async def amain(args: argparse.Namespace) -> None:
    rows = []
    for rep in range(args.repeat):
        for variant in ("uncapped", "capped"):
            got = await measure(variant, args.conns)
            rows.append({"variant": variant, "run": rep + 1, **got})
            print(f"{variant} run {rep + 1}: {got}", file=sys.stderr)
    write_results(args.json, {"conns": args.conns, "load": os.getloadavg(), "rows": rows},
                  "Peer listener under a flood of silent connections", rows,
                  notes=f"{args.conns} silent connections from 127.0.0.1 per run; honest "
                        f"handshake from 127.0.0.2; load {os.getloadavg()}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        asyncio.run(serve(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conns", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    # our sockets, and the child's (it inherits the limit): each needs `conns` and some
    raise_open_file_limit(2 * args.conns + 256)
    asyncio.run(amain(args))


if __name__ == "__main__":
    main()
