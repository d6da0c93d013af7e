"""An engine's whole process tree, and making it die with its node.

Three layers, because engines fork (vLLM: `VLLM::EngineCore`, `VLLM::Worker`; SGLang: its
scheduler and detokenizer) and a child that outlives its parent keeps holding the GPU:

1. The engine runs in its own session/process group; the main process gets the kernel's
   parent-death signal (`prctl(PR_SET_PDEATHSIG, SIGKILL)` in `preexec`), so a node that
   dies, even by SIGKILL, takes the engine's main process with it.
2. A watchdog process (`agent/watchdog.py`, stdlib only, started beside the engine) follows
   the tree: when the node dies (its parent changes) or the engine's main process ends, it
   SIGKILLs the process group and every descendant it has seen, including ones that left the
   group with setsid(). The watchdog has the parent-death signal too (SIGTERM, handled).
3. The supervisor itself kills the group and the known descendants as soon as it sees the
   main process exit (`kill_tree`), so children are gone within about a second.

Linux only for (1) and the /proc walk; elsewhere the process group alone is used.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import pathlib
import signal
import sys
from collections.abc import Callable, Iterable

from llmfabric.agent.watchdog import proc_stat

PR_SET_PDEATHSIG = 1
WATCHDOG_FILE = pathlib.Path(__file__).with_name("watchdog.py")


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux)."""
    if _LIBC is None:
        return False
    return int(_LIBC.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0


def engine_preexec(parent_pid: int) -> Callable[[], None]:
    """preexec_fn for the engine's main process: parent-death SIGKILL, and exit at once if
    the parent already died between fork and prctl (the signal would never come)."""

    def preexec() -> None:
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != parent_pid:
            os._exit(137)

    return preexec


def process_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, start time, state) of every process we can see."""
    table: dict[int, tuple[int, int, str]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit():
                st = proc_stat(int(name))
                if st is not None:
                    table[int(name)] = st
    return table


def descendants(root: int, table: dict[int, tuple[int, int, str]] | None = None
                ) -> dict[int, int]:
    """pid -> start time of every live descendant of `root` (not root itself)."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, int] = {}
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        if pid in out:
            continue
        out[pid] = table[pid][1]
        stack.extend(children.get(pid, ()))
    return out


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone)."""
    st = proc_stat(pid)
    if st is not None:
        return st[2] not in ("Z", "X")
    if os.path.isdir("/proc"):
        return False
    try:  # no /proc (not Linux): ask the kernel
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_tree(pgid: int, known: Iterable[tuple[int, int]] = ()) -> None:
    """SIGKILL the process group `pgid` and every (pid, start time) in `known` that is still
    the same process (the start time guards against a recycled pid)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    for pid, start in known:
        st = proc_stat(pid)
        if st is not None and st[1] == start:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def watchdog_command(engine_pid: int, node_pid: int, interval_s: float = 0.5) -> list[str]:
    """argv of the watchdog for an engine (run with the node's Python, no site imports)."""
    return [sys.executable, "-I", "-S", str(WATCHDOG_FILE), str(engine_pid), str(node_pid),
            str(interval_s)]
