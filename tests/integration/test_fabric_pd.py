"""Prefill/decode disaggregation through the fabric (ThunderServe; issue 14): real node
processes, 2 prefill + 2 decode simulated engines behind one ingress, the official openai SDK.

Requests run in two phases (prefill on a P node returns a KV handle, the decode on a D node
streams the answer); a decode node killed while its requests wait for their KV costs those
requests a retry on the other decode node, not an error; the ThunderServe controller sees the
node gone and its lightweight reschedule flips a prefill node to decode (no restart), whose
node republishes its role and takes decodes."""

from __future__ import annotations

import asyncio
import json
import pathlib
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from llmfabric import sim
from llmfabric.cli.controller import record_from_view
from llmfabric.clock import SystemClock
from llmfabric.controller.pd_executor import RoleFlipExecutor
from llmfabric.launch.local import LocalFabric, NodeProcess
from llmfabric.net.ports import free_port
from llmfabric.registry.records import NodeRecord
from llmfabric.scheduler.decisions import SetRole
from llmfabric.scheduler.phasesplit.controller import PDBinding, PDController
from llmfabric.scheduler.phasesplit.groups import Group, canonical
from llmfabric.scheduler.phasesplit.problem import CloudCluster, PDWorkload, TabuOptions
from llmfabric.scheduler.phasesplit.tabu import tabu_search
from llmfabric.sim.topology import cloud_instances

pytestmark = pytest.mark.slow

MODEL = "llama-3.1-8b"
MSG = [{"role": "user", "content": "explain prefill and decode"}]
sessions: dict[str, str] = {}
KV_LATENCY_MS = 1500  # each KV handoff waits this long: a window to kill a decode node in


def _engine(port: int, path: str, body: dict[str, Any] | None = None) -> Any:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method="POST" if body is not None else "GET",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def _roles(fab: LocalFabric) -> dict[str, str]:
    assert fab.ingress is not None
    nodes = fab.ingress.get_json("/v1/fabric/nodes")
    return {n["session_id"]: n["models"][0]["role"] for n in nodes["nodes"]
            if n["models"] and n["state"] == "SERVING" and not n["suspected"]}


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[LocalFabric, dict[str, NodeProcess]]]:
    root: pathlib.Path = tmp_path_factory.mktemp("pd")
    with LocalFabric(root) as fab:
        ingress = fab.start_ingress()
        nodes: dict[str, NodeProcess] = {}
        for name, role in (("p1", "prefill"), ("p2", "prefill"), ("d1", "decode"),
                           ("d2", "decode")):
            port = free_port()
            nodes[name] = fab._spawn(name, [
                "--bootstrap", ingress.peer_addr, "--provider", "pd", "--gpu", "A40",
                "--gpu-count", "1", "--on-engine-exit", "leave",
                "--process", *fab._cli(), "engine", "sim", "--model", MODEL, "--gpu", "A40",
                "--port", str(port), "--speed", "20", "--role", role, "--kv-bits", "4",
                "--kv-gbps", "10", "--kv-latency-ms", str(KV_LATENCY_MS),
            ], engine_port=port)
        fab.wait_serving({MODEL: 4}, timeout=90)
        deadline = time.monotonic() + 30
        while sorted(_roles(fab).values()) != ["decode", "decode", "prefill", "prefill"]:
            assert time.monotonic() < deadline, _roles(fab)
            time.sleep(0.2)
        yield fab, nodes


def _client(fab: LocalFabric) -> openai.AsyncOpenAI:
    assert fab.ingress is not None
    return openai.AsyncOpenAI(base_url=fab.ingress.http_url + "/v1", api_key=fab.admin_key(),
                              max_retries=0, timeout=60)


async def _stream(c: openai.AsyncOpenAI, n: int = 12) -> str:
    stream = await c.chat.completions.create(
        model=MODEL, messages=MSG, max_tokens=n, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = [ch async for ch in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == n
    return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


def _session(node: NodeProcess) -> str:
    return str(node.get_json("/v1/fabric/self")["session_id"])


def _controller(fab: LocalFabric, nodes: dict[str, NodeProcess]
                ) -> tuple[PDController, RoleFlipExecutor]:
    """ThunderServe's plan for these four one-A40 nodes (2P + 2D, decode-heavy workload), the
    planner's GPU i bound to the i-th node, records read from the ingress's fleet view."""
    topo = cloud_instances([("A40", 1)] * 4, inter_gbps=(10, 40), seed=1)
    wl = PDWorkload.from_means(8, 300, 600, slo=sim.SLO(ttft_s=2.0, tpot_s=0.1))
    start = canonical([Group(frozenset({0}), "prefill"), Group(frozenset({1}), "prefill"),
                       Group(frozenset({2}), "decode"), Group(frozenset({3}), "decode")])
    plan = tabu_search(CloudCluster.from_topology(topo), sim.get_model(MODEL), wl,
                       TabuOptions(n_step=0), start=start)
    order = ("p1", "p2", "d1", "d2")
    binding = PDBinding({sessions[k]: (i,) for i, k in enumerate(order)})
    executor = RoleFlipExecutor({sessions[k]: f"http://127.0.0.1:{nodes[k].engine_port}"
                                 for k in order})

    def records() -> list[tuple[NodeRecord, bool]]:
        assert fab.ingress is not None
        views = fab.ingress.get_json("/v1/fabric/nodes")["nodes"]
        out = []
        for v in views:
            rec = record_from_view({**v, "suspected": False})
            if rec is not None:
                out.append((rec, bool(v["suspected"])))
        return out

    return PDController(plan, binding, records, lambda: None, executor, SystemClock()), executor


def _pd(node: NodeProcess) -> dict[str, Any]:
    assert node.engine_port is not None
    return dict(_engine(node.engine_port, "/sim/stats")["pd"])


async def test_two_phase_requests_stream_through_the_sdk(
    fabric: tuple[LocalFabric, dict[str, NodeProcess]],
) -> None:
    fab, nodes = fabric
    before = {k: _pd(n) for k, n in nodes.items()}
    async with _client(fab) as c:
        texts = await asyncio.gather(*(_stream(c) for _ in range(8)))
        plain = await c.chat.completions.create(
            model=MODEL, messages=MSG, max_tokens=12, extra_body={"ignore_eos": True})
    assert len(set(texts)) == 1 and texts[0]  # the same prompt: the same deterministic text
    assert plain.choices[0].message.content == texts[0]  # non-streamed: also two-phase
    after = {k: _pd(n) for k, n in nodes.items()}
    prefills = sum(after[k]["prefills"] - before[k]["prefills"] for k in ("p1", "p2"))
    decodes = sum(after[k]["decodes"] - before[k]["decodes"] for k in ("d1", "d2"))
    assert prefills == 9 and decodes == 9
    assert all(after[k]["decodes"] == before[k]["decodes"] for k in ("p1", "p2"))
    # 4-bit KV on the wire: what the prefill nodes sent is what the decode nodes received
    sent = sum(after[k]["kv_bytes_out"] - before[k]["kv_bytes_out"] for k in ("p1", "p2"))
    got = sum(after[k]["kv_bytes_in"] - before[k]["kv_bytes_in"] for k in ("d1", "d2"))
    assert sent == got > 0 and after["d1"]["kv_bits"] == 4


async def test_a_decode_node_killed_mid_request_costs_a_retry_then_a_flip_restores_two(
    fabric: tuple[LocalFabric, dict[str, NodeProcess]],
) -> None:
    fab, nodes = fabric
    sessions.update({k: _session(n) for k, n in nodes.items()})
    d2_before = _pd(nodes["d2"])["decodes"]
    assert nodes["d1"].engine_port is not None
    d1_before = _engine(nodes["d1"].engine_port, "/sim/stats")["requests"]
    async with _client(fab) as c:
        tasks = [asyncio.create_task(_stream(c, 6)) for _ in range(10)]
        # Kill d1 as soon as a request waits there for its KV (KV_LATENCY_MS: the window),
        # not after a fixed sleep: a loaded machine may not have prefilled anything by then.
        deadline = time.monotonic() + 30
        while True:
            stats = await asyncio.to_thread(_engine, nodes["d1"].engine_port, "/sim/stats")
            in_flight = stats["requests"] - d1_before
            if in_flight >= 1 or all(t.done() for t in tasks):
                break
            assert time.monotonic() < deadline, f"no request reached d1: {_roles(fab)}"
            await asyncio.sleep(0.02)
        await asyncio.to_thread(nodes["d1"].kill_hard)
        texts = await asyncio.gather(*tasks)  # every request still completes
        assert all(texts) and in_flight >= 1  # (random pairs: all 10 avoid d1 at 2^-10)
        assert _pd(nodes["d2"])["decodes"] - d2_before == 10  # d1's went to d2 (retried)
        # more requests while d1 is dead: served by d2 alone
        assert all(await asyncio.gather(*(_stream(c, 4) for _ in range(3))))
        # the controller sees d1 gone and reschedules: p2 flips to decode (no restart), its
        # node republishes the role, the ingress routes decodes to it
        ctl, executor = _controller(fab, nodes)
        deadline = time.monotonic() + 60
        while not executor.applied:
            assert time.monotonic() < deadline, "the controller never rescheduled"
            await ctl.step()
            await asyncio.sleep(0.5)
        flips = [d for d in executor.applied if isinstance(d, SetRole)]
        assert [(d.session_ids, d.role) for d in flips] == [((sessions["p2"],), "decode")]
        assert _engine(nodes["p2"].engine_port, "/sim/role")["flips"] == 1
        while sorted(_roles(fab).values()) != ["decode", "decode", "prefill"]:
            assert time.monotonic() < deadline, _roles(fab)
            await asyncio.sleep(0.2)
        p2_before = _pd(nodes["p2"])["decodes"]
        # The flipped node decodes now: each batch picks its decode nodes at random among
        # two, so one batch may (rarely) miss p2; another one then goes out.
        deadline = time.monotonic() + 30
        while True:
            assert all(await asyncio.gather(*(_stream(c, 4) for _ in range(8))))
            if _pd(nodes["p2"])["decodes"] > p2_before:
                break
            assert time.monotonic() < deadline, f"the flipped p2 never decoded: {_roles(fab)}"
    assert nodes["p2"].alive() and _pd(nodes["p1"])["prefills"] > 0
