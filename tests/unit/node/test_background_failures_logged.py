"""The node's background readers keep going when a step of theirs raises (a bug), and the
failure is seen: logged with context and counted. The KV-cache event tracker fails on each
of the engine's many messages, so it logs the 1st, 2nd, 4th... failure, not each; a role
read that raises counts in the node's task failures (llmfabric_node_task_failures)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from types import SimpleNamespace

import msgpack
import pytest

from llmfabric.agent.kv_events_config import KvEventsEndpoint
from llmfabric.node.engine_link import KvEventsLink
from llmfabric.node.engine_role import follow_roles
from llmfabric.registry.records import ModelRole, ServedModel
from llmfabric.testing.fake_clock import FakeClock

pytestmark = pytest.mark.unit


def _message(seq: int) -> list[bytes]:
    return [b"kv", seq.to_bytes(8, "big"), msgpack.packb([1.0, []])]


def test_a_kv_event_tracker_that_raises_is_counted_and_logged_without_a_flood(
        caplog: pytest.LogCaptureFixture) -> None:
    applied: list[int] = []

    def apply(batch: object) -> None:
        applied.append(batch.seq)  # type: ignore[attr-defined]
        if len(applied) <= 5:
            raise KeyError("tracker bug")

    held = SimpleNamespace(apply=apply)
    link = KvEventsLink(KvEventsEndpoint("tcp://127.0.0.1:1", "kv"), held)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="llmfabric.node.engine_link"):
        for seq in range(6):
            link.handle(_message(seq))
    assert applied == [0, 1, 2, 3, 4, 5] and link.dropped["apply"] == 5 and link.applied == 1
    logged = [r for r in caplog.records if "applying KV-cache events" in r.getMessage()]
    assert len(logged) == 3  # the 1st, 2nd and 4th failure
    assert "KeyError('tracker bug')" in logged[0].getMessage()
    assert "seq 0" in logged[0].getMessage()
    assert logged[0].exc_info and not logged[1].exc_info


async def test_a_role_read_that_raises_is_counted_and_the_loop_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    calls = 0

    async def model_roles() -> dict[str, ModelRole]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise AttributeError("roles bug")
        return {"m": ModelRole.DECODE}

    link = SimpleNamespace(supervisor=SimpleNamespace(model_roles=model_roles))
    models = {"now": (ServedModel("m", role=ModelRole.PREFILL),)}
    failures: Counter[str] = Counter()
    stop = False

    def publish(fresh: tuple[ServedModel, ...]) -> None:
        models["now"] = fresh

    with caplog.at_level(logging.ERROR, logger="llmfabric.node.engine_role"):
        task = asyncio.create_task(follow_roles(
            clock, lambda: link, lambda: models["now"], publish,  # type: ignore[arg-type,return-value]
            lambda: stop, interval_s=2.0, failures=failures))
        await clock.advance(5.0)
        stop = True
        await clock.advance(20.0)
        await task
    assert failures == {"engine-roles": 1} and calls >= 2
    assert models["now"][0].role == ModelRole.DECODE  # read again and published
    [rec] = [r for r in caplog.records if "reading the engine's roles failed" in r.getMessage()]
    assert rec.exc_info


def test_another_parts_failure_counts_show_in_the_node_task_failures() -> None:
    """`watch_failures(prefix, counts)` reads the part's live counts at each scrape (the link
    prober's failed rounds: task "links-round")."""
    from prometheus_client import generate_latest

    from llmfabric.gossip.agent import AgentStats
    from llmfabric.node.serve.metrics import NodeMetrics

    metrics = NodeMetrics()
    metrics.watch_tasks({}, AgentStats())
    errors = {"round": 0}  # (as LinkProber.errors, which the node passes)
    metrics.watch_failures("links", errors)
    assert 'task="links-round"} 0.0' in generate_latest(metrics.registry).decode()
    errors["round"] += 2
    assert 'task="links-round"} 2.0' in generate_latest(metrics.registry).decode()
