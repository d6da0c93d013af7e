"""Network topology graph: GPUs and switches joined by NVLink/PCIe/Ethernet/WAN edges.

A `Topology` is an undirected graph (every edge is full duplex: `capacity` bytes/s each way,
`latency_s` per traversal). Nodes are GPUs (id, GPU type, host) or switches (id, aggregator
slots for in-network aggregation). Node ids are ints or strings.

Paths between GPUs:
- `shortest_paths(n_bytes)`: Dijkstra on the store-and-forward time of an `n_bytes` message,
  sum over edges of latency + n_bytes / capacity (HeroServe Alg. 2: "per-byte time + hop
  latency"); `n_bytes=0` gives the lowest-latency paths.
- `widest_paths()`: the path with the largest bottleneck capacity (ties: lowest latency).
- `pair_link(i, j)` folds a path into one alpha-beta `Link`: alpha = the path's latency,
  beta = its bottleneck capacity (cut-through, the default) or 1 / sum(1 / B_e)
  (store-and-forward).
- `bandwidth_matrix()`: beta of `pair_link` for every GPU pair, in `gpus()` order (the
  diagonal is +inf: a GPU does not send to itself over the network).

Generators: `fat_tree_tracks` (HeroServe's "tracks": servers with NVLink inside, one NIC per
GPU on access switch `k mod tracks`, access switches under core switches) and
`cloud_instances` (ThunderServe: instances of a few GPUs on a PCIe host switch, a seeded
log-uniform bandwidth between every pair of instances). `from_yaml`/`to_yaml` round-trip.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt
import yaml

from llmfabric.sim.errors import SpecError
from llmfabric.sim.hardware import get_gpu
from llmfabric.sim.parallel import Link
from llmfabric.yamlfile import YAMLFileError, read_yaml, unknown_key

MAX_AGGREGATOR_SLOTS = 1_000_000

NodeId = int | str
EdgeKind = Literal["nvlink", "pcie", "ethernet", "wan"]
EDGE_KINDS: tuple[str, ...] = ("nvlink", "pcie", "ethernet", "wan")


@dataclass(frozen=True, slots=True)
class GPUNode:
    id: NodeId
    gpu_type: str
    host: str


@dataclass(frozen=True, slots=True)
class SwitchNode:
    id: NodeId
    aggregator_slots: int = 0


@dataclass(frozen=True, slots=True)
class Edge:
    a: NodeId
    b: NodeId
    kind: EdgeKind
    capacity: float  # bytes/s, each direction
    latency_s: float

    def other(self, node: NodeId) -> NodeId:
        return self.b if node == self.a else self.a


@dataclass(frozen=True, slots=True)
class Route:
    """One path between two nodes and what it costs."""

    nodes: tuple[NodeId, ...]
    latency_s: float  # sum of edge latencies
    bottleneck: float  # smallest edge capacity on the path, bytes/s
    inverse_bw_sum: float  # sum of 1 / capacity over the edges, s/byte

    @property
    def hops(self) -> int:
        return len(self.nodes) - 1

    def time(self, n_bytes: float, store_and_forward: bool = False) -> float:
        """Seconds to move `n_bytes` along the path (cut-through: the bottleneck decides)."""
        if store_and_forward:
            return self.latency_s + n_bytes * self.inverse_bw_sum
        return self.latency_s + n_bytes / self.bottleneck

    def link(self, store_and_forward: bool = False) -> Link:
        beta = 1.0 / self.inverse_bw_sum if store_and_forward else self.bottleneck
        return Link(beta, self.latency_s)


def _bandwidth(gbps: float | None, gbs: float | None, bytes_per_s: float | None) -> float:
    given = [(v, f) for v, f in ((gbps, 1e9 / 8), (gbs, 1e9), (bytes_per_s, 1.0))
             if v is not None]
    if len(given) != 1:
        raise SpecError("give an edge's capacity exactly once: gbps, gbs or bytes_per_s")
    value, factor = given[0]
    if not value > 0 or not math.isfinite(value):
        raise SpecError(f"an edge needs a finite capacity > 0, got {value!r}")
    return float(value) * factor


class Topology:
    """GPUs, switches and full-duplex edges. Build with `add_gpu`, `add_switch`, `add_edge`
    (or a generator / `from_yaml`), then ask for paths and links."""

    def __init__(self, nodes: Iterable[GPUNode | SwitchNode] = (),
                 edges: Iterable[Edge] = ()) -> None:
        self._gpus: dict[NodeId, GPUNode] = {}
        self._switches: dict[NodeId, SwitchNode] = {}
        self._adj: dict[NodeId, list[Edge]] = {}
        self._edges: list[Edge] = []
        self._cache: dict[tuple[str, float], dict[tuple[NodeId, NodeId], Route]] = {}
        for node in nodes:
            if isinstance(node, GPUNode):
                self.add_gpu(node.id, node.gpu_type, node.host)
            else:
                self.add_switch(node.id, node.aggregator_slots)
        for e in edges:
            self.add_edge(e.a, e.b, e.kind, bytes_per_s=e.capacity, latency_s=e.latency_s)

    # --- building ---------------------------------------------------------------------
    def _add_node(self, node_id: NodeId) -> None:
        if not isinstance(node_id, (int, str)) or isinstance(node_id, bool):
            raise SpecError(f"node ids are ints or strings, got {node_id!r}")
        if node_id in self._adj:
            raise SpecError(f"node {node_id!r} already exists")
        self._adj[node_id] = []
        self._cache.clear()

    def add_gpu(self, node_id: NodeId, gpu_type: str, host: str) -> GPUNode:
        self._add_node(node_id)
        node = GPUNode(node_id, str(gpu_type), str(host))
        self._gpus[node_id] = node
        return node

    def add_switch(self, node_id: NodeId, aggregator_slots: int = 0) -> SwitchNode:
        # (10**100 was taken and printed as "INA at sw (1000...0 slots)": a switch holds
        # thousands of aggregators, not more than MAX_AGGREGATOR_SLOTS)
        if not 0 <= aggregator_slots <= MAX_AGGREGATOR_SLOTS:
            raise SpecError(f"aggregator_slots must be in 0..{MAX_AGGREGATOR_SLOTS}")
        self._add_node(node_id)
        node = SwitchNode(node_id, int(aggregator_slots))
        self._switches[node_id] = node
        return node

    def add_edge(self, a: NodeId, b: NodeId, kind: str, *, gbps: float | None = None,
                 gbs: float | None = None, bytes_per_s: float | None = None,
                 latency_s: float = 0.0) -> Edge:
        """Join `a` and `b`; capacity in Gbit/s (`gbps`), GB/s (`gbs`) or bytes/s."""
        for n in (a, b):
            if n not in self._adj:
                raise SpecError(f"edge endpoint {n!r} is not a node; add it first")
        if a == b:
            raise SpecError(f"edge from {a!r} to itself")
        if kind not in EDGE_KINDS:
            raise SpecError(f"edge kind {kind!r}; choose one of {EDGE_KINDS}")
        if not latency_s >= 0 or not math.isfinite(latency_s):
            raise SpecError("an edge needs a finite latency >= 0 s")
        edge = Edge(a, b, cast(EdgeKind, kind), _bandwidth(gbps, gbs, bytes_per_s),
                    float(latency_s))
        self._adj[a].append(edge)
        self._adj[b].append(edge)
        self._edges.append(edge)
        self._cache.clear()
        return edge

    # --- views ------------------------------------------------------------------------
    def gpus(self) -> list[NodeId]:
        """GPU ids in insertion order (the row order of `bandwidth_matrix`)."""
        return list(self._gpus)

    def switches(self) -> list[NodeId]:
        return list(self._switches)

    def gpu(self, node_id: NodeId) -> GPUNode:
        try:
            return self._gpus[node_id]
        except KeyError:
            raise SpecError(f"no GPU {node_id!r} in the topology") from None

    def switch(self, node_id: NodeId) -> SwitchNode:
        try:
            return self._switches[node_id]
        except KeyError:
            raise SpecError(f"no switch {node_id!r} in the topology") from None

    @property
    def edges(self) -> tuple[Edge, ...]:
        return tuple(self._edges)

    def neighbours(self, node_id: NodeId) -> list[Edge]:
        return list(self._adj[node_id])

    def hosts(self) -> dict[str, list[NodeId]]:
        out: dict[str, list[NodeId]] = {}
        for g in self._gpus.values():
            out.setdefault(g.host, []).append(g.id)
        return out

    # --- paths ------------------------------------------------------------------------
    def dijkstra(self, src: NodeId, n_bytes: float, *,
                 allow: Callable[[NodeId, Edge, NodeId], bool] | None = None,
                 order: Mapping[NodeId, int] | None = None, slack: float = 1e-18,
                 ) -> dict[NodeId, tuple[float, NodeId | None, Edge | None]]:
        """Fastest routes of an `n_bytes` message from `src` (sum over edges of latency +
        n_bytes / capacity): {node: (time, previous node, edge from it)}, `src` itself as
        (0, None, None). `allow(u, e, v)` filters the steps (None: every edge); equal times
        pop in `order` (default: the order nodes were added), and a label is replaced only
        by one better by more than `slack`, so equal-cost routes resolve deterministically."""
        best: dict[NodeId, tuple[float, NodeId | None, Edge | None]] = {src: (0.0, None, None)}
        if order is None:
            order = {n: k for k, n in enumerate(self._adj)}
        heap: list[tuple[float, int, NodeId]] = [(0.0, 0, src)]
        done: set[NodeId] = set()
        while heap:
            d, _, u = heapq.heappop(heap)
            if u in done:
                continue
            done.add(u)
            for e in self._adj[u]:
                v = e.other(u)
                if allow is not None and not allow(u, e, v):
                    continue
                nd = d + e.latency_s + n_bytes / e.capacity
                if v not in best or nd < best[v][0] - slack:
                    best[v] = (nd, u, e)
                    heapq.heappush(heap, (nd, order[v], v))
        return best

    def _widest(self, src: NodeId) -> dict[NodeId, tuple[float, float, NodeId | None,
                                                        Edge | None]]:
        # label = (bottleneck, latency); better = larger bottleneck, then smaller latency
        best: dict[NodeId, tuple[float, float, NodeId | None, Edge | None]] = {
            src: (math.inf, 0.0, None, None)}
        order = {n: k for k, n in enumerate(self._adj)}
        heap: list[tuple[float, float, int, NodeId]] = [(-math.inf, 0.0, 0, src)]
        done: set[NodeId] = set()
        while heap:
            nb, lat, _, u = heapq.heappop(heap)
            if u in done:
                continue
            done.add(u)
            for e in self._adj[u]:
                v = e.other(u)
                bw = min(-nb, e.capacity)
                nl = lat + e.latency_s
                cur = best.get(v)
                if cur is None or bw > cur[0] or (bw == cur[0] and nl < cur[1] - 1e-18):
                    best[v] = (bw, nl, u, e)
                    heapq.heappush(heap, (-bw, nl, order[v], v))
        return best

    @staticmethod
    def _route(dst: NodeId, prev: dict[NodeId, tuple[NodeId | None, Edge | None]]) -> Route:
        nodes = [dst]
        lat = inv = 0.0
        bott = math.inf
        cur = dst
        while True:
            p, e = prev[cur]
            if p is None or e is None:
                break
            lat += e.latency_s
            inv += 1.0 / e.capacity
            bott = min(bott, e.capacity)
            nodes.append(p)
            cur = p
        return Route(tuple(reversed(nodes)), lat, bott, inv)

    def _all_pairs(self, mode: str, n_bytes: float) -> dict[tuple[NodeId, NodeId], Route]:
        key = (mode, float(n_bytes))
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        out: dict[tuple[NodeId, NodeId], Route] = {}
        for src in self._gpus:
            prev: dict[NodeId, tuple[NodeId | None, Edge | None]]
            if mode == "shortest":
                res = self.dijkstra(src, n_bytes)
                prev = {n: (p, e) for n, (_, p, e) in res.items()}
            else:
                wres = self._widest(src)
                prev = {n: (p, e) for n, (_, _, p, e) in wres.items()}
            for dst in self._gpus:
                if dst != src and dst in prev:
                    out[(src, dst)] = self._route(dst, prev)
        self._cache[key] = out
        return out

    def shortest_paths(self, n_bytes: float = 1.0) -> dict[tuple[NodeId, NodeId], Route]:
        """Fastest route of an `n_bytes` message for every ordered pair of connected GPUs
        (Dijkstra on sum of latency + n_bytes / capacity). GPUs may forward (NVLink to a
        peer whose NIC sits on the right switch, as HeroServe's NVLink forwarding does)."""
        if n_bytes < 0:
            raise SpecError("n_bytes must be >= 0")
        return self._all_pairs("shortest", n_bytes)

    def widest_paths(self) -> dict[tuple[NodeId, NodeId], Route]:
        """Largest-bottleneck route for every ordered pair of connected GPUs (ties: latency)."""
        return self._all_pairs("widest", 0.0)

    def path(self, a: NodeId, b: NodeId, n_bytes: float = 1.0, *,
             widest: bool = False) -> Route:
        """The route `shortest_paths(n_bytes)` (or `widest_paths()`) takes from GPU a to b."""
        self.gpu(a)
        self.gpu(b)
        if a == b:
            return Route((a,), 0.0, math.inf, 0.0)
        table = self.widest_paths() if widest else self.shortest_paths(n_bytes)
        route = table.get((a, b))
        if route is None:
            raise SpecError(f"no path from {a!r} to {b!r}: the topology is disconnected")
        return route

    def pair_link(self, i: NodeId, j: NodeId, *, n_bytes: float = 1 << 20,
                  widest: bool = False, store_and_forward: bool = False) -> Link:
        """One alpha-beta Link for GPU i -> j over the path `path(i, j, n_bytes)` takes
        (default: the fastest route of a 1 MiB message; `widest=True`: the widest route)."""
        if i == j:
            raise SpecError(f"pair_link({i!r}, {j!r}): a GPU has no network link to itself")
        return self.path(i, j, n_bytes, widest=widest).link(store_and_forward)

    def bandwidth_matrix(self, *, n_bytes: float = 1 << 20, widest: bool = False,
                         store_and_forward: bool = False) -> npt.NDArray[np.float64]:
        """bytes/s of `pair_link` for every GPU pair, rows/columns in `gpus()` order; the
        diagonal is +inf; disconnected pairs are 0."""
        ids = self.gpus()
        table = self.widest_paths() if widest else self.shortest_paths(n_bytes)
        out = np.zeros((len(ids), len(ids)))
        for r, a in enumerate(ids):
            for c, b in enumerate(ids):
                if a == b:
                    out[r, c] = math.inf
                elif (a, b) in table:
                    out[r, c] = table[(a, b)].link(store_and_forward).bandwidth
        return out

    def latency_matrix(self, *, n_bytes: float = 1 << 20,
                       widest: bool = False) -> npt.NDArray[np.float64]:
        """Path latency (alpha, s) for every GPU pair in `gpus()` order; diagonal 0,
        disconnected pairs +inf."""
        ids = self.gpus()
        table = self.widest_paths() if widest else self.shortest_paths(n_bytes)
        out = np.full((len(ids), len(ids)), math.inf)
        for r, a in enumerate(ids):
            out[r, r] = 0.0
            for c, b in enumerate(ids):
                if (a, b) in table:
                    out[r, c] = table[(a, b)].latency_s
        return out

    # --- YAML -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": [{"id": g.id, "type": g.gpu_type, "host": g.host}
                     for g in self._gpus.values()],
            "switches": [{"id": s.id, "aggregator_slots": s.aggregator_slots}
                         for s in self._switches.values()],
            "edges": [{"a": e.a, "b": e.b, "kind": e.kind, "bytes_per_s": e.capacity,
                       "latency_s": e.latency_s} for e in self._edges],
        }

    @classmethod
    def from_dict(cls, doc: Any) -> Topology:
        if not isinstance(doc, dict):
            raise SpecError("a topology document is a mapping with gpus, switches, edges")
        # Unknown keys are refused: a typo (`latency_ms: 5`, `gpbs: 100`) was ignored, and the
        # edge taken with no latency or the default of a field.
        _known(doc, ("gpus", "switches", "edges"), "topology")
        topo = cls()
        for k, g in enumerate(_entries(doc, "gpus")):
            with _entry_errors("gpus", k):
                topo.add_gpu(g["id"], str(g["type"]), str(g.get("host", g["id"])))
        for k, s in enumerate(_entries(doc, "switches")):
            with _entry_errors("switches", k):
                topo.add_switch(s["id"], int(s.get("aggregator_slots", 0)))
        for k, e in enumerate(_entries(doc, "edges")):
            with _entry_errors("edges", k):
                lat = float(e.get("latency_s", 0.0)) + float(e.get("latency_us", 0.0)) * 1e-6
                topo.add_edge(e["a"], e["b"], str(e["kind"]), gbps=_opt(e, "gbps"),
                              gbs=_opt(e, "gbs"), bytes_per_s=_opt(e, "bytes_per_s"),
                              latency_s=lat)
        return topo

    @classmethod
    def from_yaml(cls, path: str | Path) -> Topology:
        """Read `gpus: [{id, type, host}]`, `switches: [{id, aggregator_slots}]`,
        `edges: [{a, b, kind, gbps | gbs | bytes_per_s, latency_s | latency_us}]`."""
        try:
            doc = read_yaml(path)
        except YAMLFileError as exc:  # (binary file, syntax error, alias bomb: one line)
            raise SpecError(str(exc)) from None
        return cls.from_dict(doc)

    def to_yaml(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


_ENTRY_KEYS = {"gpus": ("id", "type", "host"), "switches": ("id", "aggregator_slots"),
               "edges": ("a", "b", "kind", "gbps", "gbs", "bytes_per_s", "latency_s",
                         "latency_us")}


def _known(doc: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    if (unknown := unknown_key(doc, keys)) is not None:
        raise SpecError(f"{where}: unknown key {unknown!r} (the keys: {', '.join(keys)})")


def _entries(doc: dict[str, Any], section: str) -> list[dict[str, Any]]:
    """The list under `section` (absent: none), every entry a mapping of known keys."""
    entries = doc.get(section) or []
    if not isinstance(entries, list):
        raise SpecError(f"topology {section} must be a list of mappings, got {entries!r:.60}")
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise SpecError(f"topology {section}[{k}] must be a mapping, got {entry!r:.60}")
        _known(entry, _ENTRY_KEYS[section], f"topology {section}[{k}]")
    return entries


@contextmanager
def _entry_errors(section: str, k: int) -> Iterator[None]:
    """Name entry `k` of `section` in any error of building it (missing key, bad value)."""
    try:
        yield
    except SpecError as exc:
        raise SpecError(f"topology {section}[{k}]: {exc}") from None
    except KeyError as exc:
        raise SpecError(f"topology {section}[{k}] lacks the key {exc}") from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise SpecError(f"topology {section}[{k}]: {exc}") from None


def _opt(entry: dict[str, Any], key: str) -> float | None:
    v = entry.get(key)
    return None if v is None else float(v)


def fat_tree_tracks(servers: int = 4, gpus_per_server: int = 4, tracks: int = 2, *,
                    nic_gbps: float = 100.0, nvlink_gbs: float = 300.0, core: int = 1,
                    core_gbps: float | None = None,
                    gpu_types: str | Sequence[str] = "A100-40GB",
                    nvlink_latency_s: float = 2e-6, hop_latency_s: float = 1e-6,
                    aggregator_slots: int = 0) -> Topology:
    """HeroServe's testbed shape: `servers` NVLink servers (all-to-all NVLink inside, `gpu{n}`
    ids, host `server{s}`), GPU k's NIC (`nic_gbps`) on access switch `access{k mod tracks}`,
    every access switch linked to every core switch (`core{c}`, `core_gbps`, default
    nic_gbps x gpus per access switch / core, so the core is not oversubscribed).
    `gpu_types`: one type, or one per server (e.g. 2 x A100 + 2 x V100 servers)."""
    if min(servers, gpus_per_server, tracks) < 1 or core < 0:
        raise SpecError("fat_tree_tracks needs servers, gpus_per_server, tracks >= 1, core >= 0")
    types = [gpu_types] * servers if isinstance(gpu_types, str) else list(gpu_types)
    if len(types) != servers:
        raise SpecError("give one GPU type, or one per server")
    topo = Topology()
    for t in range(tracks):
        topo.add_switch(f"access{t}", aggregator_slots)
    for c in range(core):
        topo.add_switch(f"core{c}", aggregator_slots)
    n = 0
    for s in range(servers):
        gpu_name = get_gpu(types[s]).name
        ids = []
        for k in range(gpus_per_server):
            gid = f"gpu{n}"
            n += 1
            topo.add_gpu(gid, gpu_name, f"server{s}")
            topo.add_edge(gid, f"access{k % tracks}", "ethernet", gbps=nic_gbps,
                          latency_s=hop_latency_s)
            ids.append(gid)
        for a in range(len(ids)):
            for b in range(a + 1, len(ids)):
                topo.add_edge(ids[a], ids[b], "nvlink", gbs=nvlink_gbs,
                              latency_s=nvlink_latency_s)
    if core:
        per_access = math.ceil(servers * gpus_per_server / tracks)
        up = core_gbps if core_gbps is not None else nic_gbps * per_access / core
        for t in range(tracks):
            for c in range(core):
                topo.add_edge(f"access{t}", f"core{c}", "ethernet", gbps=up,
                              latency_s=hop_latency_s)
    return topo


def cloud_instances(instances: Iterable[tuple[str, int]],
                    inter_gbps: tuple[float, float] = (5.0, 40.0), seed: int = 0, *,
                    efficiency: float = 0.6, intra_gbs: float = 10.0,
                    intra_latency_s: float = 5e-6,
                    inter_latency_s: float = 1e-3) -> Topology:
    """ThunderServe's cloud: one instance per (GPU type, count), GPU ids 0.. in order, host
    `inst{k}`; inside an instance every GPU hangs off a PCIe host switch `sw{k}` at
    `intra_gbs` GB/s (effective); between every pair of instances one WAN edge of
    log-uniform(inter_gbps) Gbit/s x `efficiency` (seeded)."""
    spec = list(instances)
    lo, hi = inter_gbps
    if not spec or not 0 < lo <= hi or not 0 < efficiency <= 1:
        raise SpecError("cloud_instances needs instances, 0 < lo <= hi Gbps and an "
                        "efficiency in (0, 1]")
    rng = np.random.default_rng(seed)
    topo = Topology()
    gid = 0
    for k, (gpu_type, count) in enumerate(spec):
        if count < 1:
            raise SpecError("an instance needs >= 1 GPU")
        name = get_gpu(gpu_type).name
        topo.add_switch(f"sw{k}")
        for _ in range(count):
            topo.add_gpu(gid, name, f"inst{k}")
            topo.add_edge(gid, f"sw{k}", "pcie", gbs=intra_gbs, latency_s=intra_latency_s)
            gid += 1
    for a in range(len(spec)):
        for b in range(a + 1, len(spec)):
            gbps = math.exp(rng.uniform(math.log(lo), math.log(hi))) * efficiency
            topo.add_edge(f"sw{a}", f"sw{b}", "wan", gbps=gbps, latency_s=inter_latency_s)
    return topo
