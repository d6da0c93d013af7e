"""Peering: how a node joins the fabric and keeps its address book and relays current.

- join: bootstrap, hand the answering peers to the session as seeds, check that they can
  dial us back (else keep relay registrations), then re-bootstrap whenever we are cut off
  (a bootstrap host restarted with a new key, a long partition; gossip/rebootstrap.py);
- the address book follows the replica: a peer's addresses are added when its record
  arrives and dropped when its last session left (Slurm jobs come and go: the book must not
  grow with churn); an evicted peer's stay while the session may reconnect to it.

It reads the node's CURRENT session on every call (`session()`): an eviction or a release
replaces it (node/supervisor.py).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

from llmfabric.clock import Clock
from llmfabric.gossip.agent import GossipAgent
from llmfabric.gossip.config import preset
from llmfabric.gossip.rebootstrap import Rebootstrapper
from llmfabric.net import TlsTransport
from llmfabric.net.backoff import Backoff
from llmfabric.net.relaykeeper import RelayKeeper
from llmfabric.node.config import NodeConfig
from llmfabric.registry.records import Lifecycle
from llmfabric.registry.replica import Change
from llmfabric.untrusted import get_logger

log = get_logger(__name__)

StartLoop = Callable[[str, Callable[[], Awaitable[None]]], None]


class Peering:
    def __init__(
        self, config: NodeConfig, transport: TlsTransport, clock: Clock, rng: random.Random,
        *, session: Callable[[], GossipAgent], loop: StartLoop,
        republish: Callable[[], None],
    ) -> None:
        self.config = config
        self.transport = transport
        self.clock = clock
        self.rng = rng
        self._session = session
        self._loop = loop  # the supervisor's: restarted on failure, stopped with the node
        self._republish = republish
        self.seeds: list[str] = []  # the sessions' seed list (shared, updated in place)
        self._relay_keeper: RelayKeeper | None = None
        self._evicted_peers: set[str] = set()  # addresses kept while reconnects may help

    @property
    def own_peer(self) -> str:
        return self.transport.local_id

    # ---- joining ----------------------------------------------------------------------------
    async def join(self) -> None:
        if not self.config.bootstrap:
            return
        peers = await self.transport.bootstrap(list(self.config.bootstrap))
        self.seeds[:] = [p for p in peers if p != self.own_peer]
        self._session().contact_seeds(self.seeds)
        cfg = preset(self.config.preset)
        rebootstrap = Rebootstrapper(
            self.clock, self._session, self._redial,
            backoff=Backoff(cfg.sync_interval_s, cfg.rebootstrap_cap_s, self.rng),
            after_s=cfg.rebootstrap_after_s, check_interval_s=cfg.sync_interval_s,
        )
        self._loop("rebootstrap", rebootstrap.run)
        others = [p for p in peers if p != self.own_peer]  # (no connection to ourselves)
        if self.transport.listen_addr is None or (others and not await self._reachable(others)):
            self._use_relays(others)

    async def _redial(self) -> list[str]:
        peers = await self.transport.bootstrap(list(self.config.bootstrap), max_rounds=1)
        self.seeds[:] = [p for p in peers if p != self.own_peer]
        return list(self.seeds)

    async def _reachable(self, peers: list[str], attempts: int = 3) -> bool:
        """Dial-back through the bootstrap peers; a busy peer gets a few tries before we
        conclude we sit behind NAT (relaying everything would be the costlier mistake)."""
        reasons: list[str] = []
        for attempt in range(attempts):
            for peer in peers:
                result = await self.transport.reachability(peer)
                if result.ok:
                    return True
                reasons.append(f"{peer[:12]}: {result.reason}")
            await self.clock.sleep(0.5 * 2**attempt * (0.5 + self.rng.random()))
        log.warning("no bootstrap peer could dial us back (%s); falling back to relays",
                    "; ".join(reasons[-len(peers):]))
        return False

    def _use_relays(self, bootstrap_peers: list[str]) -> None:
        """Keep >= min_relays registrations with relay-role peers for as long as we run
        (the bootstrap peers until the registry lists a relay; net/relaykeeper.py)."""
        tcfg = self.transport.config
        self._relay_keeper = RelayKeeper(
            self.transport, self.clock, Backoff(tcfg.backoff_base, tcfg.backoff_cap, self.rng),
            candidates=self._relay_candidates, gone=self._relay_gone,
            fallback=lambda: bootstrap_peers, want=self.config.min_relays,
        )
        self._loop("relays", self._relay_keeper.run)

    def _relay_candidates(self) -> list[str]:
        """Dialable relay-role peers that are neither LEFT nor suspected, shuffled."""
        peers = list(dict.fromkeys(
            v.record.peer_id for v in self._session().nodes.all(include_left=False)
            if not v.suspected and "relay" in v.record.meta.roles and v.record.meta.peer_addrs
            and v.record.peer_id != self.own_peer
        ))
        self.rng.shuffle(peers)
        return peers

    def _relay_gone(self, peer_id: str) -> bool:
        """The registry knows the peer left (or that it does not relay); unknown is not gone
        (a bootstrap peer before the first sync)."""
        views = self._session().nodes.by_peer(peer_id)
        live = [v for v in views if v.state is not Lifecycle.LEFT]
        return bool(views) and not any("relay" in v.record.meta.roles for v in live)

    def relays_changed(self, _relays: tuple[str, ...]) -> None:
        """Relays come and go (a relay restarts): republish how we can be reached."""
        self._republish()
        if self._relay_keeper is not None:
            self._relay_keeper.poke()  # a registration was lost: re-select now

    # ---- the address book ---------------------------------------------------------------
    def on_change(self, agent: GossipAgent, change: Change) -> None:
        """A replica change of `agent` (a session's listener)."""
        view = agent.nodes.get(change.session_id)
        if view is None or view.record.peer_id == self.own_peer:
            return
        meta = view.record.meta
        if view.record.state is Lifecycle.LEFT:
            entry = change.after
            if entry.evict is not None and (
                    entry.record is None or entry.record.record.state is not Lifecycle.LEFT):
                # Evicted, not left: the agent may try to reconnect to it (a partition can
                # heal); its addresses go when it stops being a reconnect candidate.
                self._evicted_peers.add(view.record.peer_id)
            else:
                self._forget_peer(agent, view.record.peer_id)
            if self._relay_keeper is not None:
                self._relay_keeper.poke()
            return
        self.transport.add_peer(view.record.peer_id, meta.peer_addrs, meta.relays)

    async def sweep_evicted_peers(self, interval_s: float = 60.0) -> None:
        """Forget evicted peers once the agent no longer tries to reconnect to them."""
        while True:
            await self.clock.sleep(interval_s)
            if not self._evicted_peers:
                continue
            agent = self._session()
            keep = set(agent.reconnect_candidates())
            for peer in list(self._evicted_peers):
                if peer not in keep:
                    self._evicted_peers.discard(peer)
                    self._forget_peer(agent, peer)

    def _forget_peer(self, agent: GossipAgent, peer_id: str) -> None:
        """Drop a peer from the address book, unless another live session of it (a restart
        with the same key) still needs its addresses."""
        for other in agent.nodes.all(include_left=False):
            if other.record.peer_id == peer_id:
                meta = other.record.meta
                self.transport.add_peer(peer_id, meta.peer_addrs, meta.relays)
                return
        self.transport.remove_peer(peer_id)
