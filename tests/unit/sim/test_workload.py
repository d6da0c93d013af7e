"""Trace loading: the simulator's seconds format, Azure CSV (ISO dates), Mooncake JSONL
(timestamps in ms, decided once for the format, never per row), errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from llmfabric.cli.main import cli
from llmfabric.sim import WorkloadError, load_trace, replay
from llmfabric.testing.shared_data import require_data, shared_data

TRACES = shared_data("traces")


def test_azure_style_csv(tmp_path: Path) -> None:
    f = tmp_path / "azure.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:50.9951690,396,0\n")
    wl = load_trace(f)
    assert wl.arrival_s.tolist() == pytest.approx([0.0, 4.314579], abs=1e-5)
    assert wl.input_tokens.tolist() == [374, 396]
    assert wl.output_tokens.tolist() == [44, 1]  # zero outputs clamp to one token


def test_mooncake_style_jsonl_ms(tmp_path: Path) -> None:
    f = tmp_path / "m.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                 '{"timestamp": 250000, "input_length": 20, "output_length": 6}\n')
    wl = load_trace(f)
    assert wl.arrival_s.tolist() == [0.0, 250.0]


def test_mooncake_small_timestamps_are_still_ms(tmp_path: Path) -> None:
    """The unit belongs to the format: 3000 and 99000 are ms in a Mooncake trace even though
    they are small numbers (a per-row "> 1e5 means ms" guess read them as seconds)."""
    f = tmp_path / "m.jsonl"
    f.write_text('{"timestamp": 3000, "input_length": 10, "output_length": 5}\n'
                 '{"timestamp": 99000, "input_length": 20, "output_length": 6}\n'
                 '{"timestamp": 102000, "input_length": 30, "output_length": 7}\n')
    wl = load_trace(f)
    assert wl.arrival_s.tolist() == pytest.approx([0.0, 96.0, 99.0])


def test_sim_format_is_seconds_and_explicit_format_wins(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text('{"time_s": 0.5, "input_tokens": 10, "output_tokens": 5}\n'
                 '{"time_s": 250000, "input_tokens": 20, "output_tokens": 0}\n')
    wl = load_trace(f)
    assert wl.arrival_s.tolist() == [0.0, 249999.5]  # seconds, whatever the magnitude
    assert wl.output_tokens.tolist() == [5, 1]
    g = tmp_path / "native.csv"  # the llmfabric schema: timestamp in seconds
    g.write_text("timestamp,input_tokens,output_tokens\n10,5,5\n130,6,6\n")
    assert load_trace(g).arrival_s.tolist() == [0.0, 120.0]
    assert load_trace(g, fmt="llmfabric").duration_s == 120.0
    assert len(load_trace(g, limit=1)) == 1


def test_missing_columns_and_bad_rows(tmp_path: Path) -> None:
    f = tmp_path / "bad.csv"
    f.write_text("when,foo\n1,2\n")
    with pytest.raises(WorkloadError, match="columns"):
        load_trace(f)
    with pytest.raises(WorkloadError, match="unknown"):
        load_trace(f, fmt="nonsense")
    with pytest.raises(WorkloadError):
        load_trace(tmp_path / "missing.csv")
    g = tmp_path / "short.csv"
    g.write_text("time_s,input_tokens\n0,5\n")
    with pytest.raises(WorkloadError, match="output_tokens"):
        load_trace(g)
    with pytest.raises(WorkloadError):
        replay([(0.0, 0, 5)])


def test_shared_traces_load() -> None:
    require_data(TRACES / "AzureLLMInferenceTrace_conv.csv", TRACES / "conversation_trace.jsonl")
    azure = load_trace(TRACES / "AzureLLMInferenceTrace_conv.csv", limit=2000)
    mooncake = load_trace(TRACES / "conversation_trace.jsonl", limit=2000)
    for wl in (azure, mooncake):
        assert len(wl) == 2000 and np.all(np.diff(wl.arrival_s) >= 0)
        assert wl.mean_input() > 100


def test_mooncake_conversation_trace_lasts_about_an_hour() -> None:
    """12,031 requests whose last timestamp is 3,536,999 ms: the replay lasts 3,537 s (the
    per-row unit guess made it 99,000 s: its first 291 rows, <= 99,000 ms, read as seconds)."""
    require_data(TRACES / "conversation_trace.jsonl")
    wl = load_trace(TRACES / "conversation_trace.jsonl")
    assert len(wl) == 12031
    assert wl.duration_s == pytest.approx(3536.999)
    assert wl.rate == pytest.approx(12031 / 3536.999)


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_replay_refuses_non_finite_times(bad: float) -> None:
    with pytest.raises(WorkloadError, match=r"row 2: arrival time .* not a finite number"):
        replay([(0.0, 5, 5), (bad, 5, 5)])
    with pytest.raises(WorkloadError, match="row 1"):
        replay([(0.0, bad, 5)])
    assert replay([(-3.0, 5, 5), (2.0, 5, 5)]).arrival_s.tolist() == [0.0, 5.0]


@pytest.mark.parametrize(("body", "match"), [
    ("0,5,5\ninf,5,5\n", "row 2: time_s must be a finite number, got 'inf'"),
    ("0,5,5\nnan,5,5\n", "row 2: time_s must be a finite number, got 'nan'"),
    ("abc,5,5\n", "row 1: time_s must be a finite number, got 'abc'"),
    ("0,-90,5\n", "row 1: input_tokens must be a finite number >= 0, got '-90'"),
    ("0,5,inf\n", "row 1: output_tokens must be a finite number >= 0, got 'inf'"),
])
def test_sim_format_names_the_bad_row(tmp_path: Path, body: str, match: str) -> None:
    f = tmp_path / "t.csv"
    f.write_text("time_s,input_tokens,output_tokens\n" + body)
    with pytest.raises(WorkloadError, match=match):
        load_trace(f)


def test_sim_format_jsonl_row_that_is_not_an_object(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text('{"time_s": 0, "input_tokens": 5, "output_tokens": 5}\n5\n')
    with pytest.raises(WorkloadError, match="row 2 is not a JSON object"):
        load_trace(f)


def test_cli_simulate_trace_names_the_bad_row(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("time_s,input_tokens,output_tokens\n0,5,5\ninf,5,5\n")
    res = CliRunner().invoke(cli, ["simulate", "--model", "meta-llama/Llama-3.1-8B-Instruct",
                                   "--gpu", "h100", "--trace", str(f)])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert "row 2: time_s must be a finite number" in res.output


@pytest.mark.parametrize("name, data", [
    ("t.csv", b"time_s,input_tokens,output_tokens\n0,\xff\xfe,3\n"),
    ("t.jsonl", b'{"timestamp": 1, "input_length": 3, "output_length": 2}\n\xff\n'),
    ("t.bin", b"\x00\x01\xff\xfe"),
])
def test_a_trace_that_is_not_text_says_so(tmp_path: Path, name: str, data: bytes) -> None:
    # was Python's "'utf-8' codec can't decode byte 0xff in position 36: invalid start byte"
    f = tmp_path / name
    f.write_bytes(data)
    with pytest.raises(WorkloadError, match=rf"cannot read trace .*{name}: not UTF-8 text "
                                            r"\(a 0x(ff|fe) byte\); a trace is CSV or JSONL"):
        load_trace(f)
