"""HTTPS on the HTTP listeners: the lean front (ingress API) and aiohttp sites (node API,
dashboard) serve TLS from PEM files; `ServerTls.reload()` (SIGHUP) makes new connections get
the new certificate while the listener keeps running; a broken file keeps the old one."""

from __future__ import annotations

import asyncio
import pathlib
import ssl

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.x509.oid import NameOID

from llmfabric.forward import HttpForwarder
from llmfabric.front.fast_front import FastFront
from llmfabric.ingress import Ingress, IngressConfig, StaticCandidateSource
from llmfabric.net.server_tls import ServerTls
from llmfabric.testing.tls_files import write_cert

pytestmark = pytest.mark.integration


async def served_cn_and_status(port: int, path: str) -> tuple[str, int]:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    cn = x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(
        NameOID.COMMON_NAME)[0].value
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    head = await reader.readline()
    writer.close()
    return str(cn), int(head.split()[1])


async def test_fast_front_and_aiohttp_serve_tls_and_reload(tmp_path: pathlib.Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    write_cert(cert, key, "first")
    tls = ServerTls(cert, key)
    fwd = HttpForwarder()
    front = FastFront(Ingress(IngressConfig(auth_enabled=False), StaticCandidateSource([]),
                              fwd))
    port = await front.start("127.0.0.1", 0, ssl=tls.context)
    async def healthz(_r: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.context)
    await site.start()
    aport = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        assert await served_cn_and_status(port, "/v1/models") == ("first", 200)
        assert await served_cn_and_status(aport, "/healthz") == ("first", 200)
        write_cert(cert, key, "second")
        tls.reload()
        assert await served_cn_and_status(port, "/v1/models") == ("second", 200)
        assert await served_cn_and_status(aport, "/healthz") == ("second", 200)
        key.write_text("garbage")
        with pytest.raises((ssl.SSLError, OSError, ValueError)):
            tls.reload()
        assert await served_cn_and_status(port, "/v1/models") == ("second", 200)
    finally:
        await front.aclose()
        await fwd.aclose()
        await runner.cleanup()
