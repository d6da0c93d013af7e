from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.engines import text
from llmfabric.engines.timing import (
    RooflineTiming,
    SimCostTiming,
    TableTiming,
    TimingModel,
    table_timing,
    timing_for,
)


def test_table_by_gpu_class() -> None:
    assert table_timing("NVIDIA H100 80GB HBM3") is table_timing("h100")
    assert table_timing("A100-80GB").decode_step_s(1, 0) > table_timing("H100").decode_step_s(1, 0)
    assert isinstance(table_timing("unknown-accelerator"), TableTiming)


def test_timing_for_uses_sim_specs_when_known() -> None:
    t = timing_for("H100-SXM", "llama-3.1-8b")
    assert isinstance(t, SimCostTiming)
    _check_physics(t)


def test_own_roofline_from_specs() -> None:
    # llama-3.1-8b-like numbers on an H100: 8B active params, bf16, 128 KiB KV per token.
    t = RooflineTiming(flops=989e12, mem_bw=3.35e12, active_params=8e9, weight_bytes=16e9,
                       kv_bytes_per_token=131072.0)
    _check_physics(t)


def _check_physics(t: TimingModel) -> None:
    # An 8B bf16 model is memory-bound in decode: ~16 GB / ~2.5 TB/s effective ~ 6-9 ms.
    assert 0.004 < t.decode_step_s(1, 100) < 0.015
    assert t.decode_step_s(64, 64 * 1000) > t.decode_step_s(1, 1000)
    assert t.prefill_s(4000) > t.prefill_s(100)



def test_gpu_and_tp_order() -> None:
    t = timing_for("H100-SXM", "llama-3.1-8b")
    slower = timing_for("A100-80GB", "llama-3.1-8b")
    assert slower.decode_step_s(1, 100) > t.decode_step_s(1, 100)
    tp2 = timing_for("H100-SXM", "llama-3.1-8b", tp=2)
    assert tp2.decode_step_s(1, 100) < t.decode_step_s(1, 100)


def test_unknown_model_falls_back_to_table() -> None:
    assert isinstance(timing_for("H100", "no-such-model-xyz"), TableTiming)


def test_text_is_deterministic() -> None:
    s = text.seed_of("hello")
    a = "".join(text.token_text(s, i) for i in range(10))
    b = "".join(text.token_text(s, i) for i in range(10))
    assert a == b and len(a.split()) == 10
    assert 16 <= text.natural_length(s) < 80
    assert text.count_tokens("") == 1
    assert text.count_tokens("abcdefgh") == 2
    assert text.count_tokens("abcdefghi") == 3


def test_embeddings_unit_and_deterministic() -> None:
    v = text.embedding("x", 64)
    assert len(v) == 64 and math.isclose(float(np.linalg.norm(v)), 1.0, rel_tol=1e-9)
    assert v == text.embedding("x", 64)
    assert v != text.embedding("y", 64)


@given(st.text(st.characters(exclude_categories=("Cs",)), max_size=60), st.integers(0, 200))
def test_a_prompt_ending_with_its_own_answer_is_continued(prompt: str, k: int) -> None:
    """What a continued completions stream sends (prompt + relayed text) is recognised: the
    engine goes on from token k of the answer to the original prompt, as an LM would."""
    seed = text.seed_of(prompt)
    answer = "".join(text.token_text(seed, i) for i in range(k))
    got, offset = text.continued_prompt(prompt + answer)
    if k:
        assert offset >= k and got == (prompt + answer)[:len(got)]
        # (a longer tail may match when the prompt itself ends with its prefix's answer)
        rest = (prompt + answer)[len(got):]
        g = text.seed_of(got)
        assert rest == "".join(text.token_text(g, i) for i in range(offset))
    else:
        assert (prompt + answer)[len(got):] == "".join(
            text.token_text(text.seed_of(got), i) for i in range(offset))


def test_an_ordinary_prompt_is_not_a_continuation() -> None:
    assert text.continued_prompt("write a poem about the sea") == (
        "write a poem about the sea", 0)
    assert text.continued_prompt("") == ("", 0)
