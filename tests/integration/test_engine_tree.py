"""An engine's whole process tree lives and dies with it and with its node (real processes):
SIGKILL the node -> the engine and every child are gone; the engine's main process dies ->
its children are killed within 2 s, the node restarts the engine under a new session, and
leaves (exit status 5) once its restarts are used up."""

from __future__ import annotations

import os
import pathlib
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from llmfabric.agent.proctree import alive
from llmfabric.launch.local import LocalFabric, NodeProcess
from llmfabric.net.ports import free_port
from llmfabric.testing.poll import wait_until_sync

pytestmark = [pytest.mark.integration, pytest.mark.slow]
HERE = pathlib.Path(__file__).parent


@pytest.fixture
def fabric(tmp_path: pathlib.Path) -> Iterator[LocalFabric]:
    with LocalFabric(tmp_path, auth=False) as fab:
        fab.start_ingress()
        yield fab


def tree_node(fab: LocalFabric, tmp_path: pathlib.Path, name: str, *extra: str
              ) -> tuple[NodeProcess, pathlib.Path]:
    pids = tmp_path / f"{name}.pids"
    port = free_port()
    cmd = [sys.executable, str(HERE / "_tree_engine.py"), str(pids), "--model", "tree-m",
           "--gpu", "H100-SXM", "--port", str(port), "--speed", "20"]
    node = fab.add_process_node(cmd, name, "--gpu", "H100-SXM", "--gpu-count", "1", *extra,
                                engine_port=port)
    return node, pids


def read_pids(path: pathlib.Path, timeout: float = 30.0, old: tuple[int, ...] = ()
              ) -> tuple[int, int, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = tuple(int(x) for x in path.read_text().split())
        except (OSError, ValueError):
            got = ()
        if len(got) == 3 and got != old:
            return got  # type: ignore[return-value]
        time.sleep(0.05)
    raise TimeoutError(f"no engine pids in {path}")


def gone_within(pids: tuple[int, ...], seconds: float) -> list[int]:
    """The pids still alive after `seconds` (empty: all gone in time)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def serving_again(fab: LocalFabric, node: NodeProcess, old_session: str,
                  within: float = 60.0) -> dict[str, Any]:
    """The node's own view once it serves under a session other than `old_session` and the
    ingress routes to that new session.

    Neither new engine pids nor `wait_serving({model: 1})` mean that: the pids are written
    when the new engine is spawned, long before it is ready and the node changes session,
    and the ingress may still count the OLD session as serving until the DOWN reaches it by
    gossip (seconds on a loaded machine)."""
    me: dict[str, Any] = {}

    def node_serves_anew() -> bool:
        me.clear()
        me.update(node.get_json("/v1/fabric/self", timeout=10.0))
        return bool(me["session_id"] != old_session and me["state"] == "SERVING")

    def ingress_routes_to_it() -> bool:
        assert fab.ingress is not None
        nodes = fab.ingress.get_json("/v1/fabric/nodes", timeout=10.0)["nodes"]
        return any(n["session_id"] == me["session_id"] and n["state"] == "SERVING"
                   and not n["suspected"] for n in nodes)

    wait_until_sync(node_serves_anew, within, f"{node.name} serving under a new session",
                    interval=0.2, ignore=(OSError, ValueError))
    wait_until_sync(ingress_routes_to_it, within, "the ingress routing to the new session",
                    interval=0.2, ignore=(OSError, ValueError))
    return me


def _cleanup(pids: tuple[int, ...]) -> None:
    for p in pids:  # only if the test failed: never leave sleepers behind
        if alive(p):
            os.kill(p, signal.SIGKILL)


def test_sigkill_of_the_node_takes_the_whole_engine_tree(
        fabric: LocalFabric, tmp_path: pathlib.Path) -> None:
    node, pids_file = tree_node(fabric, tmp_path, "victim")
    fabric.wait_serving({"tree-m": 1})
    pids = read_pids(pids_file)
    assert node.get_json("/v1/fabric/self", timeout=10.0)["engine_process"]["pid"] == pids[0]
    assert all(alive(p) for p in pids)
    time.sleep(1.5)  # the supervisor and the watchdog have seen the escaped child
    try:
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(10)
        assert gone_within(pids, 5.0) == [], "engine processes outlived a SIGKILLed node"
    finally:
        _cleanup(pids)


def test_engine_exit_reaps_children_restarts_then_leaves(
        fabric: LocalFabric, tmp_path: pathlib.Path) -> None:
    node, pids_file = tree_node(fabric, tmp_path, "flaky", "--engine-restarts", "1")
    fabric.wait_serving({"tree-m": 1})
    first = read_pids(pids_file)
    session = node.get_json("/v1/fabric/self", timeout=10.0)["session_id"]
    time.sleep(1.5)
    all_pids: list[int] = list(first)
    try:
        os.kill(first[0], signal.SIGKILL)  # the engine's main process dies
        assert gone_within(first, 2.0) == [], "children outlived their engine by > 2 s"
        second = read_pids(pids_file, old=first)  # restarted (backoff ~1 s)
        all_pids += second
        me = serving_again(fabric, node, session)
        assert me["engine_process"]["pid"] == second[0] and me["engine_restarts"] == 1
        time.sleep(1.5)
        os.kill(second[0], signal.SIGKILL)  # restarts used up: the node leaves
        assert gone_within(second, 2.0) == []
        assert node.proc.wait(30) == 5
        assert "will not be restarted" in fabric.tail(node, 80)
    finally:
        _cleanup(tuple(all_pids))


def test_hung_engine_is_killed_and_restarted(
        fabric: LocalFabric, tmp_path: pathlib.Path) -> None:
    """No exit, just silence (/health stops answering): DOWN after the failed checks, the
    hung tree is killed, and the engine restarts under a new session."""
    import urllib.request

    node, pids_file = tree_node(fabric, tmp_path, "hangs", "--health-interval", "0.5",
                                "--health-failures", "2")
    fabric.wait_serving({"tree-m": 1})
    first = read_pids(pids_file)
    session = node.get_json("/v1/fabric/self", timeout=10.0)["session_id"]
    time.sleep(1.5)
    all_pids: list[int] = list(first)
    try:
        assert node.engine_port is not None
        req = urllib.request.Request(
            f"http://127.0.0.1:{node.engine_port}/sim/control", data=b'{"action": "hang"}',
            headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 200
        second = read_pids(pids_file, timeout=60, old=first)
        all_pids += second
        assert gone_within(first, 5.0) == [], "the hung engine's tree was not killed"
        me = serving_again(fabric, node, session)
        assert me["engine_process"]["pid"] == second[0] and me["engine_restarts"] == 1
        assert "consecutive health checks failed" in fabric.tail(node, 80)
    finally:
        _cleanup(tuple(all_pids))
