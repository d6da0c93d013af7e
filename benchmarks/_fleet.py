"""Many real nodes on loopback, spread over worker processes, for the gossip benchmarks.

Each worker process runs an asyncio loop hosting some `llmfabric.node.Node`s (real TLS
transport, gossip, SWIM and HTTP API; only the engine is left out) and answers commands from
the coordinator over a pipe. Observation hooks record, in wall-clock time, when each node's
replica first saw a session or a model, and bytes sent by the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pathlib
import signal
import tempfile
import time
from dataclasses import dataclass
from typing import Any

SECRET = "benchmark-network-secret-0123456789"


@dataclass
class _Hosted:
    node: Any  # llmfabric.node.daemon.Node
    seen_session: dict[str, float]
    seen_model: dict[str, float]
    seen_gone: dict[str, float]  # session -> when it first stopped being routable here
    routable: set[str]


def _attach(node: Any) -> _Hosted:
    from llmfabric.registry.records import Lifecycle

    hosted = _Hosted(node, {}, {}, {}, set())

    def on_change(change: Any) -> None:
        now = time.time()
        sid = change.session_id
        hosted.seen_session.setdefault(sid, now)
        entry = change.after
        rec = entry.record.record if entry.record is not None else None
        if rec is None:
            return
        if entry.state is Lifecycle.SERVING:
            for m in rec.meta.models:
                hosted.seen_model.setdefault(m.id, now)
            if entry.suspected:
                hosted.seen_gone.setdefault(sid, now)
        elif entry.state is not Lifecycle.JOIN:
            hosted.seen_gone.setdefault(sid, now)

    # A node evicted by the fabric (a false eviction under CPU starvation) rejoins with a new
    # agent: keep observing it, or its replica would silently stop counting.
    node.add_session_listener(on_change)
    return hosted


async def _start_node(root: pathlib.Path, preset: str, bootstrap: list[str], i: int) -> _Hosted:
    from llmfabric.node.config import build_config
    from llmfabric.node.daemon import Node

    cfg = build_config({}, {
        "home": root / f"n{i}", "listen": "127.0.0.1:0", "http_listen": "127.0.0.1:0",
        "preset": preset, "network_secret": SECRET, "bootstrap": tuple(bootstrap),
        "relay": not bootstrap, "gpu": "cpu",
    })
    node = Node(cfg)
    await node.start()
    return _attach(node)


async def _serve(conn: mpc.Connection, preset: str) -> None:
    root = pathlib.Path(tempfile.mkdtemp(prefix="lf-bench-"))
    hosted: dict[str, _Hosted] = {}  # name -> node
    counter = 0
    while True:
        cmd, args = await asyncio.to_thread(conn.recv)
        try:
            if cmd == "start":
                names = []
                for _ in range(args["count"]):
                    h = await _start_node(root, preset, args["bootstrap"], counter)
                    counter += 1
                    name = h.node.session_id
                    hosted[name] = h
                    names.append((name, h.node.transport.listen_addr))
                conn.send(("ok", names))
            elif cmd == "register":
                h = hosted[args["name"]]
                from llmfabric.registry.records import Lifecycle, ServedModel

                agent = h.node.agent
                t0 = time.time()
                agent.update_self(h.node.meta(engine="sim",
                                              models=(ServedModel(id=args["model"]),)))
                agent.set_state(Lifecycle.SERVING)
                conn.send(("ok", t0))
            elif cmd == "seen":
                out: dict[str, Any] = {}
                for name, h in hosted.items():
                    key = args["key"]
                    table = {"session": h.seen_session, "model": h.seen_model,
                             "gone": h.seen_gone}[args["kind"]]
                    out[name] = table.get(key)
                conn.send(("ok", out))
            elif cmd == "routes_to":  # cheap: one lookup per node, not the whole view list
                routes: dict[str, bool] = {}
                for name, h in hosted.items():
                    view = h.node.agent.nodes.get(args["session"])
                    routes[name] = view is not None and view.routable
                conn.send(("ok", routes))
            elif cmd == "routable":
                conn.send(("ok", {name: [v.session_id for v in h.node.agent.nodes.routable()]
                                  for name, h in hosted.items()}))
            elif cmd == "known":
                conn.send(("ok", {n: len(h.node.agent.nodes.all(include_left=False))
                                  for n, h in hosted.items()}))
            elif cmd == "stats":  # gossip counters summed over this worker's nodes
                total: dict[str, float] = {}
                for h in hosted.values():
                    st = h.node.gossip_stats
                    for k, v in st.msgs_out.items():
                        total[f"msgs_out.{k}"] = total.get(f"msgs_out.{k}", 0) + v
                    for k in ("bytes_out", "suspicions_raised", "suspicions_spared",
                              "evictions_issued", "refutations", "rebootstraps", "reconnects",
                              "seed_contacts"):
                        total[k] = total.get(k, 0) + getattr(st, k)
                    ts = h.node.transport.stats
                    for k in ("connections_opened", "peers_lost"):
                        total[k] = total.get(k, 0) + getattr(ts, k)
                    # inbound connections closed at accept over a handshake cap (net/config.py)
                    total["handshakes_refused_busy"] = (
                        total.get("handshakes_refused_busy", 0) + ts.handshakes_refused["busy"])
                conn.send(("ok", {"total": total}))
            elif cmd == "bytes":
                conn.send(("ok", {n: h.node.transport.stats.bytes_sent
                                  for n, h in hosted.items()}))
            elif cmd == "stop":
                for h in hosted.values():
                    await h.node.stop(drain=False)
                conn.send(("ok", None))
                return
            else:
                conn.send(("error", f"unknown command {cmd}"))
        except Exception as exc:  # report to the coordinator instead of dying silently
            conn.send(("error", repr(exc)))


def _worker_main(conn: mpc.Connection, preset: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_serve(conn, preset))


class Worker:
    def __init__(self, preset: str) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, preset), daemon=True)
        self.proc.start()
        self.names: list[str] = []

    def call(self, cmd: str, timeout: float = 120.0, **args: Any) -> Any:
        self.conn.send((cmd, args))
        if not self.conn.poll(timeout):
            raise TimeoutError(f"worker did not answer {cmd} within {timeout}s")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"worker failed {cmd}: {value}")
        return value

    def start(self, count: int, bootstrap: list[str]) -> list[tuple[str, str]]:
        got: list[tuple[str, str]] = self.call("start", count=count, bootstrap=bootstrap)
        self.names.extend(n for n, _ in got)
        return got

    def kill9(self) -> None:
        if self.proc.pid is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(10)

    def stop(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(TimeoutError, RuntimeError, EOFError, OSError):
                self.call("stop", timeout=60)
            self.proc.join(10)
        if self.proc.is_alive():
            self.kill9()


class Fleet:
    """`nodes` real nodes over `workers` processes; node 0 (worker 0) is the bootstrap."""

    def __init__(self, nodes: int, workers: int, preset: str, batch: int = 8,
                 pause_s: float = 0.5) -> None:
        self.preset = preset
        self.workers = [Worker(preset) for _ in range(workers)]
        first = self.workers[0].start(1, [])
        self.bootstrap_addr = first[0][1]
        per = [(nodes - 1) // workers + (1 if i < (nodes - 1) % workers else 0)
               for i in range(workers)]
        # Nodes join in small waves, as Slurm jobs do, not all in one instant: a start-up
        # storm on 2 shared cores would only measure the machine's overload.
        while any(per):
            for i, w in enumerate(self.workers):
                take = min(batch, per[i])
                if take:
                    w.start(take, [self.bootstrap_addr])
                    per[i] -= take
            time.sleep(pause_s)

    @property
    def size(self) -> int:
        return sum(len(w.names) for w in self.workers)

    def gather(self, cmd: str, **args: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for w in self.workers:
            if w.proc.is_alive():
                out.update(w.call(cmd, **args))
        return out

    def stats(self) -> dict[str, float]:
        """Gossip counters summed over every node of every live worker."""
        total: dict[str, float] = {}
        for w in self.workers:
            if w.proc.is_alive():
                for k, v in w.call("stats")["total"].items():
                    total[k] = total.get(k, 0) + v
        return total

    def wait_converged(self, timeout: float) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            known = self.gather("known")
            if known and min(known.values()) >= self.size:
                return time.monotonic() - start
            time.sleep(0.25)
        raise TimeoutError(f"fleet of {self.size} did not converge in {timeout}s")

    def close(self) -> None:
        for w in self.workers:
            w.stop()


def percentiles(values: list[float], missing: int = 0) -> dict[str, Any]:
    """p50/p95/p100 in ms over every replica that should have seen the event: a replica that
    never saw it counts as infinitely late (a failure, never silently dropped), so a
    percentile that falls on a miss is None (JSON null) and `missing` says how many."""
    import math

    import numpy as np

    total = len(values) + missing
    out: dict[str, Any] = {"observed": len(values), "missing": missing}
    if total == 0:
        return {**out, "p50_ms": None, "p95_ms": None, "p100_ms": None}
    arr = np.sort(np.asarray(values + [math.inf] * missing, dtype=float))
    for name, q in (("p50_ms", 50), ("p95_ms", 95), ("p100_ms", 100)):
        # nearest rank: a real observation or a miss, never an interpolation across one
        v = float(arr[max(0, math.ceil(q / 100 * total) - 1)])
        out[name] = v * 1000 if math.isfinite(v) else None
    return out
