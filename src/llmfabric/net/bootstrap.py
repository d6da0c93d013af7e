"""The bootstrap loop: try every bootstrap address; while none answers, sleep an exponential
backoff with full jitter on the injected clock and try again.

Pure of I/O itself: `connect(addr) -> peer id` is injected (the transport's
`connect_bootstrap`), so tests can drive it on a FakeClock.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from llmfabric.clock import Clock
from llmfabric.net.backoff import Backoff
from llmfabric.net.errors import NetError, PeerUnreachable
from llmfabric.untrusted import get_logger

log = get_logger(__name__)


async def run_bootstrap(
    connect: Callable[[str], Awaitable[str]],
    addrs: Sequence[str],
    clock: Clock,
    backoff: Backoff,
    max_rounds: int | None = None,
) -> list[str]:
    """Return the peer ids of the bootstrap addresses that answered in the first round in
    which any did; raise PeerUnreachable (with every address's reason) after `max_rounds`."""
    if not addrs:
        raise PeerUnreachable("no bootstrap addresses given")
    rounds = 0
    warned: list[str] | None = None  # the reasons last logged as a warning
    while True:
        got: list[str] = []
        errors: list[str] = []
        for addr in addrs:
            try:
                got.append(await connect(addr))
            except NetError as exc:
                errors.append(f"{addr}: {exc}")
        if got:
            backoff.reset()
            return got
        rounds += 1
        if max_rounds is not None and rounds >= max_rounds:
            raise PeerUnreachable(f"no bootstrap peer reachable: {'; '.join(errors)}")
        delay = backoff.next_delay()
        # A warning the first time and whenever the reasons change (a wrong secret or
        # admission kind, a host that is down): at the default level a node that could not
        # join printed nothing at all. The same reasons again are routine retries.
        level = logging.INFO if errors == warned else logging.WARNING
        warned = errors
        log.log(level, "no bootstrap peer reachable, retrying in %.2fs: %s", delay,
                "; ".join(errors))
        await clock.sleep(delay)
