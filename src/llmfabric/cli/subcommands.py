"""Subcommands under a command that also runs on its own (`llmfabric plan` places models;
`llmfabric plan net ...` plans a network). A first argument naming a registered subcommand
dispatches to it (loaded lazily from "module:attribute"); anything else runs the base
command, so existing invocations keep working unchanged.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import click


class WithSubcommands(click.Command):
    def __init__(self, base: click.Command, subcommands: Mapping[str, str]) -> None:
        names = ", ".join(f"`{base.name} {n}`" for n in sorted(subcommands))
        help_text = (base.help or "") + f"\n\nSubcommands: {names} (each has --help)."
        super().__init__(base.name or "", params=base.params, callback=base.callback,
                         help=help_text, epilog=base.epilog, short_help=base.short_help)
        self.base = base
        self.subcommands = dict(subcommands)

    def _load(self, name: str) -> click.Command:
        module, _, attr = self.subcommands[name].partition(":")
        loaded: click.Command = getattr(importlib.import_module(module), attr)
        return loaded

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        if args and args[0] in self.subcommands:
            sub = self._load(args[0])
            return sub.make_context(f"{info_name} {args[0]}", list(args[1:]), parent=parent,
                                    **extra)
        return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        if ctx.command is not self:
            return ctx.command.invoke(ctx)
        return super().invoke(ctx)


def with_subcommands(base: click.Command, subcommands: Mapping[str, str]) -> click.Command:
    return WithSubcommands(base, subcommands)
