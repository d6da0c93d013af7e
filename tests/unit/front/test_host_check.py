"""HostGuard (front/host_check.py): which Host values a node answers (DNS rebinding)
and which state-changing requests a browser sent from another site."""

from __future__ import annotations

import socket

import orjson
import pytest

from llmfabric.front.host_check import HostGuard, allowed_names, names_of

pytestmark = [pytest.mark.unit, pytest.mark.hostile]


@pytest.mark.parametrize("host", [
    "127.0.0.1", "127.0.0.1:8090", "10.1.2.3:80", "[::1]", "[::1]:8090",
    "[fe80::1%25eth0]:1", "localhost", "LOCALHOST:8090", "localhost.:1", "app.localhost:5",
    "ingress.example.org", "Ingress.Example.Org:443", "box.lan:8090", "",
])
def test_ip_literals_localhost_and_own_names_are_answered(host: str) -> None:
    guard = HostGuard(["box.lan", *names_of(["ingress.example.org:7946", "0.0.0.0:8090"])])
    assert guard.host_ok(host) and guard.host_ok(host.encode())
    assert guard.refusal(host, "GET", None, None, False) is None


@pytest.mark.parametrize("host", [
    "evil.example", "evil.example:8090", "127.0.0.1.nip.io", "ingress.example.org.evil.io",
    "::1", "[evil]:80", "[::1]x", "localhost:http", "1.2.3.4:80@evil", "7f000001.rbndr.us",
])
def test_other_names_get_421_naming_the_option(host: str) -> None:
    guard = HostGuard(["ingress.example.org"], machine_name=False)
    assert not guard.host_ok(host)
    reply = guard.refusal(host.encode(), b"GET", None, None, False)
    assert reply is not None and reply.status == 421
    err = orjson.loads(reply.body)["error"]
    assert err["code"] == "misdirected_request" and "--allowed-host" in err["message"]


def test_the_machine_name_is_answered_and_star_answers_any() -> None:
    assert HostGuard().host_ok(f"{socket.gethostname()}:8090")
    assert HostGuard(["*"]).host_ok("evil.example")


def test_key_protected_routes_are_never_refused() -> None:
    guard = HostGuard(machine_name=False)
    assert guard.refusal("evil.example", "POST", "https://evil.example", "cross-site",
                         True) is None


@pytest.mark.parametrize(("origin", "site"), [
    ("https://evil.example", None), ("null", None), ("http://127.0.0.1:9999", None),
    (None, "cross-site"), (None, "same-site"), ("http://127.0.0.1:8090", "cross-site"),
])
def test_state_changing_requests_from_another_site_get_403(origin: str | None,
                                                           site: str | None) -> None:
    guard = HostGuard(machine_name=False)
    reply = guard.refusal("127.0.0.1:8090", "POST", origin, site, False)
    assert reply is not None and reply.status == 403
    assert orjson.loads(reply.body)["error"]["code"] == "cross_origin_request"
    assert guard.refusal("127.0.0.1:8090", "GET", origin, site, False) is None  # (reads)


@pytest.mark.parametrize(("origin", "site"), [
    (None, None),  # curl, SDKs
    ("http://127.0.0.1:8090", None), ("HTTP://127.0.0.1:8090", None),
    ("https://evil.example", "same-origin"), (None, "none"),
])
def test_api_clients_and_same_origin_pages_pass(origin: str | None, site: str | None) -> None:
    assert HostGuard().refusal("127.0.0.1:8090", "POST", origin, site, False) is None


def test_allowed_names_are_host_names() -> None:
    assert allowed_names(["A.example, b", "*"]) == ("a.example", "b", "*")
    for bad in ("http://a", "a:80", "a/b", "a b", "[::1]"):
        with pytest.raises(ValueError, match="--allowed-host"):
            allowed_names([bad])


def test_the_memo_stays_small() -> None:
    guard = HostGuard(machine_name=False)
    for i in range(2000):
        guard.host_ok(f"n{i}.evil.example")
    assert len(guard._seen) <= 257
