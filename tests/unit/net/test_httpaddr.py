"""The HTTP address a node publishes is reachable from wherever its peer addresses are."""

from __future__ import annotations

import pytest

from llmfabric.net.httpaddr import is_loopback, published_http_addr


@pytest.mark.parametrize(
    ("bound", "peer_addrs", "explicit", "expected"),
    [
        # wildcard: the host other nodes already dial for the peer channel
        ("0.0.0.0", ("10.1.2.3:7946",), None, "10.1.2.3:8090"),
        ("::", ("login1.cluster:7946",), None, "login1.cluster:8090"),
        ("0.0.0.0", ("[fd00::5]:7946",), None, "[fd00::5]:8090"),
        ("0.0.0.0", ("127.0.0.1:7946",), None, "127.0.0.1:8090"),  # one-host fabric
        # a specific non-loopback host: itself
        ("10.9.9.9", ("10.1.2.3:7946",), None, "10.9.9.9:8090"),
        # loopback: only on a fabric whose peer addresses are loopback too
        ("127.0.0.1", ("127.0.0.1:7946",), None, "127.0.0.1:8090"),
        ("localhost", ("localhost:7946", "[::1]:7946"), None, "localhost:8090"),
        ("127.0.0.1", ("10.1.2.3:7946",), None, ""),
        ("127.0.0.1", ("127.0.0.1:7946", "10.1.2.3:7946"), None, ""),
        # no published peer address (NAT, relays only; or not listening): peer path only
        ("0.0.0.0", (), None, ""),
        ("10.9.9.9", (), None, ""),
        # an explicit address always wins
        ("127.0.0.1", ("10.1.2.3:7946",), "gw.example:18090", "gw.example:18090"),
        ("0.0.0.0", (), "gw.example:18090", "gw.example:18090"),
    ],
)
def test_published_http_addr_follows_the_reachability_rule(
    bound: str, peer_addrs: tuple[str, ...], explicit: str | None, expected: str
) -> None:
    assert published_http_addr(bound, 8090, peer_addrs, explicit) == expected


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.8.0.1", "localhost", "LOCALHOST", "::1", "[::1]", " 127.0.0.1 "])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "[::]", "10.0.0.1", "example.org", "node1"])
def test_not_loopback_hosts(host: str) -> None:
    assert not is_loopback(host)
