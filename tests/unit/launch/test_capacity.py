"""Fleet sizing through Slurm as data, on a virtual clock: submit when demand exceeds
capacity, replace jobs before their allocation ends (queue wait + startup ahead), cancel
idle ones after the hysteresis, never beyond max_jobs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmfabric.launch.capacity import (
    CancelJob,
    CapacityConfig,
    CapacityState,
    JobView,
    SubmitJobs,
    decide,
    needed_jobs,
)

CFG = CapacityConfig(capacity_rps=2.0, min_jobs=0, max_jobs=4, startup_s=300, lead_s=120,
                     idle_s=600)
T0 = 1_800_000_000.0


def running(jid: str, ends_in: float, inflight: int = 0) -> JobView:
    return JobView(jid, "RUNNING", T0 + ends_in, serving=True, inflight=inflight)


def test_needed_jobs() -> None:
    assert [needed_jobs(d, CFG) for d in (0, 0.1, 2, 2.01, 7.9, 100)] == [0, 1, 1, 2, 4, 4]


def test_demand_above_capacity_submits_the_difference() -> None:
    out, state = decide(5.0, [running("1", 7200)], 0, T0, CapacityState(), CFG)
    assert out == [SubmitJobs(2, out[0].reason)] and "needs 3" in out[0].reason
    # Our submissions count as capacity before squeue shows them: no double submit.
    state = CapacityState(None, (("2", T0), ("3", T0)))
    assert decide(5.0, [running("1", 7200)], 0, T0 + 10, state, CFG)[0] == []


def test_a_job_ending_before_a_replacement_could_serve_is_replaced_now() -> None:
    # Drains at end - 120 s; a new job serves after queue wait 200 s + startup 300 s.
    far = decide(1.0, [running("1", 120 + 500 + 1)], 200, T0, CapacityState(), CFG)[0]
    assert far == []
    near = decide(1.0, [running("1", 120 + 500 - 1)], 200, T0, CapacityState(), CFG)[0]
    assert len(near) == 1 and isinstance(near[0], SubmitJobs) and "replacing" in near[0].reason
    # A longer queue wait moves the replacement earlier.
    assert decide(1.0, [running("1", 3600)], 3600, T0, CapacityState(), CFG)[0]


def test_surplus_cancels_after_the_hysteresis_pending_first_then_idle_running() -> None:
    jobs = [running("1", 7200, inflight=3), running("2", 3600), running("3", 5000),
            JobView("4", "PENDING")]
    out, state = decide(2.0, jobs, 0, T0, CapacityState(), CFG)
    assert out == [] and state.surplus_since == T0
    out, state = decide(2.0, jobs, 0, T0 + 599, state, CFG)
    assert out == []
    out, state = decide(2.0, jobs, 0, T0 + 600, state, CFG)
    assert out == [CancelJob("4", True, out[0].reason)]  # type: ignore[union-attr]
    jobs = jobs[:3]
    out, state = decide(2.0, jobs, 0, T0 + 1200, state, CFG)
    # The idle job that ends soonest goes, gracefully; the busy one stays.
    assert out == [CancelJob("2", False, out[0].reason)]  # type: ignore[union-attr]
    # Demand back at capacity resets the hysteresis.
    out, state = decide(6.0, jobs, 0, T0 + 1300, state, CFG)
    assert out == [] and state.surplus_since is None


def test_a_busy_surplus_is_kept() -> None:
    jobs = [running("1", 7200, inflight=1), running("2", 7200, inflight=2)]
    state = CapacityState(surplus_since=T0)
    assert decide(0.0, jobs, 0, T0 + 10_000, state, CFG)[0] == []


@given(demand=st.floats(0, 50), n_run=st.integers(0, 6), n_pend=st.integers(0, 3),
       ends=st.lists(st.floats(0, 20_000), min_size=6, max_size=6),
       wait=st.floats(0, 5000))
def test_never_plans_beyond_max_jobs_and_never_cancels_when_short(
        demand: float, n_run: int, n_pend: int, ends: list[float], wait: float) -> None:
    jobs = [running(str(i), ends[i]) for i in range(n_run)] + [
        JobView(str(10 + i), "PENDING") for i in range(n_pend)]
    out, _ = decide(demand, jobs, wait, T0, CapacityState(surplus_since=T0 - 10**6), CFG)
    lasting = sum(1 for i in range(n_run) if ends[i] - CFG.lead_s > wait + CFG.startup_s)
    future = lasting + n_pend
    for d in out:
        if isinstance(d, SubmitJobs):
            assert future + d.count <= max(CFG.max_jobs, future) and d.count <= CFG.max_submit
            assert future < needed_jobs(demand, CFG)
        else:
            assert future > needed_jobs(demand, CFG)


def test_the_simulator_sizes_a_job_when_the_profile_gives_no_capacity() -> None:
    import pytest

    from llmfabric.launch.errors import LaunchError, ProfileError
    from llmfabric.launch.launcher import capacity_config
    from llmfabric.launch.profile import SlurmProfile, parse_profile

    def prof(gpus: int, **ctl: object) -> SlurmProfile:
        return parse_profile({"engine": "e", "gpus": gpus,
                              "fabric": {"bootstrap": ["h:1"], "secret_file": "/s"},
                              "controller": {"model": "llama-3.1-8b", **ctl}})

    one = capacity_config(prof(1, gpu="H100-SXM")).capacity_rps
    four = capacity_config(prof(4, gpu="H100-SXM")).capacity_rps
    assert 0 < one < four  # TP 4 serves more than one GPU
    assert capacity_config(prof(1, capacity_rps=3.0)).capacity_rps == 3.0
    with pytest.raises(LaunchError, match="capacity_rps"):
        capacity_config(prof(1, gpu="no-such-gpu"))
    with pytest.raises(ProfileError, match="capacity_rps"):
        prof(1)
