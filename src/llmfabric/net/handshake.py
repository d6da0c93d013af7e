"""TLS contexts and the application handshake that authenticates and admits both sides.

Python's ssl module cannot verify a self-signed *client* certificate with custom logic, so:

1. TLS 1.3 with the server's self-signed node certificate. The client does not use CA
   verification; it reads the server certificate, checks its self-signature, derives the
   server's peer id from the certified key and compares it with the expected (pinned) id.
2. Server -> HELLO {network, admission kind, server nonce}.
3. Client -> AUTH {client peer id, public key, client nonce, signature, admission proof}; the
   signature covers (label || server nonce || sha256(server certificate) || client peer id),
   so it proves the client key and is bound to this TLS server (not replayable elsewhere).
4. Server checks key -> peer id, the signature and the admission proof, then ACCEPT {server
   admission proof} or REFUSE {reason}.
5. Client checks the server's admission proof, then CONFIRM or REFUSE {reason}.

A node never connects to itself: the client stops when the server's certificate carries its
own peer id, the server refuses an AUTH that proves its own key (code "self").

Handshake messages are msgpack maps inside frames (see framing.py).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import tempfile
from dataclasses import dataclass
from typing import Any

import msgpack

from llmfabric.clock import Clock, with_timeout
from llmfabric.identity.admission import Admission, AdmissionContext
from llmfabric.identity.certs import cert_identity, cert_pem, fingerprint
from llmfabric.identity.errors import AdmissionError, CertificateRevoked, IdentityError
from llmfabric.identity.keys import NodeKey, is_valid
from llmfabric.identity.peer_id import matches
from llmfabric.net.errors import FrameError, HandshakeRefused, OversizedFrame
from llmfabric.net.framing import Frame, FrameDecoder, FrameType, encode_frame

_SIG_LABEL = b"llmfabric-client-auth-v1\x00"
NONCE_LEN = 32
# Largest handshake message: AUTH with a membership certificate (at most MAX_CERT_BYTES) is
# under 5 KiB. Before a peer is admitted, anyone who completes a TLS handshake could otherwise
# send a 1 MiB frame (the connection limit), buffered whole and then decoded: 1 MiB of empty
# msgpack maps took 72 MiB and blocked the event loop for 0.1 s per connection.
HANDSHAKE_MAX_PAYLOAD = 16 * 1024


def server_ssl_context(key: NodeKey, cert_der: bytes) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    # load_cert_chain only reads files: write both to a private temp dir, load, delete.
    with tempfile.TemporaryDirectory(prefix="llmfabric-tls-") as tmp:
        cert_path = os.path.join(tmp, "cert.pem")
        key_path = os.path.join(tmp, "key.pem")
        for path, data in ((cert_path, cert_pem(cert_der)), (key_path, key.private_pem())):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        ctx.load_cert_chain(cert_path, key_path)
    return ctx


def client_ssl_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # identity is checked by pinning the derived peer id
    return ctx


class FramedReader:
    """Reads whole frames from a stream, keeping any frames decoded ahead."""

    def __init__(self, reader: asyncio.StreamReader, decoder: FrameDecoder) -> None:
        self.reader = reader
        self.decoder = decoder
        self.pending: list[Frame] = []

    async def read_frame(self, limit: int | None = None) -> Frame | None:
        """The next frame; with `limit`, OversizedFrame as soon as more than `limit` bytes
        are buffered without a whole frame, or the frame is larger (frames decoded ahead
        of it are not limited: a peer may pipeline after its last handshake frame)."""
        while not self.pending:
            data = await self.reader.read(65536)
            if not data:
                return None
            self.pending.extend(self.decoder.feed(data))
            if limit is not None and not self.pending and self.decoder.buffered > limit:
                raise OversizedFrame(f"handshake frame over {limit} bytes")
        frame = self.pending.pop(0)
        if limit is not None and len(frame.payload) > limit:
            raise OversizedFrame(f"handshake frame of {len(frame.payload)} bytes > {limit}")
        return frame


@dataclass(frozen=True, slots=True)
class HandshakeConfig:
    key: NodeKey
    cert_der: bytes
    admission: Admission
    clock: Clock
    timeout: float = 10.0


def _pack(obj: dict[str, Any]) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


async def _expect(fr: FramedReader, ftype: FrameType, cfg: HandshakeConfig) -> dict[str, Any]:
    try:
        frame = await with_timeout(cfg.clock, fr.read_frame(HANDSHAKE_MAX_PAYLOAD), cfg.timeout)
    except TimeoutError as exc:
        raise HandshakeRefused("peer did not answer the handshake in time", code="timeout") from exc
    except FrameError as exc:
        raise HandshakeRefused(f"garbled handshake: {exc}", code=exc.code) from exc
    if frame is None:
        raise HandshakeRefused("peer closed the connection during the handshake", code="closed")
    try:
        msg = msgpack.unpackb(frame.payload, raw=False)
    except Exception as exc:
        raise HandshakeRefused("garbled handshake message", code="garbled") from exc
    if not isinstance(msg, dict):
        raise HandshakeRefused("garbled handshake message", code="garbled")
    if frame.type == FrameType.REFUSE:
        # The peer's own words, logged: quoted and cut so they cannot forge log lines.
        reason = str(msg.get("reason", "?"))[:200]
        raise HandshakeRefused(f"peer refused us: {reason!r}", code="refused_by_peer")
    if frame.type != ftype:
        raise HandshakeRefused(
            f"expected {ftype.name}, got frame type {frame.type}", code="garbled"
        )
    return msg


def _field(msg: dict[str, Any], name: str, kind: type) -> Any:
    value = msg.get(name)
    if not isinstance(value, kind):
        raise HandshakeRefused(f"handshake field {name!r} missing or wrong type", code="garbled")
    return value


def _code(exc: AdmissionError) -> str:
    """The refusal's code (counted in NetStats.handshakes_refused)."""
    return "revoked" if isinstance(exc, CertificateRevoked) else "admission"


def _refuse(writer: asyncio.StreamWriter, reason: str) -> None:
    writer.write(encode_frame(FrameType.REFUSE, _pack({"reason": reason})))


async def client_handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    cfg: HandshakeConfig,
    expected_peer: str | None,
    *,
    probe: bool = False,
) -> tuple[str, FramedReader, str]:
    """Run the dialler's side on an established TLS stream; return (server peer id, reader,
    the member its admission proof vouches for: `Admission.check`)."""
    ssl_obj = writer.get_extra_info("ssl_object")
    der = ssl_obj.getpeercert(binary_form=True) if ssl_obj is not None else None
    if not der:
        raise HandshakeRefused("peer presented no TLS certificate", code="no_cert")
    try:
        server_id, _ = cert_identity(der)
    except IdentityError as exc:
        raise HandshakeRefused(str(exc), code="bad_signature") from exc
    if expected_peer is not None and server_id != expected_peer:
        raise HandshakeRefused(
            f"peer id mismatch: expected {expected_peer}, the address answers as {server_id}",
            code="pin_mismatch",
        )
    if server_id == cfg.key.peer_id:  # (a bootstrap address that points back here)
        raise HandshakeRefused(
            f"the address answers as this node itself ({server_id}): a node does not "
            "connect to itself", code="self")
    fr = FramedReader(reader, FrameDecoder())
    hello = await _expect(fr, FrameType.HELLO, cfg)
    network = _field(hello, "network", str)
    kind = _field(hello, "kind", str)
    server_nonce = _field(hello, "nonce", bytes)
    if network != cfg.admission.network or kind != cfg.admission.kind:
        reason = (
            f"network/admission mismatch: peer is {network!r}/{kind}, "
            f"we are {cfg.admission.network!r}/{cfg.admission.kind}"
        )
        _refuse(writer, reason)
        raise HandshakeRefused(reason, code="admission")
    me = cfg.key.peer_id
    client_nonce = os.urandom(NONCE_LEN)
    ctx = AdmissionContext(
        cfg.admission.network, me, server_id, "client", client_nonce, server_nonce, cfg.clock.wall()
    )
    sig = cfg.key.sign(_SIG_LABEL + server_nonce + fingerprint(der) + me.encode())
    writer.write(
        encode_frame(
            FrameType.AUTH,
            _pack(
                {
                    "peer_id": me,
                    "public_key": cfg.key.public_bytes,
                    "nonce": client_nonce,
                    "sig": sig,
                    "proof": cfg.admission.prove(ctx),
                    "probe": probe,
                }
            ),
        )
    )
    await writer.drain()
    accept = await _expect(fr, FrameType.ACCEPT, cfg)
    proof = _field(accept, "proof", bytes)
    sctx = AdmissionContext(
        cfg.admission.network, server_id, me, "server", client_nonce, server_nonce, cfg.clock.wall()
    )
    try:
        member = cfg.admission.check(proof, sctx)
    except AdmissionError as exc:
        _refuse(writer, f"your admission proof was rejected: {exc}")
        raise HandshakeRefused(f"server failed admission: {exc}", code=_code(exc)) from exc
    writer.write(encode_frame(FrameType.CONFIRM, _pack({})))
    await writer.drain()
    return server_id, fr, member


async def server_handshake(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cfg: HandshakeConfig
) -> tuple[str, FramedReader, bool, str]:
    """Run the listener's side; return (authenticated client peer id, reader, is a probe,
    the member its admission proof vouches for: `Admission.check`).

    A probe (dial-back check) only proves the identity; the connection is not kept."""
    fr = FramedReader(reader, FrameDecoder())
    server_nonce = os.urandom(NONCE_LEN)
    me = cfg.key.peer_id
    writer.write(
        encode_frame(
            FrameType.HELLO,
            _pack(
                {
                    "network": cfg.admission.network,
                    "kind": cfg.admission.kind,
                    "nonce": server_nonce,
                    "peer_id": me,
                }
            ),
        )
    )
    await writer.drain()
    auth = await _expect(fr, FrameType.AUTH, cfg)
    client_id = _field(auth, "peer_id", str)
    public_key = _field(auth, "public_key", bytes)
    client_nonce = _field(auth, "nonce", bytes)
    sig = _field(auth, "sig", bytes)
    proof = _field(auth, "proof", bytes)
    if len(client_nonce) != NONCE_LEN:
        _refuse(writer, "bad nonce")
        raise HandshakeRefused("client nonce has the wrong length", code="garbled")
    if not matches(client_id, public_key):
        _refuse(writer, "peer id does not derive from the presented key")
        raise HandshakeRefused("client peer id does not match its key", code="bad_signature")
    if not is_valid(
        public_key, _SIG_LABEL + server_nonce + fingerprint(cfg.cert_der) + client_id.encode(), sig
    ):
        _refuse(writer, "handshake signature is invalid")
        raise HandshakeRefused("client handshake signature is invalid", code="bad_signature")
    if client_id == me:  # it holds our key: this node dialling itself, or a clone of it
        _refuse(writer, "you are this node itself (same peer id): a node does not connect to "
                        "itself; do two processes share one node key?")
        await writer.drain()
        raise HandshakeRefused(f"the dialler is this node itself ({me}): refused", code="self")
    ctx = AdmissionContext(
        cfg.admission.network, client_id, me, "client", client_nonce, server_nonce, cfg.clock.wall()
    )
    try:
        member = cfg.admission.check(proof, ctx)
    except AdmissionError as exc:
        _refuse(writer, f"admission refused: {exc}")
        await writer.drain()
        raise HandshakeRefused(f"client failed admission: {exc}", code=_code(exc)) from exc
    sctx = AdmissionContext(
        cfg.admission.network, me, client_id, "server", client_nonce, server_nonce, cfg.clock.wall()
    )
    writer.write(encode_frame(FrameType.ACCEPT, _pack({"proof": cfg.admission.prove(sctx)})))
    await writer.drain()
    await _expect(fr, FrameType.CONFIRM, cfg)
    return client_id, fr, auth.get("probe") is True, member
