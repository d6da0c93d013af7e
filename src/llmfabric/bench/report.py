"""Write a run's results: JSON (vLLM field names where they overlap) and a markdown table."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from llmfabric.untrusted import markdown_text

_ROWS: tuple[tuple[str, str], ...] = (
    ("num_requests", "Requests sent"),
    ("completed", "Successful requests"),
    ("failed", "Failed requests"),
    ("duration", "Benchmark duration (s)"),
    ("total_input_tokens", "Total input tokens"),
    ("total_output_tokens", "Total generated tokens"),
    ("request_throughput", "Request throughput (req/s)"),
    ("request_goodput", "Request goodput (req/s)"),
    ("slo_attainment", "SLO attainment"),
    ("output_throughput", "Output token throughput (tok/s)"),
    ("total_token_throughput", "Total token throughput (tok/s)"),
)
_CONFIG_KEYS = (
    "backend",
    "model_id",
    "arrival",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
)
_METRICS = (
    ("ttft", "Time to first token"),
    ("tpot", "Time per output token (excl. 1st)"),
    ("itl", "Inter-token latency"),
    ("e2el", "End-to-end latency"),
)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) >= 0.01 or value == 0 else f"{value:.4f}"
    return str(value)


def to_markdown(result: dict[str, Any], title: str = "Serving benchmark") -> str:
    lines = [f"# {title}", ""]
    config = {k: result[k] for k in _CONFIG_KEYS if result.get(k) is not None}
    if config:
        lines.append("Config: " + ", ".join(f"{k}={_cell(v)}" for k, v in config.items()))
        lines.append("")
    lines += ["| metric | value |", "|---|---|"]
    lines += [f"| {label} | {_cell(result.get(key))} |" for key, label in _ROWS]
    lines += [
        "",
        "| latency (ms) | mean | median | std | "
        + " | ".join(
            k.split("_")[0].upper() for k in result if k.startswith("p") and k.endswith("_ttft_ms")
        )
        + " |",
    ]
    pkeys = [k.split("_")[0] for k in result if k.startswith("p") and k.endswith("_ttft_ms")]
    lines.append("|---|---|---|---|" + "---|" * len(pkeys))
    for name, label in _METRICS:
        cells = [result.get(f"{s}_{name}_ms") for s in ("mean", "median", "std")]
        cells += [result.get(f"{p}_{name}_ms") for p in pkeys]
        lines.append(f"| {label} | " + " | ".join(_cell(c) for c in cells) + " |")
    errors = result.get("errors_by_kind") or {}
    lines += ["", "Errors: " + (", ".join(f"{k}: {v}" for k, v in errors.items()) or "none")]
    lines += [f"- {markdown_text(str(e['kind']))} x{e['count']}: "
              f"{markdown_text(str(e['message'])) or '(no message)'}"
              for e in result.get("error_samples") or ()]
    lines.append("")
    return "\n".join(lines)


def write_results(
    result: dict[str, Any],
    json_path: str | os.PathLike[str] | None = None,
    markdown_path: str | os.PathLike[str] | None = None,
) -> None:
    if json_path is not None:
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    if markdown_path is not None:
        path = Path(markdown_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(to_markdown(result))
