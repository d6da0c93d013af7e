"""A real node with `--tls-cert/--tls-key` and `--network-secret-file`: its HTTP API speaks
TLS, and `Node.reload()` (what SIGHUP calls) swaps both the certificate and the network
secret without a restart: a peer on the new secret is refused before and admitted after."""

from __future__ import annotations

import os
import pathlib

import pytest

from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.net import HandshakeRefused, TlsTransport, TransportConfig
from llmfabric.node.config import build_config
from llmfabric.node.daemon import Node
from llmfabric.testing.tls_files import write_cert

from .test_listener_tls import served_cn_and_status

pytestmark = pytest.mark.integration

OLD, NEW = "old-secret-0123456789abcdef", "new-secret-0123456789abcdef"


async def _dial(addr: str, secret: str) -> bool:
    t = TlsTransport(NodeKey.generate(), PskAdmission("default", secret.encode()),
                     TransportConfig(host=None))
    async with t:
        try:
            await t.connect_bootstrap(addr)
        except HandshakeRefused:
            return False
    return True


async def test_tls_listener_and_secret_rotation_on_reload(tmp_path: pathlib.Path) -> None:
    cert, key, secret = tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "secret"
    write_cert(cert, key, "first")
    secret.write_text(OLD + "\n")
    os.chmod(secret, 0o600)
    node = Node(build_config({}, {
        "home": tmp_path / "n", "listen": "127.0.0.1:0", "http_listen": "127.0.0.1:0",
        "preset": "local", "network_secret_file": secret, "gpu": "cpu",
        "tls_cert": cert, "tls_key": key}))
    await node.start()
    try:
        addr = node.transport.listen_addr
        assert addr is not None
        port = int(node.http_addr.rsplit(":", 1)[1])
        assert await served_cn_and_status(port, "/healthz") == ("first", 200)
        assert await _dial(addr, OLD)
        assert not await _dial(addr, NEW)

        write_cert(cert, key, "second")
        secret.write_text(f"{NEW}\n{OLD}\n")  # rotation: new first, old still accepted
        node.reload()
        assert await served_cn_and_status(port, "/healthz") == ("second", 200)
        assert await _dial(addr, NEW) and await _dial(addr, OLD)

        secret.write_text(NEW + "\n")  # rotation done
        node.reload()
        assert await _dial(addr, NEW) and not await _dial(addr, OLD)
        secret.write_text("")  # a broken file keeps the current secret
        node.reload()
        assert await _dial(addr, NEW)
    finally:
        await node.stop(drain=False)
