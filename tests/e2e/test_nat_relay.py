"""A node behind NAT (outbound only) is reached through a relay; wrong credentials are refused.

Topology (all namespaces created here, removed after):

    [pub] 10.201.1.2 --- 10.201.1.1 [router] 192.168.201.1 --- 192.168.201.2 [priv]
    relay + caller                MASQUERADE for 192.168.201.0/24    NATed node

`pub` has no route to 192.168.201.0/24 and the router drops NEW connections towards `priv`, so
the NATed node can only dial out: it asks the relay for a dial-back (fails), then keeps an
outbound relay connection. A caller in `pub` cannot dial it directly, but reaches it through
the relay; a caller with the wrong network secret is refused by the relay.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import pytest

pytestmark = pytest.mark.slow

RELAY = "10.201.1.2:7101"
NATED = "192.168.201.2:7103"
SELFTEST = [sys.executable, "-m", "llmfabric.net.selftest"]


def wait_file(path: pathlib.Path, proc, log: pathlib.Path, within: float = 30.0) -> dict:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if path.exists():
            return json.loads(path.read_text())
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"{path.name} not written; log:\n{log.read_text()}")


def test_nated_node_is_reached_through_the_relay(netlab, tmp_path):
    pub, router, priv = netlab.ns("pub"), netlab.ns("rtr"), netlab.ns("prv")
    _, r_pub = netlab.link(pub, "10.201.1.2/24", router, "10.201.1.1/24")
    r_priv, _ = netlab.link(router, "192.168.201.1/24", priv, "192.168.201.2/24")
    netlab.run(priv, "ip", "route", "add", "default", "via", "192.168.201.1")
    netlab.nat(router, "192.168.201.0/24", r_pub, r_priv)

    relay_ready, nated_ready = tmp_path / "relay.json", tmp_path / "nated.json"
    relay_log, nated_log = tmp_path / "relay.log", tmp_path / "nated.log"
    relay = netlab.popen(
        pub,
        [
            *SELFTEST,
            "serve",
            "--listen",
            RELAY,
            "--relay",
            "--ready-file",
            str(relay_ready),
            "--duration",
            "90",
        ],
        str(relay_log),
    )
    relay_info = wait_file(relay_ready, relay, relay_log)
    nated = netlab.popen(
        priv,
        [
            *SELFTEST,
            "serve",
            "--listen",
            NATED,
            "--bootstrap",
            RELAY,
            "--auto-relay",
            "--ready-file",
            str(nated_ready),
            "--duration",
            "90",
        ],
        str(nated_log),
    )
    nated_info = wait_file(nated_ready, nated, nated_log)
    # The dial-back through the NAT failed, so the node registered with the relay.
    assert nated_info["reachable"] is False
    assert nated_info["relays"] == [relay_info["peer_id"]]

    out = netlab.run(
        pub,
        *SELFTEST,
        "request",
        "--bootstrap",
        RELAY,
        "--target",
        nated_info["peer_id"],
        "--target-addr",
        NATED,
        "--target-relay",
        relay_info["peer_id"],
        check=False,
    )
    result = json.loads(out.strip().splitlines()[-1])
    assert result["direct"].startswith("failed"), result
    assert result["status"] == 200, result
    assert result["via"] == relay_info["peer_id"]
    assert result["body"].startswith(f"hello from {nated_info['peer_id']} to ")

    refused = netlab.run(
        pub,
        *SELFTEST,
        "request",
        "--bootstrap",
        RELAY,
        "--target",
        nated_info["peer_id"],
        "--psk",
        "not-the-network-secret-0123456789",
        check=False,
    )
    verdict = json.loads(refused.strip().splitlines()[-1])
    assert "admission refused" in verdict["refused"], verdict
    assert relay.poll() is None and nated.poll() is None
