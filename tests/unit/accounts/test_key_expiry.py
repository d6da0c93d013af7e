"""Key expiry: the `--expires` forms, the policy (a key cannot mint a longer-lived key), and
the store refusing an expired key on its cached path by its injected clock (the ingress's
401: tests/unit/ingress/test_key_access.py)."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

import pytest

from llmfabric.accounts import AccountStore, InvalidRequest, PermissionDenied
from llmfabric.accounts.expiry import parse_expiry
from llmfabric.accounts.models import ApiKey
from llmfabric.accounts.policy import expiry_for_new_key
from llmfabric.testing.fake_clock import FakeClock

NOW = 1_800_000_000.0
DAY = 86_400.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(wall_start=NOW)


@pytest.fixture
async def store(clock: FakeClock) -> AsyncIterator[AccountStore]:
    s = await AccountStore.open(":memory:", clock=clock, background=False)
    yield s
    await s.aclose()


def key(expires_at: float | None, admin: bool = False) -> ApiKey:
    return ApiKey("k1", "app", "alice", admin, 0.0, expires_at=expires_at)


def test_expires_reads_durations_dates_and_times() -> None:
    assert parse_expiry("30d", NOW) == NOW + 30 * DAY
    assert parse_expiry(" 12h ", NOW) == NOW + 12 * 3600
    assert parse_expiry("90m", NOW) == NOW + 90 * 60
    assert parse_expiry("2w", NOW) == NOW + 14 * DAY
    jan31 = dt.datetime(2027, 1, 31, tzinfo=dt.UTC).timestamp()
    assert parse_expiry("2027-01-31", NOW) == jan31  # a date: its start, UTC
    assert parse_expiry("2027-01-31T12:00:00Z", NOW) == jan31 + 12 * 3600
    assert parse_expiry("2027-01-31T12:00:00", NOW) == jan31 + 12 * 3600  # no zone: UTC
    assert parse_expiry("2027-01-31T12:00:00+02:00", NOW) == jan31 + 10 * 3600
    for bad in ("", "30", "0d", "-1d", "1y", "30 d", "1.5h", "2027-13-01", "tomorrow",
                "99999999d"):
        with pytest.raises(InvalidRequest):
            parse_expiry(bad, NOW)


@pytest.mark.hostile
def test_a_key_cannot_mint_a_longer_lived_key() -> None:
    mine = key(NOW + DAY)
    assert expiry_for_new_key(mine, None) == NOW + DAY  # unset: inherits the creator's
    assert expiry_for_new_key(mine, NOW + 60) == NOW + 60  # earlier: fine
    with pytest.raises(PermissionDenied, match="later than the creating key's own"):
        expiry_for_new_key(mine, NOW + 2 * DAY)
    assert expiry_for_new_key(key(None), NOW + 9 * DAY) == NOW + 9 * DAY
    assert expiry_for_new_key(key(NOW, admin=True), NOW + 9 * DAY) == NOW + 9 * DAY
    assert expiry_for_new_key(None, None) is None  # the operator


@pytest.mark.hostile
async def test_the_store_refuses_past_or_absurd_expiries(store: AccountStore) -> None:
    for bad in (NOW, NOW - 1, float("inf"), float("nan"), 1e300):
        with pytest.raises(InvalidRequest):
            await store.create_key("app", "alice", expires_at=bad)


@pytest.mark.hostile
async def test_an_expired_key_is_refused_on_the_cached_path(
    store: AccountStore, clock: FakeClock,
) -> None:
    k, plain = await store.create_key("app", "alice", expires_at=NOW + 60)
    assert k.expires_at == NOW + 60 and k.to_json()["expires_at"] == NOW + 60
    assert await store.authenticate(plain) == k
    assert store.authenticate_cached(plain) == k  # verified: the cached path answers
    assert store.expired_at(plain) is None
    await clock.advance(60)
    assert store.authenticate_cached(plain) is None  # the cache keeps no expired key alive
    assert await store.authenticate(plain) is None
    assert store.expired_at(plain) == NOW + 60
    assert store.expired_at(plain[:-1] + "x") is None  # a wrong secret learns nothing
    # another process (a fresh cache) refuses it too, and says why
    await store.refresh()
    assert await store.authenticate(plain) is None and store.expired_at(plain) == NOW + 60
    listed = await store.list_keys()
    assert listed[0].expires_at == NOW + 60 and listed[0].expired(clock.wall())


async def test_a_stored_job_stops_running_as_a_key_once_it_expires(
    store: AccountStore, clock: FakeClock,
) -> None:
    """A batch runs as its creator's key id, looked up before each line (`active_key`): an
    expired key answers None there too, so the rest of its batch is not sent."""
    k, _ = await store.create_key("batch", "alice", expires_at=NOW + 60)
    assert await store.active_key(k.id) == k
    await clock.advance(60)
    assert await store.active_key(k.id) is None


@pytest.mark.hostile
async def test_an_expiring_key_minting_a_key_gives_it_no_longer_life(
    store: AccountStore,
) -> None:
    parent, _ = await store.create_key("course", "cs101", expires_at=NOW + DAY)
    child, _ = await store.create_key("student", "cs101", by=parent)
    assert child.expires_at == NOW + DAY
    with pytest.raises(PermissionDenied):
        await store.create_key("student", "cs101", expires_at=NOW + 2 * DAY, by=parent)
