"""Prefix-cache sketches travel with the records over gossip (virtual time, in-memory
network): an ingress in another part of the fabric routes a prompt to the node that served
it, from the sketch alone; an over-full sketch from a member is carried but not trusted."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import orjson

from llmfabric.gossip.agent import GossipAgent
from llmfabric.registry.cache_sketch import SKETCH_BYTES
from llmfabric.routing.cache_summary import ServedPrefixes, observe_prompt
from llmfabric.routing.candidates import Candidate, candidates_for
from llmfabric.routing.prefix import CacheAwarePolicy, block_keys, prompt_text
from llmfabric.routing.request import RouteRequest

from .conftest import Cluster

DOC = {"model": "m", "messages": [
    {"role": "system", "content": "You answer questions about the attached manual. " * 10},
    {"role": "user", "content": "The manual: " + "rivers, harbors and lanterns. " * 60}]}


def _candidates(agent: GossipAgent) -> list[Candidate]:
    views = agent.nodes.all(include_left=False)
    return candidates_for("m", [(v.record, v.suspected) for v in views])


async def test_a_served_prompt_attracts_its_follow_up_across_the_fabric(
        make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster(delay=(0.001, 0.005))
    for _ in range(5):
        await c.add()
    assert await c.clock.run_until(c.converged, within=10)
    server, ingress = c.agents[3], c.agents[0]

    served = ServedPrefixes()  # what the serving node's engine_link records per request
    observe_prompt(served, "/fabric/v1/chat/completions", orjson.dumps(DOC))
    assert served.due(c.clock.now())
    server.update_self(dataclasses.replace(server.record.meta,
                                           prefix_cache=served.published(c.clock.now())))

    def arrived() -> bool:
        return any(x.prefix_cache for x in _candidates(ingress))

    assert await c.clock.run_until(arrived, within=10)
    cands = _candidates(ingress)
    follow_up = {**DOC, "messages": [*DOC["messages"],
                                     {"role": "assistant", "content": "Sure."},
                                     {"role": "user", "content": "And the lanterns?"}]}
    pol = CacheAwarePolicy(random.Random(0))
    got = pol.explain(cands, RouteRequest("m", blocks=block_keys(prompt_text(follow_up))))
    assert got.candidate.session_id == server.session_id
    assert got.reason == "sketch" and got.matched_blocks > 0


async def test_an_over_full_sketch_is_carried_but_not_routed_by(
        make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster(delay=(0.001, 0.005))
    for _ in range(4):
        await c.add()
    assert await c.clock.run_until(c.converged, within=10)
    liar, ingress = c.agents[2], c.agents[0]
    liar.update_self(dataclasses.replace(liar.record.meta, prefix_cache=b"\xff" * SKETCH_BYTES))

    def carried() -> bool:
        v = ingress.nodes.get(liar.session_id)
        return v is not None and bool(v.record.meta.prefix_cache)

    assert await c.clock.run_until(carried, within=10)  # signed and valid: stored as is
    assert all(not x.prefix_cache for x in _candidates(ingress))
    got = CacheAwarePolicy(random.Random(0)).explain(
        _candidates(ingress), RouteRequest("m", blocks=block_keys(prompt_text(DOC))))
    assert got.reason == "least_loaded"
