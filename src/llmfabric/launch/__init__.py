"""Launchers: run providers as Slurm jobs or Kubernetes workloads, size a Slurm fleet, and
run a local fabric of node processes on loopback.

Files -> concepts
- profile.py     SlurmProfile (YAML): partition, account, GPUs, CPUs, memory, time, modules,
                 container (Apptainer/Enroot/Pyxis), engine command, fabric bootstrap and
                 secret FILE, signal lead, controller sizing; `load_profile`, `time_limit_s`.
- sbatch.py      `render_sbatch(profile)`: the sbatch script (`--signal=B:TERM@lead`, the
                 secret read from its file, `exec llmfabric start ... --process ENGINE`).
- slurm.py       `Slurm`: sbatch/squeue/sacct/scancel/scontrol through an injected runner,
                 parsers of their output, one-line SlurmErrors.
- allocation.py  `allocation_end(env)`: when the node's Slurm allocation ends (walltime);
                 `WalltimeWatch`: the running node drains ahead of that end, follows it.
- capacity.py    pure fleet sizing: demand, jobs and nodes -> SubmitJobs/CancelJob decisions
                 (pre-launch replacements ahead of allocation ends, cancel idle jobs).
- launcher.py    `SlurmLauncher`: observes the queue, runs `capacity.decide` on a clock,
                 executes its decisions with sbatch/scancel.
- jobkeys.py     `JobKeys`: the node key in a job's home (shared FS), so only the job's own
                 node's records speak for it.
- k8s.py         `render_k8s(profile)`: ingress/bootstrap/relay Deployment + Service and
                 provider Deployments (GPU requests, secret from a Secret, probes, preStop
                 drain, grace period).
- local.py       `LocalFabric`: real `llmfabric start` node processes on loopback, each
                 with its own home, ports and simulated engine (the demo, multi-process
                 tests, benchmarks).
- errors.py      LaunchError, ProfileError, SlurmError, SlurmTimeout, SlurmMissing;
                 profile_problems (a profile's validation errors on one line).
"""
