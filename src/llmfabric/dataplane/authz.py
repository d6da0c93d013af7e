"""Per-request authorization of forwarded requests (`X-Fabric-Auth`), and its checking.

    X-Fabric-Auth: v1.<kid hex>.<request id hex>.<expiry ms, provider clock>.<mac hex>
    mac = HMAC-SHA256(session key, "v1.<kid>.<rid>.<exp>" \\n path \\n body)

The provider refuses: an unknown or expired session, an expiry already past or more than
`max_ahead_s` ahead, a MAC that does not match (a changed body or path), and a request id
it has seen before (`ReplayCache`, bounded: when full of live entries it refuses new
requests rather than forget one and allow a replay). All checks are O(1) plus one HMAC pass.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass

from llmfabric.dataplane.exchange import SessionKey

AUTH_HEADER = "X-Fabric-Auth"
REQUEST_TTL_S = 30.0


class AuthzError(Exception):
    """A forwarded request's authorization was refused; `code` says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _mac(key: bytes, prefix: bytes, path: bytes, body: bytes) -> bytes:
    h = hmac.new(key, prefix, hashlib.sha256)
    h.update(b"\n" + path + b"\n")
    h.update(body)
    return h.hexdigest().encode()


def authorize(s: SessionKey, path: bytes, body: bytes, local_now: float,
              ttl_s: float = REQUEST_TTL_S) -> tuple[bytes, bytes]:
    """(header value, request id) for one request under session `s`."""
    rid = os.urandom(12)
    exp_ms = int((local_now + s.offset + ttl_s) * 1000)
    prefix = b"v1.%s.%s.%d" % (s.kid.hex().encode(), rid.hex().encode(), exp_ms)
    return prefix + b"." + _mac(s.key, prefix, path, body), rid


class ReplayCache:
    """Request ids seen until their expiry; bounded by `max_entries` in all and, per sender,
    by `per_peer` (the provider's sessions: a quarter; one member with a session filled a
    shared cache at ~8,000 requests/s and every other ingress got `replay_cache_full`)."""

    def __init__(self, max_entries: int = 1_000_000, per_peer: int | None = None) -> None:
        self.max_entries = max_entries
        self.per_peer = per_peer if per_peer is not None else max_entries
        self._seen: set[bytes] = set()
        self._order: deque[tuple[float, bytes, str]] = deque()
        self._of: Counter[str] = Counter()  # live entries per sender

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, rid: bytes, exp: float, now: float, peer: str = "") -> None:
        """Remember `rid` (sent by `peer`) until `exp`; AuthzError if it was seen, or if the
        cache or the sender's share of it is full."""
        order, seen, of = self._order, self._seen, self._of
        while order and order[0][0] < now:
            _, old, who = order.popleft()
            seen.discard(old)
            of[who] -= 1
            if not of[who]:
                del of[who]
        if rid in seen:
            raise AuthzError("replayed", "this forwarded request was already received")
        if len(seen) >= self.max_entries or of[peer] >= self.per_peer:
            raise AuthzError("replay_cache_full", "too many forwarded requests in flight")
        seen.add(rid)
        of[peer] += 1
        order.append((exp, rid, peer))


@dataclass(frozen=True, slots=True)
class Verified:
    peer_id: str  # the ingress that sent it
    rid: bytes
    session: SessionKey


class ProviderSessions:
    """The provider's sessions (bounded: at most `per_peer` per ingress, so a member that
    keeps opening sessions evicts only its own, and `max_sessions` in all, oldest first) and
    the replay cache."""

    def __init__(self, *, max_sessions: int = 4096, per_peer: int = 4,
                 max_ahead_s: float = 120.0, replay: ReplayCache | None = None) -> None:
        self.max_sessions = max_sessions
        self.per_peer = per_peer
        self.max_ahead_s = max_ahead_s
        self.replay = replay or ReplayCache(per_peer=250_000)  # (a quarter, per ingress)
        self._sessions: OrderedDict[bytes, SessionKey] = OrderedDict()
        self._by_peer: dict[str, deque[bytes]] = {}

    def add(self, s: SessionKey) -> None:
        mine = self._by_peer.setdefault(s.peer_id, deque())
        while len(mine) >= self.per_peer:
            self._sessions.pop(mine.popleft(), None)
        mine.append(s.kid)
        self._sessions[s.kid] = s
        while len(self._sessions) > self.max_sessions:
            _, old = self._sessions.popitem(last=False)
            theirs = self._by_peer.get(old.peer_id)
            if theirs is not None:
                with contextlib.suppress(ValueError):
                    theirs.remove(old.kid)
                if not theirs:
                    del self._by_peer[old.peer_id]

    def __len__(self) -> int:
        return len(self._sessions)

    def drop_peer(self, peer_id: str) -> int:
        """Forget every session key of `peer_id` (its membership was revoked): its next
        request with one is refused. Returns how many."""
        mine = self._by_peer.pop(peer_id, deque())
        for kid in mine:
            self._sessions.pop(kid, None)
        return len(mine)

    def verify(self, header: str, path: bytes, body: bytes, now: float) -> Verified:
        parts = header.split(".")
        if len(parts) != 5 or parts[0] != "v1":
            raise AuthzError("bad_authorization", f"{AUTH_HEADER} is missing or malformed")
        _, kid_hex, rid_hex, exp_s, mac = parts
        try:
            if not exp_s.isdigit() or len(exp_s) > 16:  # (a 400-digit one overflowed below)
                raise ValueError(exp_s)
            kid, rid, exp_ms = bytes.fromhex(kid_hex), bytes.fromhex(rid_hex), int(exp_s)
        except ValueError:
            raise AuthzError("bad_authorization", f"{AUTH_HEADER} is malformed") from None
        s = self._sessions.get(kid)
        if s is None or s.expires < now:
            raise AuthzError("unknown_session", "unknown or expired data-plane session")
        exp = exp_ms / 1000
        if exp < now:
            raise AuthzError("expired", "the forwarded request's authorization expired")
        if exp > now + self.max_ahead_s:
            raise AuthzError("bad_expiry", "the authorization's expiry is too far ahead")
        prefix = header[: header.rindex(".")].encode()
        if not hmac.compare_digest(_mac(s.key, prefix, path, body), mac.encode()):
            raise AuthzError("bad_mac", "the forwarded request's authorization does not match")
        self.replay.add(rid, exp, now, s.peer_id)
        return Verified(s.peer_id, rid, s)
