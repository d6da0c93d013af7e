"""Real node processes on loopback measure their links to each other over the peer protocol;
`llmfabric plan net --from-fabric` reads the ingress's /v1/fabric/links and plans on them."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from llmfabric.cli.main import cli
from llmfabric.launch.local import LocalFabric
from llmfabric.scheduler.netplan.from_fabric import host_name
from llmfabric.testing.poll import wait_until_sync

pytestmark = pytest.mark.slow
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "heroserve"
PROBE = ("--link-probe-interval", "1")


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFabric]:
    with LocalFabric(tmp_path_factory.mktemp("links"), auth=False) as fab:
        fab.start_ingress(*PROBE)
        fab.add_bare_node("a100", "--gpu", "A100-80GB", "--gpu-count", "2", *PROBE)
        fab.add_bare_node("h100", "--gpu", "H100-SXM", "--gpu-count", "2", *PROBE)
        for node in fab.nodes:
            fab.wait_http(node)
        yield fab


def _measured(doc: dict[str, Any]) -> dict[str, set[str]]:
    return {n["peer"]: {link["peer"] for link in n.get("links", [])} for n in doc["nodes"]}


def test_nodes_measure_each_other_and_the_planner_reads_it(fabric: LocalFabric,
                                                         tmp_path: pathlib.Path) -> None:
    assert fabric.ingress is not None
    peers = {n.get_json("/v1/fabric/self")["peer_id"] for n in fabric.nodes}
    ingress_peer = fabric.ingress.get_json("/v1/fabric/self")["peer_id"]

    def everyone_measured_everyone() -> bool:
        seen = _measured(fabric.ingress.get_json("/v1/fabric/links", timeout=10))  # type: ignore[union-attr]
        return all(seen.get(p, set()) >= peers - {p} for p in peers)

    wait_until_sync(everyone_measured_everyone, 60, "every node measured every other",
                    interval=0.5, ignore=(OSError, KeyError))
    doc = fabric.ingress.get_json("/v1/fabric/links", timeout=10)
    for node in doc["nodes"]:
        for link in node["links"]:
            assert 0 < link["rtt_s"] < 5 and link["bytes_per_s"] > 1e5  # loopback

    # Loopback through Python TLS measures tens of MB/s here, so the KV transfer of a
    # prompt takes seconds: a loose TPOT SLA keeps the plan feasible.
    saved = tmp_path / "measured.yaml"
    result = CliRunner().invoke(cli, [
        "plan", "net", "--from-fabric", fabric.ingress.http_url, "--model", "llama-3-8b",
        "--prefill-gpus", "a100*", "--decode-gpus", "h100*",
        "--workload", str(EXAMPLES / "sharegpt.yaml"), "--sla-ttft", "2.5",
        "--sla-tpot", "30", "--max-candidates", "4", "--save-topology", str(saved),
        "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    gpus = [g for inst in plan["prefill_groups"] for grp in inst for g in grp]
    assert gpus and all(str(g).endswith(("-g0", "-g1")) for g in gpus)
    assert plan["H"] > 0 and plan["T_f"] > 0
    assert "measured" in result.stderr and "Gbit/s" in result.stderr
    topo = yaml.safe_load(saved.read_text())
    hosts = {host_name(p) for p in peers if p != ingress_peer}
    between = [e for e in topo["edges"] if e["kind"] == "ethernet"
               and {e["a"], e["b"]} == hosts]
    assert len(between) == 1  # the a100 <-> h100 link, as measured
