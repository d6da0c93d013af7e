"""RelayKeeper: a node that cannot be dialled keeps >= `want` registered relays chosen from
the registry's live relay-role peers; it drops relays that left, replaces relays that never
accept, falls back to the bootstrap peers while no relay is known, and backs off."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from llmfabric.net.backoff import Backoff
from llmfabric.net.relaykeeper import RelayKeeper
from llmfabric.testing.fake_clock import FakeClock


class FakeRelays:
    """The transport side: relays in `accepting` register as soon as they are used."""

    def __init__(self) -> None:
        self.local_id = "me"
        self.accepting: set[str] = set()
        self.in_use: set[str] = set()
        self.registered: set[str] = set()
        self.used: list[str] = []

    @property
    def relays(self) -> tuple[str, ...]:
        return tuple(sorted(self.registered))

    @property
    def relays_in_use(self) -> tuple[str, ...]:
        return tuple(sorted(self.in_use))

    def use_relays(self, relay_ids: Sequence[str]) -> None:
        for r in relay_ids:
            self.in_use.add(r)
            self.used.append(r)
            if r in self.accepting:
                self.registered.add(r)

    def drop_relays(self, relay_ids: Sequence[str]) -> None:
        for r in relay_ids:
            self.in_use.discard(r)
            self.registered.discard(r)

    def lose(self, relay: str) -> None:  # the relay's connection broke (its loop retries)
        self.registered.discard(relay)


class World:
    def __init__(self, want: int = 1) -> None:
        self.clock = FakeClock()
        self.t = FakeRelays()
        self.relay_peers: list[str] = []  # relay-role, live, not suspected
        self.left: set[str] = set()
        self.bootstrap: list[str] = []
        self.keeper = RelayKeeper(
            self.t, self.clock, Backoff(1.0, 60.0, random.Random(3)),
            candidates=lambda: self.relay_peers, gone=lambda p: p in self.left,
            fallback=lambda: self.bootstrap, want=want, interval_s=10.0, patience_s=30.0)


async def test_bootstrap_peers_are_the_fallback_until_a_relay_is_known() -> None:
    w = World()
    w.bootstrap = ["boot"]  # not a relay: it never accepts
    assert not w.keeper.step() and w.t.in_use == {"boot"}
    w.relay_peers = ["r1"]
    w.t.accepting = {"r1"}
    await w.clock.advance(31.0)  # boot had its chance
    assert not w.keeper.step()  # r1 added now, boot (never registered) makes way
    assert w.t.in_use == {"r1"} and w.t.registered == {"r1"} and "boot" in w.keeper.dropped
    assert w.keeper.step()


async def test_a_relay_that_leaves_for_good_is_replaced() -> None:
    w = World()
    w.relay_peers, w.t.accepting = ["r1", "r2"], {"r1", "r2"}
    assert not w.keeper.step() and w.t.registered == {"r1"}
    assert w.keeper.step()
    w.t.lose("r1")
    w.left.add("r1")
    w.relay_peers = ["r2"]
    assert not w.keeper.step()
    assert w.t.in_use == {"r2"} and w.t.registered == {"r2"} and w.keeper.dropped == ["r1"]
    assert w.keeper.step()


async def test_a_lost_relay_that_is_still_live_gets_time_to_come_back() -> None:
    w = World()
    w.relay_peers, w.t.accepting = ["r1", "r2"], {"r1", "r2"}
    w.keeper.step()
    w.t.lose("r1")  # connection broke; r1 is still a member: its own loop re-registers
    assert not w.keeper.step() and w.t.in_use == {"r1"}  # no churn yet
    await w.clock.advance(31.0)
    w.keeper.step()  # r1 did not come back within the patience: r2 replaces it
    assert w.t.in_use == {"r2"} and w.t.registered == {"r2"}


async def test_keeps_the_configured_number_of_relays() -> None:
    w = World(want=2)
    w.relay_peers, w.t.accepting = ["r1", "r2", "r3"], {"r1", "r2", "r3"}
    assert not w.keeper.step()
    assert len(w.t.registered) == 2 and w.keeper.step()
    gone = sorted(w.t.registered)[0]
    w.t.lose(gone)
    w.left.add(gone)
    w.relay_peers = [r for r in w.relay_peers if r != gone]
    w.keeper.step()
    assert len(w.t.registered) == 2 and gone not in w.t.in_use


async def test_run_backs_off_while_no_relay_is_known_and_wakes_on_poke() -> None:
    w = World()
    task = asyncio.get_running_loop().create_task(w.keeper.run())
    await w.clock.advance(600.0)
    idle_steps = w.keeper.steps
    # exponential backoff capped at 60 s: far fewer steps than one per second
    assert 10 <= idle_steps < 60, idle_steps
    w.relay_peers, w.t.accepting = ["r1"], {"r1"}
    w.keeper.poke()
    await w.clock.advance(0.0)
    assert w.t.registered == {"r1"}
    steps = w.keeper.steps
    await w.clock.advance(100.0)  # satisfied: one check per interval (10 s)
    assert w.keeper.steps - steps <= 11
    task.cancel()
