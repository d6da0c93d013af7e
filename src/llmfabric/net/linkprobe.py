"""Pairwise link measurement between peers: RTT and throughput estimates, a bounded table.

A probe of a peer sends `repeats` (default 3) pairs of requests over the existing peer
connection: a small one (its time is the round trip, RTT) then a large one of `large_bytes`
(its time minus the RTT is the serialization time), the pairs `pause_s` apart (jittered).
The fit is min-filtered, as in pathchar / pchar: queueing and scheduling stalls (a loaded
host, cross traffic, answers queued behind the peer's own probe of us) only ever add delay,
so the fastest request of each size is the least disturbed one. RTT = the minimum small
time; throughput = (large - small bytes) / (min large time - min small time). A stall then
moves nothing unless it hit every small (or every large) request of the probe, and the
pauses keep one burst of cross traffic from covering them all; a single timed pair (the
earlier design) read a 1 MB/s link as 1.7-3 MB/s when its small request was held up. A
median of per-pair fits would need a majority of clean pairs; the minima need one clean
request of each size. Minima that are degenerate (the fastest large no slower than the
fastest small: a link too fast to resolve) count the whole large time as serialization, a
lower bound on the throughput, as before. Estimates are smoothed (EWMA) per peer and kept in
a `LinkTable` of at most `max_entries` peers (the least recently measured goes first), so
what a node publishes stays small whatever the fabric's size.

The probing rate is bounded: every `interval_s` (jittered) at most `peers_per_round` peers
are probed, one after the other, so a node sends at most
peers_per_round x repeats x (small + large) / interval_s bytes per second for measurements
(defaults: 4 x 3 x (256 B + 80 KiB) / 60 s, about 16.4 KB/s). The large request is 80 KiB,
not the 256 KiB of a single pair, to keep that budget at the former ~17 KB/s; 80 KiB still
takes 80 ms at 1 MB/s and 4 ms at the ~20 MB/s of Python TLS, far above the RTT's noise.

Tables received from other nodes are hostile input: `parse_link_table` accepts only the
documented shape, finite values within physical bounds, well-formed peer ids and at most
`MAX_LINKS` entries, and raises `LinkTableError` otherwise.

The prober takes the clock and the probe as parameters (`ProbeFn`), so its protocol runs on
virtual time in tests; the real probe over the TLS transport is in net/link_service.py.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from llmfabric.clock import Clock
from llmfabric.net.errors import NetError
from llmfabric.untrusted import get_logger, log_due

log = get_logger(__name__)

MAX_LINKS = 32  # entries in one table (published or received)
MIN_RTT_S, MAX_RTT_S = 0.0, 60.0
MIN_BYTES_PER_S, MAX_BYTES_PER_S = 1e3, 1e13  # 1 kB/s .. 10 TB/s (80 Tbit/s)
MAX_SAMPLES = 1_000_000
_PEER_ID = re.compile(r"[A-Za-z0-9_\-]{1,128}")

# Sends `n` bytes to `peer` and waits for its (small) answer; raises on failure.
ProbeFn = Callable[[str, int], Awaitable[None]]
# What a probe of an unreachable or slow peer raises (anything else is logged with a traceback).
_UNREACHABLE = (NetError, OSError, TimeoutError)


class LinkTableError(ValueError):
    """A link table (from a peer or a fabric endpoint) is malformed or out of bounds."""


@dataclass(frozen=True, slots=True)
class LinkEstimate:
    peer: str  # the measured peer's id
    rtt_s: float  # round trip of a small request
    bytes_per_s: float  # throughput of a large request (payload bytes / s)
    samples: int  # probes folded into the estimate
    measured_at: float  # wall-clock time of the last probe (publisher's clock)

    def to_json(self) -> dict[str, Any]:
        return {
            "peer": self.peer,
            "rtt_s": self.rtt_s,
            "bytes_per_s": self.bytes_per_s,
            "samples": self.samples,
            "measured_at": self.measured_at,
        }


def _finite(doc: dict[str, Any], key: str, lo: float, hi: float) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LinkTableError(f"link {key} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out) or not lo <= out <= hi:
        raise LinkTableError(f"link {key} = {value!r} is outside [{lo:g}, {hi:g}]")
    return out


def parse_link(doc: Any) -> LinkEstimate:
    if not isinstance(doc, dict):
        raise LinkTableError("a link must be an object")
    peer = doc.get("peer")
    if not isinstance(peer, str) or not _PEER_ID.fullmatch(peer):
        raise LinkTableError(f"link peer {str(peer)[:40]!r} is not a peer id")
    samples = doc.get("samples", 1)
    if (
        isinstance(samples, bool)
        or not isinstance(samples, int)
        or not (1 <= samples <= MAX_SAMPLES)
    ):
        raise LinkTableError(f"link samples {samples!r} must be an integer in 1..{MAX_SAMPLES}")
    return LinkEstimate(
        peer,
        _finite(doc, "rtt_s", MIN_RTT_S, MAX_RTT_S),
        _finite(doc, "bytes_per_s", MIN_BYTES_PER_S, MAX_BYTES_PER_S),
        samples,
        _finite(doc, "measured_at", 0.0, 1e11),
    )


def parse_link_table(doc: Any) -> list[LinkEstimate]:
    """A received table `{"links": [...]}` -> estimates; one entry per peer, <= MAX_LINKS."""
    if not isinstance(doc, dict) or not isinstance(doc.get("links"), list):
        raise LinkTableError('a link table must be an object {"links": [...]}')
    links = doc["links"]
    if len(links) > MAX_LINKS:
        raise LinkTableError(f"a link table holds at most {MAX_LINKS} links, got {len(links)}")
    out = [parse_link(item) for item in links]
    if len({e.peer for e in out}) != len(out):
        raise LinkTableError("a link table names a peer twice")
    return out


def fit_link(
    small_s: Sequence[float], large_s: Sequence[float], small_bytes: int, large_bytes: int
) -> tuple[float, float]:
    """(RTT s, throughput bytes/s) from the times of a probe's small and large requests,
    min-filtered (see the module docstring): stalls only add delay, so each size's fastest
    request is its least disturbed one."""
    if not small_s or not large_s or not 0 < small_bytes < large_bytes:
        raise ValueError("fit_link needs times of both sizes and 0 < small < large bytes")
    rtt, large = min(small_s), min(large_s)
    # Degenerate minima (the link is too fast for the large request to resolve): count the
    # whole large time as serialization, a lower bound on the throughput.
    serialize = large - rtt if large > rtt else large
    return rtt, (large_bytes - small_bytes) / max(serialize, 1e-9)


class LinkTable:
    """This node's estimates, smoothed per peer (EWMA with weight `alpha` on the new
    sample), at most `max_entries` peers (the least recently measured is dropped)."""

    def __init__(self, *, max_entries: int = MAX_LINKS, alpha: float = 0.3) -> None:
        if not 1 <= max_entries <= MAX_LINKS or not 0 < alpha <= 1:
            raise ValueError(f"max_entries in 1..{MAX_LINKS} and alpha in (0, 1]")
        self.max_entries = max_entries
        self.alpha = alpha
        self._links: dict[str, LinkEstimate] = {}

    def update(self, peer: str, rtt_s: float, bytes_per_s: float, at: float) -> LinkEstimate:
        rtt_s = min(max(rtt_s, MIN_RTT_S), MAX_RTT_S)
        bytes_per_s = min(max(bytes_per_s, MIN_BYTES_PER_S), MAX_BYTES_PER_S)
        old = self._links.pop(peer, None)
        if old is not None:
            a = self.alpha
            rtt_s = a * rtt_s + (1 - a) * old.rtt_s
            bytes_per_s = a * bytes_per_s + (1 - a) * old.bytes_per_s
        est = LinkEstimate(
            peer, rtt_s, bytes_per_s, min(MAX_SAMPLES, (old.samples if old else 0) + 1), at
        )
        self._links[peer] = est  # re-inserted: dict order = least recently measured first
        while len(self._links) > self.max_entries:
            del self._links[next(iter(self._links))]
        return est

    def forget(self, keep: Iterable[str]) -> None:
        """Drop peers no longer in the fabric."""
        live = set(keep)
        for peer in [p for p in self._links if p not in live]:
            del self._links[peer]

    def get(self, peer: str) -> LinkEstimate | None:
        return self._links.get(peer)

    def entries(self) -> list[LinkEstimate]:
        return sorted(self._links.values(), key=lambda e: e.peer)

    def to_json(self) -> dict[str, Any]:
        return {"links": [e.to_json() for e in self.entries()]}

    def __len__(self) -> int:
        return len(self._links)


class LinkProber:
    """Measures links to the peers that `peers()` lists, a few per round, forever (`run`).

    Each round probes the `peers_per_round` peers measured longest ago (never-measured
    first); a failed probe is counted, logged at the 1st, 2nd, 4th... failure, and the peer
    is tried again in a later round."""

    def __init__(
        self,
        clock: Clock,
        probe: ProbeFn,
        peers: Callable[[], list[str]],
        table: LinkTable,
        *,
        interval_s: float = 60.0,
        peers_per_round: int = 4,
        small_bytes: int = 256,
        large_bytes: int = 80 * 1024,
        repeats: int = 3,
        pause_s: float = 0.5,
        wall: Callable[[], float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if (
            interval_s <= 0
            or peers_per_round < 1
            or not 0 < small_bytes < large_bytes
            or repeats < 1
            or not pause_s >= 0
        ):
            raise ValueError(
                "interval_s > 0, peers_per_round >= 1, 0 < small < large bytes, repeats >= 1, "
                "pause_s >= 0"
            )
        self.clock = clock
        self.probe = probe
        self.peers = peers
        self.table = table
        self.interval_s = interval_s
        self.peers_per_round = peers_per_round
        self.small_bytes = small_bytes
        self.large_bytes = large_bytes
        self.repeats = repeats
        self.pause_s = pause_s
        self.wall = wall or clock.wall
        self.rng = rng or random.Random()
        self.failures = 0  # probes that failed (each peer is tried again later)
        # Rounds that raised (a bug: logged, the next round runs), by kind as node metrics
        # export background failures (llmfabric_node_task_failures{task="links-round"}).
        self.errors: dict[str, int] = {"round": 0}
        self.probes = 0
        self._last_tried: dict[str, float] = {}

    async def measure(self, peer: str) -> LinkEstimate:
        """One probe of `peer`: `repeats` pairs of a small then a large request, timed on the
        clock, `pause_s` x U(0.5, 1.5) apart (jittered: periodic cross traffic cannot
        phase-lock with the pairs), fitted by `fit_link`."""
        small_s: list[float] = []
        large_s: list[float] = []
        for i in range(self.repeats):
            if i:
                await self.clock.sleep(self.pause_s * self.rng.uniform(0.5, 1.5))
            t0 = self.clock.now()
            await self.probe(peer, self.small_bytes)
            t1 = self.clock.now()
            await self.probe(peer, self.large_bytes)
            t2 = self.clock.now()
            small_s.append(t1 - t0)
            large_s.append(t2 - t1)
        rtt, bw = fit_link(small_s, large_s, self.small_bytes, self.large_bytes)
        self.probes += 1
        return self.table.update(peer, rtt, bw, self.wall())

    def due(self) -> list[str]:
        """The peers of the next round: least recently tried first, ties in random order."""
        peers = list(dict.fromkeys(self.peers()))
        self.table.forget(peers)
        for gone in [p for p in self._last_tried if p not in set(peers)]:
            del self._last_tried[gone]
        self.rng.shuffle(peers)
        peers.sort(key=lambda p: self._last_tried.get(p, -math.inf))
        return peers[: self.peers_per_round]

    async def round(self) -> int:
        """Probe one round of peers; returns how many were measured."""
        measured = 0
        for peer in self.due():
            self._last_tried[peer] = self.clock.now()
            try:
                await self.measure(peer)
                measured += 1
            except Exception as exc:  # unreachable, refused, timed out: try again later
                self.failures += 1
                if log_due(self.failures):  # (peers come and go: no line for each)
                    log.warning("link probe of %s failed: %r; %d failure(s) so far", peer, exc,
                                self.failures, exc_info=not isinstance(exc, _UNREACHABLE))
        return measured

    async def run(self, first_delay_s: float | None = None) -> None:
        delay = (
            self.interval_s * self.rng.uniform(0.1, 0.5) if first_delay_s is None else first_delay_s
        )
        while True:
            await self.clock.sleep(delay)
            try:
                await self.round()
            except Exception:  # (a bug: the probes go on, seen)
                n = self.errors["round"] = self.errors["round"] + 1
                if log_due(n):
                    log.exception("link probe round failed; %d failure(s) so far", n)
            delay = self.interval_s * self.rng.uniform(0.75, 1.25)
