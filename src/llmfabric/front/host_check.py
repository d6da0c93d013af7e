"""Which requests a browser page may have made against the operator's will, refused at both
fronts (the lean front and the aiohttp apps) by one function, `HostGuard.refusal`.

- **DNS rebinding**: a page on an attacker's domain whose name then resolves to 127.0.0.1
  (or to an intranet address) is same-origin with whatever answers there, and can read it,
  but its requests still carry the attacker's name in `Host`. A node answers only Host
  values that are IP literals (v4, or v6 in brackets; any port), `localhost`, the names of
  its own addresses (`--public-addr`, `--public-http-addr`, the listeners, the machine's
  host name) and the names given with `--allowed-host` (`*`: any). Another name gets
  421 Misdirected Request: the request named an authority this server is not configured
  for (RFC 9110, 15.5.20), not a permission the caller lacks (403 is the API's "your key
  may not"), so an SDK user is told to fix the URL or the server's names, not the key.
- **Cross-site requests**: a form or a no-cors fetch on any site can make the browser send a
  POST to an ingress without API keys (blind: it cannot read the answer). A request whose
  method may change state (anything but GET, HEAD, OPTIONS) is refused with 403 when the
  browser says it came from another site (`Sec-Fetch-Site: cross-site` or `same-site`), or,
  from browsers that do not send that header, when its `Origin` is not the `Host` it was
  sent to (Go 1.25's CrossOriginProtection does the same). API clients (SDKs, curl) send
  neither header and are never refused by it.

What is checked: on a node or ingress with API keys, the OpenAI API routes (POST routes,
`/v1/models`, `/v1/responses/...`, `/openapi.json`) are exempt: each needs a key, which a page
on another origin does not have (keys never ride in cookies), so API clients keep working under
any name (a Kubernetes Service's DNS name, a load balancer's). Every other route (dashboard,
fleet views, accounts, /healthz, /metrics) is checked, and on an ingress without keys every
route is. Hosts are looked up in a memo (as `safe_content_type` does): one dict lookup per
checked request.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from llmfabric.ingress.errors import Reply, error_reply

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", b"GET", b"HEAD", b"OPTIONS"})
_MEMO_CAP = 256
_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?\Z")  # an --allowed-host name


def allowed_names(values: Iterable[str]) -> tuple[str, ...]:
    """--allowed-host values (each may be a comma-separated list) as names, lower-case;
    ValueError names one that is not a host name (a port, scheme or path) nor "*"."""
    names = tuple(part.strip().lower() for item in values for part in item.split(",")
                  if part.strip())
    for name in names:
        if name != "*" and not _NAME.match(name):
            raise ValueError(f"--allowed-host {name!r}: give a host name (no port, scheme or "
                             "path), or '*' for any")
    return names


def host_name(value: str) -> str | None:
    """The host of a `Host` value ("name[:port]", "[v6]:port"), lower-case, without a final
    dot; the v6 literal with its brackets removed; None when it is not a host."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or (value[end + 1:] and not value[end + 1:].startswith(":")):
            return None
        return value[1:end]
    name, _, port = value.partition(":")
    if port and not port.isdigit():
        return None
    return name.removesuffix(".")


def _is_ip(name: str, bracketed: bool) -> bool:
    try:
        addr = ipaddress.ip_address(name)
    except ValueError:
        return False
    return bracketed == (addr.version == 6)


def names_of(addrs: Iterable[str | None]) -> set[str]:
    """The host names in "host:port" addresses (IP literals, wildcards and blanks dropped:
    any IP is allowed anyway)."""
    out: set[str] = set()
    for addr in addrs:
        if not addr:
            continue
        name = host_name(addr)
        if name and name not in ("*", "0.0.0.0", "::") and not _is_ip(name, ":" in name):
            out.add(name)
    return out


class HostGuard:
    """The Host names a node answers and the cross-site check (module doc). `allowed`: names
    from --allowed-host ("*" switches the Host check off) and the node's own names."""

    def __init__(self, allowed: Iterable[str] = (), *, machine_name: bool = True) -> None:
        names = {n.strip().lower().removesuffix(".") for n in allowed if n.strip()}
        self.any_host = "*" in names
        names.discard("*")
        names.add("localhost")
        if machine_name:
            names.add(socket.gethostname().lower())
        self.names = frozenset(names)
        self._seen: dict[str | bytes, bool] = {}

    def host_ok(self, host: str | bytes) -> bool:
        """Whether a request with this `Host` value may be answered (no Host: yes, it is
        not a browser's request)."""
        ok = self._seen.get(host)
        if ok is None:
            text = host.decode("latin-1") if isinstance(host, bytes) else host
            name = host_name(text)
            ok = (self.any_host or not text.strip() or (name is not None and (
                name in self.names or name.endswith(".localhost")
                or _is_ip(name, text.lstrip().startswith("[")))))
            if len(self._seen) > _MEMO_CAP:  # (values come from clients: keep it small)
                self._seen.clear()
            self._seen[host] = ok
        return ok

    def refusal(self, host: str | bytes, method: str | bytes, origin: str | bytes | None,
                fetch_site: str | bytes | None, key_protected: bool) -> Reply | None:
        """The answer to a request a browser may have made against the operator's will, or
        None to serve it. `key_protected`: the route authenticates every request (an API
        route of an ingress with keys): never refused here."""
        if key_protected:
            return None
        if not self.host_ok(host):
            return misdirected(host)
        if method in _SAFE_METHODS or (origin is None and fetch_site is None):
            return None
        return cross_site(host, origin, fetch_site)


def _shown(value: str | bytes) -> str:
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    return "".join(c for c in text[:100] if " " < c <= "~")


def misdirected(host: str | bytes) -> Reply:
    name = _shown(host_name(host.decode("latin-1") if isinstance(host, bytes) else host)
                  or host)
    return error_reply(
        421, f"this server does not answer the host name {name!r} (the Host header): it "
        "answers IP addresses, localhost and its own names; if that name is its own, its "
        f"operator adds `--allowed-host {name}` (docs/ingress.md 'Allowed hosts'). This "
        "refuses pages on other sites whose names were made to resolve to this server "
        "(DNS rebinding).", "misdirected_request")


def cross_site(host: str | bytes, origin: str | bytes | None,
               fetch_site: str | bytes | None) -> Reply | None:
    """403 for a state-changing request a browser sent from another site, else None."""
    if fetch_site is not None:
        site = fetch_site.decode("latin-1") if isinstance(fetch_site, bytes) else fetch_site
        if site.strip().lower() in ("same-origin", "none"):
            return None
    elif origin is not None:
        text = origin.decode("latin-1") if isinstance(origin, bytes) else origin
        want = host.decode("latin-1") if isinstance(host, bytes) else host
        try:
            netloc = urlsplit(text.strip()).netloc
        except ValueError:
            netloc = ""
        if netloc and netloc.lower() == want.strip().lower():
            return None
    return error_reply(
        403, "cross-origin request refused: a page of another site made this browser send "
        "it (Sec-Fetch-Site or Origin says so); API clients send neither header, and the "
        "dashboard calls its own origin", "cross_origin_request")
