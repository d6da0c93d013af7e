from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.accounts import ApiKey, RateLimited, RateLimiter
from llmfabric.testing.fake_clock import FakeClock


def key(rpm: int | None = None, tpm: int | None = None, kid: str = "k1") -> ApiKey:
    return ApiKey(id=kid, name="n", owner="o", admin=False, created_at=0.0,
                  requests_per_min=rpm, tokens_per_min=tpm)


async def test_requests_per_min_refuses_then_refills() -> None:
    clock = FakeClock()
    rl = RateLimiter(clock)
    k = key(rpm=3)
    for _ in range(3):
        rl.check(k)
    with pytest.raises(RateLimited) as err:
        rl.check(k)
    assert err.value.retry_after_s == pytest.approx(20.0)
    assert "requests/min" in str(err.value)
    await clock.advance(20.0)
    rl.check(k)
    with pytest.raises(RateLimited):
        rl.check(k)


async def test_tokens_per_min_charged_after_response() -> None:
    clock = FakeClock()
    rl = RateLimiter(clock)
    k = key(tpm=600)  # 10 tokens/s
    rl.check(k)
    rl.add_tokens(k.id, 700)  # overdraw by 100 tokens
    with pytest.raises(RateLimited) as err:
        rl.check(k)
    assert err.value.retry_after_s == pytest.approx(10.1)
    await clock.advance(10.2)
    rl.check(k)


def test_unlimited_key_never_limited() -> None:
    rl = RateLimiter(FakeClock())
    k = key()
    for _ in range(10_000):
        rl.check(k)
    rl.add_tokens(k.id, 10**9)
    rl.check(k)


def test_lifted_limits_take_effect_at_once_and_come_back_fresh() -> None:
    rl = RateLimiter(FakeClock())
    limited = key(rpm=1, tpm=100)
    rl.check(limited)
    rl.add_tokens(limited.id, 10**6)  # deep in token debt
    with pytest.raises(RateLimited):
        rl.check(limited)
    lifted = key()  # the same key, its limits removed
    for _ in range(100):
        rl.check(lifted)
    rl.add_tokens(lifted.id, 10**6)  # not charged anywhere
    rl.check(limited)  # limits back: full buckets, no old debt
    with pytest.raises(RateLimited):
        rl.check(limited)


def test_keys_are_independent() -> None:
    rl = RateLimiter(FakeClock())
    a, b = key(rpm=1, kid="a"), key(rpm=1, kid="b")
    rl.check(a)
    rl.check(b)
    with pytest.raises(RateLimited):
        rl.check(a)


@given(rpm=st.integers(min_value=1, max_value=50), attempts=st.integers(0, 200))
def test_never_admits_more_than_limit_without_time_passing(rpm: int, attempts: int) -> None:
    rl = RateLimiter(FakeClock())
    k = key(rpm=rpm)
    admitted = 0
    for _ in range(attempts):
        try:
            rl.check(k)
            admitted += 1
        except RateLimited as exc:
            assert exc.retry_after_s > 0
    assert admitted == min(rpm, attempts)


async def test_a_hold_is_given_back_capped_at_one_minute() -> None:
    clock = FakeClock()
    rl = RateLimiter(clock)
    k = key(tpm=600)
    rl.check(k)
    held = rl.hold(k.id, 10**6)  # at most one minute's allowance
    assert held is not None and rl._tokens[k.id].level == 0.0
    with pytest.raises(RateLimited):
        rl.hold(k.id, 1)  # (empty: refused, nothing taken)
    rl.add_tokens(k.id, 100)
    await clock.advance(30.0)
    rl.release(held)
    assert rl._tokens[k.id].level == 600.0  # (-100 + 300 refilled + 600 back: capped)
    assert rl.hold("unknown", 5) is None and rl.hold(k.id, 0) is None
    held = rl.hold(k.id, 50)
    assert held is not None
    rl.check(key())  # limits lifted: the buckets go, a late release changes nothing
    rl.release(held)
    assert k.id not in rl._tokens
