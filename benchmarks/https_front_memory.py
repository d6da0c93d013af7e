"""Memory per idle HTTPS connection on the lean front, per event loop and TLS layer.

    .venv/bin/python benchmarks/https_front_memory.py --conns 200 --json artifacts/https_mem.json

A front serving HTTPS runs in a child process (so the client's own TLS buffers are not
counted); the parent opens `--conns` TLS connections to it and leaves them idle. The child's
RSS (VmRSS) before and after, divided by the connections, is what one costs the ingress.
Variants, measured in the same run:
- `asyncio`: asyncio's loop, the front's TLS layer (`CountedTlsAccept`, 64 KiB reads);
- `asyncio-256k`: the same with asyncio's default 256 KiB buffer (the TLS layer before);
- `uvloop`: uvloop, whose own TLS layer the front keeps (skipped when uvloop is missing).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import rss_kib, write_results

from llmfabric.testing.tls_files import write_cert

VARIANTS = ("asyncio", "asyncio-256k", "uvloop")


async def serve(variant: str, cert: str, key: str) -> None:
    """The child: a front on HTTPS; prints its port, then its RSS whenever asked (a line)."""
    from llmfabric.forward import HttpForwarder
    from llmfabric.front import front_limits
    from llmfabric.front.fast_front import FastFront
    from llmfabric.ingress import Ingress, IngressConfig, StaticCandidateSource
    from llmfabric.net.server_tls import ServerTls

    if variant == "asyncio-256k":
        front_limits.CountedTlsAccept.max_size = 256 * 1024
    ingress = Ingress(IngressConfig(auth_enabled=False), StaticCandidateSource([]),
                      HttpForwarder())
    front = FastFront(ingress)
    port = await front.start("127.0.0.1", 0, ssl=ServerTls(Path(cert), Path(key)).context)
    loop = asyncio.get_running_loop()
    print(port, flush=True)
    while await loop.run_in_executor(None, sys.stdin.readline):
        print(rss_kib(), len(front._conns), flush=True)


async def measure(variant: str, conns: int, cert: str, key: str) -> dict[str, float]:
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve", variant, cert, key,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None

    async def ask() -> tuple[int, int]:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(b"\n")
        await child.stdin.drain()
        rss, open_conns = (await child.stdout.readline()).split()
        return int(rss), int(open_conns)

    port = int(await child.stdout.readline())
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    before, _ = await ask()
    held = [await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="")
            for _ in range(conns)]
    await asyncio.sleep(1.0)  # every handshake done and every connection registered
    after, registered = await ask()
    for _, writer in held:
        writer.close()
    child.kill()
    await child.wait()
    return {"rss_before_kib": before, "rss_after_kib": after, "connections": registered,
            "kib_per_connection": (after - before) / max(registered, 1)}


async def amain(args: argparse.Namespace) -> None:
    try:
        import uvloop  # noqa: F401
        variants = VARIANTS
    except ImportError:
        variants = VARIANTS[:2]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = pathlib.Path(tmp) / "c.pem", pathlib.Path(tmp) / "k.pem"
        write_cert(cert, key, "bench")
        for rep in range(args.repeat):
            for variant in variants:
                got = await measure(variant, args.conns, str(cert), str(key))
                rows.append({"variant": variant, "run": rep + 1, **got})
                print(f"{variant} run {rep + 1}: {got['kib_per_connection']:.1f} KiB per "
                      f"connection ({got['connections']} open)", file=sys.stderr)
    write_results(args.json, {"conns": args.conns, "load": os.getloadavg(), "rows": rows},
                  "HTTPS front: RSS per idle connection", rows,
                  notes=f"{args.conns} idle TLS connections per run; load {os.getloadavg()}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        variant, cert, key = sys.argv[2:5]
        if variant == "uvloop":
            import uvloop

            uvloop.run(serve(variant, cert, key))
        else:
            asyncio.run(serve(variant, cert, key))
        return
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conns", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    asyncio.run(amain(ap.parse_args()))


if __name__ == "__main__":
    main()
