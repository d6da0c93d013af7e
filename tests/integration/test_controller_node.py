"""`controller_node` (cli/controller_node.py), the node every in-fabric controller runs as: a
real node on loopback, started, read through its current session, stopped on exit; SIGTERM
sets `stop`; a bad config is a ClickException before anything starts."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal

import click
import pytest

from llmfabric.cli.controller_node import controller_node
from llmfabric.clock import SystemClock


def _overrides(home: pathlib.Path, **more: object) -> dict[str, object]:
    return {"home": home, "network_secret": "s" * 24, "gpu": "cpu", "listen": "127.0.0.1:0",
            "http_listen": "127.0.0.1:0", **more}


async def test_the_node_runs_inside_and_stops_on_exit(tmp_path: pathlib.Path) -> None:
    async with controller_node(_overrides(tmp_path), 0.0, SystemClock()) as ctl:
        own = ctl.node.key.peer_id
        assert own in {r.peer_id for r in ctl.reader.live_records()}
        assert not ctl.stop.is_set()
    assert ctl.node.stopping  # stopped on exit
    assert own not in {r.peer_id for r in ctl.reader.live_records()}  # it left


async def test_sigterm_sets_stop(tmp_path: pathlib.Path) -> None:
    before, before_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    async with controller_node(_overrides(tmp_path), 0.0, SystemClock()) as ctl:
        # Guard: without the handler, the signal below would end the test run itself.
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) is not before  # ours, not another plugin's
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(ctl.stop.wait(), 10)
    # on exit the handlers are gone: the process's own handling is back
    assert signal.getsignal(signal.SIGTERM) is before
    assert signal.getsignal(signal.SIGINT) is before_int


async def test_a_bad_config_is_a_click_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(click.ClickException, match="host:port"):
        async with controller_node(_overrides(tmp_path, listen="nowhere"), 0.0, SystemClock()):
            pytest.fail("the body must not run")
