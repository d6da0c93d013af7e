"""Trace loading: CSV with ISO dates (Azure), JSONL with ms timestamps (Mooncake), errors."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from llmfabric.sim import WorkloadError, load_trace, replay

ROOT = Path(__file__).resolve().parents[3]
TRACES = Path(os.environ.get("LLMFABRIC_SHARED_DATA", ROOT.parent / "shared" / "data")) / "traces"


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


def test_missing_columns_and_bad_rows(tmp_path: Path) -> None:
    f = tmp_path / "bad.csv"
    f.write_text("when,foo\n1,2\n")
    with pytest.raises(WorkloadError, match="columns"):
        load_trace(f)
    with pytest.raises(WorkloadError):
        replay([(0.0, 0, 5)])


@pytest.mark.skipif(not TRACES.is_dir(), reason="shared traces not present")
def test_shared_traces_load() -> None:
    azure = load_trace(TRACES / "AzureLLMInferenceTrace_conv.csv", limit=2000)
    mooncake = load_trace(TRACES / "conversation_trace.jsonl", limit=2000)
    for wl in (azure, mooncake):
        assert len(wl) == 2000 and np.all(np.diff(wl.arrival_s) >= 0)
        assert wl.mean_input() > 100
