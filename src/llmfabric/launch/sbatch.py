"""Render a SlurmProfile into an sbatch script (pure: text in, text out).

The script loads modules, runs the setup lines, reads the network secret from its FILE into
the environment (never into the script or the process table), picks a free port below the
kernel's ephemeral range for the engine's "{port}", then `exec`s `llmfabric start ...
--process ENGINE`, so the node IS the batch shell: `--signal=B:TERM@<lead>` reaches it `lead`
seconds before the time limit, it announces DOWN, drains, announces LEFT and stops the engine
while the allocation still runs. The node also learns the allocation end itself
(launch/allocation.py) and drains at the same moment if the signal comes late. Every profile
value is quoted; paths may use $VARS and ~.
"""

from __future__ import annotations

import re
import shlex

from llmfabric.launch.errors import ProfileError
from llmfabric.launch.profile import SlurmProfile

PORT_PLACEHOLDER = "{port}"
PORT_VAR = "LLMFABRIC_ENGINE_PORT"
# Picks the engine's port below the kernel's ephemeral range, as net/ports.py does, but inside
# the job, on the machine whose engine binds it: a port-0 pick comes from the range that
# outgoing connections draw from, and one may take it before the engine binds it. Port 0 only
# when there is no room.
PICK_PORT = """import random, socket
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
for port in (random.sample(range(10000, low), 64) if low - 10000 >= 1000 else []) + [0]:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            continue
        print(s.getsockname()[1])
        break
"""
# ('@' is left out: bash re-expands ${VAR@P} as a prompt string, command substitutions too)
_PATHLIKE = re.compile(r"^[A-Za-z0-9_./~${}:+=-]+\Z")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


def _path_word(value: str, what: str) -> str:
    """A path that may use $VAR/${VAR} and a leading ~, as one double-quoted shell word."""
    if not _PATHLIKE.match(value):
        raise ProfileError(f"{what} {value!r}: only letters, digits, '/._-~:+=' and $VARS")
    if value.startswith("~/") or value == "~":
        value = "$HOME" + value[1:]
    return f'"{value}"'


def _word(arg: str) -> str:
    """One argv element, quoted; "{port}" inside it becomes the engine port variable."""
    parts = arg.split(PORT_PLACEHOLDER)
    if len(parts) == 1:
        return shlex.quote(arg)
    return f'"${PORT_VAR}"'.join(shlex.quote(p) if p else "" for p in parts)


def engine_argv(profile: SlurmProfile) -> list[str]:
    """The engine command, wrapped in the container runtime when the profile has one."""
    engine = list(profile.engine)
    c = profile.container
    if c is None:
        return engine
    if c.runtime == "apptainer":
        binds = [x for m in c.mounts for x in ("--bind", m)]
        gpu = ["--nv"] if profile.gpus else []
        return ["apptainer", "exec", *gpu, *binds, *c.args, c.image, *engine]
    if c.runtime == "enroot":
        mounts = [x for m in c.mounts for x in ("--mount", m)]
        return ["enroot", "start", "--rw", *mounts, *c.args, c.image, *engine]
    mounts = [f"--container-mounts={','.join(c.mounts)}"] if c.mounts else []
    return ["srun", "--ntasks=1", f"--container-image={c.image}", *mounts, *c.args, *engine]


def sbatch_directives(profile: SlurmProfile) -> list[str]:
    p = profile
    opts = [f"--job-name={p.job_name}", f"--time={p.time}", f"--nodes={p.nodes}",
            "--ntasks-per-node=1", f"--signal=B:TERM@{p.signal_lead}", f"--output={p.output}"]
    if p.partition:
        opts.append(f"--partition={p.partition}")
    if p.account:
        opts.append(f"--account={p.account}")
    if p.qos:
        opts.append(f"--qos={p.qos}")
    if p.gpus:
        opts.append(f"--gres=gpu:{p.gpu_type}:{p.gpus}" if p.gpu_type else f"--gres=gpu:{p.gpus}")
    if p.cpus:
        opts.append(f"--cpus-per-task={p.cpus}")
    if p.memory:
        opts.append(f"--mem={p.memory}")
    if p.constraint:
        opts.append(f"--constraint={p.constraint}")
    opts.extend(p.sbatch)
    return [f"#SBATCH {o}" for o in opts]  # (values are checked to need no quoting)


def node_argv(profile: SlurmProfile) -> list[str]:
    """`llmfabric start` arguments (already shell words, the engine last)."""
    f = profile.fabric
    words = [shlex.quote(w) for w in shlex.split(f.llmfabric)]
    words += ["start", "--home", '"$LLMFABRIC_HOME"']
    for addr in f.bootstrap:
        words += ["--bootstrap", shlex.quote(addr)]
    words += ["--preset", f.preset, "--listen", shlex.quote(f.listen),
              "--http-listen", shlex.quote(f.http_listen),
              "--drain-timeout", f"{f.drain_timeout:g}", "--drain-lead", str(profile.signal_lead),
              "--label", '"slurm_job=$SLURM_JOB_ID"',
              "--label", '"slurm_cluster=${SLURM_CLUSTER_NAME:-}"']
    if f.network:
        words += ["--network", shlex.quote(f.network)]
    if f.provider:
        words += ["--provider", shlex.quote(f.provider)]
    for key, value in sorted(f.labels.items()):
        words += ["--label", shlex.quote(f"{key}={value}")]
    words += [shlex.quote(a) for a in f.args]
    words += ["--process", *(_word(a) for a in engine_argv(profile))]
    return words


def render_sbatch(profile: SlurmProfile, *, source: str = "") -> str:
    """The sbatch script for `profile` (`source`: the profile's path, for the header)."""
    f = profile.fabric
    lines = ["#!/bin/bash", *sbatch_directives(profile),
             f"# llmfabric provider job{f' from profile {source}' if source else ''}: "
             "`llmfabric slurm render` wrote this.",
             "set -eo pipefail  # (no -u: module and venv scripts read unset variables)"]
    lines += [f"module load {shlex.quote(m)}" for m in profile.modules]
    lines += list(profile.setup)
    for key, value in sorted(profile.env.items()):
        if not _ENV_KEY.match(key):
            raise ProfileError(f"env key {key!r} is not a shell variable name")
        lines.append(f"export {key}={shlex.quote(value)}")
    secret = _path_word(f.secret_file, "fabric.secret_file")
    lines += [
        f"secret_file={secret}",
        'if [ ! -r "$secret_file" ]; then',
        '  echo "llmfabric: cannot read the network secret file $secret_file" >&2; exit 2',
        "fi",
        'LLMFABRIC_NETWORK_SECRET="$(cat "$secret_file")"',
        "export LLMFABRIC_NETWORK_SECRET",
        f"LLMFABRIC_HOME={_path_word(f.home, 'fabric.home')}",
        'mkdir -p "$LLMFABRIC_HOME" && chmod 700 "$LLMFABRIC_HOME"',
        "export LLMFABRIC_HOME",
    ]
    if any(PORT_PLACEHOLDER in a for a in profile.engine):
        lines.append(f"{PORT_VAR}=$(python3 -c '{PICK_PORT}')")
    lines.append(" ".join(["exec", *node_argv(profile)]))
    return "\n".join(lines) + "\n"
