"""Engine watchdog: kill an engine's whole process tree when its node or main process dies.

Run as a file with the standard library only (`python -I -S watchdog.py ENGINE_PID NODE_PID
INTERVAL`), so it starts in milliseconds and imports nothing of llmfabric. It is the node's
child in its own process group (a signal to the engine's group does not hit it) and:
- gets SIGTERM when the node dies (parent-death signal) and also notices a changed parent
  on its next poll (the node died before the prctl);
- every INTERVAL seconds records the engine's descendants (pid and start time, from /proc),
  so children that left the process group with setsid() are still found;
- when the node died or the engine's main process ended: SIGKILLs the engine's process group
  and every recorded descendant still alive, then exits. It exits quietly when the tree is
  gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import time


def proc_stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, start time in clock ticks, state letter) from /proc/PID/stat (None: gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the LAST ')'.
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        return int(rest[1]), int(rest[19]), rest[0].decode()
    except (IndexError, ValueError):
        return None


def _descendants(root: int) -> dict[int, int]:
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit():
                st = proc_stat(int(name))
                if st is not None:
                    children.setdefault(st[0], []).append(int(name))
                    starts[int(name)] = st[1]
    out: dict[int, int] = {}
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        if pid not in out:
            out[pid] = starts[pid]
            stack.extend(children.get(pid, ()))
    return out


def _alive(pid: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st[2] not in ("Z", "X")


def _kill_all(pgid: int, known: dict[int, int]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    for pid, start in known.items():
        st = proc_stat(pid)
        if st is not None and st[1] == start:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    engine, node, interval = int(argv[1]), int(argv[2]), float(argv[3])
    fired = False

    def on_term(_sig: int, _frame: object) -> None:
        nonlocal fired
        fired = True

    signal.signal(signal.SIGTERM, on_term)
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    known: dict[int, int] = {}
    while True:
        if os.getppid() != node:
            fired = True
        main_alive = _alive(engine)
        if main_alive and not fired:
            known.update(_descendants(engine))
        if fired or not main_alive:
            # Children of the dead main process were re-parented: take the group and the
            # recorded ones, twice (a child may fork while we kill).
            for _ in range(2):
                known.update({p: s for p, s in known.items() if proc_stat(p) is not None})
                _kill_all(engine, known)
                time.sleep(0.05)
            return 0
        time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
