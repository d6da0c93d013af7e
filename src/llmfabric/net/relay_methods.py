"""`RelayMethods`: the transport's dial-back and relay API (mixed into `TlsTransport`).

Each method delegates to the transport's `RelayService` (relay.py); they live here to keep
tls_transport.py about connections and requests. See docs/network.md, "Reachability and
relays".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmfabric.clock import Clock, with_timeout
from llmfabric.net.relay import Reachability, RelayService
from llmfabric.untrusted import get_logger

log = get_logger("llmfabric.net.tls_transport")


class RelayMethods:
    relay: RelayService
    clock: Clock

    async def check_reachability(self, via: str, addr: str | None = None) -> bool:
        """Ask peer `via` to dial us back at `addr` (default: our advertised address).

        True only when `via` connected and we answered with our peer id. Never raises a
        NetError (an unreachable or busy `via` is False); the reason is logged, and
        `reachability()` returns it."""
        result = await self.reachability(via, addr)
        if not result.ok:
            log.info("dial-back check failed: %s", result.reason)
        return result.ok

    async def reachability(self, via: str, addr: str | None = None) -> Reachability:
        """Like `check_reachability`, with the reason: `Reachability(ok, reason)`."""
        return await self.relay.check_reachability(via, addr)

    def use_relays(self, relay_ids: Sequence[str]) -> None:
        """Keep persistent outbound connections to these relays (their addresses must be in
        the address book, e.g. from `connect`/`bootstrap`/`add_peer`) and re-connect them."""
        self.relay.use(relay_ids)

    def drop_relays(self, relay_ids: Sequence[str]) -> None:
        """Stop keeping registrations with these relays (see `use_relays`)."""
        self.relay.drop(relay_ids)

    @property
    def relays_in_use(self) -> tuple[str, ...]:
        """Relays we keep, or keep trying to keep, a registration with."""
        return self.relay.in_use

    async def wait_relayed(
        self,
        count: int = 1,
        timeout: float = 30.0,  # noqa: ASYNC109 - runs on the injected clock
    ) -> tuple[str, ...]:
        """Wait until at least `count` relays accepted our registration; return them."""
        await with_timeout(self.clock, self.relay.wait_registered(count), timeout)
        return self.relays

    @property
    def relays(self) -> tuple[str, ...]:
        """Relay peer ids that currently reach this node (publish as NodeMeta.relays)."""
        return self.relay.relays

    def on_relays_changed(self, callback: Callable[[tuple[str, ...]], None] | None) -> None:
        """Call `callback(relays)` whenever the set of relays reaching this node changes
        (e.g. to republish the node's record)."""
        self.relay.listener = callback
