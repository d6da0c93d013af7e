"""The planner's topology from a live fabric's measured links (`plan net --from-fabric URL`).

Reads two views of one node (docs/http-api.md): `/v1/fabric/nodes` (each node's GPUs from its
record) and `/v1/fabric/links` (each node's link table, measured by probes over the peer
protocol; net/link_service.py). Builds one host per node that has GPUs:

    GPU `<host>-g<k>` --(ethernet at PCIe speed: the way to the node's NIC)-- host `<host>`
    GPU <-> GPU of one node: nvlink when the record says so (else through the host switch)
    host switch --(ethernet: the measured link; the slower throughput and longer RTT of the
                two sides' reports)-- host switch

with host = `n` + 16 characters of the node's peer id (`host_name`). The host switch carries no
aggregator slots (a node cannot aggregate in-network), so groups across nodes use the ring.
Node-to-node latency is half the measured RTT. A pair measured by neither side has no edge
(its traffic is routed over measured hops, or the planner reports the GPUs unreachable).
Everything fetched is validated (net/linkprobe.py) before use: the views are another
process's output.
"""

from __future__ import annotations

import json
import math
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from llmfabric.net.linkprobe import LinkEstimate, LinkTableError, parse_link_table
from llmfabric.sim.errors import SpecError
from llmfabric.sim.hardware import get_gpu
from llmfabric.sim.topology import Topology

NVLINK_GBS = 300.0  # GB/s between GPUs of one node with interconnect "nvlink"
PCIE_GBS = 25.0  # GB/s GPU <-> its node's NIC
INTRA_LATENCY_S = 2e-6
MAX_GPUS_PER_NODE = 64
MAX_RESPONSE_BYTES = 8 * 1024 * 1024


@dataclass(slots=True)
class FabricTopology:
    topology: Topology
    hosts: dict[str, str]  # host name -> peer id
    links: dict[tuple[str, str], LinkEstimate]  # (host a, host b) -> the edge's estimate
    skipped: list[str] = field(default_factory=list)  # why nodes or tables were left out
    # pairs only one side reported (a table holds 32 peers): taken as that side says
    one_sided: list[tuple[str, str]] = field(default_factory=list)


def host_name(peer_id: str) -> str:
    """A plan's name for a node: 16 characters of its peer id after the multihash prefix
    that every id shares ("zQm"), about 93 bits: 8 characters (5 of them free) let a member
    grind a key in CPU-hours whose name shadowed another node's GPUs and links, and collided
    by chance in 6% of 5,000-node fleets."""
    return "n" + peer_id[3:19]


def _gpus(node: dict[str, Any], assume: tuple[str, int] | None) -> tuple[str, int, bool] | None:
    """(GPU type, count, nvlink) from a node view, or `assume` for nodes without a known GPU."""
    raw = node.get("hardware")
    hw: dict[str, Any] = raw if isinstance(raw, dict) else {}
    model, count = hw.get("gpu_model"), hw.get("gpu_count")
    nvlink = hw.get("interconnect") == "nvlink"
    if isinstance(model, str) and isinstance(count, int) and 1 <= count <= MAX_GPUS_PER_NODE:
        try:
            return get_gpu(model).name, count, nvlink
        except (KeyError, ValueError, SpecError):
            pass
    if assume is not None:
        return assume[0], assume[1], nvlink
    return None


def build_topology(nodes_doc: Any, links_doc: Any, *,
                   assume_gpu: tuple[str, int] | None = None) -> FabricTopology:
    """The topology of the nodes in `nodes_doc` that have GPUs (or `assume_gpu`: type,
    count for nodes whose record names none, e.g. a CPU test fabric), joined by the links
    measured in `links_doc`."""
    if assume_gpu is not None:
        assume_gpu = (get_gpu(assume_gpu[0]).name, assume_gpu[1])
        if not 1 <= assume_gpu[1] <= MAX_GPUS_PER_NODE:
            raise SpecError(f"--assume-gpu count must be 1..{MAX_GPUS_PER_NODE}")
    if not isinstance(nodes_doc, dict) or not isinstance(nodes_doc.get("nodes"), list):
        raise SpecError('the nodes view must be {"nodes": [...]}')
    if not isinstance(links_doc, dict) or not isinstance(links_doc.get("nodes"), list):
        raise SpecError('the links view must be {"self": ..., "nodes": [...]}')
    topo = Topology()
    hosts: dict[str, str] = {}
    skipped: list[str] = []
    views = sorted((n for n in nodes_doc["nodes"] if isinstance(n, dict)
                    and isinstance(n.get("peer_id"), str) and n.get("state") != "LEFT"),
                   key=lambda n: str(n["peer_id"]))
    for node in views:
        peer = node["peer_id"]
        host = host_name(peer)
        if host in hosts:
            if hosts[host] != peer:
                skipped.append(f"{host}: the name of two peers ({hosts[host]}, {peer}); "
                               "the second is left out")
            continue  # (else another session of the same node)
        gpus = _gpus(node, assume_gpu)
        if gpus is None:
            skipped.append(f"{host}: no known GPU in its record")
            continue
        gpu_type, count, nvlink = gpus
        hosts[host] = peer
        topo.add_switch(host)
        ids = [f"{host}-g{k}" for k in range(count)]
        for gid in ids:
            topo.add_gpu(gid, gpu_type, host)
            # "ethernet" so that the baselines' Ethernet-only routes (--compare) exist too
            topo.add_edge(gid, host, "ethernet", gbs=PCIE_GBS, latency_s=INTRA_LATENCY_S)
        if nvlink:
            for a in range(count):
                for b in range(a + 1, count):
                    topo.add_edge(ids[a], ids[b], "nvlink", gbs=NVLINK_GBS,
                                  latency_s=INTRA_LATENCY_S)
    by_peer = {peer: host for host, peer in hosts.items()}
    reports: dict[tuple[str, ...], dict[str, LinkEstimate]] = {}  # pair -> side -> estimate
    for entry in links_doc["nodes"]:
        src = entry.get("peer") if isinstance(entry, dict) else None
        if not isinstance(src, str) or src not in by_peer:
            continue
        if "error" in entry:
            skipped.append(f"{by_peer[src]}: its link table: {str(entry['error'])[:100]}")
            continue
        try:
            table = parse_link_table(entry)
        except LinkTableError as exc:
            skipped.append(f"{by_peer[src]}: its link table is invalid: {exc}")
            continue
        for est in table:
            if est.peer not in by_peer or est.peer == src:
                continue
            pair = (by_peer[src], by_peer[est.peer])
            reports.setdefault(tuple(sorted(pair)), {})[pair[0]] = est  # (one per side)
    measured: dict[tuple[str, str], LinkEstimate] = {}
    one_sided: list[tuple[str, str]] = []
    for (x, y), sides in sorted(reports.items()):
        ests = list(sides.values())
        # Each side measures the link and may lie about it: the slower throughput and the
        # longer round trip of the two (a member claiming a fat link to an honest peer is
        # overruled when that peer measured it too).
        est = LinkEstimate(ests[0].peer, max(e.rtt_s for e in ests),
                           min(e.bytes_per_s for e in ests), sum(e.samples for e in ests),
                           min(e.measured_at for e in ests))
        if len(ests) == 1:
            one_sided.append((x, y))
        measured[(x, y)] = est
        topo.add_edge(x, y, "ethernet", bytes_per_s=est.bytes_per_s,
                      latency_s=est.rtt_s / 2)
    return FabricTopology(topo, hosts, measured, skipped, one_sided)


def _get(url: str, api_key: str | None, timeout: float) -> Any:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    req = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read(MAX_RESPONSE_BYTES + 1)
    if len(body) > MAX_RESPONSE_BYTES:
        raise SpecError(f"{url}: the answer is over {MAX_RESPONSE_BYTES} bytes")
    return json.loads(body)


def fetch_fabric(url: str, *, api_key: str | None = None, timeout: float = 30.0,
                 assume_gpu: tuple[str, int] | None = None) -> FabricTopology:
    """Read the nodes and links views of the node at `url` (its HTTP API, e.g.
    http://127.0.0.1:8090) and build the topology."""
    if not url.startswith(("http://", "https://")):
        raise SpecError(f"--from-fabric wants a node's HTTP URL, got {url!r}")
    base = url.rstrip("/")
    try:
        nodes = _get(base + "/v1/fabric/nodes", api_key, timeout)
        links = _get(base + "/v1/fabric/links", api_key, timeout)
    except (OSError, ValueError) as exc:
        raise SpecError(f"cannot read the fabric at {base}: {exc}") from None
    return build_topology(nodes, links, assume_gpu=assume_gpu)


def parse_assume_gpu(text: str) -> tuple[str, int]:
    """'A100-80GB' or 'A100-80GB:4' -> (type, count)."""
    gpu, _, count = text.partition(":")
    try:
        n = int(count) if count else 1
    except ValueError:
        raise SpecError(f"--assume-gpu {text!r}: give TYPE or TYPE:COUNT") from None
    if not 1 <= n <= MAX_GPUS_PER_NODE or not gpu:
        raise SpecError(f"--assume-gpu {text!r}: count must be 1..{MAX_GPUS_PER_NODE}")
    return gpu, n


def summary(ft: FabricTopology) -> list[dict[str, Any]]:
    """The measured edges, for printing: host pair, RTT ms, Gbit/s, how many sides reported."""
    one = set(ft.one_sided)
    return [{"a": a, "b": b, "rtt_ms": round(e.rtt_s * 1e3, 3),
             "gbps": round(e.bytes_per_s * 8 / 1e9, 3) if math.isfinite(e.bytes_per_s)
             else None, "samples": e.samples, "sides": 1 if (a, b) in one else 2}
            for (a, b), e in sorted(ft.links.items())]
