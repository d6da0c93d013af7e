"""HeroServe: network-aware PD planning over heterogeneous links (COMPANIONS §3).

Files -> concepts
- paths.py     all-pairs Dijkstra routes over GPUs and switches (per-byte time + hop
               latency), optionally restricted to edge kinds; `PathRoute` keeps its edges;
               a host switch (a fabric node's NIC) carries no transit traffic.
- commcost.py  eqs. 5-15 in bytes: `t_ina`/`ina_breakdown`, `t_ring`, `t_pp`, `t_kv`,
               `choose_scheme` (Alg. 2's per-group INA/ring choice), `group_allreduce`
               (a group's cost as a `sim.collectives.AllReduceModel`).
- spread.py    HeroServe's INA member routes: NVLink forwarding to the least-loaded NIC
               (members pick in turn, least shared edge first; `commcost.ina_routes`).
- chaining.py  which TP groups form each pipeline instance: greedy on eq. 6 boundary
               costs + swaps, never worse than topology order (HeroServe only).
- grouping.py  equal-size constrained k-means on min-cost flow (seeded restarts) and the
               pairwise-swap perturbation of Alg. 2.
- problem.py   NetProblem / NetWorkload: topology, model, GPU sets, workload and SLAs.
- linkload.py  the steady-state bytes a plan pushes over each directed link per request
               (all-reduces, PP activations, KV hand-off), the rate the links carry
               (`link_rate`, under `NetProblem.link_util`) and the KV hand-off's M/G/1
               wait on its bottleneck link (`KvQueue`).
- planner.py   Alg. 1: candidate (TP, PP) enumeration, grouping, switches, schemes,
               KV paths, SLA check and scalability H by bisection, capped by the
               links (`binding` says what caps it) -> NetPlan
               (`to_deployments()` feeds the discrete-event simulator).
- baselines.py DistServe (NCCL ring), DS-SwitchML (INA at the core), DS-ATP (best-effort
               INA at the access switch) on the same topology.
- online.py    the load-aware online scheduler: PolicyTable (eqs. 16-18), Controller,
               candidate policies, concurrent all-reduce rounds on `sim.netsim.FlowSim`.
- from_fabric.py  the topology from a live fabric's measured links (/v1/fabric/nodes +
               /v1/fabric/links) for `plan net --from-fabric URL`.
- runner.py    serve a plan in the discrete-event simulator (`llmfabric simulate net`).
"""
