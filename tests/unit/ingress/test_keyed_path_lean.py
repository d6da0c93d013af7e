"""The keyed request path's shortcuts change no result: the tenancy gate's no-budget fast
path (a budget set later still applies), the body usage fast path, the scanner's content-piece
count, and the rate limiter's charge for keys without limits."""

from __future__ import annotations

import datetime as dt

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.accounts import ApiKey, RateLimited, RateLimiter
from llmfabric.accounts.budgets import Budget, BudgetBook
from llmfabric.accounts.policy import MAX_TOKENS_PER_REQUEST, clamp_tokens
from llmfabric.ingress.usage import StreamUsageScanner, Usage, usage_from_body
from llmfabric.tenancy.accounts_auth import StaticPrincipal
from llmfabric.tenancy.gate import TenancyGate
from llmfabric.testing.fake_clock import FakeClock

pytestmark = pytest.mark.unit

NOON = dt.datetime(2026, 3, 31, 12, 0, tzinfo=dt.UTC).timestamp()
DOC = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 100}


async def _request(gate: TenancyGate, who: StaticPrincipal, used: int) -> object:
    try:
        refused = await gate.admit(who, DOC)
        if refused is None:
            gate.used(Usage(used, 0))
        return refused
    finally:
        gate.settle()


async def test_no_budget_means_no_hold_and_a_budget_set_later_applies_next_request() -> None:
    book = BudgetBook(lambda: NOON)
    book.set(Budget("key", "someone-else", 10, "day"))  # budgets exist, none for k1
    gate = TenancyGate(book)
    k1 = StaticPrincipal("k1")
    assert await _request(gate, k1, 5000) is None
    assert book.held == {} and book.spent == {}  # nothing reserved, nothing charged
    book.set(Budget("owner", "k1", 1000, "day"))  # (StaticPrincipal: owner = its id)
    assert await _request(gate, k1, 900) is None  # reserved, then settled to what it used
    assert book.held == {} and sum(book.spent.values()) == 900
    refused = await _request(gate, k1, 0)  # 900 spent + its reservation > 1000
    assert refused is not None and refused.status == 429


async def test_fast_path_leaves_no_state_for_the_next_request_in_the_task() -> None:
    book = BudgetBook(lambda: NOON)
    gate = TenancyGate(book)
    k1 = StaticPrincipal("k1")
    await gate.admit(k1, DOC)  # fast path: no budget
    book.set(Budget("key", "k1", 10_000, "day"))
    gate.used(Usage(7, 0))  # (of the fast-path request: there is nothing to count it on)
    gate.settle()
    assert book.spent == {}
    assert await _request(gate, k1, 3) is None
    assert sum(book.spent.values()) == 3


_counts = (st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.booleans() | st.none()
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=3))


@given(st.dictionaries(st.sampled_from(["prompt_tokens", "completion_tokens", "input_tokens",
                                        "output_tokens", "total_tokens"]), _counts))
def test_body_usage_is_the_top_level_claim_clamped(usage: dict[str, object]) -> None:
    body = orjson.dumps({"choices": [], "usage": usage})
    got = usage_from_body(body)
    p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if p is None and "input_tokens" in usage:
        p, c = usage.get("input_tokens"), usage.get("output_tokens")
    if isinstance(p, bool) or not isinstance(p, int):
        assert got is None
        return
    if isinstance(c, bool) or not isinstance(c, int):
        c = 0
    assert got == (clamp_tokens(p), clamp_tokens(c))
    assert 0 <= got[0] <= MAX_TOKENS_PER_REQUEST and 0 <= got[1] <= MAX_TOKENS_PER_REQUEST


def test_body_usage_ignores_a_nested_usage_and_non_objects() -> None:
    nested = orjson.dumps({"choices": [{"message": {"usage": {"prompt_tokens": 9,
                                                                "completion_tokens": 9}}}]})
    assert usage_from_body(nested) is None
    assert usage_from_body(b'["usage":{]') is None
    assert usage_from_body(b'{"usage":{"prompt_tokens":1,"completion_tokens":2}') is None


_PIECE_PARTS = st.sampled_from([b'"content":"', b'"content": "', b'"text":"', b'"text": "',
                                b'"', b'x', b'"content":', b'"text":', b' ', b'\n', b'data: '])


def _old_count(data: bytes) -> int:
    c = data.count
    return (c(b'"content":"') + c(b'"content": "') + c(b'"text":"') + c(b'"text": "')
            - c(b'"content":""') - c(b'"content": ""') - c(b'"text":""') - c(b'"text": ""'))


@given(st.lists(st.lists(_PIECE_PARTS, max_size=20).map(b"".join), max_size=8))
def test_content_pieces_counted_as_every_spelling_minus_its_empty_form(
        chunks: list[bytes]) -> None:
    scanner = StreamUsageScanner(strip_usage_chunk=False)
    expected = 0
    for chunk in chunks:
        line = chunk.replace(b"\n", b" ") + b"\n"  # whole lines: none held back
        scanner.feed(line)
        expected += _old_count(line)
    assert scanner.pieces == expected


def _key(tpm: int | None) -> ApiKey:
    return ApiKey(id="k1", name="n", owner="o", admin=False, created_at=0.0,
                  tokens_per_min=tpm)


def test_tokens_of_an_unlimited_key_charge_nothing_until_it_gets_a_limit() -> None:
    clock = FakeClock()
    rl = RateLimiter(clock)
    rl.check(_key(None))
    rl.add_tokens("k1", 10**6)  # unlimited: no bucket to charge
    rl.check(_key(100))  # limited now: a fresh bucket, charged from here on
    rl.add_tokens("k1", 150)
    with pytest.raises(RateLimited):
        rl.check(_key(100))
    rl.check(_key(None))  # lifted again
    rl.add_tokens("k1", 10**6)
    rl.check(_key(None))
