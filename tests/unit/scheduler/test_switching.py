"""Flying Serving's switching policies: valid actions, no flapping under the dwell time, and
no merge for a request that one engine can hold."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.scheduler.switching import (
    SWITCH_POLICIES,
    Action,
    Bind,
    Pending,
    Release,
    SwitchState,
    actions_for_width,
    aligned_groups,
    context_length,
    ewma_rate,
    hysteresis,
    load_threshold,
    make_policy,
    min_width,
    priority,
    rate_bounds,
    scheduled,
)

pytestmark = pytest.mark.unit

N_WIDTHS = st.sampled_from([(2, (1, 2)), (4, (1, 2)), (4, (1, 2, 4)), (8, (1, 2, 4, 8)),
                            (8, (1, 4))])


def apply(groups: tuple[tuple[int, ...], ...], actions: list[Action]
          ) -> tuple[tuple[int, ...], ...]:
    """Apply actions the way an engine does; asserts each is valid for the layout."""
    out = list(groups)
    for a in actions:
        if isinstance(a, Release):
            assert a.engines in out and len(a.engines) > 1
            out.remove(a.engines)
            out += [(e,) for e in a.engines]
        else:
            assert a.engines not in out
            out = [g for g in out if not set(g) & set(a.engines)] + [a.engines]
    assert sorted(e for g in out for e in g) == list(range(len(sorted(e for g in groups
                                                                      for e in g))))
    return tuple(sorted(out))


@st.composite
def states(draw: st.DrawFn) -> SwitchState:
    n, widths = draw(N_WIDTHS)
    w = draw(st.sampled_from(widths))
    groups = tuple(tuple(range(k * w, (k + 1) * w)) for k in range(n // w)) if w > 1 \
        else tuple((e,) for e in range(n))
    ints = st.lists(st.integers(0, 20), min_size=n, max_size=n).map(tuple)
    free = st.lists(st.integers(0, 4096), min_size=n, max_size=n).map(tuple)
    pending = st.lists(st.builds(Pending, st.integers(1, 20000), st.integers(0, 3),
                                 st.integers(0, n - 1)), max_size=4).map(tuple)
    return SwitchState(width=w, groups=groups, waiting=draw(ints), running=draw(ints),
                       free_kv=draw(free), widths=widths, now=draw(st.floats(0, 100)),
                       mode_since=draw(st.floats(0, 100)),
                       arrival_rate=draw(st.floats(0, 50)), pending=draw(pending),
                       running_priority=draw(st.integers(0, 3)),
                       running_wide=draw(st.integers(0, 2)))


def test_aligned_groups_are_the_paper_set() -> None:
    assert aligned_groups(4, (1, 2, 4)) == ((0, 1), (2, 3), (0, 1, 2, 3))
    assert aligned_groups(2, (1,)) == ()
    with pytest.raises(ValueError):
        aligned_groups(4, (3,))
    with pytest.raises(ValueError):
        aligned_groups(2, (4,))


@given(N_WIDTHS)
def test_aligned_groups_are_fewer_than_2n_and_aligned(nw: tuple[int, tuple[int, ...]]) -> None:
    n, widths = nw
    groups = aligned_groups(n, widths)
    assert len(groups) < 2 * n
    for g in groups:
        assert len(g) in widths and g[0] % len(g) == 0
        assert g == tuple(range(g[0], g[0] + len(g))) and g[-1] < n


@settings(max_examples=200)
@given(states(), st.sampled_from(sorted(set(SWITCH_POLICIES) - {"scheduled"})))
def test_every_policy_returns_applicable_aligned_actions(state: SwitchState, name: str) -> None:
    allowed = set(aligned_groups(state.n, state.widths))
    actions = make_policy(name)(state)
    for a in actions:
        assert a.engines in allowed
    apply(state.groups, actions)


@given(states(), st.data())
def test_actions_for_width_reach_that_width(state: SwitchState, data: st.DataObject) -> None:
    target = data.draw(st.sampled_from(state.widths))
    after = apply(state.groups, actions_for_width(state, target))
    assert {len(g) for g in after} == {target}
    assert actions_for_width(replace(state, groups=after, width=target), target) == []


@settings(max_examples=100)
@given(st.lists(st.tuples(st.floats(0.01, 1.0), st.floats(0, 20), st.integers(0, 12)),
                min_size=5, max_size=200),
       st.floats(0.1, 5.0))
def test_hysteresis_never_flaps_within_the_dwell_time(
        obs: list[tuple[float, float, int]], dwell: float) -> None:
    policy = hysteresis(mu_tp=8.0, dwell_s=dwell)
    groups: tuple[tuple[int, ...], ...] = ((0,), (1,))
    now, since, changes = 0.0, 0.0, []
    for dt, rate, waiting in obs:
        now += dt
        width = max(len(g) for g in groups)
        state = SwitchState(width, groups, (waiting, 0), (0, 0), (512, 512), (1, 2), now,
                            since, rate)
        after = apply(groups, policy(state))
        if after != groups:
            changes.append(now)
            groups, since = after, now
    assert all(b - a >= dwell for a, b in itertools.pairwise(changes))


def test_hysteresis_thresholds() -> None:
    base = SwitchState(1, ((0,), (1,)), (0, 0), (0, 0), (512, 512), (1, 2), now=10.0,
                       mode_since=0.0, arrival_rate=1.0)
    pol = hysteresis(mu_tp=8.0)
    assert pol(base) == [Bind((0, 1), "hard")]  # 1 < 0.5 x 8 and nothing waits
    assert pol(replace(base, arrival_rate=5.0)) == []  # between the thresholds
    tp = replace(base, width=2, groups=((0, 1),))
    # 7 > 0.8 x 8, but within two standard errors of a 5 s EWMA (2 sqrt(7 / 10) = 1.7)
    assert pol(replace(tp, arrival_rate=7.0)) == []
    assert pol(replace(tp, arrival_rate=9.0)) == [Release((0, 1))]  # 9 - 1.9 > 6.4
    assert pol(replace(tp, waiting=(6, 0))) == [Release((0, 1))]  # 3W wait
    assert pol(replace(tp, arrival_rate=7.0, mode_since=9.0)) == []  # within the dwell


@settings(max_examples=300)
@given(states())
def test_context_length_never_merges_for_a_request_one_engine_holds(
        state: SwitchState) -> None:
    fits = [p for p in state.pending if p.tokens <= max(state.free_kv)]
    dp = replace(state, width=1, groups=tuple((e,) for e in range(state.n)), pending=tuple(fits))
    assert not [a for a in context_length()(dp) if isinstance(a, Bind)]


@settings(max_examples=300)
@given(states())
def test_context_length_binds_the_smallest_group_that_holds_the_request(
        state: SwitchState) -> None:
    dp = replace(state, width=1, groups=tuple((e,) for e in range(state.n)))
    big = [p for p in dp.pending if p.tokens > max(dp.free_kv)]
    binds = [a for a in context_length()(dp) if isinstance(a, Bind)]
    if not big:
        assert not binds
        return
    head = big[0]
    holding = [g for g in aligned_groups(dp.n, dp.widths)
               if sum(dp.free_kv[e] for e in g) >= head.tokens]
    if not holding:
        assert not binds
        return
    assert len(binds) == 1
    assert sum(dp.free_kv[e] for e in binds[0].engines) >= head.tokens
    assert len(binds[0].engines) == min(len(g) for g in holding)


def test_context_length_releases_when_no_wide_request_is_left() -> None:
    tp = SwitchState(2, ((0, 1),), (0, 0), (0, 0), (512, 512), (1, 2))
    assert context_length()(replace(tp, running_wide=1)) == []
    assert context_length()(tp) == [Release((0, 1))]


def test_load_threshold_is_the_repository_rule() -> None:
    s = SwitchState(1, ((0,), (1,), (2,), (3,)), (2, 9, 9, 9), (0,) * 4, (0,) * 4, (1, 2, 4))
    assert load_threshold(3)(s) == [Bind((0, 1, 2, 3), "hard")]
    tp = replace(s, width=4, groups=((0, 1, 2, 3),), waiting=(3, 0, 0, 0))
    assert load_threshold(3)(tp) == [Release((0, 1, 2, 3))]


def test_priority_binds_hard_and_releases_when_done() -> None:
    s = SwitchState(1, ((0,), (1,)), (1, 0), (1, 1), (512, 512), (1, 2),
                    pending=(Pending(40, priority=2),))
    assert priority(p_hi=1)(s) == [Bind((0, 1), "hard")]
    assert priority(p_hi=3)(s) == []
    tp = replace(s, width=2, groups=((0, 1),), pending=())
    assert priority(p_hi=1)(replace(tp, running_priority=2)) == []
    assert priority(p_hi=1)(tp) == [Release((0, 1))]


def test_scheduled_follows_the_oracle_times() -> None:
    pol = scheduled([(5.0, 2), (10.0, 1)])
    s = SwitchState(1, ((0,), (1,)), (0, 0), (0, 0), (9, 9), (1, 2))
    assert pol(replace(s, now=1.0)) == []
    assert pol(replace(s, now=6.0)) == [Bind((0, 1), "hard")]
    assert pol(replace(s, now=11.0, width=2, groups=((0, 1),))) == [Release((0, 1))]


def test_min_width_and_ewma() -> None:
    assert min_width(100, 512, (1, 2)) == 1
    assert min_width(600, 512, (1, 2)) == 2
    assert min_width(2000, 512, (1, 2)) is None
    rate = 0.0
    for _ in range(50):  # 5 s = one time constant at 10 requests/s
        rate = ewma_rate(rate, 0.1, 1)
    assert rate == pytest.approx(10.0 * (1 - 2.718281828 ** -1), rel=1e-6)
    for _ in range(1000):
        rate = ewma_rate(rate, 0.1, 1)
    assert rate == pytest.approx(10.0, rel=1e-6)
    with pytest.raises(ValueError):
        make_policy("nope")


@settings(max_examples=300)
@given(states(), st.floats(0.5, 20.0), st.floats(1.0, 30.0))
def test_hysteresis_never_releases_on_a_rate_within_its_noise(
        state: SwitchState, mu_tp: float, window: float) -> None:
    """A rate estimate within two standard errors of high x mu_TP (the EWMA of a calm
    Poisson stream spikes that far) never splits a group while fewer than 3W wait: the group
    keeps up, and a release would re-prefill its whole batch."""
    w = max(x for x in state.widths if state.n % x == 0)
    calm = replace(state, waiting=(3 * w - 1, *(0 for _ in state.waiting[1:])))
    rate, err = rate_bounds(calm, window)
    pol = hysteresis(mu_tp=mu_tp, rate_window_s=window)
    releases = [a for a in pol(calm) if isinstance(a, Release)]
    if rate - 2.0 * err <= 0.8 * mu_tp:
        assert not releases
    elif calm.width > 1 and calm.now - calm.mode_since >= 2.0:
        assert releases  # a confident overload does split it


def _prio_state(waiting: tuple[int, ...], **kw: object) -> SwitchState:
    n = len(waiting)
    return replace(SwitchState(1, tuple((e,) for e in range(n)), waiting, (0,) * n,
                               (512,) * n, (1, 2, 4), now=10.0,
                               pending=(Pending(40, priority=1),)), **kw)


def test_priority_width_follows_the_backlog() -> None:
    pol = priority()
    assert pol(_prio_state((0, 0, 3, 4))) == [Bind((0, 1, 2, 3), "hard")]  # < 2 each: widest
    # a backlog: the narrowest group, on the engines holding the least work
    assert pol(_prio_state((5, 5, 0, 3))) == [Bind((2, 3), "hard")]
    assert pol(_prio_state((5, 5, 5, 5))) == []  # saturated: no group, DP priority admission
    assert priority(width="widest")(_prio_state((5, 5, 5, 5))) == [Bind((0, 1, 2, 3), "hard")]
    assert priority(width=2)(_prio_state((0, 0, 0, 0))) == [Bind((0, 1), "hard")]
    with pytest.raises(ValueError):
        priority(width=3)
    with pytest.raises(ValueError):
        priority(busy=5.0, saturated=4.0)


def test_priority_narrows_a_wide_group_only_after_the_dwell() -> None:
    wide = _prio_state((8, 0, 0, 0), width=4, groups=((0, 1, 2, 3),), running_priority=1)
    assert priority()(replace(wide, mode_since=9.0)) == []  # 1 s since the bind
    # backlog 2 per engine: narrower, in one step (away from the engine holding the queue)
    assert priority()(wide) == [Release((0, 1, 2, 3)), Bind((2, 3), "hard")]
    assert priority()(replace(wide, waiting=(16, 0, 0, 0))) == [Release((0, 1, 2, 3))]
    assert priority()(replace(wide, waiting=(4, 0, 0, 0))) == []  # backlog 1: keep it


@settings(max_examples=300)
@given(states(), st.floats(0.1, 5.0))
def test_priority_binds_only_for_priority_work_and_within_the_allowed_widths(
        state: SwitchState, dwell: float) -> None:
    actions = priority(dwell_s=dwell)(state)
    urgent = any(p.priority >= 1 for p in state.pending)
    binds = [a for a in actions if isinstance(a, Bind)]
    assert len(binds) <= 1
    if binds:
        assert binds[0].method == "hard" and (urgent or state.running_priority >= 1)
        assert state.width == 1 or len(binds[0].engines) < state.width  # only ever narrower
    if [a for a in actions if isinstance(a, Release)] and (urgent or state.running_priority):
        assert state.now - state.mode_since >= dwell  # a narrowing waits for the dwell


@settings(max_examples=100)
@given(st.floats(0.5, 50.0), st.floats(0.2, 20.0), st.floats(1.0, 10.0))
def test_rate_bounds_remove_the_start_up_bias_of_the_ewma(
        rate: float, seconds: float, tau: float) -> None:
    """An EWMA started at 0 reads low for the first few tau; the corrected estimate of a
    steady stream is its rate from the first second on, and its error shrinks with time."""
    dt = 0.01
    ewma, t = 0.0, 0.0
    while t < seconds - 1e-9:
        ewma = ewma_rate(ewma, dt, 0, tau) + rate * -math.expm1(-dt / tau)  # a fluid stream
        t += dt
    state = SwitchState(1, ((0,), (1,)), (0, 0), (0, 0), (0, 0), now=t, arrival_rate=ewma)
    est, err = rate_bounds(state, tau)
    assert est == pytest.approx(rate, rel=1e-6)
    later = rate_bounds(replace(state, now=t + tau, arrival_rate=rate), tau)[1]
    assert 0 < later < err or math.isclose(later, err, rel_tol=1e-3)


def test_priority_keeps_the_widest_group_only_while_it_keeps_up() -> None:
    pol = priority(mu_tp=10.0)  # the widest group serves 10 requests/s at a full batch
    calm = _prio_state((0, 0, 0, 0), now=100.0, arrival_rate=7.0)
    assert pol(calm) == [Bind((0, 1, 2, 3), "hard")]
    # 9 > 0.8 x 10: everything on TP8 would queue; the narrowest group, the rest stay DP
    assert pol(replace(calm, arrival_rate=9.0)) == [Bind((0, 1), "hard")]
    wide = replace(calm, width=4, groups=((0, 1, 2, 3),), running_priority=1, pending=())
    # a bound group narrows only on a confident overload (two standard errors: 2 x 0.95)
    assert pol(replace(wide, arrival_rate=9.0)) == []
    assert pol(replace(wide, arrival_rate=12.0)) == [Release((0, 1, 2, 3)), Bind((0, 1), "hard")]
