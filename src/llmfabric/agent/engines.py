"""Engine adapters: what the agent knows about each kind of inference server.

One `EngineKind` per server: how to recognise its command line, its default port, its health
route, where its load metrics are and how to read them (agent/engine_metrics.py), the flags
that set its context length, and how to count tokens with it (the ingress's usage estimate
for engines that report none). `detect_kind(argv)` picks one from the command; `--engine
KIND` overrides (any OpenAI-compatible server: `openai`).

| kind | recognised by | port | metrics | context flag | tokenize |
|---|---|---|---|---|---|
| vllm | `vllm serve`, `vllm.entrypoints` | 8000 | /metrics (vllm:) | --max-model-len | /tokenize |
| sglang | `-m sglang.launch_server` | 30000 | /metrics (sglang:) | --context-length | - |
| llama.cpp | `llama-server` | 8080 | /metrics (--metrics), /slots | -c, --ctx-size | /tokenize |
| llama-cpp-python | `-m llama_cpp.server` | 8000 | - | --n_ctx | /extras/tokenize/count |
| tgi | `text-generation-launcher` | 3000 | /metrics (tgi_) | --max-total-tokens | /tokenize |
| torch | `llmfabric engine torch` | --port | /metrics (vllm-style) | --max-model-len | - |
| sim | `llmfabric engine sim` | --port | /metrics (vllm-style) | --max-model-len | - |
| openai | anything else | --port | - | - | - |

Behind a container launcher (`apptainer`/`singularity exec`, `enroot start`, `srun
--container-image`, `docker`/`podman run`) the engine is recognised after the launcher's
options and image (`apptainer exec --nv IMAGE vllm serve M` is vllm, not openai); the
image's name counts when no command follows it or its own entrypoint runs
(`docker run vllm/vllm-openai --model M`; `_engine_words`).

`counts_stream_usage`: the engine sends no usage in streams (llama.cpp's servers), so the
node counts a stream's tokens itself (forward/stream_usage.py). `tokenize_interrupts`: a
tokenize call while a stream runs cuts that stream short (llama-cpp-python's default
`interrupt_requests`: a request waiting for its model lock ends the running one), so the node
calls it only when the engine is otherwise idle.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineKind:
    name: str
    default_port: int | None
    health_path: str = "/health"
    metrics_path: str | None = None  # Prometheus text
    metrics_format: str = ""  # "vllm" | "sglang" | "llama.cpp" | "tgi"
    slots_path: str | None = None  # llama.cpp per-slot state (fallback without --metrics)
    context_flags: tuple[str, ...] = ()
    # POST body shape for counting tokens (agent/tokenize.py): "vllm" {"model","prompt"} ->
    # {"count"}, "llama.cpp" {"content"} -> {"tokens"}, "llama-cpp-python" {"input"} ->
    # {"count"}, "tgi" {"inputs"} -> [tokens]
    tokenize_path: str | None = None
    tokenize_format: str = ""
    counts_stream_usage: bool = False  # the node counts streams' tokens (engine sends none)
    tokenize_interrupts: bool = False  # a tokenize call ends a running stream
    # The engine's own default context when neither the command nor /v1/models tells it
    # (llama-cpp-python: n_ctx=2048); None: unknown, the node's configured default is used.
    default_context: int | None = None
    props_path: str | None = None  # llama-server /props: default_generation_settings.n_ctx
    # (quantization, bits) the engine always runs when its command says nothing: our
    # simulated engine times bf16 weights; None: unknown ("auto").
    default_precision: tuple[str, int] | None = None
    # POST {"role": "prefill"|"decode"|"both"} flips the engine's prefill/decode role without
    # a restart (ThunderServe's lightweight rescheduling); None: the engine cannot flip.
    role_path: str | None = None


KINDS: dict[str, EngineKind] = {
    k.name: k
    for k in (
        EngineKind("vllm", 8000, metrics_path="/metrics", metrics_format="vllm",
                   context_flags=("--max-model-len",), tokenize_path="/tokenize",
                   tokenize_format="vllm"),
        EngineKind("sglang", 30000, metrics_path="/metrics", metrics_format="sglang",
                   context_flags=("--context-length",)),
        EngineKind("llama.cpp", 8080, metrics_path="/metrics", metrics_format="llama.cpp",
                   slots_path="/slots", context_flags=("-c", "--ctx-size"),
                   tokenize_path="/tokenize", tokenize_format="llama.cpp",
                   props_path="/props", counts_stream_usage=True),
        EngineKind("llama-cpp-python", 8000,
                   context_flags=("--n_ctx", "--n-ctx"),
                   tokenize_path="/extras/tokenize/count", tokenize_format="llama-cpp-python",
                   default_context=2048, counts_stream_usage=True, tokenize_interrupts=True),
        EngineKind("tgi", 3000, metrics_path="/metrics", metrics_format="tgi",
                   context_flags=("--max-total-tokens",), tokenize_path="/tokenize",
                   tokenize_format="tgi"),
        EngineKind("torch", None, metrics_path="/metrics", metrics_format="vllm",
                   context_flags=("--max-model-len",)),
        EngineKind("sim", None, metrics_path="/metrics", metrics_format="vllm",
                   context_flags=("--max-model-len",),
                   default_precision=("bf16", 16), role_path="/sim/role"),
        EngineKind("openai", None),
    )
}
# Accepted spellings of --engine.
ALIASES = {"llamacpp": "llama.cpp", "llama-server": "llama.cpp", "llama_cpp": "llama-cpp-python",
           "llama-cpp": "llama-cpp-python", "text-generation-inference": "tgi",
           "unknown": "openai", "generic": "openai"}


def engine_phrase(name: str) -> str:
    """How user-facing text names an engine of kind `name`: `openai` is the kind of any
    OpenAI-compatible server (a command of no known engine), not an engine of OpenAI's."""
    return "an OpenAI-compatible engine" if name == "openai" else f"the {name} engine"


def kind_named(name: str) -> EngineKind:
    """The adapter for `--engine NAME`; ValueError lists the known names."""
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in KINDS:
        raise ValueError(f"unknown engine kind {name!r}; choose one of: {', '.join(KINDS)}")
    return KINDS[key]


# Container launchers (a Slurm profile's `container`, launch/sbatch.py) put their options and
# the image before the engine's command: `apptainer exec --nv --bind A:B IMAGE vllm serve M`.
_LAUNCHERS = frozenset({"apptainer", "singularity", "enroot", "srun", "docker", "podman"})
# The sub-command a launcher takes before its options (`apptainer exec`, `docker run`).
_SUBCOMMANDS = {"apptainer": frozenset({"exec", "run"}),
                "singularity": frozenset({"exec", "run"}),
                "enroot": frozenset({"start"}),
                "docker": frozenset({"run"}), "podman": frozenset({"run"})}
_APPTAINER_VALUES = frozenset({
    "-B", "--bind", "--mount", "--env", "--env-file", "-H", "--home", "--pwd", "-W",
    "--workdir", "-o", "--overlay", "--security", "--network", "--network-args", "--app",
    "-S", "--scratch", "--fusemount", "--hostname", "--apply-cgroups", "--dns"})
_DOCKER_VALUES = frozenset({
    "-v", "--volume", "-e", "--env", "--env-file", "--name", "--gpus", "--network", "--net",
    "-p", "--publish", "--shm-size", "--ipc", "--entrypoint", "-w", "--workdir", "-u",
    "--user", "--device", "--mount", "--runtime", "--platform", "-h", "--hostname", "-m",
    "--memory", "--cpus", "--ulimit", "-l", "--label", "--add-host", "--cap-add",
    "--cap-drop", "--security-opt", "--pid", "--restart", "--tmpfs", "--log-driver",
    "--log-opt", "--pull", "--volumes-from", "--group-add", "--stop-signal", "--userns",
    "--cgroupns", "--uts", "--cpuset-cpus", "--cpuset-mems", "--cpu-shares", "-c",
    "--cpu-period", "--cpu-quota", "--pids-limit", "--storage-opt", "--memory-swap",
    "--memory-reservation", "--blkio-weight", "--device-cgroup-rule", "--dns",
    "--dns-search", "--dns-option", "--domainname", "--expose", "--ip", "--ip6",
    "--isolation", "--link", "--mac-address", "--network-alias", "--oom-score-adj",
    "--sysctl", "-a", "--attach", "--detach-keys", "--label-file", "--annotation",
    "--health-cmd", "--health-interval", "--health-retries", "--health-timeout",
    "--health-start-period", "--stop-timeout", "--cidfile", "--cgroup-parent", "--init-path",
    "--secret", "--arch", "--os", "--variant"})
# Each launcher's options that take their value as the next word (`--bind /opt/vllm`), from
# its manual; any other option is a flag or carries its value after `=`. A value is no
# engine's name: `--name vllm-box IMAGE python -m sglang.launch_server` runs SGLang.
_VALUE_OPTIONS = {
    "apptainer": _APPTAINER_VALUES, "singularity": _APPTAINER_VALUES,
    "enroot": frozenset({"-c", "--conf", "-e", "--env", "-m", "--mount"}),
    "docker": _DOCKER_VALUES, "podman": _DOCKER_VALUES,
    "srun": frozenset({
        "-N", "--nodes", "-n", "--ntasks", "-c", "--cpus-per-task", "-p", "--partition",
        "-t", "--time", "-A", "--account", "-J", "--job-name", "--gres", "-G", "--gpus",
        "--gpus-per-node", "--gpus-per-task", "--mem", "--mem-per-cpu", "--mem-per-gpu",
        "-w", "--nodelist", "-o", "--output", "-e", "--error", "-q", "--qos", "-C",
        "--constraint", "-D", "--chdir", "--export", "--mpi", "--cpu-bind", "-m",
        "--distribution", "--ntasks-per-node", "--reservation", "--container-image",
        "--container-mounts", "--container-workdir", "--container-name",
        "--container-env"}),
}


# Words naming an engine, in the order a word is tested (one word may hold several: the
# first pattern it holds decides): (substring of the word, kind).
_ENGINE_WORDS = (("vllm", "vllm"), ("sglang", "sglang"), ("llama_cpp", "llama-cpp-python"),
                 ("llama-server", "llama.cpp"), ("llama.cpp", "llama.cpp"),
                 ("text-generation-launcher", "tgi"), ("text-generation-server", "tgi"))


def _engine_named(word: str) -> str | None:
    """The kind one word (a basename, lower case) names, or None."""
    return next((kind for part, kind in _ENGINE_WORDS if part in word), None)


# Launchers whose words after the image go to the image's own entrypoint (or runscript),
# which may be the engine: `docker run vllm/vllm-openai Qwen/Qwen2.5-7B` runs vLLM. After
# `apptainer exec`, `enroot start` and srun the words are the command that runs.
_IMAGE_RUNS = {"docker": frozenset({"run"}), "podman": frozenset({"run"}),
               "apptainer": frozenset({"run"}), "singularity": frozenset({"run"})}


@dataclass(frozen=True, slots=True)
class _Launch:
    image: str  # "" when none (srun: `--container-image=`)
    command: list[str]  # the words after the image
    image_runs: bool  # the image's entrypoint receives `command` (it may be the engine)


def _launched(argv: Sequence[str]) -> _Launch:
    """A container launcher's command line with its sub-command, options (and their values)
    and image taken apart; `--entrypoint X` puts X at the head of the command."""
    launcher = os.path.basename(argv[0]).lower()
    rest = list(argv[1:])
    sub = rest[0] if rest and rest[0] in _SUBCOMMANDS.get(launcher, ()) else ""
    i = 1 if sub else 0
    takes_value = _VALUE_OPTIONS[launcher]
    entrypoint = ""
    while i < len(rest) and rest[i].startswith("-"):
        option, _, value = rest[i].partition("=")
        i += 1
        if not value and option in takes_value and i < len(rest):
            value = rest[i]
            i += 1
        if option == "--entrypoint" and launcher in ("docker", "podman"):
            entrypoint = value
    if launcher == "srun" or i >= len(rest):
        return _Launch("", rest[i:], False)
    command = rest[i + 1:]
    if entrypoint:
        return _Launch(rest[i], [entrypoint, *command], False)
    return _Launch(rest[i], command, sub in _IMAGE_RUNS.get(launcher, ()))


def _engine_words(argv: Sequence[str]) -> list[str]:
    """The words that name the engine (basenames, lower case), in the order they decide:
    the command's first four, after any container launchers (`srun apptainer exec IMG vllm
    serve`). The image's name decides when no command follows it, or when the image's own
    entrypoint runs (`docker run`, `apptainer run`): first when the command starts with an
    option (`docker run vllm/vllm-openai --model M`), else after the command's words
    (`docker run vllm/vllm-openai Qwen/Qwen2.5-7B` is vLLM, `docker run IMG python -m
    sglang.launch_server` SGLang). After `apptainer exec IMG` the command decides
    (`apptainer exec vllm.sif python -m sglang.launch_server` is SGLang)."""
    launch = _Launch("", list(argv), False)
    while launch.command and os.path.basename(launch.command[0]).lower() in _LAUNCHERS:
        launch = _launched(launch.command)
    command = launch.command
    words = [os.path.basename(a).lower() for a in command[:4]]
    if not launch.image:
        return words
    image = os.path.basename(launch.image.split("://")[-1]).lower()
    if not command or (launch.image_runs and command[0].startswith("-")):
        return [image]
    return [*words, image] if launch.image_runs else words


def detect_kind(argv: Sequence[str]) -> EngineKind:
    """The adapter for an engine command line (see the table above); `openai` if unknown.
    The first of the engine words that names an engine decides."""
    return detected(argv)[0]


def detected(argv: Sequence[str]) -> tuple[EngineKind, str]:
    """`detect_kind` and the words it read the kind from ("" for `openai`: none named an
    engine), for errors: behind a container launcher the user sees what was understood."""
    head = _engine_words(argv)
    joined = " ".join(head)
    if "llmfabric" in joined or "llmfabric.cli.engine" in argv:
        # (the engine words too: behind a launcher `llmfabric engine sim` comes after the
        # launcher's options and image, past the command's first five words)
        for name in ("torch", "sim"):
            for words in (list(argv[:5]), head):
                if name in words:
                    return KINDS[name], " ".join(words[:words.index(name) + 1])
    for word in head:
        if (kind := _engine_named(word)) is not None:
            return KINDS[kind], word
    return KINDS["openai"], ""


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The value of the LAST occurrence of any of `names` (`--x V` or `--x=V`)."""
    found = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                found = argv[i + 1]
            elif arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
    return found


def context_from_command(kind: EngineKind, argv: Sequence[str]) -> int | None:
    """The context length the command sets (e.g. `--max-model-len 8192`, `-c 1024`)."""
    value = flag_value(argv, *kind.context_flags) if kind.context_flags else None
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        return None
    return n if n > 0 else None
