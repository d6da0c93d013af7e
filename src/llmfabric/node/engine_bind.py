"""Engines listen on loopback: only the node (its authenticated data plane) talks to them.

An engine command that binds elsewhere (`--host 0.0.0.0`, a LAN address) is refused unless
the operator allows it (`--allow-engine-public-bind`): an engine port reachable from the
network would bypass API keys, accounting and the fabric's encryption. vLLM binds every
interface when no `--host` is given, so the node adds `--host 127.0.0.1` to vLLM commands
without one (sglang, llama.cpp and `llmfabric engine sim` default to loopback).
"""

from __future__ import annotations

from collections.abc import Sequence

from llmfabric.agent.command import engine_kind
from llmfabric.net.httpaddr import is_loopback


class EngineBindError(ValueError):
    """The engine command binds a non-loopback address and that was not allowed."""


def _host(argv: Sequence[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--host" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--host="):
            return arg.split("=", 1)[1]
    return None


def loopback_engine_command(argv: Sequence[str], *, allow_public: bool = False
                            ) -> tuple[str, ...]:
    """`argv`, bound to loopback; EngineBindError for a public bind not allowed."""
    args = tuple(argv)
    host = _host(args)
    if host is None:
        if engine_kind(args) == "vllm" and not allow_public:
            return (*args, "--host", "127.0.0.1")
        return args
    if not allow_public and not is_loopback(host.strip("[]")):
        raise EngineBindError(
            f"the engine command binds {host!r}, which is not a loopback address: anyone who "
            "can reach it would bypass API keys and the fabric's encryption. Bind it to "
            "127.0.0.1 (--host 127.0.0.1), or start the node with --allow-engine-public-bind "
            "if that is really wanted")
    return args
