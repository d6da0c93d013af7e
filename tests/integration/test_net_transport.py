"""Two or three real TlsTransports on loopback: handshake, pinning, admission, datagrams,
streamed requests."""

import asyncio
import ssl

import pytest

from llmfabric.identity import CertAdmission, NodeKey, PskAdmission, sign_membership
from llmfabric.net import (
    HandlerResponse,
    HandshakeRefused,
    PeerUnreachable,
    RequestFailed,
    TlsTransport,
    TransportConfig,
)
from llmfabric.net.addressbook import parse_addr
from llmfabric.net.framing import FrameType, encode_frame
from llmfabric.testing.poll import wait_until as wait_for

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")

SECRET = b"s" * 32


def psk(secret: bytes = SECRET, network: str = "test") -> PskAdmission:
    return PskAdmission(network, secret)


async def test_datagrams_flow_both_ways_over_one_connection():
    a = TlsTransport(NodeKey.generate(), psk())
    b = TlsTransport(NodeKey.generate(), psk())
    got_a: list[tuple[str, bytes]] = []
    got_b: list[tuple[str, bytes]] = []
    async with a, b:
        a.set_handler(lambda p, m: got_a.append((p, m)))
        b.set_handler(lambda p, m: got_b.append((p, m)))
        assert await a.connect_bootstrap(b.listen_addr) == b.local_id
        for i in range(5):
            a.send(b.local_id, f"a{i}".encode())
        await wait_for(lambda: len(got_b) == 5)
        # b never dialled a: it answers over the connection a opened.
        b.send(a.local_id, b"pong")
        await wait_for(lambda: got_a == [(b.local_id, b"pong")])
        assert got_b == [(a.local_id, f"a{i}".encode()) for i in range(5)]
        assert a.connected_peers() == (b.local_id,) and b.connected_peers() == (a.local_id,)
        assert a.stats.connections_opened == 1 and b.stats.connections_opened == 1
        assert a.stats.datagrams_sent == 5 and b.stats.datagrams_received == 5
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]


async def test_send_to_an_unknown_or_dead_peer_drops_and_counts():
    a = TlsTransport(NodeKey.generate(), psk())
    async with a:
        a.send("zQmNobody", b"x")
        assert a.stats.dropped["unreachable"] == 1
        ghost = NodeKey.generate().peer_id
        a.add_peer(ghost, ["127.0.0.1:1"])
        a.send(ghost, b"x")
        a.send(ghost, b"y")
        await wait_for(lambda: a.stats.dropped["unreachable"] == 3)


async def test_dialling_by_peer_id_pins_the_expected_identity():
    a = TlsTransport(NodeKey.generate(), psk())
    b = TlsTransport(NodeKey.generate(), psk())
    async with a, b:
        impostor = NodeKey.generate().peer_id
        with pytest.raises(HandshakeRefused, match="peer id mismatch") as err:
            await a.connect(b.listen_addr, expected_peer=impostor)
        assert err.value.code == "pin_mismatch"
        assert a.stats.handshakes_refused["pin_mismatch"] == 1
        # Address book lookups pin too: b's address registered under another id fails.
        a.add_peer(impostor, [b.listen_addr])
        with pytest.raises(PeerUnreachable, match="mismatch"):
            await a.request(impostor, "GET", "/")
        assert await a.connect(b.listen_addr, expected_peer=b.local_id) == b.local_id


@pytest.mark.parametrize("case", ["wrong_secret", "wrong_network"])
async def test_wrong_credential_is_refused_on_both_sides(case):
    good = psk()
    bad = psk(b"x" * 32) if case == "wrong_secret" else psk(network="other")
    server = TlsTransport(NodeKey.generate(), good)
    client = TlsTransport(NodeKey.generate(), bad, TransportConfig(host=None))
    async with server, client:
        with pytest.raises(HandshakeRefused) as err:
            await client.connect_bootstrap(server.listen_addr)
        assert err.value.code in {"admission", "refused_by_peer"}
        await wait_for(lambda: sum(server.stats.handshakes_refused.values()) >= 1)
        assert server.connected_peers() == () and client.connected_peers() == ()
        if case == "wrong_secret":
            assert server.stats.handshakes_refused["admission"] == 1
            assert "admission refused" in err.value.reason


async def test_membership_certificates_admit_and_refuse():
    operator = NodeKey.generate()
    far = 4_000_000_000.0
    ka, kb, kc = NodeKey.generate(), NodeKey.generate(), NodeKey.generate()

    def cert_adm(key: NodeKey, op: NodeKey = operator, expires: float = far) -> CertAdmission:
        return CertAdmission(operator.public_bytes, sign_membership(op, key.peer_id, "n", expires))

    a = TlsTransport(ka, cert_adm(ka))
    b = TlsTransport(kb, cert_adm(kb), TransportConfig(host=None))
    rogue = TlsTransport(kc, cert_adm(kc, op=NodeKey.generate()), TransportConfig(host=None))
    expired = TlsTransport(kc, cert_adm(kc, expires=1.0), TransportConfig(host=None))
    async with a, b, rogue, expired:
        assert await b.connect_bootstrap(a.listen_addr) == a.local_id
        for t in (rogue, expired):
            with pytest.raises(HandshakeRefused):
                await t.connect_bootstrap(a.listen_addr)
        await wait_for(lambda: a.stats.handshakes_refused["admission"] == 2)


async def test_garbage_instead_of_a_handshake_is_refused_and_counted():
    a = TlsTransport(NodeKey.generate(), psk())
    async with a:
        host, port = parse_addr(a.listen_addr)
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        for junk in (b"\x07\x01\x00\x00\x00\x00", encode_frame(FrameType.AUTH, b"\xc1garbled")):
            reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
            writer.write(junk)
            await writer.drain()
            await reader.read()  # server closes after sending HELLO (and maybe REFUSE)
            writer.close()
            await writer.wait_closed()
        await wait_for(lambda: sum(a.stats.handshakes_refused.values()) == 2)
        assert a.stats.handshakes_refused["wrong_version"] == 1
        assert a.stats.handshakes_refused["garbled"] == 1
        assert a.connected_peers() == ()


async def test_streamed_request_response_chunk_by_chunk():
    a = TlsTransport(NodeKey.generate(), psk())
    b = TlsTransport(NodeKey.generate(), psk())
    client_saw_first = asyncio.Event()
    seen: list[tuple[str, str, str, bytes]] = []

    async def serve(req):
        body = await req.read()
        seen.append((req.peer_id, req.method, req.path, body))

        async def gen():
            yield b"first"
            # The client must see "first" before we produce more: no buffering.
            await client_saw_first.wait()
            for i in range(3):
                yield f"-{i}".encode()

        return HandlerResponse(201, (("content-type", "text/plain"),), gen())

    async with a, b:
        b.set_request_handler(serve)
        await a.connect_bootstrap(b.listen_addr)

        async def upload():
            for part in (b"he", b"llo"):
                yield part

        resp = await a.request(b.local_id, "POST", "/v1/x", (("x-k", "v"),), upload(), timeout=5)
        assert resp.status == 201 and resp.header("content-type") == "text/plain"
        chunks = []
        async with asyncio.timeout(5):
            async for c in resp.iter_chunks():
                chunks.append(c)
                client_saw_first.set()
        await resp.aclose()
        assert chunks[0] == b"first" and b"".join(chunks) == b"first-0-1-2"
        assert seen == [(a.local_id, "POST", "/v1/x", b"hello")]
        # Large bodies both ways go through flow control.
        big = bytes(range(256)) * 8192

        async def echo(req):
            return HandlerResponse(200, (), await req.read())

        b.set_request_handler(echo)
        resp = await a.request(b.local_id, "PUT", "/echo", (), big)
        assert await resp.read() == big
        await resp.aclose()


async def test_closing_a_response_early_cancels_the_stream_on_the_server():
    a = TlsTransport(NodeKey.generate(), psk())
    b = TlsTransport(NodeKey.generate(), psk())
    stopped = asyncio.Event()

    async def endless(req):
        async def gen():
            try:
                while True:
                    yield b"x" * 65536
                    await asyncio.sleep(0)
            finally:
                stopped.set()

        return HandlerResponse(200, (), gen())

    async with a, b:
        b.set_request_handler(endless)
        await a.connect_bootstrap(b.listen_addr)
        resp = await a.request(b.local_id, "GET", "/stream")
        async for _ in resp.iter_chunks():
            break
        await resp.aclose()
        async with asyncio.timeout(5):
            await stopped.wait()
        # The connection is still usable.
        resp = await a.request(b.local_id, "GET", "/stream")
        assert resp.status == 200
        await resp.aclose()


async def test_handler_errors_become_500_or_a_dropped_message_and_are_counted():
    a = TlsTransport(NodeKey.generate(), psk())
    b = TlsTransport(NodeKey.generate(), psk())

    async def broken(req):
        raise RuntimeError("boom")

    async with a, b:
        await a.connect_bootstrap(b.listen_addr)
        resp = await a.request(b.local_id, "GET", "/")
        assert resp.status == 404
        await resp.aclose()
        b.set_request_handler(broken)
        resp = await a.request(b.local_id, "GET", "/")
        assert resp.status == 500 and b"boom" in await resp.read()
        await resp.aclose()
        assert b.stats.errors == {"request_handler": 1}  # logged and counted (/metrics)

        def broken_message(peer, msg):
            raise ValueError("a bug in the message handler")

        b.set_handler(broken_message)
        a.send(b.local_id, b"one")
        await wait_for(lambda: b.stats.errors["message_handler"] == 1)
        b.set_handler(lambda p, m: None)  # the transport survived the bug
        resp = await a.request(b.local_id, "GET", "/")
        assert resp.status == 500
        await resp.aclose()


async def test_simultaneous_dials_settle_on_one_connection():
    a = TlsTransport(NodeKey.generate(), psk())
    b = TlsTransport(NodeKey.generate(), psk())
    got: list[bytes] = []
    async with a, b:
        b.set_handler(lambda p, m: got.append(m))
        await asyncio.gather(a.connect(b.listen_addr), b.connect(a.listen_addr))
        await wait_for(lambda: len(a.connected_peers()) == 1 and len(b.connected_peers()) == 1)
        await wait_for(lambda: a.connection(b.local_id) is not None)
        a.send(b.local_id, b"after-race")
        await wait_for(lambda: got == [b"after-race"])


async def test_request_timeout_and_unreachable_peer_errors():
    a = TlsTransport(NodeKey.generate(), psk())
    b = TlsTransport(NodeKey.generate(), psk())
    never = asyncio.Event()
    cancelled = asyncio.Event()

    async def stuck(req):
        try:
            await never.wait()
        finally:
            cancelled.set()
        return HandlerResponse(200)

    async with a, b:
        b.set_request_handler(stuck)
        await a.connect_bootstrap(b.listen_addr)
        with pytest.raises(RequestFailed, match=r"within 0\.2s"):
            await a.request(b.local_id, "GET", "/", timeout=0.2)
        async with asyncio.timeout(5):  # the caller's reset cancels the handler
            await cancelled.wait()
        with pytest.raises(PeerUnreachable, match="no addresses known"):
            await a.request(NodeKey.generate().peer_id, "GET", "/")


async def test_advertised_addresses_never_include_a_wildcard():
    wild = TlsTransport(NodeKey.generate(), psk(), TransportConfig(host="0.0.0.0"))
    public = TlsTransport(
        NodeKey.generate(), psk(), TransportConfig(host="0.0.0.0", public_addr="10.9.9.9:7000")
    )
    silent = TlsTransport(NodeKey.generate(), psk(), TransportConfig(host=None))
    async with wild, public, silent:
        assert wild.listen_addr is not None and wild.listen_addr.startswith("0.0.0.0:")
        assert all(not a.startswith(("0.0.0.0", "127.")) for a in wild.advertised_addrs)
        assert public.advertised_addrs == ("10.9.9.9:7000",)
        assert silent.advertised_addrs == () and silent.listen_addr is None


@pytest.mark.hostile
async def test_a_node_does_not_connect_to_itself():
    """A bootstrap address pointing back at the node connected it to itself."""
    a = TlsTransport(NodeKey.generate(), psk())
    async with a:
        with pytest.raises(HandshakeRefused) as err:
            await a.connect(a.listen_addr)
        assert err.value.code == "self"
        # As a bootstrap address, ours answers (it is us) without a connection.
        assert await a.connect_bootstrap(a.listen_addr) == a.local_id
        assert a.connected_peers() == () and a.stats.connections_opened == 0


@pytest.mark.hostile
async def test_a_revoked_member_is_disconnected_and_refused_at_the_handshake():
    """Certificates could not be revoked: a leaked member key stayed connected, and could
    reconnect, until its certificate expired."""
    from llmfabric.identity.revocation import Revocations, sign_revocations

    operator = NodeKey.generate()
    ka, kb, kc = NodeKey.generate(), NodeKey.generate(), NodeKey.generate()
    revs = Revocations(operator.public_bytes, "n")  # a's list

    def cert_adm(key: NodeKey, r: Revocations | None = None) -> CertAdmission:
        return CertAdmission(operator.public_bytes,
                             sign_membership(operator, key.peer_id, "n", 4_000_000_000.0), r)

    a = TlsTransport(ka, cert_adm(ka, revs))
    b = TlsTransport(kb, cert_adm(kb))
    c = TlsTransport(kc, cert_adm(kc), TransportConfig(host=None))
    async with a, b, c:
        assert await b.connect(a.listen_addr) == a.local_id
        assert await c.connect(a.listen_addr) == a.local_id
        await wait_for(lambda: set(a.connected_peers()) == {b.local_id, c.local_id})

        revs.offer(sign_revocations(operator, "n", 1_700_000_000.0, [b.local_id]))
        assert a.refuse_peers([b.local_id]) == 1
        await wait_for(lambda: a.connected_peers() == (c.local_id,))
        await wait_for(lambda: b.connected_peers() == ())
        # b dials again: refused, and told why.
        with pytest.raises(HandshakeRefused) as err:
            await b.connect(a.listen_addr)
        assert err.value.code == "refused_by_peer" and "revoked" in err.value.reason
        await wait_for(lambda: a.stats.handshakes_refused["revoked"] == 1)
        # a dials b: a refuses b's proof.
        with pytest.raises(HandshakeRefused) as err:
            await a.connect(b.listen_addr)
        assert err.value.code == "revoked"
        assert a.connected_peers() == (c.local_id,)  # the others stay connected
        # What a relay that lacks the list still forwards from b is dropped.
        got: list[str] = []
        a.set_handler(lambda peer, data: got.append(peer))
        a.on_datagram(b.local_id, b"x", None)
        a.on_datagram(c.local_id, b"x", None)
        assert got == [c.local_id] and a.stats.dropped["revoked"] == 1


@pytest.mark.hostile
async def test_closing_does_not_wait_for_a_frozen_peer_to_finish_tls():
    """A peer that stops reading (a frozen process, a host gone behind a stateful firewall)
    never answers TLS's close_notify: closing waited asyncio's ssl_shutdown_timeout (30 s)
    for it, so a node's SIGTERM stop took 30 s, past Slurm's KillWait. Now the socket is cut
    after CLOSE_GRACE_S and counted."""
    from llmfabric.net.connection import CLOSE_GRACE_S

    a = TlsTransport(NodeKey.generate(), psk())
    b = TlsTransport(NodeKey.generate(), psk())
    async with b:
        await a.start()
        try:
            assert await a.connect_bootstrap(b.listen_addr) == b.local_id
            await wait_for(lambda: b.connected_peers() == (a.local_id,))
            for conn in list(b._all_conns):
                conn._writer.transport.pause_reading()  # b freezes
            loop = asyncio.get_running_loop()
            started = loop.time()
            await asyncio.wait_for(a.aclose(), 10 + CLOSE_GRACE_S)
            assert loop.time() - started < 10  # (the old code waited 30 s)
            assert a.stats.dropped["close_unanswered"] == 1
        finally:
            await a.aclose()
            for conn in list(b._all_conns):
                conn._writer.transport.resume_reading()
