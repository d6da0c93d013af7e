"""A node cut off from the fabric dials its bootstrap addresses again, with exponential
backoff and jitter on the injected clock: a bootstrap host that restarts with a new key does
not strand the nodes that knew its old id. Seed re-contacts while alone back off too."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Callable, Sequence

import pytest

from llmfabric.gossip.agent import GossipAgent
from llmfabric.gossip.rebootstrap import Rebootstrapper, cut_off
from llmfabric.net.backoff import Backoff
from llmfabric.net.errors import PeerUnreachable

from .conftest import Cluster


def _keeper(c: Cluster, agent: GossipAgent, redial: Callable[[], Sequence[str]] | None = None,
            fail: bool = False) -> tuple[Rebootstrapper, list[float]]:
    calls: list[float] = []

    async def dial() -> Sequence[str]:
        calls.append(c.clock.now())
        if fail or redial is None:
            raise PeerUnreachable("no bootstrap peer reachable")
        return redial()

    cfg = c.config
    rb = Rebootstrapper(c.clock, lambda: agent, dial,
                        backoff=Backoff(1.0, cfg.rebootstrap_cap_s, random.Random(7)),
                        after_s=cfg.rebootstrap_after_s, check_interval_s=cfg.sync_interval_s)
    return rb, calls


async def test_a_bootstrap_restarted_with_a_new_key_is_found_again(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    old = await c.add(seeds=[])
    a = await c.add(seeds=[old.peer_id])
    b = await c.add(seeds=[old.peer_id])
    assert await c.clock.run_until(c.converged, within=10)
    new_boot: list[GossipAgent] = []
    tasks = []
    for agent in (a, b):
        rb, _ = _keeper(c, agent, redial=lambda: [new_boot[0].peer_id])
        tasks.append(asyncio.get_running_loop().create_task(rb.run()))
    # the bootstrap host restarts with a new key: same address, new peer id, empty replica
    await c.kill(old)
    new_boot.append(await c.add(seeds=[]))
    assert not cut_off(a)  # a still knows b and the old seed until the seed is suspected
    fresh = new_boot[0]

    def rejoined() -> bool:
        known = {sid for sid, e in fresh.replica.entries.items() if e.state.name != "LEFT"}
        return {a.session_id, b.session_id} <= known and fresh.session_id in a.replica.entries
    # a and b know each other (so they are not alone): only the seed check can trigger this
    assert await c.clock.run_until(rejoined, within=60)
    assert a.seeds == [fresh.peer_id] and a.stats.rebootstraps >= 1
    for t in tasks:
        t.cancel()


async def test_a_live_fabric_never_redials(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    boot = await c.add(seeds=[])
    a = await c.add()
    rb, calls = _keeper(c, a, redial=lambda: [boot.peer_id])
    task = asyncio.get_running_loop().create_task(rb.run())
    await c.clock.advance(300.0)
    assert calls == [] and not cut_off(a)
    task.cancel()


async def test_redials_back_off_exponentially_with_jitter(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    alone = await c.add(seeds=["gone-seed"])
    rb, calls = _keeper(c, alone, fail=True)
    task = asyncio.get_running_loop().create_task(rb.run())
    await c.clock.advance(600.0)
    task.cancel()
    cfg = c.config
    assert calls and calls[0] >= cfg.rebootstrap_after_s  # not before the grace period
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    # bounded by the cap (+ one check interval), and far fewer than one per check interval
    assert max(gaps) <= cfg.rebootstrap_cap_s + cfg.sync_interval_s + 1e-9
    assert len(calls) < 600.0 / cfg.sync_interval_s / 3
    assert sum(gaps[-5:]) / 5 > sum(gaps[:3]) / 3  # the gaps grow
    assert len(set(round(g, 6) for g in gaps[-5:])) > 1  # jittered, not a fixed interval


async def test_seed_recontacts_while_alone_back_off(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    alone = await c.add(seeds=["stale-seed-id"])
    await c.clock.advance(300.0)
    rounds = 300.0 / c.config.sync_interval_s
    # before: one re-contact per sync round (~300); now the gaps grow up to the cap
    assert 5 <= alone.stats.seed_contacts < rounds / 4, alone.stats.seed_contacts


async def test_a_bug_in_the_redial_is_logged_counted_and_retried(
    make_cluster: Callable[..., Cluster], caplog: pytest.LogCaptureFixture,
) -> None:
    """An unreachable bootstrap is routine (an info line); anything else the redial raises
    is a bug: logged with its traceback, counted in the agent's loop_errors, and the keeper
    goes on trying."""
    c = make_cluster()
    alone = await c.add(seeds=["gone-seed"])
    calls: list[float] = []

    async def broken() -> Sequence[str]:
        calls.append(c.clock.now())
        raise KeyError("a bug")

    cfg = c.config
    rb = Rebootstrapper(c.clock, lambda: alone, broken,
                        backoff=Backoff(1.0, cfg.rebootstrap_cap_s, random.Random(7)),
                        after_s=cfg.rebootstrap_after_s, check_interval_s=cfg.sync_interval_s)
    task = asyncio.get_running_loop().create_task(rb.run())
    with caplog.at_level(logging.INFO, logger="llmfabric.gossip.rebootstrap"):
        await c.clock.advance(cfg.rebootstrap_after_s + 60.0)
    task.cancel()
    assert len(calls) >= 2 and alone.stats.loop_errors == len(calls)
    bugs = [r for r in caplog.records if "re-bootstrap attempt" in r.getMessage()]
    assert len(bugs) == len(calls) and all(r.exc_info for r in bugs)


async def test_an_unreachable_bootstrap_is_no_error(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    alone = await c.add(seeds=["gone-seed"])
    rb, calls = _keeper(c, alone, fail=True)
    task = asyncio.get_running_loop().create_task(rb.run())
    await c.clock.advance(c.config.rebootstrap_after_s + 60.0)
    task.cancel()
    assert calls and alone.stats.loop_errors == 0
