"""ThunderServe's phase-split planner (../shared/papers/thunderserve.txt; COMPANIONS.md §1):
one model on heterogeneous GPUs and links, split into prefill and decode groups.

Files:
- `problem.py`     inputs: GPU, CloudCluster (per-GPU-pair bandwidth/latency), PDWorkload
  (rate, length sample, SLO), TabuOptions.
- `config.py`      Algorithm 2: per-group TP/PP, stage route order, memory-aware layer split,
  DP copies inside a group (ConfigSearch, deduce_config, GroupConfig, ReplicaConfig).
- `orchestrate.py` the capacity routing LP (GLOP) over z_ij = X_i Y_ij and the analytic pair
  attainment D_ij (M/D/1 TTFT, staged KV transfer, Little's-law TPOT), fixed point on loads.
- `stability.py`   queue stability: each replica's predicted utilisation against the stated
  headroom (load beyond it counted as missed), and the growing-queue detector on a
  simulated window (first vs second half).
- `pairmemo.py`    PairMemo: D_ij's per-replica and per-pair terms kept across the tabu's
  evaluations (one per ConfigSearch, for one workload, cluster and KV format).
- `groups.py`      solutions (groups with phases), flip/split/merge/move neighbours, early
  checks, the average-linkage clustering start.
- `evaluate.py`    scoring a solution (configs + routing) and the discrete-event simulator run
  of a plan (sim.simulate_disaggregated with PDRouting and per-stage links).
- `tabu.py`        Algorithm 1: tabu_search(cluster, model, workload, options) -> PDPlan.
- `plan.py`        PDPlan: JSON (to_json / plan_from_json), replica specs for the simulator,
  evaluate() under another workload.
- `reschedule.py`  lightweight rescheduling: phase flips and new routing, no reload.
- `controller.py`  when it runs in the fleet: node loss (DOWN/LEFT/gone/suspected) or a 25 %
  workload drift; pure `pd_decide`, `PDController` on an injected clock, decisions bound to
  sessions (`PDBinding`).
- `binding.py`     plan GPUs -> live sessions from the registry (`--label pd.gpus=0-3`, else
  role + GPU type), and the PD workload the ingresses observe (`observed_pd_workload`).
- `baselines.py`   what ThunderServe is compared with: the best fixed P:D split over instance
  groups and the colocated CP-SAT placement (simulated) on the same GPUs.
- `inputs.py`      YAML/CSV loaders for the CLI (`llmfabric plan pd`).
"""

from llmfabric.scheduler.phasesplit.plan import PDPlan
from llmfabric.scheduler.phasesplit.problem import GPU, CloudCluster, PDWorkload, TabuOptions
from llmfabric.scheduler.phasesplit.tabu import tabu_search

__all__ = ["GPU", "CloudCluster", "PDPlan", "PDWorkload", "TabuOptions", "tabu_search"]
