"""A local fabric for the dashboard's browser tests, assembled from the real pieces.

Used when `llmfabric demo` is not available. One process serves the real ingress app
(routing, HTTP forwarder, accounts auth + usage on SQLite), the real account routes, the real
node JSON routes and the dashboard; every node is a real simulated-engine SUBPROCESS. What
stands in for the node agent is a small health watcher: a node whose engine stops answering
goes DOWN in the registry view after two failed checks, as the agent would publish.

    python standin_fabric.py --dir DIR [--port 0]

prints one JSON line when ready: {"url", "admin_key", "nodes": {session_id: engine_pid}}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry

from llmfabric.accounts.bootstrap import ensure_admin_key
from llmfabric.accounts.http import add_account_routes
from llmfabric.accounts.store import AccountStore
from llmfabric.dashboard import add_dashboard_routes
from llmfabric.ingress.accounts_auth import AccountsAuth
from llmfabric.ingress.app import build_ingress_app
from llmfabric.ingress.config import IngressConfig
from llmfabric.ingress.forward_http import HttpForwarder
from llmfabric.ingress.sources import RecordsCandidateSource
from llmfabric.node.http_api import add_node_routes
from llmfabric.node.views import ObservedRecord
from llmfabric.registry.records import (
    Hardware,
    Lifecycle,
    LoadHints,
    NodeMeta,
    NodeRecord,
    ServedModel,
)

# (session id, provider, model, gpu, gpu memory GB, quantization, bits, site)
NODES = [
    ("s-h100-a1", "uni-a", "llama-3.1-8b-instruct", "H100-SXM", 80.0, "bf16", 16, "cluster-a"),
    ("s-a100-b1", "lab-b", "llama-3.1-8b-instruct", "A100-80GB", 80.0, "fp8", 8, "cluster-b"),
    ("s-l40s-b2", "lab-b", "qwen2.5-7b-instruct", "L40S", 48.0, "awq-int4", 4, "cluster-b"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StandinReplica:
    """The node views' ReplicaReader over a dict of records the watcher updates."""

    def __init__(self) -> None:
        self.session_id = "s-ingress"
        self.records: dict[str, NodeRecord] = {}
        self.last_seen: dict[str, float] = {}

    def observed(self) -> list[ObservedRecord]:
        return [
            ObservedRecord(rec, False, self.last_seen.get(sid, 0.0))
            for sid, rec in sorted(self.records.items())
        ]

    def pairs(self) -> list[tuple[NodeRecord, bool]]:
        return [(rec, False) for rec in self.records.values()]

    def raw_records(self) -> list[dict[str, Any]]:
        out = []
        for rec in self.records.values():
            d = dataclasses.asdict(rec)
            d["state"] = rec.state.name
            d["public_key"] = rec.public_key.hex()
            d["signature"] = rec.signature.hex()
            out.append({"kind": "record", **d})
        return out

    def set_state(self, sid: str, state: Lifecycle) -> None:
        rec = self.records[sid]
        if rec.state is not state:
            self.records[sid] = dataclasses.replace(
                rec, state=state, version=rec.version + 1, updated_at=time.time()
            )


def start_engine(model: str, gpu: str, port: int, log_path: str) -> subprocess.Popen[bytes]:
    code = (
        "import asyncio, sys\n"
        "from llmfabric.engines.sim_server import SimEngineConfig, serve\n"
        "asyncio.run(serve(SimEngineConfig(models=(sys.argv[1],), gpu=sys.argv[2], "
        "port=int(sys.argv[3]), speed=4.0)))\n"
    )
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-c", code, model, gpu, str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def watch(replica: StandinReplica, ports: dict[str, int], stop: asyncio.Event) -> None:
    """Mark a node SERVING once its engine answers /health and DOWN after 2 failed checks."""
    failures = dict.fromkeys(ports, 0)
    timeout = aiohttp.ClientTimeout(total=0.5)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        while not stop.is_set():
            for sid, port in ports.items():
                try:
                    async with http.get(f"http://127.0.0.1:{port}/health") as r:
                        ok = r.status == 200
                except (aiohttp.ClientError, TimeoutError, OSError):
                    ok = False
                rec = replica.records[sid]
                if ok:
                    failures[sid] = 0
                    replica.last_seen[sid] = time.time()
                    if rec.state is Lifecycle.JOIN:
                        replica.set_state(sid, Lifecycle.SERVING)
                else:
                    failures[sid] += 1
                    if failures[sid] >= 2 and rec.state is Lifecycle.SERVING:
                        replica.set_state(sid, Lifecycle.DOWN)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.3)


async def main(workdir: str, port: int) -> None:
    os.makedirs(workdir, exist_ok=True)
    replica = StandinReplica()
    ports: dict[str, int] = {}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for sid, provider, model, gpu, mem, quant, bits, site in NODES:
        eport = free_port()
        ports[sid] = eport
        procs[sid] = start_engine(model, gpu, eport, os.path.join(workdir, f"{sid}.log"))
        meta = NodeMeta(
            provider_id=provider,
            http_addr=f"127.0.0.1:{eport}",
            peer_addrs=(f"127.0.0.1:{eport + 1}",),
            hardware=Hardware(gpu, 1, mem, "nvlink" if "SXM" in gpu else "pcie", 32, 256.0),
            engine="sim",
            models=(ServedModel(model, (model.split("-instruct")[0],), quant, bits, 8192),),
            load=LoadHints(0, 0, 0.0),
            labels=(("site", site),),
            tier="transient",
        )
        replica.records[sid] = NodeRecord(
            session_id=sid,
            peer_id=f"peer-{sid}",
            public_key=b"\0" * 32,
            state=Lifecycle.JOIN,
            incarnation=0,
            version=1,
            updated_at=time.time(),
            meta=meta,
        )
    store = await AccountStore.open(
        os.path.join(workdir, "accounts.db"), flush_interval_s=0.2, refresh_interval_s=1.0
    )
    _, admin_key = await ensure_admin_key(store, os.path.join(workdir, "admin.key"))
    auth = AccountsAuth(store)
    app = build_ingress_app(
        IngressConfig(node_id=replica.session_id),
        RecordsCandidateSource(replica.pairs),
        HttpForwarder(""),
        auth=auth,
        usage_sink=auth,
        serve_metrics=False,
    )
    add_node_routes(app, replica, CollectorRegistry())
    add_account_routes(app, store)
    add_dashboard_routes(app)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port or free_port())
    await site.start()
    bound = runner.addresses[0][1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(watch(replica, ports, stop))
    ready = {
        "url": f"http://127.0.0.1:{bound}",
        "admin_key": admin_key,
        "nodes": {sid: p.pid for sid, p in procs.items()},
    }
    print(orjson.dumps(ready).decode(), flush=True)
    try:
        await stop.wait()
    finally:
        await watcher
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        await runner.cleanup()
        await store.aclose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    asyncio.run(main(args.dir, args.port))
