"""The `llmfabric` CLI: main.py holds the lazy group; one module per command group
(start, status, keys, ingress, demo, engine, simulate, plan, controller, trace, bench; API
keys in apikeys.py, `keys usage-export` in usage_export.py, `keys budget` in budgets.py;
slurm, k8s and controller_slurm for the launchers; controller_pd for `controller --pd-plan`), each
exporting `command`. controller_node.py: `controller_node`, the node every in-fabric
controller runs as (build, start, SIGTERM/SIGINT -> stop, settle, the current session's
reader; stopped on exit).
netplan.py: the HeroServe commands (`plan net`, `simulate collective|net`);
plan_pd.py: ThunderServe's `plan pd`; `plan` reaches both through subcommands.py (a
subcommand under a command that also runs on its own). simulate_flying.py: `simulate flying`
(Flying Serving's DP <-> TP switching in the simulator, mode-timeline PNG).
gpus_yaml.py: `gpu_hint()`, an unknown GPU's hint as each command can follow it. console.py:
`table_console()`, the console tables print on (piped: 200 columns, not 80), and `cell()`;
untrusted.py: `printable()` (others' text, controls escaped) and the log formatter every CLI
process logs through.
"""
