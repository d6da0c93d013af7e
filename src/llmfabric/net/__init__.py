"""Transport: TLS peer channels with pinned peer ids, bootstrap and backoff, reachability, relays.

Files (one concept each; see docs/network.md for the protocol):
- transport.py: the `Transport` Protocol gossip/membership use (send / set_handler / local_id).
- config.py: `TransportConfig` (listen address, timeouts, queues, idle closing, the cap).
- tls_transport.py: `TlsTransport`, the real implementation: listener, dialling with
  peer-id pinning, datagrams, the peer request API, bootstrap with backoff.
- limits.py: `ConnectionLimits`, idle-connection closing and the open-connection cap.
- serving.py: `serve_request`, one incoming request (relay origin, internal paths, handler).
- opener.py: `ConnectionOpener`, an authenticated `PeerConnection` from a TLS stream, both
  ways (`dial`, `accept`): tlsstream + handshake, refused handshakes counted by code.
- handshake.py: TLS contexts and the application handshake (client signature, admission).
- tlsstream.py: TLS stream open/serve with a small receive buffer (memory per connection);
  the server counts connections mid-handshake against caps from TCP accept on.
- fd_limit.py: `raise_open_file_limit`, the soft open-file limit lifted towards the hard
  one at start-up (1,024 is common; a node needs more sockets than that under load).
- source_slots.py: `SourceSlots` (counts per process and per source address under caps)
  and `HeldSlot` (one connection's slot, given back exactly once).
- fair_share.py: `FairShare`, a full relay's registrations shared max-min fairly per party
  (`relay_party`: a certificate's provider, or a source /24 or /48 on PSK networks).
- framing.py: versioned length-prefixed frames, `FrameDecoder`.
- connection.py: `PeerConnection`, one authenticated connection: dispatch, keep-alive.
- h2endpoint.py: an HTTP/2 session (sans-IO h2) carried in frames; two per connection.
- h2limits.py: what a peer can make a session buffer (advertised frame size, header list,
  windows) and `FrameGate`, which refuses an oversized frame at its header.
- tcp_keepalive.py: `KeepAlive`, `set_keepalive`, `start_watched_server`: TCP keepalive +
  TCP_USER_TIMEOUT on connections we dial and accept (dead-peer detection on both ends of
  the direct path).
- messages.py: `PeerRequest`, `PeerResponse`, `HandlerResponse`.
- relay.py: dial-back reachability check (`Reachability`), relay client (persistent
  outbound) and server.
- relay_methods.py: `RelayMethods`, the transport's dial-back and relay API (mixed into
  `TlsTransport`).
- relaykeeper.py: `RelayKeeper`, keeps a NATed node registered with >= N live relays
  (re-selects when one leaves or never answers; backoff).
- addressbook.py: peer id -> direct addresses and relays; `parse_addr`, `host_addrs`.
- httpaddr.py: `published_http_addr`, the HTTP address a node may publish (reachability rule).
- server_tls.py: `ServerTls`, TLS for the HTTP listeners from PEM files, reloaded in place.
- bootstrap.py: `run_bootstrap`, the retry loop over bootstrap addresses (injected clock).
- backoff.py: exponential backoff with full jitter.
- stats.py: `NetStats` counters (bytes, datagrams, drops by reason, refused handshakes).
- errors.py: `NetError` > PeerUnreachable, HandshakeRefused, RequestFailed (> PeerClosed),
  FrameError.
- linkprobe.py: `LinkProber` (bounded-rate RTT / throughput probes of peers, injected
  clock and probe), `fit_link` (min-filtered fit of a probe's repeated small / large
  requests), `LinkTable` (bounded, smoothed), `parse_link_table` (hostile input).
- link_service.py: `LinkService`, link measurement over the peer protocol: the real probe
  on a `TlsTransport` (drives `LinkProber`), the probe sink and link-table paths a node
  answers, the fabric view (every live peer's table: /v1/fabric/links).
- ports.py: `free_port`, a loopback port picked below the kernel's ephemeral range for a
  process that binds it later (engines a node starts, local fabrics, tests).
- selftest.py: a small node process (`python -m llmfabric.net.selftest`) for e2e tests.
"""

from llmfabric.net.config import TransportConfig
from llmfabric.net.errors import (
    FrameError,
    HandshakeRefused,
    NetError,
    PeerClosed,
    PeerUnreachable,
    RequestFailed,
)
from llmfabric.net.messages import HandlerResponse, PeerRequest, PeerResponse
from llmfabric.net.relay import Reachability
from llmfabric.net.stats import NetStats
from llmfabric.net.tls_transport import TlsTransport
from llmfabric.net.transport import Transport

__all__ = [
    "FrameError",
    "HandlerResponse",
    "HandshakeRefused",
    "NetError",
    "NetStats",
    "PeerClosed",
    "PeerRequest",
    "PeerResponse",
    "PeerUnreachable",
    "Reachability",
    "RequestFailed",
    "TlsTransport",
    "Transport",
    "TransportConfig",
]
