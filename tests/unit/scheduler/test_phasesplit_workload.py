"""PDWorkload from measured lengths (the paper's Azure 2023 trace): a seeded draw of real
(prompt, output) pairs, cut to the model's context window as a serving front end must."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.scheduler.errors import SpecError
from llmfabric.scheduler.phasesplit.problem import PDWorkload
from llmfabric.testing.shared_data import require_data, shared_data


def test_draws_whole_pairs_deterministically() -> None:
    ins, outs = np.array([100, 200, 300]), np.array([1, 2, 3])
    a = PDWorkload.from_samples(2.0, ins, outs, n=64, seed=5)
    b = PDWorkload.from_samples(2.0, ins, outs, n=64, seed=5)
    assert np.array_equal(a.in_lengths, b.in_lengths)
    assert np.array_equal(a.out_lengths, b.out_lengths)
    # pairs stay together: output k always comes with prompt 100 k
    assert np.array_equal(a.in_lengths, 100 * a.out_lengths)
    assert set(a.out_lengths.tolist()) == {1, 2, 3}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 5000), st.integers(1, 5000)), min_size=1, max_size=30),
    st.integers(2, 4096),
    st.integers(0, 10),
)
def test_every_pair_fits_the_window(pairs: list[tuple[int, int]], ctx: int, seed: int) -> None:
    ins, outs = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    wl = PDWorkload.from_samples(1.0, ins, outs, max_context=ctx, n=50, seed=seed)
    assert np.all(wl.in_lengths + wl.out_lengths <= ctx)
    assert np.all(wl.in_lengths >= 1) and np.all(wl.out_lengths >= 1)
    uncut = PDWorkload.from_samples(1.0, ins, outs, n=50, seed=seed)
    # only cut, never grown; pairs already inside the window are unchanged
    assert np.all(wl.in_lengths <= uncut.in_lengths)
    assert np.all(wl.out_lengths <= uncut.out_lengths)
    inside = uncut.in_lengths + uncut.out_lengths <= ctx
    assert np.array_equal(wl.in_lengths[inside], uncut.in_lengths[inside])
    # the output is kept whole whenever it leaves room for one prompt token
    keep = uncut.out_lengths <= ctx - 1
    assert np.array_equal(wl.out_lengths[keep], uncut.out_lengths[keep])


@pytest.mark.parametrize(
    ("ins", "outs", "kw"),
    [
        ([], [], {}),
        ([1, 2], [1], {}),
        ([[1]], [[1]], {}),
        ([5], [5], {"n": 0}),
        ([5], [5], {"max_context": 1}),
    ],
)
def test_hostile_inputs_are_refused(ins: list[int], outs: list[int], kw: dict[str, int]) -> None:
    with pytest.raises(SpecError):
        PDWorkload.from_samples(1.0, ins, outs, **kw)


def test_azure_trace_medians_are_the_papers() -> None:
    """ThunderServe App. E quotes the Azure 2023 trace's MEDIANS (conversation ~1020 prompt /
    129 output tokens, coding ~1500 / 13); their means are far larger (long tails)."""
    paths = {k: shared_data("traces", f"AzureLLMInferenceTrace_{k}.csv") for k in ("conv", "code")}
    require_data(*paths.values())
    stats = {}
    for k, p in paths.items():
        with p.open(newline="") as fh:
            rows = [
                (int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(fh)
            ]
        a = np.array(rows)
        stats[k] = (np.median(a[:, 0]), np.median(a[:, 1]), a[:, 1].mean())
    assert stats["conv"][:2] == (1020, 129)
    assert abs(stats["code"][0] - 1500) < 50 and stats["code"][1] == 13
    assert stats["conv"][2] > 1.5 * 129  # mean output 211: the median is not the mean
