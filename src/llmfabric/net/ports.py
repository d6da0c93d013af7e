"""Picking a free loopback port for a process that binds it later (engines, local fabrics, tests).

A port handed out by the kernel for `bind(port 0)` comes from the ephemeral range, the same range
every outgoing connection and every other port-0 listener draws from; between our pick and the
engine's bind one of those may take it (CI saw an engine fail with EADDRINUSE that way). So we
pick at random *below* the ephemeral range, where the kernel never assigns ports on its own, and
check that the port binds now. Only another explicit pick can then collide: within this process
a port handed out is not handed out again for the next `_REMEMBERED` picks (a local fabric picks
a node's peer and HTTP ports before either binds, and a port picked but not yet bound binds
fine: the suite saw one node given the same port for both), and across processes random
choice over thousands of ports makes it rare.
"""

from __future__ import annotations

import pathlib
import random
import socket
import threading
from collections import deque

_RANGE_FILE = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000  # below this sit well-known services (Postgres 5432, Slurm 6817-6818, ...)
_ATTEMPTS = 64
_REMEMBERED = 4096
# Ports this process handed out lately, not handed out again (see the module docstring).
_handed: deque[int] = deque(maxlen=_REMEMBERED)
_handed_set: set[int] = set()
_lock = threading.Lock()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux default 32768-60999 when it cannot be read)."""
    try:
        low, high = (int(x) for x in _RANGE_FILE.read_text().split()[:2])
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _candidates(rng: random.Random) -> list[int]:
    low, high = ephemeral_range()
    if low - _LOWEST >= 1000:  # room below the ephemeral range
        return rng.sample(range(_LOWEST, low), _ATTEMPTS)
    if 65535 - high >= 1000:  # a range configured low: use the room above it
        return rng.sample(range(high + 1, 65536), _ATTEMPTS)
    return []


def _binds(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _hand_out(port: int) -> int:
    if len(_handed) == _REMEMBERED:
        _handed_set.discard(_handed[0])
    _handed.append(port)
    _handed_set.add(port)
    return port


def free_port(host: str = "127.0.0.1", rng: random.Random | None = None) -> int:
    """A port that binds now, that the kernel will not hand to anyone else on its own, and
    that this process has not handed out lately."""
    with _lock:
        for port in _candidates(rng or random.Random()):
            if port not in _handed_set and _binds(host, port):
                return _hand_out(port)
        with socket.socket() as sock:  # no room outside the ephemeral range: the race stays
            sock.bind((host, 0))
            chosen: int = sock.getsockname()[1]
            return _hand_out(chosen)
