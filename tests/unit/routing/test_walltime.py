"""Walltime routing: a request never starts on a node whose allocation ends (minus its drain
lead) before the request is expected to finish, while another node outlasts it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.walltime import (
    DEFAULT_TOKENS,
    fixed_rate,
    outlasts,
    requested_tokens,
    sim_rate,
    walltime_filter,
)

NOW = 1_800_000_000.0


def cand(sid: str, end: float = 0.0, lead: float = 0.0, gpu: str = "L40S",
         model: str = "qwen3-1.7b") -> Candidate:
    return Candidate(sid, "p", "prov", "", (), Hardware(gpu, 1, 48.0), ServedModel(model),
                     LoadHints(), alloc_end=end, drain_lead_s=lead)


def test_requested_tokens() -> None:
    assert requested_tokens({"max_tokens": 10}) == 10
    assert requested_tokens({"max_completion_tokens": 7, "max_tokens": 10}) == 7
    for bad in ({}, {"max_tokens": True}, {"max_tokens": -3}, {"max_tokens": "9"}):
        assert requested_tokens(bad) == DEFAULT_TOKENS
    assert requested_tokens({"max_tokens": 10**12}) == 1 << 20


def test_long_requests_avoid_nodes_ending_soon() -> None:
    est = fixed_rate(per_token_s=0.05, overhead_s=5)
    ending = cand("ending", end=NOW + 200, lead=100)  # drains in 100 s
    steady = cand("steady")
    both = [ending, steady]
    assert walltime_filter(both, NOW, 1900, est) == both  # 100 s: done as the drain starts
    assert walltime_filter(both, NOW, 1901, est) == [steady]  # 100.05 s: cut by the drain
    assert walltime_filter(both, NOW, 100, est) == both  # 10 s: fine on either
    # Nobody outlasts it: every candidate stays (a possible cut beats a certain 503).
    assert walltime_filter([ending], NOW, 10_000, est) == [ending]


def test_sim_rate_prices_known_models_and_falls_back() -> None:
    est = sim_rate(fallback=fixed_rate(per_token_s=1.0, overhead_s=0), background=False)
    known = est(cand("a"), 1000)
    assert 5 < known < 1000  # a decode step on an L40S is well under a second
    assert est(cand("b", model="no-such-model"), 1000) == 1000.0
    assert est(cand("c", gpu="H100-SXM"), 1000) < known  # faster GPU, shorter estimate


def test_background_estimates_answer_with_the_fallback_until_ready() -> None:
    from llmfabric.testing.poll import wait_until_sync

    est = sim_rate(fallback=fixed_rate(per_token_s=1.0, overhead_s=0))
    assert est(cand("a"), 1000) == 1000.0  # not computed yet: the fallback, no waiting
    wait_until_sync(lambda: est(cand("a"), 1000) < 1000.0, 30, "the background estimate",
                    interval=0.01)


@given(end=st.floats(0, 1e10), lead=st.floats(0, 1e5), expected=st.floats(0, 1e6),
       now=st.floats(0, 1e10))
def test_outlasts_is_the_drain_deadline(end: float, lead: float, expected: float,
                                        now: float) -> None:
    c = cand("x", end=end, lead=lead)
    assert outlasts(c, now, expected) == (end <= 0 or now + expected <= end - lead)


@given(st.lists(st.tuples(st.floats(0, 2e9), st.floats(0, 1e4)), min_size=1, max_size=6),
       st.integers(1, 100_000))
def test_filter_never_widens_and_never_empties(nodes: list[tuple[float, float]],
                                               tokens: int) -> None:
    cands = [cand(str(i), e, lead) for i, (e, lead) in enumerate(nodes)]
    kept = walltime_filter(cands, NOW, tokens, fixed_rate())
    assert kept and all(c in cands for c in kept)
    fits = [c for c in cands if outlasts(c, NOW, fixed_rate()(c, tokens))]
    assert kept == (fits or cands)


def test_the_simulators_rate_is_none_for_unknown_names_and_a_logged_bug(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from llmfabric import sim
    from llmfabric.routing.walltime import _sim_token_s

    with caplog.at_level("ERROR", logger="llmfabric.routing.walltime"):
        assert _sim_token_s("no-such-model", "H100", 1) is None  # (a record's name)
        assert caplog.text == ""

        def broken(*args: object) -> float:
            raise TypeError("a bug")

        monkeypatch.setattr(sim, "decode_step_time", broken)
        assert _sim_token_s("llama-3.1-8b", "H100", 1) is None
    assert "failed to price 'llama-3.1-8b'" in caplog.text and "a bug" in caplog.text
