"""Laws of the data plane's pieces in-process: the exchange only works with the right keys,
an authorization verifies exactly once and only for its path and body, the replay cache is
bounded and fails closed, sealing detects any change, sessions per peer are capped."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.dataplane.authz import AuthzError, ProviderSessions, ReplayCache, authorize
from llmfabric.dataplane.exchange import ExchangeError, answer, finish, offer
from llmfabric.dataplane.sealing import (
    DATA,
    END,
    HEAD,
    FrameOpener,
    Sealer,
    open_body,
    open_trace,
    seal_body,
    seal_trace,
)
from llmfabric.identity import NodeKey

pytestmark = pytest.mark.unit

ING, PROV, OTHER = NodeKey.generate(), NodeKey.generate(), NodeKey.generate()


def _pair(now: float = 1000.0):  # type: ignore[no-untyped-def]
    sent = offer(ING, PROV.peer_id)
    msg, provider_side = answer(PROV, sent.message, now, https_port=443)
    return finish(sent, msg, now), provider_side


def test_exchange_agrees_and_binds_identities() -> None:
    ingress_side, provider_side = _pair()
    assert ingress_side.key == provider_side.key and ingress_side.kid == provider_side.kid
    assert provider_side.peer_id == ING.peer_id and ingress_side.peer_id == PROV.peer_id
    sent = offer(ING, PROV.peer_id)
    with pytest.raises(ExchangeError, match="another node"):
        answer(OTHER, sent.message, 0.0)  # addressed to PROV
    msg, _ = answer(PROV, sent.message, 0.0)
    forged = offer(ING, OTHER.peer_id)  # an answer from PROV to an offer for OTHER
    with pytest.raises(ExchangeError):
        finish(forged, msg, 0.0)
    tampered = bytearray(sent.message)
    tampered[-5] ^= 1
    with pytest.raises(ExchangeError):
        answer(PROV, bytes(tampered), 0.0)


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=2000), st.binary(min_size=1, max_size=64))
def test_an_authorization_verifies_once_and_only_for_its_body(body: bytes, extra: bytes
                                                              ) -> None:
    s, ps = _pair(time.time())
    sessions = ProviderSessions()
    sessions.add(ps)
    header, _ = authorize(s, b"/p", body, time.time())
    with pytest.raises(AuthzError, match="does not match"):
        sessions.verify(header.decode(), b"/p", body + extra, time.time())
    with pytest.raises(AuthzError, match="does not match"):
        sessions.verify(header.decode(), b"/q", body, time.time())
    assert sessions.verify(header.decode(), b"/p", body, time.time()).peer_id == ING.peer_id
    with pytest.raises(AuthzError, match="already received"):
        sessions.verify(header.decode(), b"/p", body, time.time())


def test_replay_cache_is_bounded_and_fails_closed() -> None:
    cache = ReplayCache(max_entries=3)
    for i in range(3):
        cache.add(bytes([i]), exp=10.0, now=0.0)
    with pytest.raises(AuthzError, match="too many"):
        cache.add(b"x", exp=10.0, now=0.0)
    cache.add(b"x", exp=20.0, now=11.0)  # the others expired: room again
    assert len(cache) == 1
    with pytest.raises(AuthzError, match="already"):
        cache.add(b"x", exp=20.0, now=12.0)


def test_sessions_per_peer_are_capped() -> None:
    sessions = ProviderSessions(per_peer=2, max_sessions=100)
    _, honest = _pair()
    sessions.add(honest)
    for _ in range(50):  # a member opening session after session
        sent = offer(OTHER, PROV.peer_id)
        sessions.add(answer(PROV, sent.message, 1000.0)[1])
    assert len(sessions) == 3
    assert sessions._sessions.get(honest.kid) is honest


@pytest.mark.hostile
def test_the_sealed_trace_context_hides_the_trace_and_detects_any_change() -> None:
    """A relay saw each relayed request's `traceparent`: the trace id linked the hops of one
    trace. Sealed, one length for traced and untraced requests; changed, moved to another
    request or path, or oversized, it is a bad_seal."""
    key, rid, aad = b"k" * 32, b"r" * 12, b"prefix\n/path"
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    sealed, none = seal_trace(key, rid, aad, tp), seal_trace(key, rid, aad, "")
    assert "4bf92f35" not in sealed and len(sealed) == len(none)
    assert open_trace(key, rid, aad, sealed) == tp and open_trace(key, rid, aad, none) is None
    flipped = sealed[:5] + ("A" if sealed[5] != "A" else "B") + sealed[6:]
    for k, r, a, v in ((key, rid, aad, flipped), (key, b"x" * 12, aad, sealed),
                       (key, rid, b"prefix\n/other", sealed), (key, rid, aad, "%%%"),
                       (key, rid, aad, "A" * 600)):
        with pytest.raises(AuthzError, match="trace context"):
            open_trace(k, r, a, v)
    # (its key differs from the body's: the same request id is no reused nonce)
    assert seal_body(key, rid, aad, tp.encode().ljust(64, b"\0")) != base64_decode(sealed)


def base64_decode(value: str) -> bytes:
    import base64

    return base64.urlsafe_b64decode(value)


def test_sealing_detects_any_change() -> None:
    key, rid = b"k" * 32, b"r" * 12
    sealed = seal_body(key, rid, b"aad", b"hello")
    assert open_body(key, rid, b"aad", sealed) == b"hello"
    with pytest.raises(AuthzError):
        open_body(key, rid, b"aad", sealed[:-1] + bytes([sealed[-1] ^ 1]))
    with pytest.raises(AuthzError):
        open_body(key, rid, b"other path", sealed)
    sealer = Sealer(key, rid)
    frames = [sealer.head(200, "text/event-stream"), sealer.frame(DATA, b"a"),
              sealer.frame(DATA, b"b"), sealer.frame(END, b"")]
    wire = b"".join(frames)
    opener = FrameOpener(key, rid)
    got = [opener.feed(wire[i:i + 7]) for i in range(0, len(wire), 7)]
    kinds = [k for part in got for k, _ in part]
    assert kinds == [HEAD, DATA, DATA, END] and opener.ended
    reordered = frames[0] + frames[2] + frames[1]
    with pytest.raises(AuthzError):
        FrameOpener(key, rid).feed(reordered)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=30),
       st.lists(st.integers(1, 400), min_size=1, max_size=20))
def test_frames_open_the_same_however_the_stream_is_cut(payloads: list[bytes],
                                                        cuts: list[int]) -> None:
    """Law: the opener yields the sealer's frames, in order, whatever chunks the wire comes
    in (one chunk of many frames included: it is read by offset, not re-sliced per frame)."""
    key, rid = b"k" * 32, b"r" * 12
    sealer = Sealer(key, rid)
    wire = b"".join([sealer.head(200, "text/plain"),
                     *(sealer.frame(DATA, p) for p in payloads), sealer.frame(END, b"")])
    opener, got, pos, i = FrameOpener(key, rid), [], 0, 0
    while pos < len(wire):
        step = cuts[i % len(cuts)]
        got += opener.feed(wire[pos:pos + step])
        pos, i = pos + step, i + 1
    whole = FrameOpener(key, rid).feed(wire)
    assert got == whole and [p for k, p in got if k == DATA] == payloads and opener.ended


@pytest.mark.hostile
@pytest.mark.parametrize("provider_now", [float("inf"), float("nan"), 1e308, -1e308])
def test_an_answer_with_an_impossible_clock_is_refused(provider_now: float) -> None:
    """A provider's signed `now`/`exp` reach the ingress's authorization arithmetic: inf
    raised OverflowError there (not an UpstreamError, so the request was not retried)."""
    sent = offer(ING, PROV.peer_id)
    msg, _ = answer(PROV, sent.message, provider_now)
    with pytest.raises(ExchangeError, match="clock"):
        finish(sent, msg, 1000.0)
    msg, _ = answer(PROV, sent.message, 1000.0 + 3600.0)  # an hour off: skew, still taken
    assert finish(sent, msg, 1000.0).offset == 3600.0


@pytest.mark.hostile
def test_an_expiry_of_hundreds_of_digits_is_a_clean_refusal() -> None:
    ps = ProviderSessions()
    ingress_side, provider_side = _pair()
    ps.add(provider_side)
    header, _ = authorize(ingress_side, b"/p", b"", 1000.0)
    parts = header.decode().split(".")
    parts[3] = "9" * 400
    with pytest.raises(AuthzError) as err:
        ps.verify(".".join(parts), b"/p", b"", 1000.0)
    assert err.value.code == "bad_authorization"


@pytest.mark.hostile
def test_one_sender_cannot_fill_the_replay_cache_for_the_others() -> None:
    """The provider's replay cache is shared by every ingress: one member with a session
    filled it (~8,000 requests/s) and the others got `replay_cache_full`."""
    cache = ReplayCache(max_entries=8, per_peer=3)
    for i in range(3):
        cache.add(bytes([i]), exp=10.0, now=0.0, peer="mallory")
    with pytest.raises(AuthzError) as err:
        cache.add(b"m", exp=10.0, now=0.0, peer="mallory")
    assert err.value.code == "replay_cache_full"
    for i in range(3):
        cache.add(bytes([100 + i]), exp=10.0, now=0.0, peer="honest")
    cache.add(b"m", exp=20.0, now=11.0, peer="mallory")  # its entries expired: room again


@pytest.mark.hostile
def test_a_revoked_ingress_s_session_keys_are_dropped() -> None:
    """A revoked member kept using the data-plane session keys it held (up to an hour)."""
    s, ps = _pair(time.time())
    sessions = ProviderSessions()
    sessions.add(ps)
    assert sessions.drop_peer(ING.peer_id) == 1 and len(sessions) == 0
    header, _ = authorize(s, b"/p", b"", time.time())
    with pytest.raises(AuthzError):
        sessions.verify(header.decode(), b"/p", b"", time.time())
    assert sessions.drop_peer(ING.peer_id) == 0
