"""Read a trace file of any known format in chunks, without loading it all into memory.

CSV is streamed with `pyarrow.csv.open_csv`, Parquet with `ParquetFile.iter_batches`, JSONL line
by line with orjson. `iter_batches` yields lists of at most `chunk_rows` TraceRecords and calls
`progress(bytes_done, bytes_total)` after each chunk (rows of Parquet files stand for bytes).
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from llmfabric.traces.errors import TraceFormatError, UnknownTraceFormatError
from llmfabric.traces.formats import FORMATS, adapter_for, format_from_columns
from llmfabric.traces.schema import TraceRecord
from llmfabric.untrusted import clip, printable

Progress = Callable[[int, int], None]
DEFAULT_CHUNK_ROWS = 65_536

_JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
_CSV_SUFFIXES = (".csv",)
_PARQUET_SUFFIXES = (".parquet", ".pq")


def container_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in _JSONL_SUFFIXES:
        return "jsonl"
    if suffix in _CSV_SUFFIXES:
        return "csv"
    if suffix in _PARQUET_SUFFIXES:
        return "parquet"
    raise UnknownTraceFormatError(
        f"{path}: unknown file type {suffix!r}; traces must be .csv, .jsonl/.json or .parquet"
    )


def detect_format(path: str | os.PathLike[str]) -> str:
    """The trace format of `path`, guessed from its header / first row."""
    p = Path(path)
    container = container_of(p)
    first: dict[str, Any] | None = None
    if container == "jsonl":
        with p.open("rb") as fh:
            for lineno, line in enumerate(fh, start=1):
                if line.strip():
                    first = _json_row(line, p, lineno)
                    break
        columns = list(first or {})
    elif container == "csv":
        import pyarrow.csv as pacsv

        reader = pacsv.open_csv(p, read_options=pacsv.ReadOptions(block_size=1 << 16))
        columns = list(reader.schema.names)
        try:
            rows = reader.read_next_batch().slice(0, 1).to_pylist()
        except StopIteration:  # header only: the format still shows in the column names
            rows = []
        first = {k: str(v) for k, v in rows[0].items()} if rows else None
    else:
        import pyarrow.parquet as pq

        columns = list(pq.ParquetFile(p).schema_arrow.names)
    return format_from_columns(columns, first)


def _json_row(line: bytes, path: Path, lineno: int) -> dict[str, Any]:
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(f"{path}: line {lineno} is not valid JSON ({exc})") from exc
    if not isinstance(row, dict):
        raise TraceFormatError(f"{path}: line {lineno} must be a JSON object")
    return row


def _adapt(
    adapt: Callable[[dict[str, Any]], TraceRecord], row: dict[str, Any], path: Path, n: int
) -> TraceRecord:
    """`adapt(row)`; any failure is a TraceFormatError that says where in the file it was:
    line `n` of JSONL, row `n` of CSV/Parquet (data rows counted from 1, the header excluded)."""
    try:
        return adapt(row)
    except (TraceFormatError, TypeError, ValueError, OverflowError) as exc:
        where = f"line {n}" if container_of(path) == "jsonl" else f"row {n}"
        detail = exc if isinstance(exc, TraceFormatError) else f"bad value ({exc})"
        raise TraceFormatError(f"{path}: {where}: {detail}") from exc


class _CountingReader(io.RawIOBase):
    """A read-only file wrapper that counts the bytes handed out (for progress on CSV)."""

    def __init__(self, fh: io.BufferedReader) -> None:
        self._fh = fh
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._fh.readinto(buffer)
        self.count += n or 0
        return n or 0


def iter_batches(
    path: str | os.PathLike[str],
    fmt: str = "auto",
    *,
    model: str | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    progress: Progress | None = None,
) -> Iterator[list[TraceRecord]]:
    """Yield the trace's records in chunks of at most `chunk_rows`.

    `fmt` is one of `FORMATS` or "auto"; `model` overrides the model of every record (traces
    without a model column use the file's stem otherwise).
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"trace file {p} does not exist")
    if chunk_rows < 1:
        raise ValueError("chunk_rows must be at least 1")
    container = container_of(p)
    try:
        if fmt == "auto":
            fmt = detect_format(p)
        elif fmt not in FORMATS:
            raise UnknownTraceFormatError(
                f"unknown format {fmt!r}; use auto or one of {FORMATS}")
        adapt = adapter_for(fmt, default_model=p.stem, model=model)
        if container == "jsonl":
            yield from _jsonl_batches(p, adapt, chunk_rows, progress)
        elif container == "csv":
            yield from _csv_batches(p, adapt, chunk_rows, progress)
        else:
            yield from _parquet_batches(p, adapt, chunk_rows, progress)
    except ValueError as exc:
        # pyarrow's ArrowInvalid (a ValueError) on a file that is no CSV/Parquet: it named no
        # file ("Empty CSV file") and quoted the offending bytes raw, control characters and
        # all, onto the operator's terminal
        raise TraceFormatError(f"{p}: not a readable {container} trace: "
                               f"{printable(clip(str(exc), 200))}") from exc


def iter_records(
    path: str | os.PathLike[str], fmt: str = "auto", **kwargs: Any
) -> Iterator[TraceRecord]:
    """Every record of the trace, one at a time (same arguments as `iter_batches`)."""
    for batch in iter_batches(path, fmt, **kwargs):
        yield from batch


def _jsonl_batches(
    p: Path, adapt: Callable[[dict[str, Any]], TraceRecord], chunk: int, progress: Progress | None
) -> Iterator[list[TraceRecord]]:
    total = p.stat().st_size
    done = 0
    batch: list[TraceRecord] = []
    with p.open("rb") as fh:
        for lineno, line in enumerate(fh, start=1):
            done += len(line)
            if not line.strip():
                continue
            batch.append(_adapt(adapt, _json_row(line, p, lineno), p, lineno))
            if len(batch) >= chunk:
                yield batch
                batch = []
                if progress:
                    progress(done, total)
    if batch:
        yield batch
    if progress:
        progress(total, total)


def _csv_batches(
    p: Path, adapt: Callable[[dict[str, Any]], TraceRecord], chunk: int, progress: Progress | None
) -> Iterator[list[TraceRecord]]:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    total = p.stat().st_size
    # Read every column as text: adapters convert, so odd timestamps (7 fractional digits,
    # offsets) never trip pyarrow's inference, and types are stable from chunk to chunk.
    with p.open("rb") as raw:
        header = raw.readline().decode("utf-8-sig")
    column_names = next(csv.reader([header]), [])
    convert = pacsv.ConvertOptions(
        column_types={n: pa.string() for n in column_names}, strings_can_be_null=True
    )
    with p.open("rb") as fh:
        counter = _CountingReader(fh)
        reader = pacsv.open_csv(
            io.BufferedReader(counter),
            read_options=pacsv.ReadOptions(block_size=1 << 20),
            convert_options=convert,
        )
        batch: list[TraceRecord] = []
        n = 0  # data rows, the header excluded
        for record_batch in reader:
            for row in record_batch.to_pylist():
                n += 1
                batch.append(_adapt(adapt, row, p, n))
                if len(batch) >= chunk:
                    yield batch
                    batch = []
            if progress:
                progress(min(counter.count, total), total)
        if batch:
            yield batch
    if progress:
        progress(total, total)


def _parquet_batches(
    p: Path, adapt: Callable[[dict[str, Any]], TraceRecord], chunk: int, progress: Progress | None
) -> Iterator[list[TraceRecord]]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(p)
    total = pf.metadata.num_rows
    done = 0
    for record_batch in pf.iter_batches(batch_size=chunk):
        rows = record_batch.to_pylist()
        yield [_adapt(adapt, row, p, done + k) for k, row in enumerate(rows, 1)]
        done += len(rows)
        if progress:
            progress(done, total)
