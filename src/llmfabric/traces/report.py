"""`analyze_trace`: run the characterization over a file and write DIR/ (PNGs, JSON, report.md).

Files written:
- `summary.json`: one entry per model, `{MODEL: {"requests", "input_tokens": {"p50", "p95",
  "p99"}, "output_tokens": {...}, "burstiness_peak", "prefix_reuse_ratio", ...}}` (null where
  the trace lacks the data: no hash ids -> prefix_reuse_ratio null, no latency -> latency_s
  null);
- `trace.json`: the whole trace: records, models, tokens, time bin and reuse history;
- one PNG + one JSON per figure: tiers, burstiness, burstiness_timeline, lengths,
  output_ratio, prefix_reuse (when hash ids exist), latency (when latencies exist);
- `report.md` linking them with the headline numbers.

Model names are what clients asked for: in report.md each is `markdown_text()` (a `|` would
break the table, `<script>` render in some viewers, ESC reach a terminal's `cat`), in the
plots `plots.label()`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from llmfabric.traces import plots
from llmfabric.traces.analysis import Characterization, TraceAnalyzer
from llmfabric.traces.load import DEFAULT_CHUNK_ROWS, iter_batches
from llmfabric.untrusted import markdown_text

ProgressFactory = Callable[[int], Callable[[int, int], None]]


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf become null, tuples become lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _write_json(path: Path, data: Any) -> None:
    path.write_bytes(orjson.dumps(_clean(data), option=orjson.OPT_INDENT_2))


def analyze_trace(
    path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    fmt: str = "auto",
    model: str | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    history_s: float = 3_600.0,
    bin_s: float | None = None,
    plots_enabled: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> Characterization:
    """Characterize the trace at `path` and write every artifact into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    analyzer = TraceAnalyzer(bin_s=bin_s, history_s=history_s)
    for batch in iter_batches(path, fmt, model=model, chunk_rows=chunk_rows, progress=progress):
        analyzer.add(batch)
    ch = analyzer.finish()
    _write_json(out / "summary.json", ch.models)
    _write_json(out / "trace.json", ch.trace)
    figures: list[tuple[str, str, Any]] = [
        ("tiers", "Token usage per model, ranked (tiers of the power law)", ch.tiers),
        (
            "burstiness",
            "Burstiness magnitude per model",
            {
                m: {
                    "burstiness_peak": v["burstiness_peak"],
                    "request_burstiness_peak": v["request_burstiness_peak"],
                    "mean_tpm_active": v["mean_tpm_active"],
                    "active_minutes": v["active_minutes"],
                }
                for m, v in ch.models.items()
            },
        ),
        ("burstiness_timeline", "Burstiness over time (TPM / mean TPM)", ch.burstiness_timelines),
        (
            "lengths",
            "Input and output length CDFs",
            {
                "aggregate": ch.lengths["aggregate"],
                "models": {
                    m: {
                        "input_tokens": ch.models[m]["input_tokens"],
                        "output_tokens": ch.models[m]["output_tokens"],
                    }
                    for m in ch.lengths["cdf_models"]
                },
            },
        ),
        ("output_ratio", "Output-token ratio over time", ch.output_ratio),
    ]
    if ch.prefix_reuse:
        figures.append(
            (
                "prefix_reuse",
                "Prefix reuse ratio over the model lifetime",
                {
                    "history_s": history_s,
                    "series": ch.prefix_reuse,
                    "ratio": {m: v["prefix_reuse_ratio"] for m, v in ch.models.items()},
                },
            )
        )
    if ch.latency:
        figures.append(
            ("latency", "End-to-end latency CDF, reasoning vs non-reasoning", ch.latency)
        )
    x_scale, x_unit = _axis_unit(float(ch.trace["bin_s"]))
    for name, _, data in figures:
        _write_json(out / f"{name}.json", data)
    if plots_enabled:
        plots.plot_tiers(ch, out / "tiers.png")
        plots.plot_burstiness(ch, out / "burstiness.png")
        plots.plot_burstiness_timeline(ch, out / "burstiness_timeline.png")
        plots.plot_lengths(ch, analyzer, out / "lengths.png")
        plots.plot_series(
            ch.output_ratio,
            out / "output_ratio.png",
            xlabel=f"{x_unit} since trace start",
            x_scale=x_scale,
            ylabel="output / (input + output) tokens",
            title="Output-token ratio over time",
        )
        if ch.prefix_reuse:
            plots.plot_series(
                ch.prefix_reuse,
                out / "prefix_reuse.png",
                xlabel=f"{x_unit} since the model's first request",
                x_scale=x_scale,
                ylabel="reused input tokens / input tokens",
                title=f"Prefix reuse (history {history_s:g} s)",
            )
        if ch.latency:
            plots.plot_latency(analyzer, out / "latency.png")
    (out / "report.md").write_text(_markdown(Path(path).name, ch, figures, plots_enabled))
    return ch


def _axis_unit(bin_s: float) -> tuple[float, str]:
    if bin_s < 3_600:
        return 60.0, "minutes"
    if bin_s < 86_400:
        return 3_600.0, "hours"
    return 86_400.0, "days"


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _markdown(
    source: str, ch: Characterization, figures: list[tuple[str, str, Any]], with_png: bool
) -> str:
    lines = [
        f"# Workload characterization of `{source}`",
        "",
        f"{ch.trace['records']} requests, {ch.trace['models']} models, "
        f"{ch.trace['total_tokens']} tokens. Numbers per model: [summary.json](summary.json); "
        "the whole trace: [trace.json](trace.json).",
        "",
        "| model | tier | requests | input p50/p95/p99 | output p50/p95/p99 | burstiness peak "
        "| prefix reuse |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in ch.tiers:
        m = ch.models[row["model"]]
        inp, outp = m["input_tokens"] or {}, m["output_tokens"] or {}
        lines.append(
            f"| {markdown_text(row['model'])} | {m['tier']} | {m['requests']} | "
            f"{'/'.join(_fmt(inp.get(k)) for k in ('p50', 'p95', 'p99'))} | "
            f"{'/'.join(_fmt(outp.get(k)) for k in ('p50', 'p95', 'p99'))} | "
            f"{_fmt(m['burstiness_peak'], 2)} | {_fmt(m['prefix_reuse_ratio'], 3)} |"
        )
    lines.append("")
    for name, title, _ in figures:
        lines.append(f"## {title}")
        lines.append("")
        if with_png:
            lines.append(f"![{title}]({name}.png)")
            lines.append("")
        lines.append(f"Data: [{name}.json]({name}.json)")
        lines.append("")
    if not ch.prefix_reuse:
        lines.append("Prefix reuse: the trace has no hash ids.\n")
    if not ch.latency:
        lines.append("Latency: the trace has no end-to-end latencies.\n")
    return "\n".join(lines)
