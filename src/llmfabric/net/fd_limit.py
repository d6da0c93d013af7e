"""`raise_open_file_limit`: lift the process's soft limit on open files towards its hard limit
at start-up, as servers do (Go's runtime does it for every program since 1.19).

Many Linux systems (and Slurm jobs, which inherit the login shell's limits) start processes
with a soft limit of 1,024 open files, while the hard limit is far higher. A node holds a
socket per peer connection (up to `TransportConfig.max_connections`, 512), per connection
mid-handshake (up to 256 on each TLS listener), per client and upstream connection of its
ingress, and its engine's: at 1,024 an ingress under load fails to accept (EMFILE) long
before any cap of ours applies. Raising the soft limit needs no privilege; it never lowers
it, and `select()` is not used anywhere (asyncio uses epoll), so large descriptors are fine.
"""

from __future__ import annotations

from types import ModuleType

from llmfabric.untrusted import get_logger

log = get_logger(__name__)

DEFAULT_TARGET = 65536


def raise_open_file_limit(target: int = DEFAULT_TARGET) -> tuple[int, int]:
    """Raise RLIMIT_NOFILE's soft limit to min(target, hard) when it is lower; returns the
    soft limit (before, after). Where the platform has no such limit, (-1, -1)."""
    try:
        import resource
    except ImportError:  # (not on Windows)
        return -1, -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError) as exc:
        # Some systems cap the soft limit below the hard one (macOS: OPEN_MAX, 10,240, under
        # an unlimited hard limit; some containers): take the largest value they allow.
        got = _largest_allowed(resource, soft, want, hard)
        if got == soft:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, want, exc)
            return soft, soft
        want = got
    log.info("open-file limit raised from %d to %d (hard limit %d)", soft, want, hard)
    return soft, want


def _largest_allowed(resource: ModuleType, ok: int, refused: int, hard: int) -> int:
    """Bisect between a soft limit that holds (`ok`) and one refused; sets and returns the
    largest accepted (`ok` if none above it is)."""
    while refused - ok > 1:
        mid = (ok + refused) // 2
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (mid, hard))
        except (ValueError, OSError):
            refused = mid
        else:
            ok = mid
    resource.setrlimit(resource.RLIMIT_NOFILE, (ok, hard))
    return ok
