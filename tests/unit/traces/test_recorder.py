"""TraceRecorder: anonymized rows in the trace schema, hashes that reveal shared prefixes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.testing.fake_clock import FakeClock
from llmfabric.traces import TraceError, TraceRecorder, approx_tokens, bucket_hashes, iter_records
from llmfabric.traces.analysis import TraceAnalyzer
from llmfabric.traces.recorder import flatten_messages

SALT = b"0123456789abcdef0123456789abcdef"


def test_approx_tokens() -> None:
    assert approx_tokens("Hello, world!") == ["Hello", ",", " world", "!"]
    assert "".join(approx_tokens("a  b\n c.")) == "a  b\n c."


def test_buckets_of_16_tokens_chained_and_salted() -> None:
    tokens = [f" w{i}" for i in range(40)]
    ids = bucket_hashes(tokens, SALT)
    assert len(ids) == 3 and all(len(h) == 16 for h in ids)
    changed = [*tokens[:20], " other", *tokens[21:]]
    ids2 = bucket_hashes(changed, SALT)
    assert ids2[0] == ids[0] and ids2[1] != ids[1] and ids2[2] != ids[2]
    assert bucket_hashes(tokens, b"another salt, 16+ bytes")[0] != ids[0]


@given(st.lists(st.text(min_size=1, max_size=4), max_size=80), st.integers(0, 5))
def test_prefix_hashes_are_leading_hashes(tokens: list[str], k: int) -> None:
    prefix = tokens[: 16 * k]
    full = bucket_hashes(tokens, SALT)
    assert full[: len(prefix) // 16] == bucket_hashes(prefix, SALT)[: len(prefix) // 16]


def test_record_writes_no_text_and_keeps_numeric_sampling(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "t" / "ingress.jsonl"
    recorder = TraceRecorder(path, SALT, clock=clock)
    rec = recorder.record(
        "llama",
        messages=[{"role": "user", "content": "my secret diagnosis is flu"}],
        input_tokens=12,
        output_tokens=5,
        sampling_params={
            "temperature": 0.2,
            "max_tokens": 9,
            "stop": ["secret"],
            "user": "bob",
            "messages": ["x"],
        },
        latency_s=0.75,
    )
    recorder.close()
    text = path.read_text()
    assert "secret" not in text and "flu" not in text and "bob" not in text
    row = json.loads(text)
    assert row["model"] == "llama" and row["input_tokens"] == 12 and row["output_tokens"] == 5
    assert row["sampling_params"] == {"temperature": 0.2, "max_tokens": 9}
    assert row["latency_s"] == 0.75 and row["block_tokens"] == 16
    assert row["timestamp"] == clock.wall()
    assert tuple(row["hash_ids"]) == rec.hash_ids and len(rec.hash_ids or ()) == 1
    with pytest.raises(TraceError, match="closed"):
        recorder.record("llama", prompt="x")


def test_approximate_count_when_engine_count_unknown(tmp_path: Path) -> None:
    recorder = TraceRecorder(tmp_path / "t.jsonl", SALT)
    rec = recorder.make_record("m", prompt="one two three")
    assert rec.input_tokens == 3 and rec.hash_ids is not None and len(rec.hash_ids) == 1
    recorder.close()


def test_short_salt_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="16 random bytes"):
        TraceRecorder(tmp_path / "t.jsonl", b"short")


def test_flatten_messages_parts() -> None:
    text = flatten_messages(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]},
        ]
    )
    assert text == "<|system|>\nbe brief\n<|user|>\nhi<image_url>\n"


async def test_recorded_trace_loads_and_shows_reuse(tmp_path: Path) -> None:
    path = tmp_path / "ingress.jsonl"
    recorder = TraceRecorder(path, SALT, clock=FakeClock())
    prompt = " ".join(f"w{i}" for i in range(32))  # exactly 32 approximate tokens: 2 buckets
    recorder.record("m", prompt=prompt, output_tokens=1, timestamp=100.0)
    recorder.record("m", prompt=prompt, output_tokens=1, timestamp=110.0)
    await recorder.aclose()
    records = list(iter_records(path))
    assert [r.input_tokens for r in records] == [32, 32]
    analyzer = TraceAnalyzer()
    analyzer.add(records)
    assert analyzer.finish().models["m"]["prefix_reuse_ratio"] == pytest.approx(0.5)
