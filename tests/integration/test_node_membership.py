"""Eight real node processes on loopback join through one bootstrap peer and converge; after a
SIGKILL the others detect the dead node and stop listing it; a SIGTERM'd node leaves cleanly."""

from __future__ import annotations

import re
import signal
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from llmfabric.launch.local import LocalFabric, NodeProcess
from llmfabric.testing.poll import wait_until_sync

pytestmark = pytest.mark.slow


def _views(node: NodeProcess) -> dict[str, dict[str, object]]:
    return {n["session_id"]: n for n in node.get_json("/v1/fabric/nodes")["nodes"]}


def _eventually(check: Callable[[], bool], timeout: float, what: str) -> None:
    wait_until_sync(check, timeout, what, interval=0.2, ignore=(OSError,))


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFabric]:
    with LocalFabric(tmp_path_factory.mktemp("members"), auth=False) as fab:
        fab.start_ingress()
        for _ in range(7):
            fab.add_bare_node()
        for node in fab.nodes:
            fab.wait_http(node)
        yield fab


def _session(node: NodeProcess) -> str:
    sid = node.get_json("/v1/fabric/self")["session_id"]
    assert isinstance(sid, str)
    return sid


def test_eight_nodes_converge_then_detect_a_killed_node(fabric: LocalFabric) -> None:
    nodes = fabric.nodes
    assert len(nodes) == 8
    sessions = {_session(n) for n in nodes}
    _eventually(
        lambda: all(set(_views(n)) >= sessions for n in nodes),
        timeout=20, what="every replica lists all 8 sessions",
    )
    victim = nodes[3]
    victim_sid = _session(victim)
    victim.kill_hard()
    survivors = [n for n in nodes if n is not victim]

    def dead_everywhere() -> bool:
        for n in survivors:
            v = _views(n).get(victim_sid)
            if v is not None and not (v["suspected"] or v["state"] in ("DOWN", "LEFT")):
                return False
        return True

    _eventually(dead_everywhere, timeout=15, what="every survivor suspects or evicted the victim")
    _eventually(
        lambda: all(_views(n)[victim_sid]["state"] == "LEFT" for n in survivors),
        timeout=30, what="the victim is evicted (LEFT) everywhere",
    )
    for n in survivors:  # nobody else was touched
        views = _views(n)
        assert all(views[s]["state"] != "LEFT" for s in sessions - {victim_sid})


def _evictions_issued(nodes: list[NodeProcess]) -> int:
    """SWIM evictions the nodes issued so far (their /metrics counters)."""
    total = 0
    for n in nodes:
        with urllib.request.urlopen(n.http_url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        found = re.search(r'^llmfabric_membership_events_total\{event="eviction_issued"\} (\S+)$',
                          text, re.MULTILINE)
        assert found, f"no eviction counter in {n.name}'s metrics"
        total += int(float(found.group(1)))
    return total


def test_sigterm_announces_left_before_exit(fabric: LocalFabric) -> None:
    leaver = fabric.nodes[5]
    sid = _session(leaver)
    others = [n for n in fabric.nodes if n is not leaver and n.alive()]
    evictions = _evictions_issued(others)
    leaver.signal(signal.SIGTERM)
    assert leaver.proc.wait(timeout=30) == 0
    observer = fabric.nodes[0]
    # A LEFT reached by eviction looks the same in the view (state LEFT, not suspected): what
    # tells the graceful path apart is that no member had to evict the leaver. (Not a 5 s
    # window: the announcement spreads by gossip, which a loaded machine slows down.)
    _eventually(lambda: _views(observer)[sid]["state"] == "LEFT", timeout=30,
                what="the ingress sees the graceful LEFT")
    assert _views(observer)[sid]["suspected"] is False
    assert _evictions_issued(others) == evictions, (
        "the leaver was evicted by SWIM instead of leaving: " + fabric.tail(leaver))
