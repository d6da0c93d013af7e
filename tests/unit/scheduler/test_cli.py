from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from llmfabric.cli.controller import record_from_view
from llmfabric.cli.plan import command as plan_command
from llmfabric.registry.records import Lifecycle
from llmfabric.scheduler.errors import SpecError
from llmfabric.scheduler.spec import cluster_from_dict, workload_from_dict

ROOT = Path(__file__).resolve().parents[3]


def test_plan_json_with_the_simulator(tmp_path: Path) -> None:
    cluster = tmp_path / "c.yaml"
    cluster.write_text("pools:\n  - {gpu: A100-80GB, nodes: 1, gpus_per_node: 4}\n")
    workload = tmp_path / "w.yaml"
    workload.write_text("models:\n  - {model: llama-2-7b, rate: 2, mean_in: 256, mean_out: 64}\n"
                        "  - {model: llama-3.1-8b, rate: 1, mean_in: 256, mean_out: 64}\n")
    res = CliRunner().invoke(plan_command, ["--cluster", str(cluster), "--workload",
                                            str(workload), "--json", "--workers", "2",
                                            "--compare"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert set(doc) == {"cpsat", "memp", "greedy"}
    cp = doc["cpsat"]
    assert set(cp["allocation"]) == {"llama-2-7b", "llama-3.1-8b"}
    assert sum(g["gpus"] for g in cp["groups"]) <= 4
    assert cp["throughput_rps"] > 0 and cp["mean_latency_s"] > 0


def test_plan_rich_table_for_the_paper_case_files_exist() -> None:
    c = ROOT / "examples/cluster-table1.yaml"
    w = ROOT / "examples/workload-table1.yaml"
    from llmfabric.scheduler.spec import load_cluster, load_workload

    assert load_cluster(c).gpus == 56
    assert [m.arrival_rate for m in load_workload(w).loads] == [110, 185.5, 221]


def test_bad_specs_say_what_is_wrong() -> None:
    import pytest

    with pytest.raises(SpecError, match="gpus_per_node"):
        cluster_from_dict({"pools": [{"gpu": "A100", "nodes": 1, "gpus_per_node": 0}]})
    with pytest.raises(SpecError, match="rate"):
        workload_from_dict({"models": [{"model": "x", "mean_in": 1, "mean_out": 1}]})


def test_record_from_node_view() -> None:
    view = {"session_id": "s1", "peer_id": "p", "state": "JOIN", "suspected": False,
            "hardware": {"gpu_model": "H100-SXM", "gpu_count": 8, "gpu_memory_gb": 80.0,
                         "interconnect": "nvlink"}, "engine": "", "models": []}
    rec = record_from_view(view)
    assert rec is not None and rec.state == Lifecycle.JOIN and rec.meta.hardware.gpu_count == 8
    assert record_from_view({**view, "suspected": True}) is None
    assert record_from_view({"state": "JOIN"}) is None
