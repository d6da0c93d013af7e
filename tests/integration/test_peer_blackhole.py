"""The peer path when the network drops a connection's packets (a partition: no FIN, no RST),
on loopback with real transports and a TCP relay in between that stops carrying bytes.

Every forwarding path must honour the ingress's `Timeouts` (so the ingress fails over to
the next candidate in time), and a peer connection that went silent must be found dead and
closed, so later requests dial again instead of each waiting out its timeout on it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import orjson
import pytest

from llmfabric.forward import ChoosingForwarder
from llmfabric.forward.peer import PeerResponse
from llmfabric.forward.secure import DataPlaneSessions, SealedPeerForwarder
from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.errors import UpstreamConnectError, UpstreamError
from llmfabric.net import HandlerResponse, TlsTransport, TransportConfig
from llmfabric.node.serve.dataplane_server import DataPlaneServer
from llmfabric.node.serve.peer_api import PeerApi
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate

pytestmark = [pytest.mark.integration]

PATH = "/v1/chat/completions"
BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
# What must bound each case: a hang shows as the test's own (much larger) limit expiring.
NEVER_S = 20.0


class Blackhole:
    """A TCP relay that can stop carrying bytes both ways while the sockets stay open: what
    an iptables DROP does to an established connection (held bytes flow again on `heal`)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.open = asyncio.Event()
        self.open.set()
        self.addr = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.addr = f"127.0.0.1:{port}"

    def cut(self) -> None:
        self.open.clear()

    def heal(self) -> None:
        self.open.set()

    async def _accept(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        host, _, port = self.target.rpartition(":")
        ur, uw = await asyncio.open_connection(host, int(port))
        self._writers += [w, uw]
        for src, dst in ((r, uw), (ur, w)):
            task = asyncio.ensure_future(self._pump(src, dst))
            self._tasks.add(task)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await src.read(65536):
                await self.open.wait()
                dst.write(data)
                await dst.drain()
        dst.close()

    async def aclose(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for w in self._writers:
            w.close()
        if self._server is not None:
            self._server.close()


class StallingEngine:
    """Answers a stream's first chunk, then nothing more while `stall` is set."""

    def __init__(self) -> None:
        self.stall = False

    async def serve_body(self, path: str, body: bytes, *_: object) -> HandlerResponse:
        stall = self.stall

        async def gen() -> AsyncIterator[bytes]:
            yield b'data: {"i": 0}\n\n'
            if stall:
                await asyncio.sleep(3600)
            yield b"data: [DONE]\n\n"

        return HandlerResponse(200, (("content-type", "text/event-stream"),), gen())


def adm() -> PskAdmission:
    return PskAdmission("bh-test", b"b" * 32)


def cand(peer_id: str, http_addr: str = "") -> Candidate:
    return Candidate(session_id="s1", peer_id=peer_id, provider_id="p", http_addr=http_addr,
                     relays=(), hardware=Hardware(gpu_model="H100", gpu_count=1),
                     model=ServedModel("m"), load=LoadHints())


class Lab:
    def __init__(self, probe_s: float = 0.3) -> None:
        self.engine = StallingEngine()
        pkey, self.ing_key = NodeKey.generate(), NodeKey.generate()
        self.prov = TlsTransport(pkey, adm(), TransportConfig())
        dp = DataPlaneServer(pkey, lambda: self.engine,  # type: ignore[arg-type,return-value]
                             {self.ing_key.peer_id}.__contains__, max_body_bytes=1 << 20)

        async def assign(peer: str, b: bytes) -> HandlerResponse:
            return HandlerResponse(202, (), b"ok")

        self.prov.set_request_handler(PeerApi(dp, assign).handle)
        self.ing = TlsTransport(self.ing_key, adm(),
                                TransportConfig(host=None, probe_timeout=probe_s))
        self.sessions = DataPlaneSessions(self.ing_key, self.ing)
        self.sealed = SealedPeerForwarder(self.sessions, self.ing)
        self.hole: Blackhole | None = None

    async def __aenter__(self) -> Lab:
        await self.prov.start()
        await self.ing.start()
        assert self.prov.listen_addr is not None
        self.hole = Blackhole(self.prov.listen_addr)
        await self.hole.start()
        self.ing.add_peer(self.prov.local_id, [self.hole.addr], [])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.hole is not None:  # first: a TLS goodbye into a black hole waits long
            await self.hole.aclose()
        await self.ing.aclose()
        await self.prov.aclose()

    async def served(self, t: Timeouts) -> bytes:
        up = await self.sealed.open(cand(self.prov.local_id), PATH, BODY, t)
        try:
            return await up.read()
        finally:
            await up.aclose()


async def test_a_sealed_answer_that_stalls_ends_at_the_total_limit_not_the_idle_one() -> None:
    async with Lab() as lab:
        t = Timeouts(connect=2, first_byte=2, idle=60, total=0.5)
        assert b"[DONE]" in await lab.served(Timeouts(connect=2, first_byte=2, idle=2, total=5))
        lab.engine.stall = True
        async with asyncio.timeout(NEVER_S):
            with pytest.raises(UpstreamError, match="total"):
                await lab.served(t)


class _SilentAfterHead:
    """Wraps the ingress's transport: each answer's head arrives, its body never does (the
    partition came between them)."""

    def __init__(self, inner: TlsTransport) -> None:
        self.inner = inner

    async def request(self, peer_id: str, method: str, path: str,
                      headers: Sequence[tuple[str, str]], body: bytes, *,
                      timeout: float = 30.0) -> PeerResponse:  # noqa: ASYNC109
        resp = await self.inner.request(peer_id, method, path, headers, body, timeout=timeout)
        await resp.aclose()

        async def silence() -> AsyncIterator[bytes]:
            await asyncio.sleep(3600)
            yield b""

        return _Resp(resp.status, resp.headers, silence())


class _Resp:
    def __init__(self, status: int, headers: Sequence[tuple[str, str]],
                 body: AsyncIterator[bytes]) -> None:
        self.status, self.headers, self._body = status, headers, body

    def iter_chunks(self) -> AsyncIterator[bytes]:
        return self._body

    async def aclose(self) -> None:
        return None


async def test_a_session_answer_cut_after_its_head_fails_within_the_connect_limit() -> None:
    async with Lab() as lab:
        sessions = DataPlaneSessions(lab.ing_key, _SilentAfterHead(lab.ing))
        async with asyncio.timeout(NEVER_S):
            with pytest.raises(UpstreamConnectError, match="session"):
                await sessions.get(lab.prov.local_id, 0.5)


async def test_a_dead_peer_connection_is_probed_and_closed_so_later_requests_redial() -> None:
    async with Lab(probe_s=0.3) as lab:
        assert lab.hole is not None
        t = Timeouts(connect=1, first_byte=0.5, idle=1, total=5)
        assert b"[DONE]" in await lab.served(t)
        peer = lab.prov.local_id
        conn = lab.ing.connection(peer)
        assert conn is not None
        lab.hole.cut()  # packets dropped: no FIN, the connection still looks open
        async with asyncio.timeout(NEVER_S):
            with pytest.raises(UpstreamError):
                await lab.served(t)
            # keep-alive would notice after 3 x 15 s; the timed-out request's probe sooner
            await conn.closed.wait()
        assert lab.ing.connection(peer) is None
        assert lab.ing.stats.dropped["probe_unanswered"] == 1
        lab.hole.heal()  # the next request dials a fresh connection and is served
        async with asyncio.timeout(NEVER_S):
            assert b"[DONE]" in await lab.served(t)


async def test_a_live_but_slow_peer_answers_the_probe_and_keeps_its_connection() -> None:
    async with Lab(probe_s=0.3) as lab:
        t = Timeouts(connect=1, first_byte=0.5, idle=1, total=5)
        assert b"[DONE]" in await lab.served(t)
        peer = lab.prov.local_id
        conn = lab.ing.connection(peer)
        lab.engine.stall = True
        with pytest.raises(UpstreamError):  # the head comes, the end does not: total
            await lab.served(Timeouts(connect=1, first_byte=0.5, idle=0.2, total=5))
        with contextlib.suppress(UpstreamError):  # (may or may not time out: no probe needed)
            await lab.served(Timeouts(connect=1, first_byte=0.001, idle=1, total=5))
        await asyncio.sleep(0.6)  # past the probe's limit: the PONG came, nothing closed
        assert lab.ing.connection(peer) is conn
        assert lab.ing.stats.dropped["probe_unanswered"] == 0


class _DirectDown:
    """A direct path whose connect times out (the node's host is cut off)."""

    enforces_timeouts = True  # (the Forwarder capability: it never waits past its phases)

    def __init__(self, connect_s: float) -> None:
        self.connect_s = connect_s
        self.tries = 0

    async def open(self, candidate: Candidate, path: str, body: bytes,
                   timeouts: Timeouts) -> object:
        self.tries += 1
        await asyncio.sleep(self.connect_s)
        raise UpstreamConnectError("cannot connect: timed out")

    async def aclose(self) -> None:
        return None


async def test_a_node_cut_off_on_both_paths_keeps_its_direct_address_first() -> None:
    # Falling back to the peer network only helps a node whose address is wrong; when the
    # peer path fails as well the node is cut off, and after the heal its direct address is
    # the one that works: it is not skipped.
    async with Lab() as lab:
        assert lab.hole is not None
        lab.hole.cut()
        direct = _DirectDown(0.1)
        fwd = ChoosingForwarder(direct, lab.sealed)  # type: ignore[arg-type]
        c = cand(lab.prov.local_id, "10.9.9.9:8090")
        t = Timeouts(connect=0.2, first_byte=0.5, idle=1, total=5)
        for _ in range(2):
            async with asyncio.timeout(NEVER_S):
                with pytest.raises(UpstreamError, match=r"direct: .*peer network"):
                    await fwd.open(c, PATH, BODY, t)
        assert direct.tries == 2


async def test_an_answer_that_goes_silent_on_a_dead_connection_fails_before_idle() -> None:
    # The head came, then the partition: the idle limit (60 s here, 120 s by default) is
    # the node's allowance for a slow engine, not for a dead connection. The connection,
    # with a request waiting on it, probes itself and closes when nothing at all arrives.
    async with Lab(probe_s=0.3) as lab:
        assert lab.hole is not None
        lab.engine.stall = True
        t = Timeouts(connect=1, first_byte=1, idle=60, total=60)
        up = await lab.sealed.open(cand(lab.prov.local_id), PATH, BODY, t)
        lab.hole.cut()
        async with asyncio.timeout(NEVER_S):
            with pytest.raises(UpstreamError, match=r"broke off|cut short"):
                await up.read()
        await up.aclose()
        assert lab.ing.stats.dropped["probe_unanswered"] == 1


async def test_a_slow_engine_on_a_live_connection_is_not_mistaken_for_a_dead_one() -> None:
    async with Lab(probe_s=0.2) as lab:
        lab.engine.stall = True
        t = Timeouts(connect=1, first_byte=1, idle=1.5, total=60)
        up = await lab.sealed.open(cand(lab.prov.local_id), PATH, BODY, t)
        conn = lab.ing.connection(lab.prov.local_id)
        with pytest.raises(UpstreamError, match=r"no data for 1\.5 s"):  # idle, no sooner
            await up.read()
        await up.aclose()
        assert lab.ing.connection(lab.prov.local_id) is conn
        assert lab.ing.stats.dropped["probe_unanswered"] == 0
