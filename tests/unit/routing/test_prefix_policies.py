"""prefix_bounded, session and cache_aware: affinity where the bound allows, never past it."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.registry.cache_sketch import build_sketch
from llmfabric.routing import Candidate, candidates_for, make_policy
from llmfabric.routing.errors import InvalidSessionIdError
from llmfabric.routing.prefix import (
    MAX_SESSION_CHARS,
    CacheAwarePolicy,
    PrefixBoundedPolicy,
    SessionAffinityPolicy,
    block_keys,
    bounded_limit,
    prompt_text,
    routing_keys,
    session_header,
    session_key,
)
from llmfabric.routing.request import RouteRequest, route_request

from .conftest import make_record

SYSTEM = "You are a helpful assistant. " * 20  # > 2 blocks, shared by every conversation


def _cands(n: int = 4) -> list[Candidate]:
    return candidates_for("m", [(make_record(f"s{i}"), False) for i in range(n)])


def _req(text: str, session: str = "") -> RouteRequest:
    return RouteRequest("m", blocks=block_keys(text), session=session)


def test_block_keys_chain_so_a_shared_prefix_shares_leading_keys() -> None:
    a = block_keys(SYSTEM + "conversation one " * 40)
    b = block_keys(SYSTEM + "conversation two " * 40)
    n = len(SYSTEM.encode()) // 256
    assert a[:n] == b[:n] and a[n] != b[n]
    assert block_keys("") == () and len(block_keys("short")) == 1


def test_prompt_text_and_session_key_read_the_body() -> None:
    doc = {"messages": [{"role": "system", "content": "S"},
                        {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
           "user": "alice", "metadata": {"session_id": "conv-9"}}
    assert prompt_text(doc) == "system\x1fS\x1euser\x1fhi"
    assert session_key(doc) == "conv-9"
    assert session_key({"user": "bob"}) == "bob" and session_key({"user": 3}) == ""
    assert routing_keys({"prompt": "abc"}) == (block_keys("abc"), "")


def test_session_id_is_a_fabric_metadata_key() -> None:
    r = route_request("m", metadata={"session_id": "x"}, session="x")
    assert r.session == "x"


def test_prefix_bounded_follows_a_conversation_to_the_node_that_served_it() -> None:
    pol = PrefixBoundedPolicy(random.Random(0))
    cands = _cands(8)
    history = SYSTEM + "user: tell me about otters. " * 12
    first = pol.explain(cands, _req(history))
    for turn in range(5):
        history += f" assistant: answer {turn}. user: and more {turn}? " * 6
        got = pol.explain(cands, _req(history))
        assert got.candidate == first.candidate
        assert got.reason == "memory" and got.matched_blocks >= 2


def test_conversations_sharing_only_the_system_prompt_spread() -> None:
    pol = PrefixBoundedPolicy(random.Random(0))
    cands = _cands(8)
    picks = [pol.explain(cands, _req(SYSTEM + f"conversation {i} " * 40)) for i in range(64)]
    assert len({p.candidate.session_id for p in picks}) >= 6
    assert {p.reason for p in picks} == {"least_loaded"}


def test_session_policy_sticks_by_key_and_spills_at_the_bound() -> None:
    pol = SessionAffinityPolicy(random.Random(0), eps=0.25)
    cands = _cands(4)
    first = pol.pick(cands, _req("x", session="c1"))
    assert all(pol.pick(cands, _req(f"other {i}", session="c1")) == first for i in range(5))
    picks = []
    for _ in range(6):  # one hot conversation, requests that never end
        got = pol.explain(cands, _req("x", session="hot"))
        pol.on_request_start(got.candidate)
        picks.append(got)
    assert picks[0].reason == "session"
    # The second request may not make s_hot hold 2 of 2 (limit ceil(1.25 * 2 / 4) = 1).
    assert picks[1].reason == "spill" and picks[1].candidate != picks[0].candidate
    assert picks[1].preferred == picks[0].candidate.session_id
    counts = pol.outstanding
    assert max(counts.values()) <= bounded_limit(sum(counts.values()) - 1, 4, 0.25)


def test_cache_aware_prefers_the_node_whose_sketch_holds_the_prompt() -> None:
    text = SYSTEM + "a long shared document " * 60
    keys = block_keys(text)
    cands = [dataclasses.replace(c, prefix_cache=build_sketch(keys) if c.session_id == "s2"
                                 else b"") for c in _cands(4)]
    pol = CacheAwarePolicy(random.Random(0))
    got = pol.explain(cands, RouteRequest("m", blocks=keys))
    assert got.candidate.session_id == "s2" and got.reason == "sketch"
    assert got.matched_blocks == len(keys)


def test_cache_aware_sketch_cannot_attract_more_than_the_bound() -> None:
    text = SYSTEM + "everyone asks this " * 60
    keys = block_keys(text)
    liar = build_sketch(keys)
    cands = [dataclasses.replace(c, prefix_cache=liar if c.session_id == "s0" else b"")
             for c in _cands(4)]
    pol = CacheAwarePolicy(random.Random(0), eps=0.25)
    for _ in range(40):
        pol.on_request_start(pol.pick(cands, RouteRequest("m", blocks=keys)))
    assert pol.outstanding["s0"] <= bounded_limit(39, 4, 0.25)


def test_new_policies_are_registered() -> None:
    for name in ("prefix_bounded", "session", "cache_aware"):
        assert make_policy(name, random.Random(0)).name == name
    with pytest.raises(ValueError):
        PrefixBoundedPolicy(random.Random(0), eps=-1)


POLICY = st.sampled_from([PrefixBoundedPolicy, SessionAffinityPolicy, CacheAwarePolicy])
OPS = st.lists(st.tuples(st.booleans(), st.integers(0, 7), st.integers(0, 5)),
               min_size=1, max_size=120)


@settings(max_examples=150, deadline=None)
@given(POLICY, st.integers(2, 8), st.floats(0.0, 1.0), OPS)
def test_bounded_load_is_never_exceeded(policy: type, n: int, eps: float,
                                        ops: list[tuple[bool, int, int]]) -> None:
    """Whatever the prompts, sessions, sketches and completions: a pick never takes a
    candidate past ceil((1 + eps) * (in_flight + 1) / n)."""
    keys = [block_keys(SYSTEM + f"doc {d} " * 80) for d in range(8)]
    cands = [dataclasses.replace(c, prefix_cache=build_sketch(keys[i % 3]))
             for i, c in enumerate(_cands(n))]
    pol = policy(random.Random(0), eps=eps)
    live: list[Candidate] = []
    for start, doc, sess in ops:
        if start or not live:
            total = sum(pol.outstanding.values())
            got = pol.explain(cands, RouteRequest("m", blocks=keys[doc], session=f"u{sess}"))
            pol.on_request_start(got.candidate)
            live.append(got.candidate)
            assert pol.outstanding[got.candidate.session_id] <= bounded_limit(total, n, eps)
            assert got.limit == bounded_limit(total, n, eps)
        else:
            pol.on_request_end(live.pop(doc % len(live)), ok=True)


def test_session_header_takes_precedence_and_is_validated() -> None:
    doc = {"user": "alice", "metadata": {"session_id": "conv-9"}}
    assert session_key(doc, session_header("hdr-1")) == "hdr-1"
    assert session_key(doc, session_header(None)) == "conv-9"
    assert session_key(doc, session_header("   ")) == "conv-9"
    assert session_header(" padded ") == "padded"
    assert session_header("x" * MAX_SESSION_CHARS) == "x" * MAX_SESSION_CHARS
    for bad in ("x" * (MAX_SESSION_CHARS + 1), "café", "a\r\nb", "a\x00b", "\u2028"):
        with pytest.raises(InvalidSessionIdError):
            session_header(bad)
    assert routing_keys(doc, "hdr-2")[1] == "hdr-2"
