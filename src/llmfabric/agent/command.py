"""What the agent learns from an engine command line: the engine kind and where it listens.

Kind: from the command (agent/engines.py `detect_kind`: vllm, sglang, llama.cpp,
llama-cpp-python, tgi, torch, sim, else openai), or `--engine KIND`.
URL: `--engine-url` if given; else `--host`/`--port` from the command (0.0.0.0/:: mean
loopback for us); else the kind's default port (vllm 8000, sglang 30000, llama-server 8080,
llama-cpp-python 8000, tgi 3000). torch, sim and OpenAI-compatible (`openai`) engines need
--port in the command or an explicit engine URL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmfabric.agent.engines import (
    EngineKind,
    detect_kind,
    detected,
    engine_phrase,
    flag_value,
    kind_named,
)
from llmfabric.agent.errors import EngineCommandError

_WILDCARDS = {"0.0.0.0", "::", "[::]", "", "*"}


@dataclass(frozen=True, slots=True)
class EngineCommand:
    argv: tuple[str, ...]
    adapter: EngineKind
    base_url: str  # e.g. "http://127.0.0.1:8000" (no trailing slash, no /v1)

    @property
    def kind(self) -> str:
        return self.adapter.name


def engine_kind(argv: Sequence[str]) -> str:
    return detect_kind(argv).name


def parse_engine_command(argv: Sequence[str], engine_url: str | None = None,
                         kind: str | None = None) -> EngineCommand:
    if not argv:
        raise EngineCommandError("no engine command given; put it after --process")
    args = tuple(argv)
    try:
        adapter, seen = (kind_named(kind), "") if kind else detected(args)
    except ValueError as exc:
        raise EngineCommandError(str(exc)) from None
    if engine_url:
        return EngineCommand(args, adapter, engine_url.rstrip("/").removesuffix("/v1"))
    port_s = flag_value(args, "--port")
    if port_s is None:
        if adapter.default_port is None:
            what = _how_known(adapter, kind, seen, args)
            raise EngineCommandError(
                f"cannot tell which port the engine listens on: {what} has no default port; "
                "add --port to its command or pass --engine-url http://HOST:PORT"
            )
        port = adapter.default_port
    else:
        try:
            port = int(port_s)
        except ValueError:
            raise EngineCommandError(f"engine --port {port_s!r} is not a number") from None
    host = flag_value(args, "--host") or "127.0.0.1"
    if host in _WILDCARDS:
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return EngineCommand(args, adapter, f"http://{host}:{port}")


def _how_known(adapter: EngineKind, kind: str | None, seen: str, args: Sequence[str]) -> str:
    """The engine and where its kind came from, e.g. "the sim engine (detected from
    `llmfabric engine sim`)": behind a container launcher the user sees what was understood."""
    if kind:
        return f"{engine_phrase(adapter.name)} (--engine {kind})"
    if seen:
        return f"{engine_phrase(adapter.name)} (detected from `{seen}`)"
    shown = " ".join(args[:8]) + (" ..." if len(args) > 8 else "")
    return (f"{engine_phrase(adapter.name)} (no known engine named in `{shown}`; --engine "
            "KIND sets one)")
