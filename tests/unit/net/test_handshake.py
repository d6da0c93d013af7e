"""The application handshake (net/handshake.py), each side against a hand-driven, hostile
other side: garbage bytes, wrong frame types, non-map or mistyped messages, a short nonce, a
peer id that does not derive from its key, a bad signature, a wrong admission proof, silence
(timed out on the FakeClock) and a close. Every failure is a HandshakeRefused with a code, and
the server answers a client it rejects after reading its AUTH with a REFUSE frame saying why.

Loopback TCP for the server side (server_handshake never looks at TLS), TLS for the client
side (it reads the server's certificate)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgpack
import pytest

from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.identity.admission import AdmissionContext
from llmfabric.identity.certs import fingerprint, make_self_signed_cert
from llmfabric.net.errors import HandshakeRefused
from llmfabric.net.framing import FrameDecoder, FrameType, encode_frame
from llmfabric.net.handshake import (
    _SIG_LABEL,
    NONCE_LEN,
    FramedReader,
    HandshakeConfig,
    client_handshake,
    client_ssl_context,
    server_handshake,
    server_ssl_context,
)
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.poll import wait_until

NET = "hs-test"
SECRET = b"s" * 32
TIMEOUT = 10.0  # virtual seconds


def pack(obj: object) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def config(key: NodeKey, clock: FakeClock, secret: bytes = SECRET) -> HandshakeConfig:
    return HandshakeConfig(key, make_self_signed_cert(key), PskAdmission(NET, secret), clock,
                           TIMEOUT)


Script = Callable[[FramedReader, asyncio.StreamWriter, HandshakeConfig], Awaitable[None]]


@contextlib.asynccontextmanager
async def server_side(cfg: HandshakeConfig) -> AsyncIterator[
        tuple[asyncio.Task[tuple[str, FramedReader, bool, str]], asyncio.StreamReader,
              asyncio.StreamWriter]]:
    """A plain-TCP listener running server_handshake on its first connection; yields (that
    handshake's task, the client's reader and writer) for the test to drive by hand."""
    accepted: asyncio.Future[asyncio.Task[tuple[str, FramedReader, bool, str]]] = (
        asyncio.get_running_loop().create_future())
    writers: list[asyncio.StreamWriter] = []

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        writers.append(w)
        task = asyncio.ensure_future(server_handshake(r, w, cfg))
        accepted.set_result(task)
        with contextlib.suppress(Exception):
            await task

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    task = await asyncio.wait_for(accepted, 10)
    try:
        yield task, reader, writer
    finally:
        task.cancel()
        writer.close()
        for w in writers:
            w.close()
        server.close()
        await server.wait_closed()


def auth_for(client: NodeKey, hello: dict[str, Any], server_cert: bytes,
             secret: bytes = SECRET, **override: Any) -> dict[str, Any]:
    """A correct AUTH message for `hello` (then `override` spoils a field)."""
    nonce = os.urandom(NONCE_LEN)
    me = client.peer_id
    ctx = AdmissionContext(NET, me, hello["peer_id"], "client", nonce, hello["nonce"],
                           1_700_000_000.0)
    msg = {"peer_id": me, "public_key": client.public_bytes, "nonce": nonce,
           "sig": client.sign(_SIG_LABEL + hello["nonce"] + fingerprint(server_cert)
                              + me.encode()),
           "proof": PskAdmission(NET, secret).prove(ctx), "probe": False}
    msg.update(override)
    return msg


async def read_hello(reader: asyncio.StreamReader) -> tuple[FramedReader, dict[str, Any]]:
    fr = FramedReader(reader, FrameDecoder())
    frame = await asyncio.wait_for(fr.read_frame(), 10)
    assert frame is not None and frame.type == FrameType.HELLO
    hello = msgpack.unpackb(frame.payload, raw=False)
    assert hello["network"] == NET and len(hello["nonce"]) == NONCE_LEN
    return fr, hello


async def refused(task: asyncio.Task[Any]) -> HandshakeRefused:
    with pytest.raises(HandshakeRefused) as info:
        await asyncio.wait_for(task, 10)
    return info.value


async def refuse_reason(fr: FramedReader) -> str:
    frame = await asyncio.wait_for(fr.read_frame(), 10)
    assert frame is not None and frame.type == FrameType.REFUSE
    reason: str = msgpack.unpackb(frame.payload, raw=False)["reason"]
    return reason


async def test_a_correct_client_is_admitted_and_confirms() -> None:
    clock, server_key, client = FakeClock(), NodeKey.generate(), NodeKey.generate()
    cfg = config(server_key, clock)
    async with server_side(cfg) as (task, reader, writer):
        fr, hello = await read_hello(reader)
        assert hello["peer_id"] == server_key.peer_id
        writer.write(encode_frame(FrameType.AUTH, pack(auth_for(client, hello, cfg.cert_der,
                                                                probe=True))))
        frame = await asyncio.wait_for(fr.read_frame(), 10)
        assert frame is not None and frame.type == FrameType.ACCEPT
        writer.write(encode_frame(FrameType.CONFIRM, pack({})))
        peer, _, probe, member = await asyncio.wait_for(task, 10)
    assert peer == client.peer_id and probe is True and member == ""  # (PSK: no member)


@pytest.mark.parametrize(("wire", "code"), [
    (b"\xff" * 64, "wrong_version"),  # not our framing at all
    (encode_frame(FrameType.AUTH, b"\xc1\xc1"), "garbled"),  # not msgpack
    (encode_frame(FrameType.AUTH, pack([1, 2, 3])), "garbled"),  # msgpack, but not a map
    (encode_frame(FrameType.CONFIRM, pack({})), "garbled"),  # a frame out of turn
    (encode_frame(FrameType.AUTH, pack({"peer_id": 7})), "garbled"),  # mistyped fields
    (encode_frame(FrameType.REFUSE, pack({"reason": "no thanks"})), "refused_by_peer"),
])
async def test_garbage_from_the_client_is_refused_with_a_code(wire: bytes, code: str) -> None:
    async with server_side(config(NodeKey.generate(), FakeClock())) as (task, reader, writer):
        await read_hello(reader)
        writer.write(wire)
        err = await refused(task)
    assert err.code == code, err


@pytest.mark.parametrize(("spoil", "code", "reason"), [
    ("short_nonce", "garbled", "bad nonce"),
    ("someone_elses_id", "bad_signature", "does not derive"),
    ("bad_sig", "bad_signature", "signature is invalid"),
    ("wrong_secret", "admission", "admission refused"),
])
async def test_a_hostile_auth_is_refused_and_told_why(spoil: str, code: str,
                                                       reason: str) -> None:
    cfg = config(NodeKey.generate(), FakeClock())
    client = NodeKey.generate()
    async with server_side(cfg) as (task, reader, writer):
        fr, hello = await read_hello(reader)
        override: dict[str, Any] = {
            "short_nonce": {"nonce": b"x" * (NONCE_LEN - 1)},
            "someone_elses_id": {"peer_id": NodeKey.generate().peer_id},
            "bad_sig": {"sig": client.sign(b"something else")},
            "wrong_secret": {},
        }[spoil]
        secret = b"t" * 32 if spoil == "wrong_secret" else SECRET
        writer.write(encode_frame(FrameType.AUTH, pack(
            auth_for(client, hello, cfg.cert_der, secret, **override))))
        err = await refused(task)
        assert err.code == code, err
        assert reason in await refuse_reason(fr)


async def test_a_silent_client_times_out_on_the_injected_clock() -> None:
    clock = FakeClock()
    async with server_side(config(NodeKey.generate(), clock)) as (task, reader, _):
        await read_hello(reader)
        await clock.advance(TIMEOUT - 1)
        assert not task.done()  # no wall time involved: nothing fires early
        await clock.advance(2)
        err = await refused(task)
    assert err.code == "timeout"


async def test_a_client_closing_mid_handshake_is_a_clean_refusal() -> None:
    async with server_side(config(NodeKey.generate(), FakeClock())) as (task, reader, writer):
        await read_hello(reader)
        writer.close()
        err = await refused(task)
    assert err.code == "closed"


@contextlib.asynccontextmanager
async def hostile_tls_server(key: NodeKey, script: Script) -> AsyncIterator[tuple[str, int]]:
    """A TLS listener with `key`'s certificate that plays `script` instead of a handshake."""
    cfg = config(key, FakeClock())
    done: list[asyncio.StreamWriter] = []

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        done.append(w)
        with contextlib.suppress(Exception):
            await script(FramedReader(r, FrameDecoder()), w, cfg)

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0,
                                        ssl=server_ssl_context(key, cfg.cert_der))
    try:
        yield "127.0.0.1", server.sockets[0].getsockname()[1]
    finally:
        for w in done:
            w.close()
        server.close()
        await server.wait_closed()


async def dial(addr: tuple[str, int], expected: str | None, clock: FakeClock | None = None,
               network: str = NET) -> tuple[str, FramedReader, str]:
    key = NodeKey.generate()
    cfg = HandshakeConfig(key, make_self_signed_cert(key), PskAdmission(network, SECRET),
                          clock or FakeClock(), TIMEOUT)
    reader, writer = await asyncio.open_connection(*addr, ssl=client_ssl_context())
    try:
        return await asyncio.wait_for(client_handshake(reader, writer, cfg, expected), 10)
    finally:
        writer.close()


def hello_from(cfg: HandshakeConfig, network: str = NET) -> bytes:
    return encode_frame(FrameType.HELLO, pack({
        "network": network, "kind": cfg.admission.kind, "nonce": os.urandom(NONCE_LEN),
        "peer_id": cfg.key.peer_id}))


async def test_the_client_pins_the_server_identity() -> None:
    async def hello(fr: FramedReader, w: asyncio.StreamWriter, cfg: HandshakeConfig) -> None:
        w.write(hello_from(cfg))
        await asyncio.sleep(5)

    async with hostile_tls_server(NodeKey.generate(), hello) as addr:
        with pytest.raises(HandshakeRefused) as info:
            await dial(addr, expected=NodeKey.generate().peer_id)
    assert info.value.code == "pin_mismatch"


async def test_the_client_refuses_another_network_and_tells_the_server() -> None:
    told: list[str] = []

    async def other_network(fr: FramedReader, w: asyncio.StreamWriter,
                            cfg: HandshakeConfig) -> None:
        w.write(hello_from(cfg, network="elsewhere"))
        told.append(await refuse_reason(fr))

    key = NodeKey.generate()
    async with hostile_tls_server(key, other_network) as addr:
        with pytest.raises(HandshakeRefused) as info:
            await dial(addr, expected=key.peer_id)
        await wait_until(lambda: told, 10, "the server reads the REFUSE")
    assert info.value.code == "admission"
    assert told and "network/admission mismatch" in told[0]


@pytest.mark.parametrize(("accept", "code"), [
    (encode_frame(FrameType.ACCEPT, pack({"proof": b"forged" * 6})), "admission"),
    (encode_frame(FrameType.ACCEPT, pack({"proof": "a string"})), "garbled"),
    (encode_frame(FrameType.HELLO, pack({})), "garbled"),  # HELLO again instead of ACCEPT
    (b"\x01" * 3, "closed"),  # a partial frame, then the server hangs up
])
async def test_the_client_refuses_a_bad_accept(accept: bytes, code: str) -> None:
    async def bad_accept(fr: FramedReader, w: asyncio.StreamWriter,
                         cfg: HandshakeConfig) -> None:
        w.write(hello_from(cfg))
        frame = await fr.read_frame()
        assert frame is not None and frame.type == FrameType.AUTH
        w.write(accept)
        await w.drain()
        w.close()

    key = NodeKey.generate()
    async with hostile_tls_server(key, bad_accept) as addr:
        with pytest.raises(HandshakeRefused) as info:
            await dial(addr, expected=key.peer_id)
    assert info.value.code == code, info.value


async def test_a_silent_server_times_out_on_the_injected_clock() -> None:
    async def silent(fr: FramedReader, w: asyncio.StreamWriter, cfg: HandshakeConfig) -> None:
        await asyncio.sleep(30)

    clock = FakeClock()
    key = NodeKey.generate()
    async with hostile_tls_server(key, silent) as addr:
        call = asyncio.ensure_future(dial(addr, key.peer_id, clock))
        await wait_until(lambda: clock.pending_timers, 10, "the client waits for HELLO")
        await clock.advance(TIMEOUT + 1)
        with pytest.raises(HandshakeRefused) as info:
            await asyncio.wait_for(call, 10)
    assert info.value.code == "timeout"


@pytest.mark.hostile
@pytest.mark.parametrize("sent", ["header_and_32k", "whole_megabyte"])
async def test_an_outsider_s_megabyte_auth_is_refused_before_it_is_buffered(sent: str) -> None:
    """Before admission, an AUTH frame may not use the 1 MiB connection frame limit: the
    server buffered all of it, then decoded it (1 MiB of empty msgpack maps: 72 MiB and
    0.1 s of event loop per connection, for anyone who completes a TLS handshake)."""
    n = (1 << 20) - 16
    bomb = b"\x81\xa1x\xdd" + n.to_bytes(4, "big") + b"\x80" * n  # {"x": [{}, {}, ...]}
    wire = encode_frame(FrameType.AUTH, bomb)
    async with server_side(config(NodeKey.generate(), FakeClock())) as (task, reader, writer):
        await read_hello(reader)
        writer.write(wire[: 6 + 32 * 1024] if sent == "header_and_32k" else wire)
        err = await refused(task)  # (a server waiting for the rest fails here, in 10 s)
    assert err.code == "oversized", err


@pytest.mark.hostile
async def test_a_peer_s_refusal_reason_cannot_forge_log_lines() -> None:
    async def refuse(fr: FramedReader, w: asyncio.StreamWriter, cfg: HandshakeConfig) -> None:
        w.write(encode_frame(FrameType.REFUSE, pack(
            {"reason": "x\n2026-12-02 ERROR forged line" + "y" * 5000})))
        await w.drain()

    key = NodeKey.generate()
    async with hostile_tls_server(key, refuse) as addr:
        with pytest.raises(HandshakeRefused) as info:
            await dial(addr, expected=key.peer_id)
    assert info.value.code == "refused_by_peer"
    assert "\n" not in info.value.reason and len(info.value.reason) < 300


@pytest.mark.hostile
async def test_the_server_refuses_a_client_with_its_own_key() -> None:
    """A dialler proving the server's own key (this node dialling itself through a bootstrap
    address redirected back at it, or a clone sharing its key) was admitted: the node ended
    up connected to itself."""
    clock, server_key = FakeClock(), NodeKey.generate()
    cfg = config(server_key, clock)
    async with server_side(cfg) as (task, reader, writer):
        fr, hello = await read_hello(reader)
        writer.write(encode_frame(FrameType.AUTH, pack(auth_for(server_key, hello,
                                                                cfg.cert_der))))
        err = await refused(task)
        assert err.code == "self", err
        assert "itself" in await refuse_reason(fr)


@pytest.mark.hostile
async def test_the_client_refuses_a_server_that_is_itself() -> None:
    """Dialling an address that answers with our own certificate (no pin: a bootstrap
    address) went through the whole handshake and connected the node to itself."""
    async def honest(fr: FramedReader, w: asyncio.StreamWriter, cfg: HandshakeConfig) -> None:
        w.write(hello_from(cfg))
        await asyncio.sleep(5)

    key = NodeKey.generate()
    async with hostile_tls_server(key, honest) as addr:
        cfg = config(key, FakeClock())
        reader, writer = await asyncio.open_connection(*addr, ssl=client_ssl_context())
        try:
            with pytest.raises(HandshakeRefused) as info:
                await asyncio.wait_for(client_handshake(reader, writer, cfg, None), 10)
        finally:
            writer.close()
    assert info.value.code == "self" and "itself" in info.value.reason
