"""free_port: a port that binds now, chosen where the kernel never hands ports out on its own."""

from __future__ import annotations

import pathlib
import random
import socket

import pytest

from llmfabric.net import ports


def _range_file(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    return path


def test_the_port_is_below_the_ephemeral_range_and_binds() -> None:
    low, _ = ports.ephemeral_range()
    for seed in range(20):
        port = ports.free_port(rng=random.Random(seed))
        assert port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free, as promised


def test_a_taken_port_is_skipped() -> None:
    seed = next(s for s in range(100, 200)
                if ports._candidates(random.Random(s))[0] not in ports._handed_set)
    first = ports._candidates(random.Random(seed))[0]  # what this seed proposes first
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", first))
        holder.listen()
        assert ports.free_port(rng=random.Random(seed)) != first  # taken: another one


def test_a_port_handed_out_is_not_handed_out_again_before_it_is_bound() -> None:
    """A local fabric picks a node's peer and HTTP ports before either binds: a picked,
    unbound port binds fine, so two picks could return one port (the suite saw a node whose
    HTTP listener found its own peer listener on its port)."""
    picked = [ports.free_port(rng=random.Random(11)) for _ in range(50)]
    assert len(set(picked)) == 50


def test_a_low_configured_range_uses_the_room_above_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setattr(ports, "_RANGE_FILE", _range_file(tmp_path, "1024\t40000\n"))
    assert ports.free_port(rng=random.Random(1)) > 40000


def test_a_range_covering_every_port_falls_back_to_the_kernel(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setattr(ports, "_RANGE_FILE", _range_file(tmp_path, "1024 65535"))
    assert 1024 <= ports.free_port() <= 65535


def test_an_unreadable_range_means_the_linux_default(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setattr(ports, "_RANGE_FILE", tmp_path / "missing")
    assert ports.ephemeral_range() == (32768, 60999)
    monkeypatch.setattr(ports, "_RANGE_FILE", _range_file(tmp_path, "garbage"))
    assert ports.ephemeral_range() == (32768, 60999)
