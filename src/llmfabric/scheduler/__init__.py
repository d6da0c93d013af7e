"""Placement: CP-SAT over allocation and parallelism, baselines (memP, greedy), fleet controller.

Files -> concepts
- problem.py     inputs: Pool (identical nodes of one GPU type), Cluster, ModelLoad, Workload,
                 FixedGroup (running replicas), Problem.
- perf.py        the PerformanceModel protocol the scheduler is built against; Estimate.
- simadapter.py  SimPerformance: PerformanceModel backed by `llmfabric.sim` (benchmarks, CLI).
- standin.py     AnalyticStandIn: closed-form stand-in PerformanceModel for unit tests only.
- options.py     PlacementOptions (objective, load units, time limit, formulation, ...).
- curves.py      RateCurve: one replica's estimates vs rate, its capacity, and the overload
                 rule (load above capacity is unserved, charged the penalty).
- tables.py      candidates (model, pool, TP) and their precomputed estimate tables.
- placement.py   Group, Placement, capacity rule, table load split, evaluate().
- levels.py      exact load splits of the level and convex formulations (fixed replicas),
                 and the continuous envelope split.
- split.py       the objective every policy is scored by (the resolved formulation's model).
- cpsat.py       the CP-SAT model (convex, table or level formulation; latency/throughput/
                 cost objectives).
- baselines.py   memP, greedy fill, local search.
- exhaustive.py  exhaustive enumerator for small instances (tests check CP-SAT against it).
- policies.py    POLICIES by name (cpsat, memp, greedy, exhaustive) and plan().
- packing.py     replicas -> concrete nodes and GPU ids.
- decisions.py   Assign/Release decisions, command templates, Executor, LoggingExecutor.
- controller.py  pure decide() over registry records + workload, FleetController loop.
- observed.py    the observed workload: ingress nodes' published demand summed from records.
- spec.py        cluster/workload YAML loading (pydantic at the boundary).
- tracewl.py     a Workload from a request trace (per-model rate, length mean and spread).
- errors.py      SchedulerError hierarchy.
- netplan/       HeroServe: network-aware PD planning over a topology (TP/PP, GPU groups,
                 INA or ring per group, KV paths, scalability H), its baselines, and the
                 online policy table (see its __init__).
- switching.py   re-exports Flying Serving's DP <-> TP switching policies (SwitchState ->
                 Bind/Release, SWITCH_POLICIES by name, aligned_groups) from sim/switching.py,
                 their home below sim/flying.py; used by engines/torchref.
- phasesplit/    ThunderServe: one model split into prefill/decode groups (tabu search,
                 per-group TP/PP, routing LP, lightweight rescheduling); see its docstring.
"""
