"""The ingress's accounts adapter on a real store: a remembered key stops working the moment
it is revoked here, and at the next key refresh when it is revoked by another process; usage
recorded on the way is counted exactly (clamped)."""

from __future__ import annotations

import pathlib

from llmfabric.accounts import AccountStore, RateLimiter
from llmfabric.tenancy.accounts_auth import AccountsAuth
from llmfabric.testing.fake_clock import FakeClock


async def test_revocation_takes_effect_through_the_adapter(tmp_path: pathlib.Path) -> None:
    db = str(tmp_path / "a.db")
    clock = FakeClock()
    store = await AccountStore.open(db, clock=clock, background=False)
    other = await AccountStore.open(db, background=False)  # another process (the CLI)
    try:
        auth = AccountsAuth(store, RateLimiter(clock))
        key, plain = await store.create_key("app", "alice")
        key2, plain2 = await store.create_key("app2", "alice")
        for _ in range(3):  # remembered after the first
            who = await auth.authenticate(plain)
            assert who is not None and who.id == key.id
            assert auth.check_rate(who) is None
            auth.record(who.id, "m", 5, 2**64)  # (a provider's absurd claim: clamped)
        assert await auth.authenticate(plain2) is not None
        await store.revoke(key.id, by=None)
        assert await auth.authenticate(plain) is None  # here: at once
        await other.revoke(key2.id, by=None)
        await store.refresh()  # (the background task does this every refresh_interval_s)
        assert await auth.authenticate(plain2) is None  # elsewhere: at the next refresh
        rows = await store.usage(key_id=key.id)
        assert [(r.requests, r.prompt_tokens, r.completion_tokens) for r in rows] == [
            (3, 15, 3 * 100_000_000)]
    finally:
        await other.aclose()
        await store.aclose()
