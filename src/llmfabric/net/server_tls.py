"""TLS for the HTTP listeners (ingress API, dashboard, node API): a server context loaded
from PEM files, reloaded in place (SIGHUP): handshakes after a reload use the new
certificate, open connections keep theirs. TLS 1.2 at least."""

from __future__ import annotations

import pathlib
import ssl


class ServerTls:
    def __init__(self, cert: pathlib.Path, key: pathlib.Path) -> None:
        self.cert = cert
        self.key = key
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.reloads = 0
        self.reload()

    def reload(self) -> None:
        """Load the files again; raises (ssl.SSLError, OSError) and keeps the old pair when
        the new one is unusable."""
        self.context.load_cert_chain(self.cert, self.key)
        self.reloads += 1
