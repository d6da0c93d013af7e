"""Which HTTP address a node publishes (NodeMeta.http_addr) for the direct forwarding path.

Rule: the published HTTP address must be reachable from wherever the node's published peer
addresses (NodeMeta.peer_addrs) are reachable, because an ingress that can dial the peer
address will POST requests to the HTTP address directly.

- an explicit address (`public_http_addr`) is published as given;
- a node with no published peer address (behind NAT: relays only; or not listening) is
  reached through the peer network only: none;
- bound to a specific non-loopback host: that host;
- bound to a wildcard (0.0.0.0, ::): the host of the first published peer address
  (`--public-addr`, else the transport's advertised address) with the HTTP port;
- bound to loopback: only when every published peer address is loopback too (a fabric on
  one host: the demo, tests); otherwise none, and ingresses use the authenticated peer path.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from llmfabric.net.addressbook import parse_addr

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})


def is_wildcard(host: str) -> bool:
    return host in WILDCARD_HOSTS


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and "localhost" (names other than localhost are not resolved);
    wildcards are not loopback."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def join_hostport(host: str, port: int) -> str:
    host = host.strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def published_http_addr(
    bound_host: str, port: int, peer_addrs: Sequence[str], explicit: str | None = None
) -> str:
    """The HTTP address to publish ("" for none) under the rule in the module docstring."""
    if explicit:
        return explicit
    peer_hosts = []
    for addr in peer_addrs:
        try:
            peer_hosts.append(parse_addr(addr)[0])
        except ValueError:
            continue
    if not peer_hosts:
        return ""
    if is_wildcard(bound_host):
        return join_hostport(peer_hosts[0], port)
    if is_loopback(bound_host):
        if all(is_loopback(h) for h in peer_hosts):
            return join_hostport(bound_host, port)
        return ""
    return join_hostport(bound_host, port)
