"""ThunderServe Algorithm 1: tabu search over group construction and phases (COMPANIONS.md
§1.2). Each step draws up to 20 x n_neigh moves to collect n_neigh distinct, non-tabu
neighbours passing the early checks, moves to the best (even if worse), keeps the best seen.
The tabu list holds the last n_mem accepted SOLUTIONS. Deterministic for a seed."""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable

import numpy as np

from llmfabric.scheduler.errors import InfeasibleError
from llmfabric.scheduler.phasesplit.config import ConfigSearch
from llmfabric.scheduler.phasesplit.evaluate import Evaluated, evaluate_groups, simulate
from llmfabric.scheduler.phasesplit.groups import (
    Group,
    Solution,
    canonical,
    early_ok,
    initial_solution,
    neighbour,
    solution_key,
)
from llmfabric.scheduler.phasesplit.plan import PDPlan
from llmfabric.scheduler.phasesplit.problem import CloudCluster, PDWorkload, TabuOptions
from llmfabric.sim.models import ModelSpec, get_model

EXHAUSTIVE_START = 12


def _score(ev: Evaluated | None) -> tuple[float, float, float]:
    """Attainment with the load beyond the headroom counted as missed, then served share
    (both to 1e-9: below that the analytic scores differ by float noise), then the lower
    highest predicted replica load: of two plans that serve alike, the one with more
    headroom rides out bursts better (the analytic attainment saturates at 1)."""
    if ev is None:
        return (-1.0, 0.0, -np.inf)
    r = ev.routing
    peak = max((float(v.max()) for v in (r.load_prefill, r.load_decode)
                if v is not None and v.size), default=0.0)
    return (round(r.score, 9), -round(r.unserved, 9), -peak)


def _best_phases(sol: Solution, f: Callable[[Solution], Evaluated | None],
                 feasible: Callable[[frozenset[int], str], bool]) -> Solution:
    """The clustering start's best phase vector (exhaustive for <= 12 groups; else the
    random phases drawn by initial_solution): random phases can start the walk far from
    any good plan, and 2^12 LP solves are cheap next to the search."""
    if len(sol) > EXHAUSTIVE_START:
        return sol
    best, best_score = sol, _score(f(sol))
    for vec in itertools.product(("prefill", "decode"), repeat=len(sol)):
        cand = canonical([Group(g.gpus, p) for g, p in zip(sol, vec, strict=True)])
        if not early_ok(cand, feasible):
            continue
        sc = _score(f(cand))
        if sc > best_score:
            best, best_score = cand, sc
    return best


def to_plan(ev: Evaluated, cluster: CloudCluster, model: ModelSpec, workload: PDWorkload,
            options: TabuOptions, trace: tuple[float, ...] = (), solve_s: float = 0.0,
            notes: tuple[str, ...] = ()) -> PDPlan:
    key = repr(sorted((sorted(g.gpus), g.phase) for g in ev.groups)).encode()
    return PDPlan(ev.groups, ev.configs, ev.routing, ev.routing.attainment,
                  workload.rate * (1 - ev.routing.unserved), cluster, model, workload,
                  options.kv_bits, options.kv_group, options.pipelined_pp, trace, solve_s,
                  hashlib.sha256(key).hexdigest()[:12], notes)


def tabu_search(cluster: CloudCluster, model: ModelSpec | str, workload: PDWorkload,
                options: TabuOptions | None = None, *,
                start: Solution | None = None,
                moves: tuple[float, float, float, float] | None = None,
                search: ConfigSearch | None = None,
                progress: Callable[[int, float], None] | None = None) -> PDPlan:
    """The best plan found (analytic evaluator inside the search)."""
    opts = options or TabuOptions()
    spec = get_model(model)
    t0 = time.perf_counter()
    rng = np.random.default_rng(opts.seed)
    cs = search or ConfigSearch(cluster, spec, workload, pipelined_pp=opts.pipelined_pp,
                                max_pp=opts.max_pp)

    def feasible(gpus: frozenset[int], phase: str) -> bool:
        return cs.deduce(gpus, phase) is not None  # type: ignore[arg-type]

    cache: dict[frozenset[tuple[frozenset[int], str]], Evaluated | None] = {}

    def f(sol: Solution) -> Evaluated | None:
        key = solution_key(sol)
        if key not in cache:
            cache[key] = evaluate_groups(sol, cs, cluster, spec, workload,
                                         kv_bits=opts.kv_bits, kv_group=opts.kv_group,
                                         orchestrate=opts.orchestrate,
                                         headroom=opts.headroom)
        return cache[key]

    x = start if start is not None else _best_phases(
        initial_solution(cluster, feasible, rng), f, feasible)
    x0 = x
    best_sol, best = x, f(x)
    if best is None:
        raise InfeasibleError("the initial solution holds no prefill/decode replica pair")
    tabu: list[frozenset[tuple[frozenset[int], str]]] = [solution_key(x)]
    trace = [best.attainment]
    weights = moves or opts.move_weights
    for step in range(opts.n_step):
        seen: dict[frozenset[tuple[frozenset[int], str]], Solution] = {}
        for _ in range(20 * opts.n_neigh):
            if len(seen) >= opts.n_neigh:
                break
            _, cand = neighbour(x, cluster, rng, weights)
            if cand is None:
                continue
            key = solution_key(cand)
            if key in seen or key in tabu[-opts.n_mem:] if opts.n_mem else key in seen:
                continue
            if not early_ok(cand, feasible):
                continue
            seen[key] = cand
        if not seen:
            break
        scored = [(_score(f(s)), k, s) for k, s in seen.items()]
        top = max(scored, key=lambda t: t[0])
        x = top[2]
        if top[0] > _score(best):
            best_sol, best = x, f(x)
        tabu.append(solution_key(x))
        del tabu[:-max(opts.n_mem, 1)]
        trace.append(_score(best)[0])
        if progress is not None:
            progress(step, trace[-1])
    assert best is not None and best_sol is not None
    if opts.final_sim_top > 0:
        best = _simulated_best(best, cache.get(solution_key(x0)), cache, cluster, spec,
                               workload, opts)
    return to_plan(best, cluster, spec, workload, opts, tuple(trace),
                   time.perf_counter() - t0)


def _simulated_best(best: Evaluated, start: Evaluated | None,
                    cache: dict[frozenset[tuple[frozenset[int], str]], Evaluated | None],
                    cluster: CloudCluster, spec: ModelSpec, workload: PDWorkload,
                    opts: TabuOptions) -> Evaluated:
    """The analytic top `final_sim_top` (plus the start) re-scored by the simulator: the
    analytic evaluator saturates near full attainment and is optimistic under load, so its
    choice among near-equal plans is noise; ties keep the analytic order. A candidate whose
    queue grows over the window ranks below every stable one, and candidates are compared
    on the window's later half: a queue that builds shows there first."""
    ranked = sorted((ev for ev in cache.values() if ev is not None), key=_score, reverse=True)
    pool = [best, *(e for e in ranked if e is not best)][:opts.final_sim_top]
    if start is not None and all(e is not start for e in pool):
        pool.append(start)
    scored = []
    for k, ev in enumerate(pool):
        sim = simulate(ev.prefill, ev.decode, ev.routing, cluster, workload,
                       kv_bits=opts.kv_bits,
                       kv_group=opts.kv_group, pipelined_pp=opts.pipelined_pp,
                       duration_s=opts.final_sim_s, seed=opts.seed + 1)
        trend = sim.trend
        stable = trend is None or not trend.growing
        late = sim.attainment if trend is None or trend.attainment != trend.attainment \
            else trend.attainment
        scored.append((stable, late, -k, ev))
    return max(scored, key=lambda t: (t[0], t[1], t[2]))[3]
