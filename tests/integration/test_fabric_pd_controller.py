"""The PD controller as its own process across the fabric (ThunderServe; issue 14), extending
test_fabric_pd.py: `llmfabric controller --pd-plan` joins the fabric, binds the plan's GPUs
to the live nodes from its replica, publishes the plan's routing as the signed item of its
record, and when a decode node dies flips a prefill node to decode over the peer protocol
(the node flips its engine and republishes its role). An ingress on another node that
trusts the controller (`--controller`) routes by the plan; the bootstrap ingress, which
lists no controller, ignores it."""

from __future__ import annotations

import asyncio
import json
import pathlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import openai
import pytest

from llmfabric import sim
from llmfabric.identity import NodeKey
from llmfabric.launch.local import LocalFabric, NodeProcess
from llmfabric.net.ports import free_port
from llmfabric.scheduler.phasesplit.groups import Group, canonical
from llmfabric.scheduler.phasesplit.inputs import load_cluster
from llmfabric.scheduler.phasesplit.problem import PDWorkload, TabuOptions
from llmfabric.scheduler.phasesplit.tabu import tabu_search
from llmfabric.testing.poll import wait_until_sync

from .test_fabric_pd import MODEL, MSG, _engine, _pd

pytestmark = pytest.mark.slow

# (name, role); the node at index i holds the plan's GPU i (`--label pd.gpus=i`): unlabelled
# nodes of one role and GPU type bind in session-id order, which is random per run, so the
# plan's GPU 0 (X = 1) would land on p2 about half the time and the test's p1/p2 checks fail.
ROLES = (("p1", "prefill"), ("p2", "prefill"), ("d1", "decode"), ("d2", "decode"))


def _write_plan(root: pathlib.Path) -> list[str]:
    """Four one-A40 hosts, GPUs 0, 1 prefill and 2, 3 decode; the plan's X sends every
    prefill to GPU 0 (p1, by its label), so routing by the plan is visible. Returns the CLI's
    plan args."""
    cluster = root / "cluster.yaml"
    cluster.write_text("instances:\n" + "".join(
        f"  - {{gpu: A40, count: 1, host: h{i}}}\n" for i in range(4)))
    links = root / "links.csv"
    links.write_text("src,dst,gbs,latency_s\n" + "".join(
        f"{i},{j},2.0,0.001\n" for i in range(4) for j in range(4) if i != j))
    wl = PDWorkload.from_means(8, 300, 600, slo=sim.SLO(ttft_s=2.0, tpot_s=0.1))
    start = canonical([Group(frozenset({0}), "prefill"), Group(frozenset({1}), "prefill"),
                       Group(frozenset({2}), "decode"), Group(frozenset({3}), "decode")])
    plan = tabu_search(load_cluster(cluster, links, None), sim.get_model(MODEL), wl,
                       TabuOptions(n_step=0), start=start)
    doc = plan.to_json()
    doc["routing"]["x"] = [1.0, 0.0]  # (a valid plan: the LP may pick any split)
    path = root / "plan.json"
    path.write_text(json.dumps(doc))
    return ["--pd-plan", str(path), "--pd-cluster", str(cluster), "--pd-links", str(links)]


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[LocalFabric, dict[str, NodeProcess], NodeProcess, str,
                               list[str]]]:
    root: pathlib.Path = tmp_path_factory.mktemp("pdctl")
    ctl_home = root / "ctl"
    ctl_home.mkdir()
    ctl_id = NodeKey.load_or_create(ctl_home)[0].peer_id
    with LocalFabric(root) as fab:
        ingress = fab.start_ingress()
        trusting = fab._spawn("ingress-b", [
            "--bootstrap", ingress.peer_addr, "--ingress", "--provider", "fabric",
            "--no-auth", "--controller", ctl_id])
        nodes: dict[str, NodeProcess] = {}
        for gpu, (name, role) in enumerate(ROLES):
            port = free_port()
            nodes[name] = fab._spawn(name, [
                "--bootstrap", ingress.peer_addr, "--provider", "pd", "--gpu", "A40",
                "--gpu-count", "1", "--on-engine-exit", "leave", "--accept-assignments",
                "--controller", ctl_id, "--label", f"pd.gpus={gpu}",
                "--process", *fab._cli(), "engine", "sim", "--model", MODEL, "--gpu", "A40",
                "--port", str(port), "--speed", "20", "--role", role, "--kv-bits", "4",
                "--kv-gbps", "10", "--kv-latency-ms", "200",
            ], engine_port=port)
        fab.wait_http(trusting)
        fab.wait_serving({MODEL: 4}, timeout=90)
        fab.wait_serving({MODEL: 4}, via=trusting, timeout=60)
        _wait(lambda: _roles(trusting) == ["decode", "decode", "prefill", "prefill"],
              "roles not published")
        yield fab, nodes, trusting, str(ctl_home), _write_plan(root)


async def _requests(base_url: str, key: str, n: int) -> None:
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0,
                                  timeout=60) as c:
        replies = await asyncio.gather(*(c.chat.completions.create(
            model=MODEL, messages=MSG, max_tokens=4, stream=False,
            extra_body={"ignore_eos": True}) for _ in range(n)))
    assert all(r.usage is not None and r.usage.completion_tokens == 4 for r in replies)


def _roles(via: NodeProcess) -> list[str]:
    views = via.get_json("/v1/fabric/nodes")["nodes"]
    return sorted(v["models"][0]["role"] for v in views
                  if v["models"] and v["state"] == "SERVING" and not v["suspected"])


def _prefills(nodes: dict[str, NodeProcess]) -> dict[str, int]:
    return {k: int(_pd(nodes[k])["prefills"]) for k in ("p1", "p2")}


def _wait(cond: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    wait_until_sync(cond, timeout, what, interval=0.3)


async def test_a_controller_process_flips_over_the_peer_protocol_and_ingresses_follow(
    fabric: tuple[LocalFabric, dict[str, NodeProcess], NodeProcess, str, list[str]],
) -> None:
    fab, nodes, trusting, ctl_home, plan_args = fabric
    assert fab.ingress is not None
    log = pathlib.Path(ctl_home) / "controller.log"
    with log.open("wb") as out:
        ctl = subprocess.Popen(  # noqa: ASYNC220 (a long-running process, not awaited)
            [sys.executable, "-m", "llmfabric.cli.main", "controller",
             "--bootstrap", fab.ingress.peer_addr, "--network-secret", fab.secret,
             "--preset", "local", "--home", ctl_home, "--listen", "127.0.0.1:0",
             "--interval", "1", "--settle", "3", "--drift", "1000", *plan_args],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        _wait(lambda: b"published routing plan" in log.read_bytes(),
              f"no plan published: {log.read_text()[-2000:]}")
        # the trusting ingress installs the plan once the record arrives: every prefill on p1
        before = _prefills(nodes)
        deadline = time.monotonic() + 30
        while True:
            await _requests(trusting.http_url, "none", 6)
            after = _prefills(nodes)
            if after["p2"] == before["p2"]:
                break
            assert time.monotonic() < deadline, (
                f"the trusting ingress never used the plan: prefills {before} -> {after}")
            before = after
        assert after["p1"] - before["p1"] == 6
        # the ingress that lists no controller ignores the plan: both prefill nodes work
        before = _prefills(nodes)
        await _requests(fab.ingress.http_url, fab.admin_key(), 16)
        after = _prefills(nodes)
        assert after["p1"] > before["p1"] and after["p2"] > before["p2"]

        # a decode node dies: the controller flips p2 to decode over the peer protocol
        await asyncio.to_thread(nodes["d1"].kill_hard)
        assert nodes["p2"].engine_port is not None
        _wait(lambda: _engine(nodes["p2"].engine_port, "/sim/role")["role"] == "decode",
              f"p2 never flipped: {log.read_text()[-2000:]}")
        assert _engine(nodes["p2"].engine_port, "/sim/role")["flips"] == 1
        assert _engine(nodes["p1"].engine_port, "/sim/role")["role"] == "prefill"
        assert nodes["p2"].alive()  # no restart
        text = log.read_text()
        assert "failed: " not in text, text[-2000:]  # (PeerPDExecutor's failures)

        _wait(lambda: _roles(trusting) == ["decode", "decode", "prefill"],
              "roles not republished")
        # the re-plan's routing (p1 prefills, p2 and d2 decode) reaches the trusting ingress
        # by gossip after the roles do; until then the old plan gives p2 no decode weight
        _wait(lambda: b"(1 prefill x 2 decode sessions)" in log.read_bytes(),
              f"no re-plan published: {log.read_text()[-2000:]}")
        p2_before = int(_pd(nodes["p2"])["decodes"])
        deadline = time.monotonic() + 30
        while int(_pd(nodes["p2"])["decodes"]) == p2_before:  # the flipped node decodes
            assert time.monotonic() < deadline, (
                f"the flipped p2 never decoded: {log.read_text()[-2000:]}")
            await _requests(trusting.http_url, "none", 8)
    finally:
        ctl.terminate()
        try:
            ctl.wait(20)
        except subprocess.TimeoutExpired:
            ctl.kill()
