"""The `llmfabric` command. Each command group lives in its own module, imported lazily so the
CLI starts fast and a group whose optional dependency is missing fails alone, with a clear error.
"""

from __future__ import annotations

import importlib
import importlib.util

import click

# command name -> module under llmfabric.cli that defines `command: click.Command`.
COMMANDS: dict[str, str] = {
    "start": "start",
    "status": "status",
    "keys": "keys",
    "ingress": "ingress",
    "demo": "demo",
    "engine": "engine",
    "simulate": "simulate",
    "plan": "plan",
    "controller": "controller",
    "trace": "trace",
    "bench": "bench",
    "slurm": "slurm",
    "k8s": "k8s",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, mod in COMMANDS.items() if _available(mod))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name)
        if module is None or not _available(module):
            return None
        loaded = importlib.import_module(f"llmfabric.cli.{module}")
        command: click.Command = loaded.command
        return command


def _available(module: str) -> bool:
    return importlib.util.find_spec(f"llmfabric.cli.{module}") is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llmfabric")
def cli() -> None:
    """llmfabric: one OpenAI-compatible LLM service over GPU nodes scattered across clusters."""


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
