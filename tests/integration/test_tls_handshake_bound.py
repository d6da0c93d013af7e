"""Every TLS listener aborts a connection that does not finish its handshake in time: the
lean front (public HTTPS ingress), the provider's pinned data-plane listener, the peer
transport and a node's HTTPS API. asyncio's default is 60 s, so a hostile client could hold
sockets and TLS buffers that long for the price of a TCP connect. Each case: a silent client
and one that sends half a ClientHello are closed within the bound, and an honest TLS client
is served afterwards; the front also on uvloop (its own TLS layer). On asyncio's loop the
front counts a connection against its caps from the TCP accept on (uvloop: once its
handshake is done) and closes connections mid-handshake when it shuts down. Real sockets on
loopback."""

from __future__ import annotations

import asyncio
import json
import pathlib
import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest

from llmfabric.forward import HttpForwarder
from llmfabric.front.fast_front import FastFront
from llmfabric.front.front_limits import FrontLimits
from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.ingress import Ingress, IngressConfig, StaticCandidateSource
from llmfabric.net import TlsTransport, TransportConfig
from llmfabric.net.server_tls import ServerTls
from llmfabric.node.config import build_config
from llmfabric.node.daemon import Node
from llmfabric.node.serve.dataplane_server import DataPlaneServer
from llmfabric.testing.poll import wait_until
from llmfabric.testing.tls_files import write_cert

pytestmark = [pytest.mark.integration, pytest.mark.hostile]

BOUND_S = 2.0  # the handshake limit each listener is given here (honest ones meet it too)
CLOSED_WITHIN_S = 15.0  # far under asyncio's 60 s default, far over BOUND_S
# The first bytes of a TLS 1.2+ ClientHello record: a client that starts and then stalls.
HALF_HELLO = bytes([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC, 0x03, 0x03])

Listener = Callable[[pathlib.Path], AbstractAsyncContextManager[int]]


def insecure_client() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


@asynccontextmanager
async def https_front(
    tmp: pathlib.Path, limits: FrontLimits | None = None
) -> AsyncIterator[tuple[FastFront, int]]:
    """A lean front serving HTTPS with no providers on loopback, and its port."""
    cert, key = tmp / "c.pem", tmp / "k.pem"
    write_cert(cert, key, "front")
    fwd = HttpForwarder()
    ingress = Ingress(IngressConfig(auth_enabled=False), StaticCandidateSource([]), fwd)
    ff = FastFront(ingress, limits=limits)
    try:
        yield ff, await ff.start("127.0.0.1", 0, ssl=ServerTls(cert, key).context)
    finally:
        await ff.aclose()
        await fwd.aclose()


@asynccontextmanager
async def front(tmp: pathlib.Path) -> AsyncIterator[int]:
    async with https_front(tmp, FrontLimits(handshake_timeout_s=BOUND_S)) as (_, port):
        yield port


@asynccontextmanager
async def dataplane(_tmp: pathlib.Path) -> AsyncIterator[int]:
    dp = DataPlaneServer(
        NodeKey.generate(),
        lambda: None,
        lambda _peer: False,
        max_body_bytes=1024,
        tls_handshake_timeout_s=BOUND_S,
    )
    try:
        yield await dp.start_https("127.0.0.1", 0)
    finally:
        await dp.aclose()


@asynccontextmanager
async def transport(_tmp: pathlib.Path) -> AsyncIterator[int]:
    t = TlsTransport(
        NodeKey.generate(),
        PskAdmission("default", b"k" * 32),
        TransportConfig(handshake_timeout=BOUND_S),
    )
    await t.start()
    try:
        assert t.listen_addr is not None
        yield int(t.listen_addr.rsplit(":", 1)[1])
    finally:
        await t.aclose()


async def closed_after(port: int, first: bytes) -> float:
    """Seconds until the listener closes a connection that sent `first` and then nothing."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    try:
        if first:
            writer.write(first)
            await writer.drain()
        try:
            while await asyncio.wait_for(reader.read(4096), CLOSED_WITHIN_S):
                pass  # (a TLS alert may come before the close)
        except ConnectionResetError:
            pass
        return time.monotonic() - started
    finally:
        writer.close()


async def handshakes(port: int) -> bool:
    _, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=insecure_client(), server_hostname=""),
        CLOSED_WITHIN_S,
    )
    done = writer.get_extra_info("ssl_object") is not None
    writer.close()
    return done


async def stalled_handshakes_are_cut(port: int) -> None:
    """A silent client and a half ClientHello are closed in time; an honest one connects."""
    waits = await asyncio.gather(closed_after(port, b""), closed_after(port, HALF_HELLO))
    # wait_for raised TimeoutError (the test fails) if one stayed open CLOSED_WITHIN_S
    assert all(w < CLOSED_WITHIN_S for w in waits), waits
    assert await handshakes(port)


@pytest.mark.parametrize(
    "listener", [front, dataplane, transport], ids=["front", "dataplane", "transport"]
)
async def test_a_stalled_handshake_is_cut_and_honest_clients_still_connect(
    listener: Listener, tmp_path: pathlib.Path
) -> None:
    async with listener(tmp_path) as port:
        await stalled_handshakes_are_cut(port)


def test_on_uvloop_the_front_keeps_its_own_tls_and_the_bound(tmp_path: pathlib.Path) -> None:
    """uvloop (the CLI's loop when installed) serves HTTPS with its own TLS layer, which the
    front keeps; the handshake limit still cuts stalled clients."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        limits = FrontLimits(handshake_timeout_s=BOUND_S)
        async with https_front(tmp_path, limits) as (ff, port):
            await stalled_handshakes_are_cut(port)
            await wait_until(lambda: ff.slots.total == 0, 5, "the honest client's slot back")
            assert not ff.slots.handshaking  # (asyncio's CountedTlsAccept is not used here)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())


async def test_a_nodes_https_api_bounds_the_handshake(tmp_path: pathlib.Path) -> None:
    """A node that is not an ingress serves its API over aiohttp (no lean front); its
    listener takes `front_limits.handshake_timeout_s` too."""
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    write_cert(cert, key, "node")
    node = Node(
        build_config(
            {},
            {
                "home": tmp_path / "n",
                "listen": "127.0.0.1:0",
                "http_listen": "127.0.0.1:0",
                "preset": "local",
                "network_secret": "s" * 24,
                "gpu": "cpu",
                "tls_cert": cert,
                "tls_key": key,
                "front_limits": {"handshake_timeout_s": BOUND_S},
            },
        )
    )
    await node.start()
    try:
        port = int(node.http_addr.rsplit(":", 1)[1])
        assert await closed_after(port, HALF_HELLO) < CLOSED_WITHIN_S
        assert await handshakes(port)
    finally:
        await node.stop(drain=False)


async def test_connections_mid_handshake_count_against_the_per_client_cap(
    tmp_path: pathlib.Path,
) -> None:
    """Over HTTPS a connection takes its slot at TCP accept: silent connections fill the
    per-client cap long before their handshake limit, the next one is aborted at once, and
    the slots come back when they close (the handshake never done)."""
    limits = FrontLimits(handshake_timeout_s=60.0, max_connections_per_client=4)
    async with https_front(tmp_path, limits) as (ff, port):
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        try:
            await wait_until(lambda: ff.slots.total == 4, 5, "the silent connections counted")
            # over the cap: cut long before the 60 s handshake limit, and refused
            assert await closed_after(port, HALF_HELLO) < CLOSED_WITHIN_S
            assert ff.refused_connections == 1
            scraped = ff.ingress.metrics.render().decode()
            assert "llmfabric_ingress_connections_refused_total 1.0" in scraped
            assert "llmfabric_ingress_connections_open 4.0" in scraped
            with pytest.raises((ConnectionError, ssl.SSLError, OSError)):
                await handshakes(port)
            for _, writer in silent:
                writer.close()
            await wait_until(lambda: ff.slots.total == 0, 5, "their slots given back")
            assert ff.slots.per_source == {} and not ff.slots.handshaking
            assert await handshakes(port)
            await wait_until(lambda: ff.slots.total == 0, 5, "the honest client's slot back")
        finally:
            for _, writer in silent:
                writer.close()


async def test_a_timed_out_handshake_gives_its_slot_back(tmp_path: pathlib.Path) -> None:
    async with https_front(tmp_path, FrontLimits(handshake_timeout_s=BOUND_S)) as (ff, port):
        assert await closed_after(port, HALF_HELLO) < CLOSED_WITHIN_S  # cut by the limit
        await wait_until(lambda: ff.slots.total == 0, 5, "the slot given back")
        assert ff.slots.per_source == {} and not ff.slots.handshaking
        # operators see it: the failed handshake is counted in the ingress's metrics
        scraped = ff.ingress.metrics.render().decode()
        assert "llmfabric_ingress_tls_handshakes_failed_total 1.0" in scraped
        assert "llmfabric_ingress_connections_open 0.0" in scraped


async def test_shutting_down_closes_connections_mid_handshake(tmp_path: pathlib.Path) -> None:
    """A front that stops does not leave silent clients holding sockets until their
    handshake limit (60 s here): they are closed with it."""
    async with https_front(tmp_path, FrontLimits(handshake_timeout_s=60.0)) as (ff, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await wait_until(lambda: ff.slots.handshaking, 5, "the connection accepted")
            await asyncio.wait_for(ff.aclose(), CLOSED_WITHIN_S)
            assert await asyncio.wait_for(reader.read(), CLOSED_WITHIN_S) == b""
            assert ff.slots.total == 0
        finally:
            writer.close()


async def test_a_large_body_over_https_is_read_whole(tmp_path: pathlib.Path) -> None:
    """The front's TLS layer reads 64 KiB at a time (not asyncio's 256 KiB): a 2 MiB JSON
    body spread over ~130 TLS records still arrives whole and gets its answer."""
    message = {"role": "user", "content": "x" * (2 << 20)}
    body = json.dumps({"model": "nobody-serves-this", "messages": [message]}).encode()
    async with https_front(tmp_path) as (_, port):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=insecure_client(), server_hostname="")
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CLOSED_WITHIN_S)
        rest = await asyncio.wait_for(reader.read(), CLOSED_WITHIN_S)
        writer.close()
        # the whole body was parsed: the answer names the model it asked for
        assert head.split()[1] in (b"404", b"503"), head
        assert b"nobody-serves-this" in rest, rest[:300]
