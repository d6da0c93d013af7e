"""Matplotlib figures (Agg backend, PNG) for a Characterization. One function per figure.

Model names are what clients asked for: each goes through `label()` (controls escaped, `$`
not read as mathtext, whose parse error failed `trace analyze`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from llmfabric.traces.analysis import Characterization, TraceAnalyzer
from llmfabric.untrusted import printable


def label(name: str) -> str:
    """A model name as matplotlib prints it verbatim: controls escaped, each `$` escaped (a
    pair would start mathtext: "$\\frac{a$" raised at savefig), and a leading `_`, which
    would leave the name out of the legend, after a space."""
    text = printable(name).replace("$", "\\$")
    return " " + text if text.startswith("_") else text


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)


def _cdf(ax: Any, values: np.ndarray[Any, Any], label: str) -> None:
    if values.size == 0:
        return
    data = np.sort(values)
    ax.step(data, np.arange(1, data.size + 1) / data.size, where="post", label=label)


def plot_tiers(ch: Characterization, path: Path, top: int = 20) -> None:
    plt = _plt()
    rows = ch.tiers[:top]
    fig, ax = plt.subplots(figsize=(9, 4))
    colors = {1: "tab:red", 2: "tab:orange", 3: "tab:gray"}
    ax.bar(
        range(len(rows)),
        [max(r["tokens"], 1) for r in rows],
        color=[colors.get(r["tier"], "tab:gray") for r in rows],
    )
    ax.set_xticks(range(len(rows)), [label(r["model"]) for r in rows], rotation=60, ha="right",
                  fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("tokens (input + output)")
    ax.set_title("Token usage per model (red: tier 1, orange: tier 2, gray: tier 3)")
    _save(fig, path)


def plot_burstiness(ch: Characterization, path: Path, top: int = 15) -> None:
    plt = _plt()
    peaks = sorted(
        ((m, v["burstiness_peak"]) for m, v in ch.models.items() if v["burstiness_peak"]),
        key=lambda kv: -kv[1],
    )[:top]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar(range(len(peaks)), [p for _, p in peaks], color="tab:blue")
    ax.set_xticks(range(len(peaks)), [label(m) for m, _ in peaks], rotation=60, ha="right",
                  fontsize=7)
    ax.set_ylabel("peak TPM / mean TPM (active minutes)")
    ax.set_title("Burstiness magnitude per model")
    _save(fig, path)


def plot_burstiness_timeline(ch: Characterization, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4))
    for model, series in ch.burstiness_timelines.items():
        if series:
            xs, ys = zip(*series, strict=True)
            ax.plot(xs, ys, lw=0.8, label=label(model))
    ax.set_xlabel("hours since the model's first request")
    ax.set_ylabel("TPM / mean TPM")
    ax.set_title("Burstiness over time")
    ax.legend(fontsize=7)
    _save(fig, path)


def plot_lengths(ch: Characterization, analyzer: TraceAnalyzer, path: Path) -> None:
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for model in ch.lengths["cdf_models"]:
        inputs, outputs, _ = analyzer.samples(model)
        _cdf(left, np.maximum(inputs, 1), label(model))
        _cdf(right, np.maximum(outputs, 1), label(model))
    for ax, key, title in ((left, "input_tokens", "input"), (right, "output_tokens", "output")):
        agg = ch.lengths["aggregate"][key]
        if agg:
            for name, value in agg.items():
                ax.axvline(max(value, 1), ls=":", color="k", lw=0.8)
                ax.text(max(value, 1), 0.02, name.upper(), rotation=90, fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel(f"{title} tokens")
        ax.set_ylabel("CDF")
        ax.legend(fontsize=7)
    _save(fig, path)


def plot_series(
    series: dict[str, list[tuple[float, float]]],
    path: Path,
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    x_scale: float = 86_400.0,
) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4))
    for name, points in series.items():
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot([x / x_scale for x in xs], ys, marker=".", lw=0.8, label=label(name))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(fontsize=7)
    _save(fig, path)


def plot_latency(analyzer: TraceAnalyzer, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    _cdf(ax, analyzer.latency_samples(True), "reasoning")
    _cdf(ax, analyzer.latency_samples(False), "non-reasoning")
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency (s)")
    ax.set_ylabel("CDF")
    ax.legend()
    _save(fig, path)
