"""Queue stability of PD plans: the stated utilisation headroom (analytic) and the growing-queue
detector on simulated traces (stability.py), and their use by the planner."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric import sim
from llmfabric.scheduler.errors import SpecError
from llmfabric.scheduler.phasesplit.config import ConfigSearch
from llmfabric.scheduler.phasesplit.orchestrate import PairModel, Routing
from llmfabric.scheduler.phasesplit.problem import CloudCluster, PDWorkload, TabuOptions
from llmfabric.scheduler.phasesplit.stability import overload_share, queue_trend
from llmfabric.scheduler.phasesplit.tabu import tabu_search
from llmfabric.sim.topology import cloud_instances

pytestmark = pytest.mark.unit
MODEL = sim.get_model("llama-30b")
SLO = sim.SLO(ttft_s=1.5, tpot_s=0.1)


# --- the headroom, by hand -------------------------------------------------------------


def test_overload_share_by_hand() -> None:
    # one decode replica taking all 8 req/s at 85 % of its capacity, headroom 80 %: it gets
    # 8 (1 - 0.8 / 0.85) = 0.4706 req/s too many = 5.88 % of all requests
    assert overload_share(np.array([8.0]), np.array([0.85]), 0.8, 8.0) == pytest.approx(
        1 - 0.8 / 0.85
    )
    # at 50 % nothing is beyond the headroom
    assert overload_share(np.array([8.0]), np.array([0.5]), 0.8, 8.0) == 0.0
    # two replicas, 4 req/s each at 0.9 and 0.6: only the first counts, 4 (1 - 8/9) / 8
    got = overload_share(np.array([4.0, 4.0]), np.array([0.9, 0.6]), 0.8, 8.0)
    assert got == pytest.approx(4 * (1 - 0.8 / 0.9) / 8)
    # a loaded replica with no capacity: everything it gets is too much
    assert overload_share(np.array([2.0, 6.0]), np.array([np.inf, 0.1]), 0.8, 8.0) == 0.25
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(SpecError):
            overload_share(np.array([1.0]), np.array([0.5]), bad, 1.0)
    with pytest.raises(SpecError):
        TabuOptions(headroom=0.0)
    with pytest.raises(SpecError):
        TabuOptions(headroom=1.2)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.one_of(st.just(0.0), st.floats(1e-3, 10.0)), st.floats(0.0, 3.0)),
        min_size=1,
        max_size=8,
    ),
    st.floats(0.05, 1.0),
    st.floats(0.05, 1.0),
)
def test_overload_share_laws(reps: list[tuple[float, float]], h1: float, h2: float) -> None:
    lam = np.array([r[0] for r in reps])
    rho = np.array([r[1] for r in reps])
    rate = max(float(lam.sum()), 1e-3)
    lo, hi = sorted((h1, h2))
    a, b = overload_share(lam, rho, lo, rate), overload_share(lam, rho, hi, rate)
    assert 0.0 <= b <= a <= 1.0  # a tighter headroom never counts less
    # zero exactly when no loaded replica is past the headroom
    assert (b == 0.0) == bool(np.all((rho <= hi) | (lam == 0)))


@pytest.fixture(scope="module")
def pair() -> tuple[CloudCluster, PDWorkload, PairModel]:
    cluster = CloudCluster.from_topology(
        cloud_instances([("A40", 8), ("RTX-3090-Ti", 4)], inter_gbps=(5, 40), seed=3)
    )
    wl = PDWorkload.from_means(4, 1000, 100, slo=SLO)
    cs = ConfigSearch(cluster, MODEL, wl)
    pre = cs.deduce(frozenset(range(0, 8)), "prefill")
    dec = cs.deduce(frozenset(range(8, 12)), "decode")
    assert pre is not None and dec is not None and len(dec.replica_configs) == 1
    pm = PairModel(
        pre.replica_configs, dec.replica_configs, cluster, MODEL, wl, 4, 64, headroom=0.8
    )
    return cluster, wl, pm


def _all_to(pm: PairModel) -> Routing:
    """Requests spread evenly over the prefill replicas, all to the one decode replica."""
    m = len(pm.pre)
    x = np.full(m, 1.0 / m)
    y = np.ones((m, 1))
    z = x[:, None] * y
    return Routing(x, y, z, 0.0, 1.0)


@pytest.mark.parametrize(("load", "flagged"), [(0.85, True), (0.5, False)])
def test_a_decode_replica_at_85_percent_is_penalised_at_50_not(
    pair: tuple[CloudCluster, PDWorkload, PairModel], load: float, flagged: bool
) -> None:
    cluster, wl, base = pair
    # the arrival rate that loads the decode replica to `load` of its TPOT-bound tokens/s
    rate = load * float(base.tps[0]) / base.mean_out
    pm = PairModel(base.pre, base.dec, cluster, MODEL, wl.scaled(rate), 4, 64, headroom=0.8)
    r = pm.with_loads(_all_to(pm))
    assert r.load_decode is not None and r.load_prefill is not None
    assert float(r.load_decode[0]) == pytest.approx(load)
    m = len(pm.pre)
    assert r.load_prefill == pytest.approx(rate / m * pm.mean_s)
    assert r.load_prefill.max() < 0.8  # only the decode replica is past the headroom
    if flagged:
        assert r.overload == pytest.approx(1 - 0.8 / 0.85)
        assert r.score == pytest.approx(1.0 - (1 - 0.8 / 0.85))
    else:
        assert r.overload == 0.0 and r.score == 1.0


def test_the_lp_never_loads_a_replica_past_the_headroom(
    pair: tuple[CloudCluster, PDWorkload, PairModel],
) -> None:
    cluster, wl, pm = pair
    for rate in (1.0, 3.0, 6.0, 12.0):
        w = wl.scaled(rate)
        p = PairModel(pm.pre, pm.dec, cluster, MODEL, w, 4, 64, headroom=0.7)
        r = p.route()
        assert r.load_prefill is not None and r.load_decode is not None
        want = overload_share(
            rate * np.concatenate([r.z.sum(axis=1), r.z.sum(axis=0)]),
            np.concatenate([r.load_prefill, r.load_decode]),
            0.7,
            rate,
        )
        assert r.overload == pytest.approx(want)
        assert r.score == pytest.approx(r.attainment - r.overload)
        if r.overload == 0.0:
            assert max(r.load_prefill.max(), r.load_decode.max()) <= 0.7 + 1e-9
    with pytest.raises(SpecError):
        PairModel(pm.pre, pm.dec, cluster, MODEL, wl, 4, 64, headroom=0.0)


# --- the growing-queue detector on synthetic traces ----------------------------------


def _trace(tpot: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    n = len(tpot)
    arrival = np.linspace(0.0, 100.0, n, endpoint=False)
    ttft = np.full(n, 0.3)
    e2e = ttft + 100 * tpot
    return arrival, ttft, tpot, e2e


def test_a_queue_that_builds_is_flagged_by_hand() -> None:
    # first half: TPOT 0.05 (stretch 0.5, all met). Second half: every other request at
    # 0.2 s (stretch 2): attainment 1.0 -> 0.5, mean stretch 0.5 -> 1.25 (2.5x)
    tpot = np.full(200, 0.05)
    tpot[100::2] = 0.2
    t = queue_trend(*_trace(tpot), SLO, 100.0)
    assert (t.first_attainment, t.second_attainment) == (1.0, 0.5)
    assert t.first_stretch == pytest.approx(0.5) and t.second_stretch == pytest.approx(1.25)
    assert t.growing and t.attainment == 0.5


def test_a_steady_trace_with_bursts_is_not_flagged() -> None:
    # the same misses in both halves: no trend
    tpot = np.full(200, 0.05)
    tpot[::10] = 0.2
    t = queue_trend(*_trace(tpot), SLO, 100.0)
    assert t.first_attainment == t.second_attainment == 0.9 and not t.growing
    # a later half slower but within the deadline (stretch 0.5 -> 0.9): nothing missed more
    tpot = np.full(200, 0.05)
    tpot[100:] = 0.09
    assert not queue_trend(*_trace(tpot), SLO, 100.0).growing


def test_a_small_drop_within_chance_is_not_flagged() -> None:
    # 1 more miss in 100 (0.99 -> 0.98) is far below 3 standard errors even though the
    # missed requests are very slow
    tpot = np.full(200, 0.05)
    tpot[[5, 150, 160]] = 5.0
    t = queue_trend(*_trace(tpot), SLO, 100.0)
    assert t.first_attainment == 0.99 and t.second_attainment == 0.98 and not t.growing


def test_unfinished_requests_count_as_missed() -> None:
    arrival, ttft, tpot, e2e = _trace(np.full(200, 0.05))
    ttft[120:] = np.nan
    tpot[120:] = np.nan
    e2e[120:] = np.nan
    t = queue_trend(arrival, ttft, tpot, e2e, sim.SLO(tpot_s=0.1), 100.0)
    assert t.second_attainment == pytest.approx(0.2) and t.growing
    with pytest.raises(SpecError):
        queue_trend(arrival, ttft, tpot, e2e[:10], SLO, 100.0)
    with pytest.raises(SpecError):
        queue_trend(arrival, ttft, tpot, e2e, SLO, 0.0)


# --- the planner ------------------------------------------------------------------------


def test_the_planners_pick_is_within_the_headroom_and_says_so() -> None:
    cluster = CloudCluster.from_topology(
        cloud_instances(
            [("A40", 2), ("RTX-3090-Ti", 2), ("RTX-A5000", 2)], inter_gbps=(5, 40), seed=3
        )
    )
    wl = PDWorkload.from_means(6, 800, 120, slo=sim.SLO(ttft_s=1.5, tpot_s=0.08))
    opts = TabuOptions(n_step=4, headroom=0.75, final_sim_top=2, final_sim_s=20.0)
    plan = tabu_search(cluster, "llama-3.1-8b", wl, opts)
    again = tabu_search(cluster, "llama-3.1-8b", wl, opts)
    assert plan.plan_id == again.plan_id  # deterministic for a seed
    doc = plan.to_json()["routing"]
    loads = doc["load_prefill"] + doc["load_decode"]
    assert len(doc["load_decode"]) == plan.n_decode
    if doc["overload"] == 0.0:
        assert max(loads) <= 0.75 + 1e-9
    else:
        assert max(v if v is not None else np.inf for v in loads) > 0.75
    score = plan.evaluate(duration_s=20.0, seed=1)
    assert score.trend is not None and score.trend.first_attainment >= 0.0


def test_of_two_plans_that_serve_alike_the_search_prefers_more_headroom() -> None:
    from llmfabric.scheduler.phasesplit.evaluate import Evaluated
    from llmfabric.scheduler.phasesplit.tabu import _score

    def ev(attainment: float, overload: float, peak: float) -> Evaluated:
        one = np.ones((1, 1))
        r = Routing(
            np.ones(1), one, one, 0.0, attainment, overload, np.array([0.3]), np.array([peak])
        )
        return Evaluated((), (), r, (), ())

    # analytic attainment 1 (to float noise) for both: the less loaded wins
    assert _score(ev(1.0, 0.0, 0.5)) > _score(ev(1.0 + 1e-12, 0.0, 0.7))
    # a real difference in attainment still comes first
    assert _score(ev(0.99, 0.0, 0.2)) < _score(ev(1.0, 0.0, 0.79))
    # load beyond the headroom counts as missed before any tie-break
    assert _score(ev(1.0, 0.06, 0.85)) < _score(ev(0.95, 0.0, 0.8))
    assert _score(None) < _score(ev(0.0, 0.0, 0.1))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.001, 1.0), min_size=1, max_size=60))
def test_a_window_whose_halves_match_is_never_growing(first: list[float]) -> None:
    # the second half repeats the first half's latencies: no trend, whatever they are
    tpot = np.array(first + first)
    t = queue_trend(*_trace(tpot), SLO, 100.0)
    assert t.first_attainment == t.second_attainment and not t.growing
