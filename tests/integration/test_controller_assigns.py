"""Issue 5's loop end to end: bare nodes join with their (simulated) GPUs, the fleet controller
joins the fabric, plans, sends assignments over the peer protocol, the nodes start engines
from their own templates and serve through the ingress."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import openai
import pytest

from llmfabric.launch.local import LocalFabric
from llmfabric.testing.poll import wait_until_sync

pytestmark = pytest.mark.slow

WORKLOAD = "models:\n  - {model: qwen3-1.7b, rate: 2, mean_in: 200, mean_out: 20}\n"


@pytest.fixture
def fabric(tmp_path: pathlib.Path) -> Iterator[LocalFabric]:
    with LocalFabric(tmp_path / "fabric") as fab:
        fab.start_ingress()
        gpu = ("--gpu", "L40S", "--gpu-count", "1", "--gpu-memory", "48")
        fab.add_bare_node("idle-a", "--accept-assignments", *gpu)
        fab.add_bare_node("closed", *gpu)  # does not accept assignments
        for node in fab.nodes:
            fab.wait_http(node)
        yield fab


def test_controller_fills_idle_nodes_over_the_peer_protocol(
    fabric: LocalFabric, tmp_path: pathlib.Path
) -> None:
    assert fabric.ingress is not None
    workload = tmp_path / "workload.yaml"
    workload.write_text(WORKLOAD)
    result = subprocess.run(
        [sys.executable, "-m", "llmfabric.cli.main", "controller",
         "--bootstrap", fabric.ingress.peer_addr, "--network-secret", fabric.secret,
         "--preset", "local", "--home", str(tmp_path / "ctl"), "--listen", "127.0.0.1:0",
         "--workload", str(workload), "--template", "sim", "--policy", "greedy", "--once"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    decisions = json.loads(result.stdout)
    assigned = {sid for d in decisions if d["kind"] == "Assign" for sid in d["session_ids"]}
    assert assigned, result.stderr
    # A node that does not accept assignments is not capacity.
    closed_sid = fabric.nodes[2].get_json("/v1/fabric/self")["session_id"]
    assert closed_sid not in assigned
    assert "failed" not in result.stderr
    fabric.wait_serving({"qwen3-1.7b": 1}, timeout=60)
    idle_a = fabric.nodes[1].get_json("/v1/fabric/self")
    assert idle_a["state"] == "SERVING" and idle_a["engine"] == "sim"
    client = openai.OpenAI(base_url=fabric.ingress.http_url + "/v1",
                           api_key=fabric.admin_key(), max_retries=0)
    reply = client.chat.completions.create(
        model="qwen3-1.7b", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 3
    assert fabric.nodes[2].get_json("/v1/fabric/self")["state"] == "JOIN"


def test_controller_plans_for_the_demand_the_ingress_observes(tmp_path: pathlib.Path) -> None:
    """No workload file: the ingress publishes what it routes, the controller reads it from
    its replica and fills the idle node with the model that has demand."""
    from llmfabric.launch.local import EngineSpec

    with LocalFabric(tmp_path / "fabric") as fab:
        ingress = fab.start_ingress("--demand-interval", "0.5")
        fab.add_node(EngineSpec("qwen3-1.7b", "L40S", speed=50), "serving")
        fab.add_bare_node("idle", "--accept-assignments", "--gpu", "L40S", "--gpu-count", "1",
                          "--gpu-memory", "48")
        fab.wait_serving({"qwen3-1.7b": 1}, timeout=60)
        client = openai.OpenAI(base_url=ingress.http_url + "/v1", api_key=fab.admin_key(),
                               max_retries=0)
        for _ in range(12):
            client.chat.completions.create(
                model="qwen3-1.7b", messages=[{"role": "user", "content": "hello there"}],
                max_tokens=5)
        demand: list[dict[str, float]] = []

        def measured() -> bool:
            demand[:] = ingress.get_json("/v1/fabric/self").get("demand", [])
            return bool(demand)

        wait_until_sync(measured, 30, "the ingress measures demand", interval=0.3)
        assert [d["model"] for d in demand] == ["qwen3-1.7b"]
        assert demand[0]["rate"] > 0 and demand[0]["mean_out"] == 5.0
        result = subprocess.run(
            [sys.executable, "-m", "llmfabric.cli.main", "controller",
             "--bootstrap", ingress.peer_addr, "--network-secret", fab.secret,
             "--preset", "local", "--home", str(tmp_path / "ctl"), "--listen", "127.0.0.1:0",
             "--template", "sim", "--once"],
            capture_output=True, text=True, timeout=120,
        )
        assert result.returncode == 0, result.stderr
        decisions = json.loads(result.stdout)
        idle_sid = fab.nodes[2].get_json("/v1/fabric/self")["session_id"]
        assigns = [d for d in decisions if d["kind"] == "Assign"]
        assert [(d["model"], d["session_ids"]) for d in assigns] == [
            ("qwen3-1.7b", [idle_sid])], result.stderr


WORKLOAD_7B = "models:\n  - {model: llama-2-7b, rate: 2, mean_in: 200, mean_out: 20}\n"


def _controller(fab: LocalFabric, home: pathlib.Path, workload: pathlib.Path,
                *extra: str) -> subprocess.CompletedProcess[str]:
    assert fab.ingress is not None
    return subprocess.run(
        [sys.executable, "-m", "llmfabric.cli.main", "controller",
         "--bootstrap", fab.ingress.peer_addr, "--network-secret", fab.secret,
         "--preset", "local", "--home", str(home), "--listen", "127.0.0.1:0",
         "--workload", str(workload), "--template", "sim", "--policy", "greedy", "--once",
         *extra],
        capture_output=True, text=True, timeout=180,
    )


def test_reclaim_releases_the_engine_over_the_peer_protocol_then_reassigns(
    fabric: LocalFabric, tmp_path: pathlib.Path
) -> None:
    """--reclaim: the controller releases a node serving a model the plan no longer wants
    (drain, stop the engine, back to a bare JOIN session) and assigns it the new model; no
    409 busy. The node's peer id stays; its session is new."""
    assert fabric.ingress is not None
    first = tmp_path / "qwen.yaml"
    first.write_text(WORKLOAD)
    result = _controller(fabric, tmp_path / "ctl", first)
    assert result.returncode == 0, result.stderr
    fabric.wait_serving({"qwen3-1.7b": 1}, timeout=60)
    node = fabric.nodes[1]
    before = node.get_json("/v1/fabric/self")
    assert before["state"] == "SERVING"

    second = tmp_path / "7b.yaml"
    second.write_text(WORKLOAD_7B)
    result = _controller(fabric, tmp_path / "ctl", second, "--reclaim")
    assert result.returncode == 0, result.stderr
    decisions = json.loads(result.stdout)
    kinds = [(d["kind"], d["model"]) for d in decisions]
    assert kinds == [("Release", "qwen3-1.7b"), ("Assign", "llama-2-7b")], result.stderr
    assert decisions[0]["session_id"] == before["session_id"]
    assert decisions[1]["session_ids"] == [before["session_id"]]
    assert "failed" not in result.stderr and "busy" not in result.stderr, result.stderr
    fabric.wait_serving({"llama-2-7b": 1}, timeout=60)
    after = node.get_json("/v1/fabric/self")
    assert after["state"] == "SERVING" and after["engine"] == "sim"
    assert [m["id"] for m in after["models"]] == ["llama-2-7b"]
    assert after["session_id"] != before["session_id"]
    assert after["peer_id"] == before["peer_id"]
    client = openai.OpenAI(base_url=fabric.ingress.http_url + "/v1",
                           api_key=fabric.admin_key(), max_retries=0)
    reply = client.chat.completions.create(
        model="llama-2-7b", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert reply.usage is not None and reply.usage.completion_tokens == 3
    # the old session left: the ingress no longer lists qwen3-1.7b as served anywhere (its
    # LEFT is another session's record than the new SERVING one: it may arrive after it)
    wait_until_sync(lambda: fabric.serving_models().get("qwen3-1.7b", 0) == 0, 30,
                    f"qwen3-1.7b still served: {fabric.serving_models()}", interval=0.2)
