"""`TransportConfig`: listen address, timeouts, queue sizes, idle closing and the connection
cap of a `TlsTransport` (see docs/network.md for how the values were chosen)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TransportConfig:
    host: str | None = "127.0.0.1"  # listen address; None: never listen (outbound only)
    port: int = 0  # 0: any free port
    public_addr: str | None = None  # advertised "host:port" (default: the bound address)
    relay: bool = False  # serve as a relay for nodes that cannot be dialled
    # Clients a relay registers, in all and from one source address (net/source_slots.py).
    # A registration's connection is never closed for idleness or the connection cap, so
    # without a cap sybil keys (free on a PSK network) held connections without bound; the
    # per-source cap is half, as for handshakes, so one host cannot take every slot while a
    # NATed site's nodes (one public address) still fit. A full relay shares its slots
    # fairly between parties (net/fair_share.py: certified providers, else /24 or /48
    # networks): a newcomer whose party holds two fewer than the largest takes that party's
    # least recently used slot. Over a cap: 503, and the client keeps trying with backoff
    # (and uses its other relays meanwhile).
    relay_max_clients: int | None = 1024
    relay_max_clients_per_ip: int | None = 512
    connect_timeout: float = 5.0  # TCP connect only (the kernel answers it, not the peer)
    # The TLS handshake, and then each peer-handshake message, must arrive within this. A
    # CPU-starved peer (event loop lagging by seconds) is slow here, so it is generous.
    handshake_timeout: float = 20.0
    # Inbound connections that have not finished their handshakes (TLS, then the peer
    # handshake) at once, in all and from one IP address; over either cap a connection is
    # closed at TCP accept and counted (handshakes_refused["busy"]); the peer retries with
    # backoff. Without them a flood of silent connections would hold a socket and TLS
    # buffers each for `handshake_timeout`, up to the process's file limit. The per-address
    # cap keeps one host from taking every slot, and is half the total because honest
    # bursts from one address happen: a NATed site, or a loopback fleet, whose handshakes
    # take seconds on a starved host (128 nodes on 2 busy cores: 70 refused at 64, none
    # at 128; docs/benchmarks.md).
    max_handshakes: int | None = 256
    max_handshakes_per_ip: int | None = 128
    # Limit for the transport's own requests (dial-back, relay registration). The dial-back
    # includes the answering peer's probe dial (connect + TLS + peer handshake).
    internal_timeout: float = 90.0
    keepalive: float = 15.0
    # A request that timed out on a connection makes it send a PING; a connection that then
    # receives nothing at all for this long is closed as dead (no FIN: a partition) instead
    # of after 3 keep-alive intervals. Generous: a CPU-starved peer answers late, and closing
    # a live connection fails the requests in flight on it.
    probe_timeout: float = 5.0
    max_pending_per_peer: int = 64  # datagrams queued while a connection is being set up
    direct_retry_after: float = 30.0  # after a failed direct dial, use relays for this long
    backoff_base: float = 0.5
    backoff_cap: float = 30.0
    # Close a connection after this long without datagrams or requests either way (pings do
    # not count); None keeps connections open. Never closes one with requests in flight or
    # a relay registration connection. A later send dials again (~3 ms CPU for both sides,
    # and a delay: a SWIM probe that must dial first may miss its timeout). 60 s caused
    # false evictions in a 128-node fleet on 2 cores (docs/network.md); 300 s closes only
    # connections to peers this node really stopped talking to.
    idle_close_s: float | None = 300.0
    # Open connections above this: close the least recently used one idle for at least
    # `evict_min_idle_s` (same exemptions). When none qualifies the cap is exceeded: cutting
    # connections in active use would only trade memory for a handshake per message.
    max_connections: int | None = 512
    evict_min_idle_s: float = 30.0
