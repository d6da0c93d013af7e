"""Loaders: every format from small files the tests write, chunking, detection, errors."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmfabric.testing.shared_data import require_data, shared_data
from llmfabric.traces import (
    TraceFormatError,
    UnknownTraceFormatError,
    detect_format,
    iter_batches,
    iter_records,
)


@pytest.mark.parametrize("container", ["jsonl", "csv", "parquet"])
def test_native_roundtrip_every_container(
    native_trace: Callable[[str], Path], container: str
) -> None:
    path = native_trace(container)
    assert detect_format(path) == "llmfabric"
    records = list(iter_records(path))
    assert [r.timestamp for r in records] == [0.0, 30.0, 60.0, 61.0, 90.0, 200.0]
    first = records[0]
    assert (first.model, first.input_tokens, first.output_tokens) == ("a", 20, 10)
    assert first.sampling_params == {"temperature": 0.5}
    assert first.hash_ids == (1, 2) and first.block_tokens == 16
    assert first.latency_s == 2.0
    assert records[2].hash_ids is None and records[1].latency_s is None


def test_chunks_are_bounded_and_progress_reaches_the_end(
    native_trace: Callable[[str], Path],
) -> None:
    for container in ("jsonl", "csv", "parquet"):
        seen: list[tuple[int, int]] = []
        batches = list(
            iter_batches(
                native_trace(container),
                chunk_rows=4,
                progress=lambda d, t, seen=seen: seen.append((d, t)),
            )
        )
        assert [len(b) for b in batches] == [4, 2], container
        assert seen and seen[-1][0] == seen[-1][1], container


def test_swissai_aliases(tmp_path: Path, writers: Any) -> None:
    path = writers.csv(
        tmp_path / "swiss.csv",
        [
            {
                "created_at": "2025-01-01T00:00:30Z",
                "model_id": "apertus-8b",
                "prompt_tokens": 7,
                "completion_tokens": 3,
                "temperature": "0.7",
                "max_tokens": "64",
                "latency_ms": "1500",
            }
        ],
        [
            "created_at",
            "model_id",
            "prompt_tokens",
            "completion_tokens",
            "temperature",
            "max_tokens",
            "latency_ms",
        ],
    )
    (rec,) = list(iter_records(path, "swissai"))
    assert rec.timestamp == 1735689630.0
    assert rec.model == "apertus-8b"
    assert (rec.input_tokens, rec.output_tokens) == (7, 3)
    assert rec.sampling_params == {"temperature": 0.7, "max_tokens": 64}
    assert rec.latency_s == 1.5


def test_native_millisecond_timestamps(tmp_path: Path, writers: Any) -> None:
    path = writers.jsonl(
        tmp_path / "ms.jsonl",
        [{"timestamp": 1735689630500, "model": "m", "input_tokens": 1, "output_tokens": 1}],
    )
    (rec,) = list(iter_records(path))
    assert rec.timestamp == 1735689630.5


def test_burstgpt(tmp_path: Path, writers: Any) -> None:
    cols = ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"]
    rows = [
        {
            "Timestamp": 5,
            "Model": "ChatGPT",
            "Request tokens": 472,
            "Response tokens": 18,
            "Total tokens": 490,
            "Log Type": "Conversation log",
        },
        {
            "Timestamp": 45,
            "Model": "GPT-4",
            "Request tokens": 1087,
            "Response tokens": 0,
            "Total tokens": 1087,
            "Log Type": "API log",
        },
    ]
    path = writers.csv(tmp_path / "BurstGPT_1.csv", rows, cols)
    assert detect_format(path) == "burstgpt"
    recs = list(iter_records(path))
    assert [(r.timestamp, r.model, r.input_tokens, r.output_tokens) for r in recs] == [
        (5.0, "ChatGPT", 472, 18),
        (45.0, "GPT-4", 1087, 0),
    ]


@pytest.mark.parametrize(
    ("stamp", "fmt", "expected"),
    [
        ("2023-11-16 18:15:46.6805900", "azure2023", 1700158546.68059),
        ("2024-05-10 00:00:00.009930+00:00", "azure2024", 1715299200.00993),
    ],
)
def test_azure(tmp_path: Path, stamp: str, fmt: str, expected: float) -> None:
    path = tmp_path / "AzureLLMInferenceTrace_code.csv"
    path.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n{stamp},4808,10\n")
    assert detect_format(path) == fmt
    (rec,) = list(iter_records(path))
    assert rec.timestamp == pytest.approx(expected)
    assert rec.model == "AzureLLMInferenceTrace_code"
    assert (rec.input_tokens, rec.output_tokens) == (4808, 10)
    (renamed,) = list(iter_records(path, model="gpt-4"))
    assert renamed.model == "gpt-4"


def test_mooncake(tmp_path: Path, writers: Any) -> None:
    path = writers.jsonl(
        tmp_path / "conversation_trace.jsonl",
        [{"timestamp": 1500, "input_length": 600, "output_length": 20, "hash_ids": [0, 1]}],
    )
    assert detect_format(path) == "mooncake"
    (rec,) = list(iter_records(path))
    assert rec.timestamp == 1.5 and rec.block_tokens == 512
    assert rec.hash_ids == (0, 1) and rec.model == "conversation_trace"


def test_errors_say_what_to_do(tmp_path: Path, writers: Any) -> None:
    odd = tmp_path / "trace.txt"
    odd.write_text("x")
    with pytest.raises(UnknownTraceFormatError, match=r"\.csv"):
        list(iter_records(odd))
    unknown = writers.jsonl(tmp_path / "u.jsonl", [{"foo": 1}])
    with pytest.raises(UnknownTraceFormatError, match="pass the format explicitly \\(--format"):
        list(iter_records(unknown))
    empty = tmp_path / "e.jsonl"
    empty.write_text("")  # (said "cannot tell the trace format from columns []")
    with pytest.raises(UnknownTraceFormatError, match=r"^no columns .*\(an empty file\?\)$"):
        list(iter_records(empty))
    broken = writers.jsonl(
        tmp_path / "b.jsonl", [{"timestamp": 1, "input_tokens": 1, "output_tokens": 1}]
    )
    with pytest.raises(TraceFormatError, match="model"):
        list(iter_records(broken, "llmfabric"))
    with pytest.raises(UnknownTraceFormatError):
        list(iter_records(broken, "nope"))


def _shared_traces() -> Path:
    return shared_data("traces")


def test_real_azure_and_mooncake_traces_load() -> None:
    azure = _shared_traces() / "AzureLLMInferenceTrace_code.csv"
    require_data(azure, _shared_traces() / "synthetic_trace.jsonl")
    assert detect_format(azure) == "azure2023"
    assert sum(len(b) for b in iter_batches(azure, chunk_rows=4096)) == 8819
    mooncake = _shared_traces() / "synthetic_trace.jsonl"
    first = next(iter_records(mooncake))
    assert first.block_tokens == 512 and first.hash_ids


def test_header_only_csv_is_an_empty_trace(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("timestamp,model,input_tokens,output_tokens\n")
    assert detect_format(path) == "llmfabric"
    assert list(iter_records(path)) == []


_NATIVE = '"timestamp": 1, "model": "m", "input_tokens": 1, "output_tokens": 1'
_BURST = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("h.jsonl", f'{{{_NATIVE}}}\n\n{{{_NATIVE}, "hash_ids": 5}}\n', r"line 3: hash_ids 5"),
        ("l.jsonl", f'{{{_NATIVE}, "latency_s": "abc"}}\n', r"line 1: latency_s 'abc'"),
        ("l.jsonl", f'{{{_NATIVE}, "latency_s": -2}}\n', r"line 1: latency_s -2 must be"),
        ("b.csv", f"{_BURST}5,m,1,1,2,a\nxyz,m,1,1,2,a\n", r"row 2: Timestamp 'xyz'"),
        ("i.csv", "timestamp,model,input_tokens,output_tokens\ninf,m,1,1\n", r"row 1: timestamp"),
        ("n.csv", "timestamp,model,input_tokens,output_tokens\n-inf,m,1,1\n", r"row 1: timestamp"),
        (
            "e.csv",
            "timestamp,model,input_tokens,output_tokens\nnan,m,1,1\n",
            r"row 1: .*no timestamp",
        ),
        ("t.csv", "timestamp,model,input_tokens,output_tokens\n1,m,-90,1\n", r"row 1: input"),
        ("o.csv", f"{_BURST}5,m,1,-1,0,a\n", r"row 1: Response tokens '-1' must be >= 0"),
        ("f.jsonl", f'{{{_NATIVE}, "block_tokens": "x"}}\n', r"line 1: block_tokens 'x'"),
        ("j.jsonl", f"{{{_NATIVE}}}\n[1]\n", r"line 2 must be a JSON object"),
    ],
)
def test_bad_values_name_the_row_and_field(
    tmp_path: Path, name: str, text: str, match: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceFormatError, match=match):
        list(iter_records(path))


def test_mooncake_bad_hash_ids_and_infinite_timestamp(tmp_path: Path, writers: Any) -> None:
    row = {"timestamp": 1500, "input_length": 600, "output_length": 20}
    bad_hashes = writers.jsonl(tmp_path / "m.jsonl", [{**row, "hash_ids": "abc"}])
    with pytest.raises(TraceFormatError, match="line 1: hash_ids 'abc'"):
        list(iter_records(bad_hashes))
    path = tmp_path / "m.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"timestamp": [1.0, math.inf], "input_length": [1, 2], "output_length": [1, 2]}),
        path,
    )
    with pytest.raises(TraceFormatError, match="row 2: timestamp inf must be finite"):
        list(iter_records(path))
