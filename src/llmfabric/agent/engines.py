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
options and image (`apptainer exec --nv IMAGE vllm serve M` is vllm, not openai); the image
decides only when the image's own entrypoint runs (`docker run vllm/vllm-openai --model M`).

`counts_stream_usage`: the engine sends no usage in streams (llama.cpp's servers), so the
node counts a stream's tokens itself (node/engine/stream_usage.py). `tokenize_interrupts`: a
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
    "--log-opt", "--pull", "--volumes-from", "--group-add", "--stop-signal"})
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


def _launched(argv: Sequence[str]) -> tuple[str, list[str]]:
    """(image, command) of a container launcher's command line: its sub-command, options
    (with their values) and image skipped. srun names no image (`--container-image=`)."""
    launcher = os.path.basename(argv[0]).lower()
    rest = list(argv[1:])
    i = 1 if rest and rest[0] in _SUBCOMMANDS.get(launcher, ()) else 0
    takes_value = _VALUE_OPTIONS[launcher]
    while i < len(rest) and rest[i].startswith("-"):
        option = rest[i]
        i += 1
        if "=" not in option and option in takes_value:
            i += 1
    if launcher == "srun" or i >= len(rest):
        return "", rest[i:]
    return rest[i], rest[i + 1:]


def _engine_words(argv: Sequence[str]) -> list[str]:
    """The words that name the engine (basenames, lower case): the command's first four,
    after any container launchers (`srun apptainer exec IMG vllm serve`). The image counts
    only when no command follows it or the command starts with an option (the image's own
    entrypoint runs the engine: `docker run vllm/vllm-openai --model M`); otherwise the
    command decides (`apptainer exec vllm.sif python -m sglang.launch_server` is SGLang)."""
    image = ""
    command = list(argv)
    while command and os.path.basename(command[0]).lower() in _LAUNCHERS:
        image, command = _launched(command)
    if image and (not command or command[0].startswith("-")):
        return [os.path.basename(image.split("://")[-1]).lower()]
    return [os.path.basename(a).lower() for a in command[:4]]


def detect_kind(argv: Sequence[str]) -> EngineKind:
    """The adapter for an engine command line (see the table above); `openai` if unknown.
    The first of the engine words that names an engine decides."""
    head = _engine_words(argv)
    joined = " ".join(head)
    if "llmfabric" in joined or "llmfabric.cli.engine" in argv:
        if "torch" in argv[:5]:
            return KINDS["torch"]
        if "sim" in argv[:5]:
            return KINDS["sim"]
    for word in head:
        if (kind := _engine_named(word)) is not None:
            return KINDS[kind]
    return KINDS["openai"]


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
