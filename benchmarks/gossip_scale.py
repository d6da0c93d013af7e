"""The control plane at scale: the REAL gossip, SWIM and registry code of N nodes on the
in-memory network (llmfabric.testing MemNet) with virtual time (FakeClock).

Per N and network profile (`flat`: one site, U(0.2, 1) ms per message; `3site`: nodes spread
over three sites, 20 / 30 / 40 ms between each pair of sites on top) it measures:
- join: a new node (seeded with one random member) until each other replica holds its
  session; register: a SERVING node publishes a new model until each replica routes to it
  (p50/p95/p100 virtual ms over every replica; a replica that has not seen it within the
  wait counts as infinitely late);
- idle and churn bytes per node per second (every message byte the agents send); churn =
  1% of the nodes leaving (LEFT, then gone) and as many new nodes joining per virtual minute;
  under churn also each churned join's convergence (as for join, over the replicas live
  throughout), suspicions and evictions, and the bytes by message kind;
- at 1% packet loss over a window: suspicions raised and evictions of live sessions (every
  node is alive then: each suspicion is false);
- CPU: wall seconds per virtual second / N (this machine, shared cores: an upper bound);
- memory: one standalone Replica holding N signed records, each decoded by itself, as a
  real node holds them (tracemalloc).

What the simulation shares, so that N replicas fit one process: the fleet starts converged
(one replica applies every node's signed SERVING record and is frozen; every agent adopts
it copy-on-write, `GossipAgent.adopt`, so each replica holds only its own changes and
10,000 nodes fit in ~1.3 GB; the join measured is a new node's, through the real protocol),
and Ed25519 verification of an item is done once per process, not once per replica
(`SharedVerify`: a real node verifies each new item once; its cost is reported separately,
per node per second, from the counted first-time verifications). Above `--max-full` nodes
the script measures only what a node holds and sends at that N: the standalone replica,
and one anti-entropy repair between two replicas of N records that differ in one session.

    python benchmarks/gossip_scale.py --nodes 1000,10000 --max-full 10000 --json OUT.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import os
import pathlib
import random
import resource
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _common import write_results

import llmfabric.gossip.agent as agent_mod
import llmfabric.registry.replica as replica_mod
from llmfabric.gossip.agent import GossipAgent
from llmfabric.gossip.antientropy import AntiEntropy
from llmfabric.gossip.config import PRESETS, GossipConfig
from llmfabric.gossip.wire import Message, encode, item_size
from llmfabric.identity.keys import NodeKey
from llmfabric.membership.memberset import Member, MemberSet
from llmfabric.registry.codec import SignedRecord, verify_record
from llmfabric.registry.facts import Fact, verify_fact
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import Lifecycle, NodeMeta, ServedModel
from llmfabric.registry.replica import Change, Replica, item_parts
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.memnet import MemNet

SITE_MS = {(0, 1): 20.0, (0, 2): 30.0, (1, 2): 40.0}
SENT_BYTES: dict[str, int] = {}  # bytes every agent encoded to send, by message kind


def _counting_encode(msg: Message, session_id: str) -> bytes:
    data = encode(msg, session_id)
    kind = type(msg).__name__
    SENT_BYTES[kind] = SENT_BYTES.get(kind, 0) + len(data)
    return data


agent_mod.encode = _counting_encode  # type: ignore[assignment]  # tally by kind, same bytes


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] if s else float("nan")


class SharedVerify:
    """Verify each distinct signed item once per process (a real node verifies it once)."""

    def __init__(self) -> None:
        self.records: dict[bytes, SignedRecord] = {}
        self.facts: dict[bytes, Fact] = {}
        self.calls = 0

    def record(self, body: bytes, sig: bytes) -> SignedRecord:
        self.calls += 1
        got = self.records.get(sig)
        if got is None or got.body != body:
            got = self.records[sig] = verify_record(body, sig)
        return got

    def fact(self, body: bytes, sig: bytes) -> Fact:
        self.calls += 1
        got = self.facts.get(sig)
        if got is None or got.body != body:
            got = self.facts[sig] = verify_fact(body, sig)
        return got

    def install(self) -> None:
        replica_mod.verify_record = self.record  # type: ignore[assignment]
        replica_mod.verify_fact = self.fact  # type: ignore[assignment]


def verify_cost_s() -> float:
    """Seconds per Ed25519 record verification (decode included) on this machine."""
    key = NodeKey.generate()
    o = RecordOwner(key, NodeMeta(models=(ServedModel("m"),)), wall=1.7e9)
    rec = o.current
    verify_record(rec.body, rec.signature)  # warm up
    t = time.perf_counter()
    for _ in range(200):
        verify_record(rec.body, rec.signature)
    return (time.perf_counter() - t) / 200


def replica_memory_bytes(n: int) -> float:
    """Bytes one Replica holds for n signed SERVING records, each decoded separately."""
    clock = FakeClock()
    items = []
    for i in range(n):  # a key per node: a replica admits only a few sessions per peer
        o = RecordOwner(NodeKey.generate(), meta_for(i), wall=clock.wall())
        items.append(o.set_state(Lifecycle.SERVING, wall=clock.wall()))
    wire = [(it.body, it.signature) for it in items]
    del items
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    r = Replica(clock)
    for body, sig in wire:
        r.apply(verify_record(body, sig))  # what ingest does, minus the duplicate check
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return float(used)


def repair_bytes(n: int, buckets: int = 32) -> dict[str, int]:
    """Bytes of one anti-entropy round between two replicas of n records differing in one."""
    clock = FakeClock()
    a, b = Replica(clock, buckets=buckets), Replica(clock, buckets=buckets)
    for i in range(n):
        o = RecordOwner(NodeKey.generate(), meta_for(i), wall=clock.wall())
        it = o.set_state(Lifecycle.SERVING, wall=clock.wall())
        a.apply(it)
        b.apply(it if i else o.update_meta(meta_for(i, extra=True), wall=clock.wall()))
    sent: dict[str, int] = {}
    queue: list[tuple[str, Message]] = []
    ae = {"a": AntiEntropy(a, lambda p, m: queue.append((p, m)), 60_000),
          "b": AntiEntropy(b, lambda p, m: queue.append((p, m)), 60_000)}
    ae["a"].start("b")
    while queue:
        to, msg = queue.pop(0)
        kind = type(msg).__name__
        sent[kind] = sent.get(kind, 0) + len(encode(msg, "s" * 40))
        peer = "a" if to == "b" else "b"
        side = ae[to]
        match kind:
            case "SyncRoot":
                side.on_root(peer, msg)  # type: ignore[arg-type]
            case "SyncBuckets":
                side.on_buckets(peer, msg)  # type: ignore[arg-type]
            case "SyncDigest":
                side.on_digest(peer, msg)  # type: ignore[arg-type]
            case "SyncDeltas":
                side.on_deltas(peer, msg)  # type: ignore[arg-type]
    sent["total"] = sum(sent.values())
    return sent


def record_item_bytes() -> int:
    """Wire bytes of one SERVING record item as this benchmark's nodes publish it."""
    o = RecordOwner(NodeKey.generate(), meta_for(123), wall=1.7e9)
    return item_size(item_parts(o.set_state(Lifecycle.SERVING, wall=1.7e9)))


def refresh_B_per_node_s(n: int, cfg: GossipConfig) -> float:
    """Each owner republishes its record every gc.refresh_interval_s (so that it never ages
    out); a refresh is a minor change, sent on `minor_transmits` times by every replica.
    The measured windows start with fresh records and are shorter than the interval, so
    this share of idle traffic is computed, not measured."""
    return n / cfg.gc.refresh_interval_s * cfg.minor_transmits * record_item_bytes()


def meta_for(i: int, extra: bool = False, site: int = 0) -> NodeMeta:
    models = (ServedModel(f"model-{i % 8}"),) + ((ServedModel("bench-model"),) if extra else ())
    ip = f"10.{site}.{i // 250 % 250}.{i % 250}"
    return NodeMeta(provider_id=f"p{i % 13}", http_addr=f"{ip}:8000", peer_addrs=(f"{ip}:7000",),
                    engine="vllm", models=models, labels=(("site", f"site-{site}"),))


class Fleet:
    def __init__(self, n: int, profile: str, config: GossipConfig, seed: int) -> None:
        self.clock = FakeClock(resolution=0.001)
        self.rng = random.Random(seed)
        self.site: dict[str, int] = {}
        sites = 3 if profile == "3site" else 1

        def link(src: str, dst: str) -> float:
            a, b = self.site.get(src, 0), self.site.get(dst, 0)
            return 0.0 if a == b else SITE_MS[(min(a, b), max(a, b))] / 1000

        self.net = MemNet(self.clock, seed=seed, delay=(0.0002, 0.001),
                          link_delay=link if sites > 1 else None)
        self.sites = sites
        self.config = config
        self.agents: list[GossipAgent] = []
        self.count = 0

    def make(self, seeds: list[str]) -> GossipAgent:
        key = NodeKey.generate()
        site = self.count % self.sites
        self.site[key.peer_id] = site
        a = GossipAgent(self.net.transport(key.peer_id), self.clock, key,
                        meta_for(self.count, site=site), config=self.config, seeds=seeds,
                        rng=random.Random(self.rng.random()))
        self.count += 1
        return a

    async def start_converged(self, n: int) -> None:
        """n agents whose replicas already hold every member's SERVING record."""
        fresh = [self.make([]) for _ in range(n)]
        for a in fresh:
            a.owner.set_state(Lifecycle.SERVING, wall=self.clock.wall())
        # One replica gets every record through the real apply() and is frozen; every agent
        # adopts it copy-on-write (Replica.adopt, MemberSet.fork): what N applies would
        # leave in each, while each replica holds only its own changes from then on.
        first = Replica(self.clock, self.config.gc, buckets=self.config.buckets,
                        trust=self.config.trust)
        for a in fresh:
            first.apply(a.owner.current)
        base = first.freeze()
        del first
        members = MemberSet.shared(Member(sid, e.record.record.peer_id)
                                   for sid, e in base.entries.items() if e.record is not None)
        for a in fresh:
            a.adopt(base, members)
        for a in fresh:
            a.queue.clear()
        for a in fresh:
            await a.start()
            self.agents.append(a)
        # The fleet's millions of long-lived objects (records, keys, agents) out of the cyclic
        # GC's sight: full collections over them were a large share of the wall time.
        gc.collect()
        gc.freeze()

    async def join(self) -> GossipAgent:
        seed = self.rng.choice(self.live()).peer_id
        a = self.make([seed])
        await a.start()
        a.set_state(Lifecycle.SERVING)
        self.agents.append(a)
        return a

    async def leave(self, a: GossipAgent) -> None:
        await a.leave()
        await a.aclose()

    def live(self) -> list[GossipAgent]:
        return [a for a in self.agents if a._running and not a.evicted]

    def bytes(self) -> int:
        return sum(a.stats.bytes_out for a in self.agents)

    async def aclose(self) -> None:
        for a in self.agents:
            await a.aclose()
        await self.net.aclose()
        gc.unfreeze()


async def spread(fleet: Fleet, start: Callable[[], Any], seen_when: Callable[[GossipAgent, Change],
                 bool], wait_s: float) -> tuple[dict[str, float], int]:
    """Start an event; per replica, virtual ms until `seen_when(agent, change)` held."""
    observers = list(fleet.live())
    seen: dict[str, float] = {}
    t0 = fleet.clock.now()
    hooks = []
    for a in observers:
        def cb(change: Change, a: GossipAgent = a) -> None:
            if a.peer_id not in seen and seen_when(a, change):
                seen[a.peer_id] = (fleet.clock.now() - t0) * 1000
        a.add_listener(cb)
        hooks.append((a, cb))
    subject = await start()
    watchers = [a for a in observers if a is not subject]
    own = subject.peer_id
    await fleet.clock.run_until(lambda: len(seen) - (own in seen) >= len(watchers),
                                within=wait_s, step=0.005)
    for a, cb in hooks:
        a.replica.remove_listener(cb)
    return {a.peer_id: seen.get(a.peer_id, float("inf")) for a in watchers}, len(watchers)


def summary(lat: dict[str, float]) -> dict[str, float]:
    xs = list(lat.values())
    return {"p50_ms": pct(xs, 0.5), "p95_ms": pct(xs, 0.95), "p100_ms": max(xs),
            "missing": sum(1 for x in xs if x == float("inf"))}


async def run_one(n: int, profile: str, preset: str, seed: int, idle_s: float, churn_s: float,
                  loss_s: float, wait_s: float, verify: SharedVerify) -> dict[str, Any]:
    cfg = PRESETS[preset]
    fleet = Fleet(n, profile, cfg, seed)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t_build = time.perf_counter()
    await fleet.start_converged(n)
    build_s = time.perf_counter() - t_build
    out: dict[str, Any] = {"nodes": n, "profile": profile, "preset": preset,
                           "build_wall_s": round(build_s, 1)}
    log(f"n={n} {profile}: built in {build_s:.0f} s")
    await fleet.clock.advance(5.0)  # the start-up push of every own record dies out
    # idle
    b0, v0, w0, c0 = fleet.bytes(), verify.calls, time.perf_counter(), time.process_time()
    await fleet.clock.advance(idle_s)
    wall = time.perf_counter() - w0
    # process CPU, not wall: on a shared machine wall also counts the other users' time
    out["cpu_proc_ms_per_node_per_s"] = (time.process_time() - c0) / idle_s / n * 1000
    out["wall_s_per_virtual_s"] = wall / idle_s
    out["idle_B_per_node_s"] = (fleet.bytes() - b0) / n / idle_s
    out["cpu_ms_per_node_per_s"] = wall / idle_s / n * 1000
    out["idle_verifies_per_node_s"] = (verify.calls - v0) / n / idle_s
    # join and registration
    lat, _ = await spread(fleet, fleet.join,
                          lambda a, ch: ch.session_id == fleet.agents[-1].session_id, wait_s)
    out["join"] = summary(lat)
    log(f"n={n} {profile}: idle {out['idle_B_per_node_s']:.0f} B/s/node, "
        f"{out['wall_s_per_virtual_s']:.2f} s wall per virtual s; join {out['join']}")
    log(f"n={n} {profile}: idle + join done at {time.perf_counter() - t_build:.0f} s")
    target = fleet.rng.choice(fleet.live()[:-1])

    async def register() -> GossipAgent:
        target.update_self(dataclasses.replace(target.record.meta, models=(
            *target.record.meta.models, ServedModel("bench-model"))))
        return target

    def routes(a: GossipAgent, ch: Change) -> bool:
        if ch.session_id != target.session_id or ch.after.record is None:
            return False
        rec = ch.after.record.record
        return (ch.after.state is Lifecycle.SERVING and not ch.after.suspected
                and any(m.id == "bench-model" for m in rec.meta.models))

    lat, _ = await spread(fleet, register, routes, wait_s)
    out["register"] = summary(lat)
    log(f"n={n} {profile}: register {out['register']}")
    await fleet.clock.advance(5.0)
    # churn: 1% leave and 1% join per virtual minute (--churn 0: not run)
    if churn_s > 0:
        await churn_window(fleet, n, churn_s, wait_s, out)
        log(f"n={n} {profile}: churn done at {time.perf_counter() - t_build:.0f} s: "
            f"{out['churn_B_per_node_s']:.0f} B/s/node, joins {out['churn_join']}, "
            f"{out['churn_suspicions']} suspicions, {out['churn_evicted_live_nodes']} evicted")
    # 1% loss (--loss 0: not run)
    if loss_s > 0:
        await loss_window(fleet, n, loss_s, out)
        log(f"n={n} {profile}: loss {loss_s:.0f} s: {out['loss_false_suspicions']} "
            f"suspicions, {out['loss_evicted_live_nodes']} evicted")
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out["peak_rss_MB"] = rss1 / 1024  # ru_maxrss is in kB on Linux
    out["sim_rss_per_replica_kB"] = (rss1 - rss0) / n  # shared records: a lower bound
    out["wall_s"] = round(time.perf_counter() - t_build, 1)
    await fleet.aclose()
    return out


async def churn_window(fleet: Fleet, n: int, churn_s: float, wait_s: float,
                       out: dict[str, Any]) -> None:
    """1% of the nodes leave (LEFT, then gone) and as many new nodes join per virtual minute,
    for churn_s virtual s. Bytes per live node per s over the window; per churned join, the
    virtual ms until each replica that was live when the window began (and still is at its
    end) first holds the joiner's session, given wait_s after the window for the last ones."""
    per_min = max(1, round(0.01 * n))
    gap = 60.0 / per_min
    observers = fleet.live()
    started: dict[str, float] = {}  # churned joiner's session -> virtual time of its start
    seen: dict[str, dict[str, float]] = {}  # session -> observer peer -> virtual ms

    def watch(a: GossipAgent) -> Callable[[Change], None]:
        def cb(ch: Change) -> None:
            t0 = started.get(ch.session_id)
            if t0 is not None:
                seen[ch.session_id].setdefault(a.peer_id, (fleet.clock.now() - t0) * 1000)
        return cb

    hooks = [(a, watch(a)) for a in observers]
    for a, cb in hooks:
        a.add_listener(cb)
    s0 = sum(a.stats.suspicions_raised for a in fleet.agents)
    e0 = sum(a.stats.evictions_issued for a in fleet.agents)
    k0 = dict(SENT_BYTES)
    b0, w0, c0, t0 = fleet.bytes(), time.perf_counter(), time.process_time(), fleet.clock.now()
    events = 0
    # leave() sleeps one gossip tick on the fake clock: run it beside advance()
    leaving = []
    while fleet.clock.now() - t0 < churn_s:
        victim = fleet.rng.choice(fleet.live()[1:])
        leaving.append(asyncio.get_running_loop().create_task(fleet.leave(victim)))
        t_join = fleet.clock.now()
        joiner = await fleet.join()
        started[joiner.session_id] = t_join
        seen[joiner.session_id] = {}
        events += 1
        if events % 10 == 0:
            log(f"  churn: {events} leaves + joins, virtual {fleet.clock.now() - t0:.0f} s, "
                f"wall {time.perf_counter() - w0:.0f} s")
        await fleet.clock.advance(gap)
    await asyncio.gather(*leaving)
    span = fleet.clock.now() - t0
    live = fleet.live()
    out["churn_window_s"] = span
    out["churn_events"] = events
    out["churn_B_per_node_s"] = (fleet.bytes() - b0) / len(live) / span
    out["churn_B_per_node_s_by_kind"] = {
        k: (v - k0.get(k, 0)) / len(live) / span for k, v in sorted(SENT_BYTES.items())}
    out["churn_cpu_ms_per_node_per_s"] = (time.perf_counter() - w0) / span / n * 1000
    out["churn_cpu_proc_ms_per_node_per_s"] = (time.process_time() - c0) / span / n * 1000
    out["churn_suspicions"] = sum(a.stats.suspicions_raised for a in fleet.agents) - s0
    out["churn_evictions_issued"] = sum(a.stats.evictions_issued for a in fleet.agents) - e0
    out["churn_evicted_live_nodes"] = sum(1 for a in fleet.agents if a._running and a.evicted)
    await fleet.clock.advance(wait_s)  # the last joins get the same wait as the single join
    for a, cb in hooks:
        a.replica.remove_listener(cb)
    still = [a.peer_id for a in observers if a._running and not a.evicted]
    lat = [seen[sid].get(p, float("inf")) for sid in started for p in still
           if p != sid]  # a session id is never a peer id: every pair counts
    out["churn_join"] = summary(dict(enumerate(lat)))
    per_join_p95 = [pct([seen[sid].get(p, float("inf")) for p in still], 0.95) for sid in started]
    out["churn_join_p95_ms_worst_join"] = max(per_join_p95)
    out["churn_join_observers"] = len(still)


async def loss_window(fleet: Fleet, n: int, loss_s: float, out: dict[str, Any]) -> None:
    """1% loss on every message for loss_s virtual s: every node is alive, so every
    suspicion is false and every eviction of a live session is a false eviction."""
    live = fleet.live()
    s0 = sum(a.stats.suspicions_raised for a in fleet.agents)
    e0 = sum(a.stats.evictions_issued for a in fleet.agents)
    b0, c0 = fleet.bytes(), time.process_time()
    fleet.net.loss = 0.01
    await fleet.clock.advance(loss_s)
    fleet.net.loss = 0.0
    out["loss_cpu_proc_ms_per_node_per_s"] = (time.process_time() - c0) / loss_s / n * 1000
    out["loss_window_s"] = loss_s
    out["loss_false_suspicions"] = sum(a.stats.suspicions_raised for a in fleet.agents) - s0
    out["loss_evictions_issued"] = sum(a.stats.evictions_issued for a in fleet.agents) - e0
    out["loss_evicted_live_nodes"] = sum(1 for a in live if a.evicted)
    out["loss_B_per_node_s"] = (fleet.bytes() - b0) / len(live) / loss_s


def fits_in_memory(n: int, per_replica_sim_kB: float) -> bool:
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return False
    return n * per_replica_sim_kB * 1024 < 0.5 * avail


def flat_row(r: dict[str, Any]) -> dict[str, Any]:
    def lat(k: str) -> str:
        s = r.get(k)
        return "-" if not s else f"{s['p50_ms']:.0f} / {s['p95_ms']:.0f} / {s['p100_ms']:.0f}"
    return {
        "nodes": r["nodes"], "profile": r.get("profile", "-"), "run": r.get("run", "full"),
        "join p50/p95/p100 ms": lat("join"), "register p50/p95/p100 ms": lat("register"),
        "idle B/s/node (+ refresh)": (
            f"{r['idle_B_per_node_s']:.0f} (+{r['refresh_B_per_node_s']:.0f})"
            if "idle_B_per_node_s" in r else f"- (+{r['refresh_B_per_node_s']:.0f})"),
        "AE repair B (32 / 256 buckets)": (
            f"{r['repair_one_session_bytes']['total']} / "
            f"{r['repair_one_session_bytes_256_buckets']['total']}"),
        "churn B/s/node": r.get("churn_B_per_node_s", "-"),
        "churned join p50/p95/p100 ms": lat("churn_join"),
        "false susp. / evictions @1% loss": (
            f"{r['loss_false_suspicions']} / {r['loss_evicted_live_nodes']} "
            f"({r['loss_window_s']:.0f} s)" if "loss_window_s" in r else "-"),
        "replica MB": round(r["replica_MB"], 1),
        "CPU ms/node/s": r.get("cpu_proc_ms_per_node_per_s", r.get("cpu_ms_per_node_per_s", "-")),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="128,1000")
    ap.add_argument("--profiles", default="flat,3site")
    ap.add_argument("--preset", default="lan", choices=sorted(PRESETS))
    ap.add_argument("--idle", type=float, default=30.0, help="idle window, virtual s")
    ap.add_argument("--churn", type=float, default=120.0, help="churn window, virtual s")
    ap.add_argument("--loss", type=float, default=600.0, help="1%% loss window, virtual s")
    ap.add_argument("--wait", type=float, default=10.0, help="virtual s a replica may take")
    ap.add_argument("--max-full", type=int, default=2000,
                    help="largest N simulated in full; above it only per-node parts")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args()
    verify = SharedVerify()
    verify.install()
    per_verify = verify_cost_s()
    results: list[dict[str, Any]] = []
    for n in (int(x) for x in args.nodes.split(",")):
        replica_mb = replica_memory_bytes(n) / 1e6
        repair = repair_bytes(n)
        repair256 = repair_bytes(n, buckets=256)
        refresh = refresh_B_per_node_s(n, PRESETS[args.preset])
        for profile in args.profiles.split(","):
            if n > args.max_full:
                r: dict[str, Any] = {"nodes": n, "profile": profile, "run": "per-node parts"}
            else:
                t = time.perf_counter()
                r = asyncio.run(run_one(n, profile, args.preset, args.seed, args.idle,
                                        args.churn, args.loss, args.wait, verify))
                r["run"] = "full"
                r["real_s"] = round(time.perf_counter() - t, 1)
            r["replica_MB"] = replica_mb
            r["repair_one_session_bytes"] = repair
            r["repair_one_session_bytes_256_buckets"] = repair256
            r["refresh_B_per_node_s"] = refresh
            results.append(r)
            print(r, file=sys.stderr)
    notes = (
        f"Real GossipAgent/SWIM/Replica code on MemNet + FakeClock (1 ms timer resolution), "
        f"preset `{args.preset}`, windows: idle {args.idle:.0f} s, churn {args.churn:.0f} s, "
        f"1% loss {args.loss:.0f} s (virtual). Ed25519 verification is shared between "
        f"replicas; a real node pays {per_verify * 1e6:.0f} us per first-time item on top of "
        "the CPU column. Replica MB: one replica of N separately decoded signed records. "
        "`per-node parts`: N replicas do not fit this machine; only the replica memory and one "
        "anti-entropy repair were measured at that N (see JSON).")
    write_results(args.json, {"args": vars(args) | {"json": str(args.json)},
                              "verify_us": per_verify * 1e6, "rows": results},
                  "Control plane at scale (virtual time)", [flat_row(r) for r in results],
                  notes=notes)


if __name__ == "__main__":
    main()
