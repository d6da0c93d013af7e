"""What the agent learns from an engine command line: the engine kind and where it listens.

Kind: vllm (`vllm serve`, `python -m vllm.entrypoints.openai.api_server`), sglang
(`python -m sglang.launch_server`), llama.cpp (`llama-server`, `python -m llama_cpp.server`),
sim (`llmfabric engine sim`, `python -m llmfabric.cli.engine sim`), else unknown.
URL: `--engine-url` if given; else `--host`/`--port` from the command (0.0.0.0/:: mean
loopback for us); else the engine's default port: vllm 8000, sglang 30000, llama.cpp 8080.
sim and unknown engines need --port in the command or an explicit engine URL.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from llmfabric.agent.errors import EngineCommandError

DEFAULT_PORTS: dict[str, int] = {"vllm": 8000, "sglang": 30000, "llama.cpp": 8080}
_WILDCARDS = {"0.0.0.0", "::", "[::]", "", "*"}


@dataclass(frozen=True, slots=True)
class EngineCommand:
    argv: tuple[str, ...]
    kind: str  # "vllm" | "sglang" | "llama.cpp" | "sim" | "unknown"
    base_url: str  # e.g. "http://127.0.0.1:8000" (no trailing slash, no /v1)


def engine_kind(argv: Sequence[str]) -> str:
    names = [os.path.basename(a).lower() for a in argv[:4]]
    joined = " ".join(names)
    if "vllm" in joined:
        return "vllm"
    if "sglang" in joined:
        return "sglang"
    if "llama-server" in joined or "llama_cpp" in joined or "llama.cpp" in joined:
        return "llama.cpp"
    if "llmfabric.cli.engine" in argv or (
        "engine" in argv and "sim" in argv and "llmfabric" in " ".join(argv[:4])
    ):
        return "sim"
    return "unknown"


def _flag(argv: Sequence[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def parse_engine_command(argv: Sequence[str], engine_url: str | None = None) -> EngineCommand:
    if not argv:
        raise EngineCommandError("no engine command given; put it after --process")
    args = tuple(argv)
    kind = engine_kind(args)
    if engine_url:
        return EngineCommand(args, kind, engine_url.rstrip("/").removesuffix("/v1"))
    port_s = _flag(args, "--port")
    if port_s is None:
        if kind not in DEFAULT_PORTS:
            raise EngineCommandError(
                f"cannot tell which port the {kind} engine listens on; add --port to its "
                "command or pass --engine-url http://HOST:PORT"
            )
        port = DEFAULT_PORTS[kind]
    else:
        try:
            port = int(port_s)
        except ValueError:
            raise EngineCommandError(f"engine --port {port_s!r} is not a number") from None
    host = _flag(args, "--host") or "127.0.0.1"
    if host in _WILDCARDS:
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return EngineCommand(args, kind, f"http://{host}:{port}")
