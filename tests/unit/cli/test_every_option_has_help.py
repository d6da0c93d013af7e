"""Every option of every command says what it is in `--help` (`plan --policy`, `ingress
--host`, `bench --slo-*` and others listed only a type and a default)."""

from __future__ import annotations

from collections.abc import Iterator

import click

from llmfabric.cli.main import cli
from llmfabric.cli.subcommands import WithSubcommands


def _commands(group: click.Group, ctx: click.Context, path: str
              ) -> Iterator[tuple[str, click.Command]]:
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        yield from _walk(command, ctx, f"{path} {name}")


def _walk(command: click.Command, ctx: click.Context, path: str
          ) -> Iterator[tuple[str, click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        yield from _commands(command, click.Context(command, parent=ctx), path)
    if isinstance(command, WithSubcommands):  # (`plan net`, `plan pd`, ...)
        for name in sorted(command.subcommands):
            yield from _walk(command._load(name), ctx, f"{path} {name}")


def test_every_option_of_every_command_has_help() -> None:
    ctx = click.Context(cli)
    bare = [f"{path} {param.opts[0]}"
            for path, command in _commands(cli, ctx, "llmfabric")
            for param in command.params
            if isinstance(param, click.Option) and not param.hidden and not param.help
            and param.name != "help"]
    assert bare == []
