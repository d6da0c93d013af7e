"""Workloads: synthetic prompts of the requested length, replayed traces keep their prefixes."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from llmfabric.bench import (
    Poisson,
    prompt_from_hash_ids,
    replay_workload,
    synthetic_prompt,
    synthetic_workload,
)
from llmfabric.traces import TraceRecord


@given(st.integers(1, 2000), st.integers(0, 100))
def test_synthetic_prompt_has_n_words_and_4n_minus_1_chars(n: int, seed: int) -> None:
    prompt = synthetic_prompt(n, random.Random(seed))
    assert len(prompt.split(" ")) == n
    assert len(prompt) == 4 * n - 1  # ceil(len / 4) == n under the 4-chars-per-token rule


def test_synthetic_workload_lengths_and_bounds() -> None:
    specs = synthetic_workload(
        Poisson(50.0),
        model="m",
        input_len=100,
        output_len=20,
        range_ratio=0.5,
        max_requests=40,
        max_duration_s=100,
        seed=7,
    )
    assert len(specs) == 40
    assert all(50 <= s.input_len <= 150 and 10 <= s.output_len <= 30 for s in specs)
    assert all(len(s.prompt.split(" ")) == s.input_len and s.model == "m" for s in specs)
    again = synthetic_workload(
        Poisson(50.0),
        model="m",
        input_len=100,
        output_len=20,
        range_ratio=0.5,
        max_requests=40,
        max_duration_s=100,
        seed=7,
    )
    assert again == specs


def test_prompts_from_hash_ids_share_exactly_the_shared_blocks() -> None:
    a = prompt_from_hash_ids([1, 2, 3], 16, 48).split(" ")
    b = prompt_from_hash_ids([1, 2, 9], 16, 48).split(" ")
    assert len(a) == 48 and a[:32] == b[:32] and a[32:] != b[32:]
    assert len(prompt_from_hash_ids([1], 16, 40).split(" ")) == 40


def test_replay_workload_uses_trace_times_lengths_and_model_override() -> None:
    records = [
        TraceRecord(10.0, "x", 30, 5, hash_ids=(1, 2), block_tokens=16),
        TraceRecord(12.0, "y", 5000, 900),
        TraceRecord(20.0, "x", 20, 0),
    ]
    specs = replay_workload(
        records,
        time_scale=2.0,
        max_requests=10,
        max_duration_s=100,
        max_input_len=1000,
        max_output_len=100,
    )
    assert [s.offset_s for s in specs] == [0.0, 4.0, 20.0]
    assert [(s.model, s.input_len, s.output_len) for s in specs] == [
        ("x", 30, 5),
        ("y", 1000, 100),
        ("x", 20, 1),
    ]
    assert specs[0].prompt == prompt_from_hash_ids((1, 2), 16, 30)
    forced = replay_workload(records, max_requests=2, max_duration_s=100, model="m")
    assert [s.model for s in forced] == ["m", "m"]
