"""A tiny node process for end-to-end network tests (network namespaces, NAT, relays).

    python -m llmfabric.net.selftest serve --listen 10.0.0.2:7000 --relay --ready-file F
    python -m llmfabric.net.selftest serve --listen 192.168.1.2:7000 --bootstrap 10.0.0.2:7000 \
        --auto-relay --ready-file F
    python -m llmfabric.net.selftest request --bootstrap 10.0.0.2:7000 --target PEER \
        --target-addr 192.168.1.2:7000 --target-relay RELAY

`serve` answers every request with "hello from <peer id> to <origin>: <body>" and writes a JSON
ready file {peer_id, listen, reachable, relays}. With --auto-relay it asks its first bootstrap
peer for a dial-back and, when it cannot be dialled, keeps an outbound relay connection to it.
`request` prints one JSON line: whether the direct dial failed, and the relayed response.
Every process stops after --duration seconds at most.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import pathlib
import signal
import sys
from typing import Any

from llmfabric.identity.admission import PskAdmission
from llmfabric.identity.keys import NodeKey
from llmfabric.net.addressbook import parse_addr
from llmfabric.net.config import TransportConfig
from llmfabric.net.errors import NetError
from llmfabric.net.messages import HandlerResponse, PeerRequest
from llmfabric.net.tls_transport import TlsTransport


def _transport(args: argparse.Namespace, *, listen: str | None, relay: bool) -> TlsTransport:
    host, port = parse_addr(listen) if listen else (None, 0)
    cfg = TransportConfig(
        host=host,
        port=port,
        public_addr=args.public_addr or listen,
        relay=relay,
        connect_timeout=args.connect_timeout,
        backoff_base=0.2,
        backoff_cap=2.0,
        keepalive=5.0,
    )
    return TlsTransport(NodeKey.generate(), PskAdmission(args.network, args.psk.encode()), cfg)


def _write_ready(path: str, info: dict[str, Any]) -> None:
    tmp = pathlib.Path(path + ".tmp")
    tmp.write_text(json.dumps(info))
    tmp.rename(path)  # atomic: readers never see a partial file


async def _serve(args: argparse.Namespace) -> int:
    t = _transport(args, listen=args.listen, relay=args.relay)

    async def handler(req: PeerRequest) -> HandlerResponse:
        body = await req.read()
        text = f"hello from {t.local_id} to {req.peer_id}: ".encode() + body
        return HandlerResponse(200, (("x-via", req.via or ""),), text)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with t:
        t.set_request_handler(handler)
        reachable: bool | None = None
        if args.bootstrap:
            peers = await t.bootstrap(args.bootstrap, max_rounds=20)
            if args.auto_relay:
                try:
                    reachable = await t.check_reachability(peers[0])
                except NetError:
                    reachable = False
                if not reachable:
                    t.use_relays(peers[:1])
                    await t.wait_relayed(1, timeout=20)
        info: dict[str, Any] = {
            "peer_id": t.local_id,
            "listen": t.listen_addr,
            "reachable": reachable,
            "relays": list(t.relays),
        }
        if args.ready_file:
            _write_ready(args.ready_file, info)
        print(json.dumps(info), flush=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(args.duration):
                await stop.wait()
    return 0


async def _request(args: argparse.Namespace) -> int:
    t = _transport(args, listen=None, relay=False)
    out: dict[str, Any] = {}
    async with t:
        try:
            relay_id = await t.connect_bootstrap(args.bootstrap[0])
        except NetError as exc:
            out["refused"] = str(exc)
            print(json.dumps(out), flush=True)
            return 3
        out["bootstrap_peer"] = relay_id
        if args.target_addr:
            try:
                await t.connect(args.target_addr, expected_peer=args.target)
                out["direct"] = "ok"
            except NetError as exc:
                out["direct"] = f"failed: {exc}"
        t.add_peer(args.target, [args.target_addr] if args.target_addr else [], args.target_relay)
        try:
            resp = await t.request(args.target, "POST", "/hello", (), b"ping", timeout=20)
            async with resp:
                out.update(status=resp.status, via=resp.via, body=(await resp.read()).decode())
        except NetError as exc:
            out["error"] = str(exc)
    print(json.dumps(out), flush=True)
    return 0 if out.get("status") == 200 else 4


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmfabric.net.selftest")
    p.add_argument("mode", choices=["serve", "request"])
    p.add_argument("--listen", default=None, help="host:port to listen on (serve)")
    p.add_argument("--public-addr", default=None)
    p.add_argument("--relay", action="store_true", help="serve as a relay")
    p.add_argument("--auto-relay", action="store_true", help="use the bootstrap as relay if NATed")
    p.add_argument("--bootstrap", action="append", default=[])
    p.add_argument("--network", default="e2e")
    p.add_argument("--psk", default="e2e-secret-0123456789abcdef")
    p.add_argument("--target", default=None)
    p.add_argument("--target-addr", default=None)
    p.add_argument("--target-relay", action="append", default=[])
    p.add_argument("--ready-file", default=None)
    p.add_argument("--duration", type=float, default=120.0)
    p.add_argument("--connect-timeout", type=float, default=3.0)
    args = p.parse_args(argv)
    if args.mode == "request" and (not args.target or not args.bootstrap):
        p.error("request needs --target and --bootstrap")
    coro = _serve(args) if args.mode == "serve" else _request(args)
    return asyncio.run(coro)


if __name__ == "__main__":
    sys.exit(main())
