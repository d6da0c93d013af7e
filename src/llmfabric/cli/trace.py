"""`llmfabric trace analyze FILE --out DIR`: workload characterization of a trace file."""

from __future__ import annotations

from pathlib import Path

import click

FORMAT_CHOICES = ("auto", "llmfabric", "swissai", "burstgpt", "azure2023", "azure2024", "mooncake")


@click.group(name="trace")
def command() -> None:
    """Workload traces: characterization report (OpenTela §6 analyses)."""


@command.command(name="analyze")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="directory for summary.json, per-figure PNG + JSON and report.md",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMAT_CHOICES),
    default="auto",
    show_default=True,
    help="trace format (detected from the columns by default)",
)
@click.option("--model", default=None, help="model name for every record (overrides the file)")
@click.option(
    "--history",
    "history_s",
    type=click.FloatRange(min=1.0),
    default=3600.0,
    show_default=True,
    help="prefix-reuse history window, seconds",
)
@click.option(
    "--bin",
    "bin_s",
    type=click.FloatRange(min=60.0),
    default=None,
    help="time-bin of the over-time series, seconds [default: auto, <= 100 bins]",
)
@click.option(
    "--chunk-rows",
    type=click.IntRange(min=1),
    default=65_536,
    show_default=True,
    help="rows read per chunk",
)
@click.option("--no-plots", is_flag=True, help="write the JSON numbers and report only")
@click.option("--quiet", is_flag=True, help="no progress bar")
def analyze(
    file: Path,
    out_dir: Path,
    fmt: str,
    model: str | None,
    history_s: float,
    bin_s: float | None,
    chunk_rows: int,
    no_plots: bool,
    quiet: bool,
) -> None:
    """Characterize the trace FILE and write the figures, numbers and report into --out."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    from llmfabric.traces import TraceError
    from llmfabric.traces.report import analyze_trace

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        disable=quiet,
        transient=True,
    ) as bar:
        task = bar.add_task(f"reading {file.name}", total=None)

        def on_progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        try:
            ch = analyze_trace(
                file,
                out_dir,
                fmt=fmt,
                model=model,
                chunk_rows=chunk_rows,
                history_s=history_s,
                bin_s=bin_s,
                plots_enabled=not no_plots,
                progress=on_progress,
            )
        except (TraceError, ValueError) as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(
        f"{ch.trace['records']} requests, {ch.trace['models']} models -> {out_dir / 'report.md'}"
    )
