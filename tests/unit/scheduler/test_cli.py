from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
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


def test_plan_rich_table_for_the_paper_case() -> None:
    """The rich table of `plan` on the paper's Table 1 files: one row per group, the stage
    that produced the plan, and the real time spent estimating (it was always +0.00 s)."""
    c = ROOT / "examples/cluster-table1.yaml"
    w = ROOT / "examples/workload-table1.yaml"
    res = CliRunner().invoke(plan_command, ["--cluster", str(c), "--workload", str(w),
                                            "--workers", "2", "--compare"],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    out = res.output
    for policy in ("cpsat", "memp", "greedy"):
        assert f"placement: {policy} (" in out
    assert re.search(r"placement: cpsat \((OPTIMAL|OPTIMAL_WITHIN_GAP|FEASIBLE), from "
                     r"(cpsat|cpsat\+polish|warm start)\)", out), out
    rows = [[c.strip() for c in line.strip().strip("│").split("│")]
            for line in out.splitlines() if line.lstrip().startswith("│")]
    rows = [r for r in rows if r[0] != "model"]  # the header
    assert {r[0] for r in rows} == {"Llama-2-13b", "CodeLlama-34b", "Llama-3.3-70B-Instruct"}
    for cells in rows:  # model, GPU, TP, DP, GPUs, load share
        assert len(cells) == 6, cells
        tp, dp, gpus = (int(cells[i]) for i in (2, 3, 4))
        assert tp * dp == gpus and cells[1] in ("A100-80GB", "GH200")
        assert cells[5].endswith("%")
    est = [float(m) for m in re.findall(r"\+(\d+\.\d+) s estimating", out)]
    assert len(est) == 3 and all(e > 0 for e in est)
    assert "of its load has no replica" in out  # 516 req/s do not fit on 56 GPUs


def _trace(path: Path) -> None:
    rows = [{"timestamp": float(t), "model": "llama-2-7b", "input_tokens": 100 + 200 * (t % 2),
             "output_tokens": 50} for t in range(40)]
    rows += [{"timestamp": 2.0 * t, "model": "qwen3-1.7b", "input_tokens": 80,
              "output_tokens": 10 + t} for t in range(20)]
    rows += [{"timestamp": 5.0, "model": "some-custom-model", "input_tokens": 10,
              "output_tokens": 5}]
    path.write_text("\n".join(json.dumps(r) for r in sorted(rows, key=lambda r: r["timestamp"]))
                    + "\n")


def test_workload_from_a_trace(tmp_path: Path) -> None:
    from llmfabric.scheduler.tracewl import workload_from_trace

    trace = tmp_path / "t.jsonl"
    _trace(trace)
    wl = workload_from_trace(trace, rate_scale=2.0)
    assert [m.model for m in wl.loads] == ["llama-2-7b", "qwen3-1.7b", "some-custom-model"]
    llama = wl.loads[0]
    assert llama.arrival_rate == pytest.approx(2.0 * 40 / 39.0)  # span 0..39 s
    assert (llama.mean_in, llama.std_in, llama.mean_out, llama.std_out) == pytest.approx(
        (200.0, 100.0, 50.0, 0.0))
    qwen = wl.loads[1]
    assert qwen.arrival_rate == pytest.approx(2.0 * 20 / 39.0)
    assert qwen.mean_out == pytest.approx(19.5) and qwen.std_out == pytest.approx(
        (sum((10 + t - 19.5) ** 2 for t in range(20)) / 20) ** 0.5)


def test_plan_from_a_workload_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    _trace(trace)
    cluster = tmp_path / "c.yaml"
    cluster.write_text("pools:\n  - {gpu: A100-80GB, nodes: 1, gpus_per_node: 4}\n")
    res = CliRunner().invoke(plan_command, ["--cluster", str(cluster), "--workload-trace",
                                            str(trace), "--json", "--workers", "2"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert set(doc["workload"]) == {"llama-2-7b", "qwen3-1.7b"}
    assert doc["workload"]["llama-2-7b"]["rate"] == pytest.approx(40 / 39.0)
    assert doc["workload"]["llama-2-7b"]["std_in"] == pytest.approx(100.0)
    assert any("some-custom-model" in n and "left out" in n for n in doc["notes"])
    assert {g["model"] for g in doc["groups"]} == {"llama-2-7b", "qwen3-1.7b"}
    assert doc["build_s"] > 0
    both = CliRunner().invoke(plan_command, ["--cluster", str(cluster), "--workload-trace",
                                             str(trace), "--workload", str(cluster)])
    assert both.exit_code != 0 and "exactly one" in both.output


def test_bad_specs_say_what_is_wrong() -> None:
    with pytest.raises(SpecError, match="gpus_per_node"):
        cluster_from_dict({"pools": [{"gpu": "A100", "nodes": 1, "gpus_per_node": 0}]})
    with pytest.raises(SpecError, match="rate"):
        workload_from_dict({"models": [{"model": "x", "mean_in": 1, "mean_out": 1}]})


def test_a_swapped_cluster_and_workload_is_one_line_per_field() -> None:
    """`plan --cluster W --workload C` printed pydantic's multi-line dump (private class
    names, links to its website); now each field is named on one line with the keys."""
    res = CliRunner().invoke(plan_command, [
        "--cluster", str(ROOT / "examples" / "workload-table1.yaml"),
        "--workload", str(ROOT / "examples" / "cluster-table1.yaml")])
    assert res.exit_code == 1
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("Error:")]
    assert "models: field required" in line and "pools: unknown key (the keys: models:" in line
    assert "pydantic" not in res.output and "_ClusterIn" not in res.output
    with pytest.raises(SpecError, match=r"^w: the file: should be a mapping \(models:"):
        workload_from_dict(["x"], "w")


def test_record_from_node_view() -> None:
    view = {"session_id": "s1", "peer_id": "p", "state": "JOIN", "suspected": False,
            "hardware": {"gpu_model": "H100-SXM", "gpu_count": 8, "gpu_memory_gb": 80.0,
                         "interconnect": "nvlink"}, "engine": "", "models": []}
    rec = record_from_view(view)
    assert rec is not None and rec.state == Lifecycle.JOIN and rec.meta.hardware.gpu_count == 8
    assert record_from_view({**view, "suspected": True}) is None
    assert record_from_view({"state": "JOIN"}) is None


def test_controller_dry_run_with_node_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """`controller --node URL --once`: reads the node's registry view, plans, and prints the
    decisions it would take (LoggingExecutor: nothing is sent). Bare nodes count as capacity
    only when they accept assignments; serving nodes are fixed capacity."""
    import llmfabric.cli.controller as ctl_cli

    def view(sid: str, state: str, roles: list[str], models: list[str] = ()) -> dict[str, Any]:
        return {"session_id": sid, "peer_id": f"p-{sid}", "state": state, "suspected": False,
                "hardware": {"gpu_model": "A100-80GB", "gpu_count": 4, "gpu_memory_gb": 80.0,
                             "interconnect": "nvlink"},
                "engine": "sim" if models else "", "roles": roles,
                "models": [{"id": m} for m in models]}

    views = [view("idle", "JOIN", ["assignable"]), view("closed", "JOIN", []),
             view("busy", "SERVING", [], ["llama-2-7b"]),
             {**view("gone", "JOIN", ["assignable"]), "suspected": True}]
    fetched: list[str] = []

    async def fake_fetch(url: str) -> list[Any]:
        fetched.append(url)
        return [(r, "") for r in (ctl_cli.record_from_view(v) for v in views) if r is not None]

    monkeypatch.setattr(ctl_cli, "_fetch", fake_fetch)
    workload = tmp_path / "w.yaml"
    workload.write_text("models:\n  - {model: llama-2-7b, rate: 4, mean_in: 256, mean_out: 64}\n"
                        "  - {model: llama-3.1-8b, rate: 2, mean_in: 256, mean_out: 64}\n")
    res = CliRunner().invoke(ctl_cli.command, ["--node", "http://node:8080", "--workload",
                                               str(workload), "--policy", "greedy", "--once"])
    assert res.exit_code == 0, res.output
    assert fetched == ["http://node:8080"]
    decisions = json.loads(res.output[res.output.index("["):])
    assert [d["kind"] for d in decisions] == ["Assign"]
    (assign,) = decisions
    assert assign["session_ids"] == ["idle"] and assign["template"] == "sim"
    assert assign["tp"] * assign["dp"] == len(assign["gpu_ids"])
    # the busy node serves llama-2-7b already (fixed capacity): the idle one gets the other
    assert assign["model"] == "llama-3.1-8b"
    usage = CliRunner().invoke(ctl_cli.command, ["--once"])
    assert usage.exit_code != 0 and "--bootstrap" in usage.output


@pytest.mark.parametrize(("status", "key", "expected"), [
    (401, None, "needs an API key (HTTP 401)"),
    (401, "lf-wrong", "refused the API key (HTTP 401)"),
    (404, None, "answered HTTP 404"),
])
def test_controller_dry_run_says_why_the_node_refused(
        monkeypatch: pytest.MonkeyPatch, status: int, key: str | None, expected: str) -> None:
    """`controller --node URL` against an ingress whose fleet views need a key printed an
    aiohttp traceback (ClientResponseError 401); now one line says what to do."""
    import http.server
    import threading

    import llmfabric.cli.controller as ctl_cli

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {"LLMFABRIC_API_KEY": key} if key else {}
        monkeypatch.delenv("LLMFABRIC_API_KEY", raising=False)
        res = CliRunner().invoke(ctl_cli.command, [
            "--node", f"http://127.0.0.1:{server.server_address[1]}", "--once"], env=env)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert res.exit_code == 1, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert expected in res.output and "Traceback" not in res.output
    if status == 401:
        assert "LLMFABRIC_API_KEY" in res.output and "--public-fleet-info" in res.output
