"""`llmfabric controller --help` says what each option is."""

from __future__ import annotations

import click

from llmfabric.cli.controller import command


def test_every_controller_option_says_what_it_is() -> None:
    """--network-secret, --membership-cert, --operator-key, --preset, --policy and --interval
    had no help: `controller --help` listed '--interval FLOAT RANGE  [default: 30.0]' with no
    unit."""
    bare = [p.opts[0] for p in command.params
            if isinstance(p, click.Option) and not p.help and p.name != "help"]
    assert bare == []
