"""Link measurements on the peer protocol, over a TlsTransport (linkprobe.py holds the logic).

  POST /_fabric/v1/link-probe   a probe: the body (<= MAX_PROBE_BYTES) is read and dropped,
                                answered 204 (the prober times it)
  GET  /_fabric/v1/links        this node's link table {"peer": id, "links": [...]}
  GET  /v1/fabric/links         (node HTTP API) this node's table and every live peer's,
                                fetched on request over the peer protocol and validated:
                                the measured matrix `llmfabric plan net --from-fabric` reads

Tables are exchanged on request rather than gossiped in the records: they change with every
probe and only a planner needs them, so the records (and every replica) stay small.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import orjson

from llmfabric.clock import Clock, with_timeout
from llmfabric.net import HandlerResponse, NetError, PeerRequest, TlsTransport
from llmfabric.net.errors import BodyTooLarge
from llmfabric.net.linkprobe import (
    LinkProber,
    LinkTable,
    LinkTableError,
    parse_link_table,
)

PROBE_PATH = "/_fabric/v1/link-probe"
LINKS_PATH = "/_fabric/v1/links"
MAX_PROBE_BYTES = 1024 * 1024
MAX_TABLE_BYTES = 64 * 1024  # a peer's answer; MAX_LINKS entries need ~5 KB
MAX_FABRIC_PEERS = 128  # peers asked for their tables per /v1/fabric/links request
PROBE_TIMEOUT_S = 10.0
PROBE_ANSWER_LIMIT = 4096  # the answer is a 204: a larger one is not read on
FETCH_TIMEOUT_S = 5.0
# A fabric view is reused this long, and concurrent requests share one collection: an HTTP
# caller cannot turn requests into a storm of peer requests.
FABRIC_VIEW_TTL_S = 5.0
_JSON = (("content-type", "application/json"),)


def _error(status: int, message: str) -> HandlerResponse:
    return HandlerResponse(status, _JSON, orjson.dumps({"error": {"message": message}}))


class LinkService:
    """Probes peers (`run`), answers probes and table requests, assembles the fabric view."""

    def __init__(self, transport: TlsTransport, clock: Clock, peers: Callable[[], list[str]],
                 *, probe_targets: Callable[[], list[str]] | None = None,
                 interval_s: float = 60.0, rng: random.Random | None = None) -> None:
        """`peers`: whose tables the fabric view collects; `probe_targets` (default: the
        same): whom to probe (the node leaves out peers reached only through relays, so
        probes do not load relays)."""
        self.transport = transport
        self.clock = clock
        self.peers = peers
        self._view: tuple[float, dict[str, Any]] | None = None
        self._collecting = asyncio.Lock()
        self.table = LinkTable()
        self.prober = LinkProber(clock, self.probe, probe_targets or peers, self.table,
                                 interval_s=max(interval_s, 1e-3), rng=rng)
        self.enabled = interval_s > 0

    @property
    def peer_id(self) -> str:
        return self.transport.key.peer_id

    async def run(self) -> None:
        if self.enabled:
            await self.prober.run()

    async def probe(self, peer: str, n_bytes: int) -> None:
        resp = await self.transport.request(
            peer, "POST", PROBE_PATH, (("content-type", "application/octet-stream"),),
            bytes(n_bytes), timeout=PROBE_TIMEOUT_S)
        async with resp:
            await resp.read(PROBE_ANSWER_LIMIT)
        if resp.status != 204:
            raise NetError(f"probe of {peer} answered {resp.status}")

    # ---- the peer side ------------------------------------------------------------------
    def handles(self, path: str) -> bool:
        return path in (PROBE_PATH, LINKS_PATH)

    async def handle(self, request: PeerRequest) -> HandlerResponse:
        if request.path == PROBE_PATH:
            if request.method != "POST":
                return _error(405, "POST a probe")
            seen = 0
            async for chunk in request.iter_chunks():
                seen += len(chunk)
                if seen > MAX_PROBE_BYTES:
                    return _error(413, f"a probe carries at most {MAX_PROBE_BYTES} bytes")
            return HandlerResponse(204, (), b"")
        if request.method != "GET":
            return _error(405, "GET the link table")
        return HandlerResponse(200, _JSON, orjson.dumps(self.own()))

    def own(self) -> dict[str, Any]:
        return {"peer": self.peer_id, **self.table.to_json()}

    # ---- the fabric view ----------------------------------------------------------------
    async def _fetch(self, peer: str) -> dict[str, Any]:
        # The whole fetch, body included, within FETCH_TIMEOUT_S: the request's own timeout
        # covers only the head, and a peer that then went silent held the view's lock (and
        # every later /v1/fabric/links call) for good.
        try:
            status, body = await with_timeout(self.clock, self._get_table(peer),
                                              FETCH_TIMEOUT_S)
            if status != 200:
                raise LinkTableError(f"answered {status}")
            links = parse_link_table(orjson.loads(body))
        except TimeoutError:
            return {"peer": peer, "error": f"no table within {FETCH_TIMEOUT_S:g} s"}
        except (NetError, LinkTableError, orjson.JSONDecodeError) as exc:
            return {"peer": peer, "error": str(exc)[:200]}
        return {"peer": peer, "links": [e.to_json() for e in links]}

    async def _get_table(self, peer: str) -> tuple[int, bytes]:
        resp = await self.transport.request(peer, "GET", LINKS_PATH, timeout=FETCH_TIMEOUT_S)
        async with resp:
            try:
                return resp.status, await resp.read(MAX_TABLE_BYTES)
            except BodyTooLarge:
                raise LinkTableError(f"the table is over {MAX_TABLE_BYTES} bytes") from None

    async def fabric(self) -> dict[str, Any]:
        """This node's table and each live peer's (an unreachable or malformed one is an
        entry with "error"): the measured link matrix of the fabric as this node sees it.
        Cached for FABRIC_VIEW_TTL_S; one collection at a time."""
        async with self._collecting:
            if self._view is not None and self.clock.now() - self._view[0] < FABRIC_VIEW_TTL_S:
                return self._view[1]
            view = await self._collect()
            self._view = (self.clock.now(), view)
            return view

    async def _collect(self) -> dict[str, Any]:
        peers = [p for p in dict.fromkeys(self.peers()) if p != self.peer_id]
        fetched = await asyncio.gather(*(self._fetch(p) for p in peers[:MAX_FABRIC_PEERS]))
        return {"self": self.peer_id, "nodes": [self.own(), *fetched]}
