"""Node: one running llmfabric node, wired from its parts.

    node = Node(config)
    await node.start()      # key, transport, gossip, HTTP API; engine + SERVING if --process
    await node.wait_stopped()   # until stop() (SIGTERM/SIGINT), fail-stop or eviction handling
    await node.stop()       # drain, announce LEFT, stop the engine, close everything

The data flow stays one way: the transport feeds gossip, gossip keeps the replica, the replica
feeds the address book, routing and the read-only HTTP views. The node writes only its own
record (through the GossipAgent's RecordOwner).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import random
from typing import Any

import orjson
from aiohttp import web

from llmfabric.agent import EngineEvent, EngineState, InflightTracker
from llmfabric.agent.hardware import discover_hardware
from llmfabric.clock import Clock, SystemClock
from llmfabric.gossip.agent import GossipAgent
from llmfabric.gossip.config import preset
from llmfabric.gossip.rebootstrap import Rebootstrapper
from llmfabric.gossip.stats import AgentStats
from llmfabric.identity import NodeKey
from llmfabric.ingress.demand import DemandMeter
from llmfabric.ingress.demand import moved as demand_moved
from llmfabric.ingress.front_limits import front_limits
from llmfabric.launch.allocation import allocation_end
from llmfabric.net import HandlerResponse, TlsTransport, TransportConfig
from llmfabric.net.backoff import Backoff
from llmfabric.net.httpaddr import is_wildcard, published_http_addr
from llmfabric.net.relaykeeper import RelayKeeper
from llmfabric.net.server_tls import ServerTls
from llmfabric.node.admission import (
    admission_from_config,
    own_certificate,
    provider_verifier,
    read_secret_file,
    record_policy,
)
from llmfabric.node.assignment import AssignmentError, engine_command, parse_assignment
from llmfabric.node.config import ConfigError, NodeConfig, parse_hostport
from llmfabric.node.dataplane_server import DataPlaneServer
from llmfabric.node.engine_bind import EngineBindError, loopback_engine_command
from llmfabric.node.engine_link import EngineLink, error_response
from llmfabric.node.http_api import FleetAuth, add_node_routes
from llmfabric.node.ingress_link import IngressLink
from llmfabric.node.link_service import LinkService
from llmfabric.node.metrics import NodeMetrics
from llmfabric.node.peer_api import PeerApi
from llmfabric.node.ports import free_port
from llmfabric.node.release import release_engine
from llmfabric.node.replica_reader import AgentReplicaReader
from llmfabric.node.walltime import WalltimeWatch
from llmfabric.registry.records import Lifecycle, LoadHints, NodeMeta
from llmfabric.registry.replica import Change

log = logging.getLogger(__name__)


class NodeError(RuntimeError):
    """The node cannot start or keep running; the message says what to fix."""


class Node:
    def __init__(
        self, config: NodeConfig, *, clock: Clock | None = None, rng: random.Random | None = None
    ) -> None:
        if not config.has_credential():
            raise NodeError(
                "a node joins only with a credential: pass --network-secret (or env "
                "LLMFABRIC_NETWORK_SECRET) or --membership-cert FILE with --operator-key KEY"
            )
        if config.public_http_addr is not None:
            try:
                parse_hostport(config.public_http_addr)
            except ConfigError as exc:
                raise NodeError(f"public_http_addr: {exc}") from None
        if config.process:
            try:
                config = config.model_copy(update={"process": loopback_engine_command(
                    config.process, allow_public=config.allow_engine_public_bind)})
            except EngineBindError as exc:
                raise NodeError(str(exc)) from None
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.key, _ = NodeKey.load_or_create(config.home)
        # TLS for the HTTP listeners (--tls-cert/--tls-key), reloaded by reload().
        self.tls = (ServerTls(config.tls_cert, config.tls_key)
                    if config.tls_cert is not None and config.tls_key is not None else None)
        self.admission = admission_from_config(config)
        self.transport = TlsTransport(
            self.key,
            self.admission,
            self._transport_config(),
            clock=self.clock,
            rng=self.rng,
        )
        # Who a record's provider really is (certificate or key fingerprint), for the
        # replica's record policy and the ingress allowlist (registry.provider).
        self.providers = provider_verifier(config, self.clock.wall)
        self._own_cert = own_certificate(config)
        self.inflight = InflightTracker()
        self.metrics = NodeMetrics()
        # One set of gossip counters for the node's life: the agent of a later session (after
        # an eviction) keeps counting into it, so exported counters never go back.
        self.gossip_stats = AgentStats()
        self.agent: GossipAgent | None = None
        self.engine: EngineLink | None = None
        self.ingress: IngressLink | None = None
        self._runner: web.AppRunner | None = None
        self._http_addr = ""  # where this host reaches our HTTP API (banner, tests)
        self._http_bind: tuple[str, int] | None = None  # bound (host, port)
        self._stopped = asyncio.Event()
        self._exit_code = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._seeds: list[str] = []
        self._relay_keeper: RelayKeeper | None = None
        self._evicted_peers: set[str] = set()  # addresses kept while reconnects may help
        self._stopping = False
        # The data plane: session keys with ingresses, the pinned HTTPS listener, sealed
        # peer requests (docs/network.md "Data plane").
        self.dataplane = DataPlaneServer(
            self.key, lambda: self.engine, self._is_member,
            max_body_bytes=config.max_body_bytes)
        self.metrics.watch_dataplane(self.dataplane.refused, self.dataplane.served)
        self._alloc_end: float | None = config.alloc_end  # walltime (node/walltime.py)
        self._engine_restarts = 0
        # Pairwise link measurements to peers (RTT, throughput), read by planners.
        self.links = LinkService(self.transport, self.clock, self._live_peers,
                                 probe_targets=self._direct_peers,
                                 interval_s=config.link_probe_interval_s, rng=self.rng)

    # ---- properties ---------------------------------------------------------------------
    @property
    def session_id(self) -> str:
        return self._agent.session_id

    @property
    def http_addr(self) -> str:
        return self._http_addr

    @property
    def stopping(self) -> bool:
        """SIGTERM (or a fail-stop) began: no new work."""
        return self._stopping

    @property
    def exit_code(self) -> int:
        return self._exit_code

    @property
    def _agent(self) -> GossipAgent:
        if self.agent is None:
            raise NodeError("the node is not started")
        return self.agent

    def _transport_config(self) -> TransportConfig:
        host, port = parse_hostport(self.config.listen)
        return TransportConfig(
            host=host, port=port, public_addr=self.config.public_addr, relay=self.config.relay
        )

    # ---- start --------------------------------------------------------------------------
    async def start(self) -> None:
        await self.transport.start()
        self.agent = self._new_agent()
        reader = AgentReplicaReader(lambda: self._agent, self.clock, self.providers.identity)
        app = web.Application(client_max_size=self.config.max_body_bytes + 1)
        add_node_routes(app, reader, self.metrics.registries, self._refresh_metrics,
                        self._local_view, fleet_auth=self._fleet_auth(),
                        links=self.links.fabric)
        if self.config.ingress:
            self.ingress = await IngressLink.create(
                self.config, reader, self.transport, self.rng, self.clock, key=self.key,
                identify=self.providers.identity,
            )
            self.ingress.mount(app)
            self.metrics.add_registry(self.ingress.metrics_registry)
            if self.config.api_listen:
                await self.ingress.start_front(
                    self.config.api_listen, ssl=self.tls.context if self.tls else None,
                    limits=front_limits(self.config.front_limits))
        self.transport.set_request_handler(PeerApi(
            self.dataplane, self._assign, lambda p, b: release_engine(self, p, b),
            links=self.links).handle)
        if self.config.process:
            self.engine = self._engine_link(self.config)
        await self._serve_http(app)
        if self._http_bind is not None:  # the direct path: HTTPS pinned to our node key
            await self.dataplane.start_https(self._http_bind[0], self.config.dataplane_port)
        if self._alloc_end is None:
            self._alloc_end = await asyncio.to_thread(allocation_end, dict(os.environ))
        self._agent.update_self(self._meta())
        # Relays come and go (a relay restarts): republish how we can be reached.
        self.transport.on_relays_changed(self._relays_changed)
        # A connection lost without a CLOSE (kill -9, crash): probe that peer at once.
        self.transport.on_peer_lost(
            lambda peer: self.agent.probe_soon(peer) if self.agent is not None else None)
        await self._agent.start()
        self._spawn(self._join(), "join")
        self._spawn(self._sweep_evicted_peers(), "forget-evicted")
        self._spawn(self.links.run(), "link-probe")
        if self.ingress is not None:
            self._spawn(self._publish_demand(self.ingress.demand), "demand")
            self._spawn(self._publish_key_grants(self.ingress), "key-grants")
        if self.engine is not None:
            self._spawn(self._run_engine(self.engine), "engine")
        if self._alloc_end is not None:
            self._spawn(self._walltime(self._alloc_end).run(), "walltime")

    def _walltime(self, end: float) -> WalltimeWatch:
        def moved(new_end: float) -> None:
            self._alloc_end = new_end
            self._republish()

        env = dict(os.environ)
        refresh = None if self.config.alloc_end is not None else (lambda: allocation_end(env))
        return WalltimeWatch(self.clock, end, self.config.drain_lead_s, drain=self.stop,
                             republish=moved, refresh=refresh)

    def _fleet_auth(self) -> FleetAuth | None:
        """On an ingress with API keys the fleet views need a key (unless the operator
        opted into a public catalog with --public-fleet-info)."""
        if not (self.config.ingress and self.config.auth) or self.config.public_fleet_info:
            return None

        async def valid(token: str | None) -> bool:
            store = self.ingress.store if self.ingress is not None else None
            return token is not None and store is not None and (
                await store.authenticate(token)) is not None

        return valid

    def _new_agent(self) -> GossipAgent:
        agent = GossipAgent(
            self.transport,
            self.clock,
            self.key,
            self._meta(),
            config=preset(self.config.preset),
            seeds=self._seeds,
            rng=self.rng,
            stats=self.gossip_stats,
            policy=record_policy(self.providers),
        )
        agent.add_listener(self._on_change)
        agent.on_evicted(self._on_evicted)
        return agent

    async def _serve_http(self, app: web.Application) -> None:
        host, port = parse_hostport(self.config.http_listen, default_host="127.0.0.1")
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True,
                           ssl_context=self.tls.context if self.tls else None)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        bound_port = sockets[0].getsockname()[1] if sockets else port
        self._http_bind = (host, bound_port)
        shown = "127.0.0.1" if is_wildcard(host) else host
        self._http_addr = f"{shown}:{bound_port}"

    def _published_http_addr(self, peer_addrs: tuple[str, ...]) -> str:
        """The HTTP address other nodes may dial directly: reachable from wherever our peer
        addresses are (net/httpaddr.py; docs/node.md)."""
        if self._http_bind is None:
            return ""
        host, port = self._http_bind
        return published_http_addr(host, port, peer_addrs, self.config.public_http_addr)

    def _meta(self, **changes: Any) -> NodeMeta:
        base = self.agent.record.meta if self.agent is not None else None
        roles = tuple(
            r
            for r, on in (
                ("ingress", self.config.ingress),
                ("relay", self.config.relay),
                ("assignable", self.config.accept_assignments),
            )
            if on
        )
        hardware = (
            base.hardware
            if base is not None
            else discover_hardware(
                gpu=self.config.gpu,
                gpu_count=self.config.gpu_count,
                gpu_memory_gb=self.config.gpu_memory_gb,
            )
        )
        peer_addrs = self.transport.advertised_addrs if self._dialable() else ()
        meta = NodeMeta(
            provider_id=self.config.provider or self.key.peer_id,
            peer_addrs=peer_addrs,
            http_addr=self._published_http_addr(peer_addrs),
            relays=self.transport.relays,
            hardware=hardware,
            engine=base.engine if base is not None else "",
            models=base.models if base is not None else (),
            load=base.load if base is not None else NodeMeta().load,
            demand=base.demand if base is not None else (),
            keys=base.keys if base is not None else (),
            prefix_cache=base.prefix_cache if base is not None else b"",
            labels=tuple(sorted(self.config.labels.items())),
            tier=self.config.tier,
            roles=roles,
            alloc_end=self._alloc_end or 0.0,
            drain_lead_s=self.config.drain_lead_s if self._alloc_end else 0.0,
            cert=self._own_cert,
        )
        return dataclasses.replace(meta, **changes)

    def _dialable(self) -> bool:
        return self.transport.listen_addr is not None and not self.transport.relays

    # ---- joining the fabric -------------------------------------------------------------
    async def _join(self) -> None:
        if not self.config.bootstrap:
            return
        peers = await self.transport.bootstrap(list(self.config.bootstrap))
        self._seeds[:] = [p for p in peers if p != self.key.peer_id]
        self._agent.contact_seeds(self._seeds)
        # Cut off later (a bootstrap host restarted with a new key, a long partition): dial
        # the bootstrap addresses again, with backoff (gossip/rebootstrap.py).
        cfg = preset(self.config.preset)
        rebootstrap = Rebootstrapper(
            self.clock, lambda: self._agent, self._redial,
            backoff=Backoff(cfg.sync_interval_s, cfg.rebootstrap_cap_s, self.rng),
            after_s=cfg.rebootstrap_after_s, check_interval_s=cfg.sync_interval_s,
        )
        self._spawn(rebootstrap.run(), "rebootstrap")
        if self.transport.listen_addr is None or not await self._reachable(peers):
            self._use_relays(peers)

    async def _redial(self) -> list[str]:
        peers = await self.transport.bootstrap(list(self.config.bootstrap), max_rounds=1)
        self._seeds[:] = [p for p in peers if p != self.key.peer_id]
        return list(self._seeds)

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
        self._spawn(self._relay_keeper.run(), "relays")

    def _relay_candidates(self) -> list[str]:
        """Dialable relay-role peers that are neither LEFT nor suspected, shuffled."""
        peers = list(dict.fromkeys(
            v.record.peer_id for v in self._agent.nodes.all(include_left=False)
            if not v.suspected and "relay" in v.record.meta.roles and v.record.meta.peer_addrs
            and v.record.peer_id != self.key.peer_id
        ))
        self.rng.shuffle(peers)
        return peers

    def _relay_gone(self, peer_id: str) -> bool:
        """The registry knows the peer left (or that it does not relay); unknown is not gone
        (a bootstrap peer before the first sync)."""
        views = self._agent.nodes.by_peer(peer_id)
        live = [v for v in views if v.state is not Lifecycle.LEFT]
        return bool(views) and not any("relay" in v.record.meta.roles for v in live)

    def _relays_changed(self, _relays: tuple[str, ...]) -> None:
        self._republish()
        if self._relay_keeper is not None:
            self._relay_keeper.poke()  # a registration was lost: re-select now

    def _republish(self) -> None:
        if self.agent is not None and not self._stopping:
            self.agent.update_self(self._meta())

    def _on_change(self, change: Change) -> None:
        view = self._agent.nodes.get(change.session_id) if self.agent is not None else None
        if view is None or view.record.peer_id == self.key.peer_id:
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
                self._forget_peer(view.record.peer_id)
            if self._relay_keeper is not None:
                self._relay_keeper.poke()
            return
        self.transport.add_peer(view.record.peer_id, meta.peer_addrs, meta.relays)

    async def _sweep_evicted_peers(self, interval_s: float = 60.0) -> None:
        """Forget evicted peers once the agent no longer tries to reconnect to them."""
        while True:
            await self.clock.sleep(interval_s)
            if not self._evicted_peers or self.agent is None:
                continue
            keep = set(self.agent.reconnect_candidates())
            for peer in list(self._evicted_peers):
                if peer not in keep:
                    self._evicted_peers.discard(peer)
                    self._forget_peer(peer)

    def _forget_peer(self, peer_id: str) -> None:
        """A session left: drop its peer from the address book (Slurm jobs come and go; the
        book must not grow with churn), unless another live session of that peer (a restart
        with the same key) still needs its addresses."""
        for other in self._agent.nodes.all(include_left=False):
            if other.record.peer_id == peer_id:
                meta = other.record.meta
                self.transport.add_peer(peer_id, meta.peer_addrs, meta.relays)
                return
        self.transport.remove_peer(peer_id)

    def _on_evicted(self) -> None:
        # A false eviction (partition, long pause): rejoin under a new session id.
        if not self._stopping:
            log.warning("this session was evicted by the fabric; rejoining with a new session")
            self._spawn(self._rejoin(), "rejoin")

    async def _rejoin(self) -> None:
        old = self._agent
        state = old.record.state
        await old.aclose()
        await self.new_session(old.record.meta, serving=state is Lifecycle.SERVING)

    async def new_session(self, meta: NodeMeta, *, serving: bool = False) -> GossipAgent:
        """Continue under a fresh session id (the previous agent is closed): after a false
        eviction, or to become bare again after a release (node/release.py)."""
        self.agent = self._new_agent()
        self.agent.update_self(meta)
        if serving:
            self.agent.set_state(Lifecycle.SERVING)
        await self.agent.start()
        return self.agent

    # ---- engine -------------------------------------------------------------------------
    def _engine_link(self, config: NodeConfig, env: dict[str, str] | None = None) -> EngineLink:
        return EngineLink(config, self.clock, self.inflight, env=env)

    def _live_peers(self) -> list[str]:
        """Peers of live, unsuspected sessions other than ours (link probe targets)."""
        if self.agent is None:
            return []
        return list(dict.fromkeys(
            v.record.peer_id for v in self.agent.nodes.all(include_left=False)
            if not v.suspected and v.record.peer_id != self.key.peer_id))

    def _direct_peers(self) -> list[str]:
        """Live peers we reach without a relay (both sides dialable): the link probe
        targets. A relayed pair is not measured: probes would load the relay."""
        if self.agent is None or not self._dialable():
            return []
        return list(dict.fromkeys(
            v.record.peer_id for v in self.agent.nodes.all(include_left=False)
            if not v.suspected and v.record.peer_id != self.key.peer_id
            and v.record.meta.peer_addrs))

    def _is_member(self, peer_id: str) -> bool:
        """A live session of `peer_id` is in our registry replica (relayed session offers:
        the relay's word on the origin proves nothing)."""
        return self.agent is not None and any(
            v.state is not Lifecycle.LEFT for v in self.agent.nodes.by_peer(peer_id))

    async def _assign(self, peer: str, body: bytes) -> HandlerResponse:
        """Start an engine for a controller's assignment (bare nodes that accept them)."""
        if not self.config.accept_assignments:
            return error_response(403, "this node does not accept assignments (start it with "
                                  "--accept-assignments)", "assignments_disabled")
        if self.config.controllers and peer not in self.config.controllers:
            return error_response(403, f"peer {peer} is not an allowed controller",
                                  "not_a_controller")
        if self.engine is not None or self._stopping:
            return error_response(409, "this node already runs an engine", "busy")
        try:
            assignment = parse_assignment(body)
        except AssignmentError as exc:
            return error_response(400, str(exc), "invalid_assignment")
        argv = loopback_engine_command(engine_command(assignment, free_port()),
                                       allow_public=self.config.allow_engine_public_bind)
        env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, assignment.gpu_ids))}
        if not assignment.gpu_ids:
            env = {}
        self.engine = self._engine_link(
            self.config.model_copy(update={"process": tuple(argv), "engine_url": None}), env
        )
        log.info("assignment from %s: %s", peer, " ".join(argv))
        self._spawn(self._run_engine(self.engine), "engine")
        return HandlerResponse(
            202, (("content-type", "application/json"),),
            orjson.dumps({"session_id": self.session_id, "command": argv}),
        )

    async def _run_engine(self, engine: EngineLink) -> None:
        try:
            info = await engine.start()
        except Exception as exc:
            log.error(
                "the engine did not become ready: %s (engine log: %s); announcing LEFT and "
                "exiting with status 3", exc, self.config.home / "logs" / "engine.log")
            if self._exit_code == 0:
                self._exit_code = 3
            await self.stop(drain=False)  # DOWN, LEFT, engine stopped, transport closed
            return
        self._agent.update_self(self._meta(engine=info.kind, models=info.models))
        self._agent.set_state(Lifecycle.SERVING)
        engine.supervisor.on_state_change(lambda ev: self._on_engine_event(engine, ev))
        self._spawn(self._publish_load(), "load")

    def _local_view(self) -> dict[str, Any]:
        engine = self.engine
        return {"engine_process": engine.local_view() if engine is not None else None,
                "engine_restarts": self._engine_restarts}

    def _on_engine_event(self, engine: EngineLink, event: EngineEvent) -> None:
        if self._stopping or engine is not self.engine:
            return
        if event.state is EngineState.DOWN:
            log.error("engine down: %s", event.reason)
            if self._agent.record.state < Lifecycle.DOWN:
                self._agent.set_state(Lifecycle.DOWN)
            self._spawn(self._after_engine_down(engine), "engine-down")
        elif event.state is EngineState.FATAL:
            log.error("fatal engine failure, fail-stop: %s", event.log_line or event.reason)
            self._exit_code = 4
            self._spawn(self.stop(drain=False), "fail-stop")

    async def _after_engine_down(self, engine: EngineLink) -> None:
        """The engine exited (its tree is already killed) or stopped answering: restart it
        under a new session with backoff, or leave (`on_engine_exit`, `engine_restarts`)."""
        await engine.aclose(2.0)  # a hung engine is killed; an exited one is reaped
        cfg = self.config
        while not self._stopping:
            if cfg.on_engine_exit == "leave" or self._engine_restarts >= cfg.engine_restarts:
                log.error("the engine is gone and will not be restarted (%s); announcing LEFT "
                          "and exiting with status 5",
                          "--on-engine-exit leave" if cfg.on_engine_exit == "leave" else
                          f"{self._engine_restarts} restarts used")
                if self._exit_code == 0:
                    self._exit_code = 5
                await self.stop(drain=False)
                return
            self._engine_restarts += 1
            delay = min(30.0, 2.0 ** (self._engine_restarts - 1))
            delay *= 0.75 + 0.5 * self.rng.random()
            log.warning("restarting the engine in %.1f s (restart %d of %d)", delay,
                        self._engine_restarts, cfg.engine_restarts)
            await self.clock.sleep(delay)
            if self.stopping:  # (SIGTERM while we waited)
                return
            # Same command and environment (an assigned engine keeps its GPUs).
            env = engine.supervisor.config.env
            fresh = self._engine_link(engine.config, dict(env) if env else None)
            self.engine = fresh
            try:
                info = await fresh.start()
            except Exception as exc:
                log.error("engine restart failed: %s", exc)
                continue
            old = self._agent
            meta = old.record.meta
            await old.leave()  # the DOWN session ends; the engine serves under a new one
            await old.aclose()
            await self.new_session(dataclasses.replace(meta, engine=info.kind,
                                                       models=info.models), serving=True)
            fresh.supervisor.on_state_change(functools.partial(self._on_engine_event, fresh))
            log.info("engine restarted; serving again as session %s", self.session_id)
            return

    async def _publish_load(self, interval_s: float = 10.0) -> None:
        """Refresh the load hint in the record when it changed, at most every `interval_s`:
        every record change is gossiped to the whole fabric, so load stays a coarse hint and
        routing policies track their own in-flight counts. The engine's own metrics (queue,
        running, KV-cache use, prefix hits; agent/engine_metrics.py) ride along, rounded so
        noise does not cause gossip."""
        last: LoadHints | None = None
        while not self._stopping:
            await self.clock.sleep(interval_s)
            engine = self.engine
            if engine is None or self._agent.record.state is not Lifecycle.SERVING:
                continue
            hints = self.inflight.load_hints()
            try:
                eload = await engine.supervisor.load()
            except Exception:
                log.exception("reading the engine's metrics failed")
                eload = None
            if eload is not None:
                hints = dataclasses.replace(
                    hints, queued=eload.waiting, running=eload.running,
                    kv_usage=round(eload.kv_usage, 2),
                    prefix_hit_rate=round(eload.prefix_hit_rate or 0.0, 2))
            changes: dict[str, Any] = {}
            if hints != last:
                changes["load"] = hints
            served = engine.served_prefixes  # the prefix-cache sketch (routing/cache_summary)
            if served.due(self.clock.now()):
                changes["prefix_cache"] = served.published(self.clock.now())
            if changes and not self._stopping:
                last = hints
                self._agent.update_self(self._meta(**changes))

    async def _publish_demand(self, meter: DemandMeter) -> None:
        """Publish the ingress's observed per-model workload (the fleet controller's input)
        when it moved materially, at most every `demand_interval_s`."""
        while not self._stopping:
            await self.clock.sleep(self.config.demand_interval_s)
            snapshot = meter.snapshot()
            if not self._stopping and demand_moved(self._agent.record.meta.demand, snapshot):
                self._agent.update_self(self._meta(demand=snapshot))

    def reload(self) -> None:
        """SIGHUP: re-read the TLS certificate and the network secret file (a rotation:
        handshakes from now on prove and accept the new pair). A broken file is logged and
        the previous values stay."""
        if self.tls is not None:
            try:
                self.tls.reload()
                log.warning("reloaded the TLS certificate %s", self.tls.cert)
            except (OSError, ValueError) as exc:
                log.error("TLS reload failed, keeping the previous certificate: %s", exc)
        path = self.config.network_secret_file
        if path is not None and hasattr(self.admission, "set_secrets"):
            try:
                self.admission.set_secrets(*read_secret_file(path))
                log.warning("reloaded the network secret from %s", path)
            except (ConfigError, ValueError) as exc:
                log.error("network secret reload failed, keeping the previous one: %s", exc)

    async def _publish_key_grants(self, ingress: IngressLink) -> None:
        """Publish our keys' grants (hashes only) when they change, so ingresses that trust us
        as a key issuer accept them, and drop revoked ones within a second (accounts.grants)."""
        while not self._stopping:
            await self.clock.sleep(1.0)
            grants = ingress.key_grants()
            if not self._stopping and grants != self._agent.record.meta.keys:
                self._agent.update_self(self._meta(keys=grants))

    # ---- stop ---------------------------------------------------------------------------
    async def wait_stopped(self) -> int:
        await self._stopped.wait()
        return self._exit_code

    async def stop(self, *, drain: bool = True) -> None:
        """Stop taking requests, drain in-flight ones, announce LEFT, stop the engine."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        agent = self.agent
        try:
            if agent is not None and agent.record.state < Lifecycle.DOWN:
                agent.set_state(Lifecycle.DOWN)  # ingresses stop routing to us
            self.inflight.close()  # stragglers get 503 and are retried elsewhere
            if drain:
                await self.inflight.drained(self.config.drain_timeout_s)
            if agent is not None:
                await agent.leave()
            if self.engine is not None:
                await self.engine.aclose(None if drain else 2.0)
        finally:
            current = asyncio.current_task()  # stop() may run in one of our own tasks
            for task in list(self._tasks):
                if task is not current:
                    task.cancel()
            if agent is not None:
                await agent.aclose()
            if self.ingress is not None:
                await self.ingress.aclose()
            if self._runner is not None:
                await self._runner.cleanup()
            await self.dataplane.aclose()
            await self.transport.aclose()
            self._stopped.set()

    # ---- helpers ------------------------------------------------------------------------
    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"node-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("node task %s failed", task.get_name(), exc_info=task.exception())

    def _refresh_metrics(self) -> None:
        if self.agent is not None:
            self.metrics.refresh(self.agent, self.transport, self.inflight)
