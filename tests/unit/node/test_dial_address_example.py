"""The error for a malformed address others connect to gives a host to dial as its example:
`--bootstrap foo` said "e.g. 0.0.0.0:7946", a listen address, which nothing can connect to."""

from __future__ import annotations

import pytest

from llmfabric.node.config import ConfigError, build_config


def test_a_malformed_bootstrap_address_is_shown_a_host_to_dial() -> None:
    with pytest.raises(ConfigError) as raised:
        build_config({}, {"bootstrap": ("foo",), "network_secret": "s" * 20})
    message = str(raised.value)
    assert "bootstrap: 'foo' is not host:port (e.g. node1.example.org:7946)" in message
    assert "0.0.0.0" not in message


def test_a_malformed_listen_address_keeps_a_listen_example() -> None:
    with pytest.raises(ConfigError, match=r"e\.g\. 0\.0\.0\.0:7946"):
        build_config({}, {"listen": "foo"})


def test_a_malformed_public_http_addr_is_shown_a_host_to_dial() -> None:
    with pytest.raises(ConfigError, match=r"e\.g\. node1\.example\.org:8090\)$"):
        build_config({}, {"public_http_addr": "gateway", "network_secret": "s" * 20})
