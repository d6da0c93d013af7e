"""Node: one running llmfabric node, wired from its parts (the composition root).

    node = Node(config)
    await node.start()      # key, transport, gossip, HTTP API; engine + SERVING if --process
    await node.wait_stopped()   # until stop() (SIGTERM/SIGINT), fail-stop or a failed task
    await node.stop()       # drain, announce LEFT, stop the engine, close everything

The data flow stays one way: the transport feeds gossip, gossip keeps the replica, the replica
feeds the address book, routing and the read-only HTTP views. The node writes only its own
record (through the GossipAgent's RecordOwner).

Who owns what: the NodeSupervisor (node/supervisor.py) owns the sessions, the engine and
every background loop; nothing else replaces them. Peering (node/peering.py) joins the
fabric and keeps the address book; EngineRole (node/engine_role.py) runs, restarts, assigns
and releases the engine. This file builds the parts and says when sessions change.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
from typing import Any

from aiohttp import web

from llmfabric.agent import InflightTracker
from llmfabric.agent.hardware import discover_hardware
from llmfabric.clock import Clock, SystemClock
from llmfabric.front.front_limits import front_limits
from llmfabric.front.host_check import HostGuard, names_of
from llmfabric.front.web_app import host_middleware
from llmfabric.gossip.agent import GossipAgent
from llmfabric.gossip.config import preset
from llmfabric.gossip.stats import AgentStats
from llmfabric.identity import AdmissionError, NodeKey, PskAdmission
from llmfabric.identity.admission import MembershipCert
from llmfabric.launch.allocation import WalltimeWatch, allocation_end
from llmfabric.net import TlsTransport, TransportConfig
from llmfabric.net.httpaddr import is_wildcard, published_http_addr
from llmfabric.net.link_service import LinkService
from llmfabric.net.server_tls import ServerTls
from llmfabric.net.tcp_keepalive import KeepAlive
from llmfabric.node.admission import (
    admission_from_config,
    own_certificate,
    provider_verifier,
    read_secret_file,
    record_policy,
    revocations_from_config,
)
from llmfabric.node.config import ConfigError, NodeConfig, parse_hostport
from llmfabric.node.engine_link import EngineBindError, EngineLink, loopback_engine_command
from llmfabric.node.engine_role import EngineRole, flip_role, refuse_controller
from llmfabric.node.ingress_link import IngressLink
from llmfabric.node.peering import Peering
from llmfabric.node.revocations import follow_revocations
from llmfabric.node.serve.dataplane_server import DataPlaneServer
from llmfabric.node.serve.http_api import FleetAuth, add_node_routes
from llmfabric.node.serve.metrics import NodeMetrics
from llmfabric.node.serve.peer_api import PeerApi
from llmfabric.node.serve.replica_reader import AgentReplicaReader
from llmfabric.node.supervisor import KEEP, ONE_SHOT, Keep, NodeSupervisor, SessionChanged
from llmfabric.registry.records import Lifecycle, NodeMeta
from llmfabric.registry.replica import Listener
from llmfabric.telemetry.demand import DemandMeter
from llmfabric.telemetry.demand import moved as demand_moved
from llmfabric.untrusted import get_logger

log = get_logger(__name__)

EXIT_TASK_FAILED = 6  # a background task failed beyond its restart policy (docs/node.md)
EXIT_REVOKED = 7  # the operator's revocation list names this node's key or certificate


class NodeError(RuntimeError):
    """The node cannot start or keep running; the message says what to fix."""


class NodeRevoked(NodeError):
    """This node's own key or certificate is on the operator's revocation list (the CLI
    exits with EXIT_REVOKED)."""


class Node:
    def __init__(
        self, config: NodeConfig, *, clock: Clock | None = None, rng: random.Random | None = None
    ) -> None:
        if not config.has_credential():
            raise NodeError(
                "a node joins only with a credential: pass --network-secret-file FILE (or "
                "--network-secret, env LLMFABRIC_NETWORK_SECRET) or --membership-cert FILE "
                "with --operator-key KEY"
            )
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
        # The operator's revocation list (certificate networks), shared by the handshake's
        # admission and the registry's record check; read from --revocation-list and the
        # state directory, learnt from peers and passed on (`revoking`, below).
        self.revocations = revocations_from_config(config)
        self.admission = admission_from_config(config, self.revocations)
        host, port = parse_hostport(config.listen)
        self.transport = TlsTransport(
            self.key, self.admission,
            TransportConfig(host=host, port=port, public_addr=config.public_addr,
                            relay=config.relay),
            clock=self.clock, rng=self.rng,
        )
        # Who a record's provider really is (certificate or key fingerprint), for the
        # replica's record policy and the ingress allowlist (registry.provider).
        self.providers = provider_verifier(config, self.clock.wall, self.revocations)
        self._own_cert = own_certificate(config)
        own_cert_id = MembershipCert.from_json(self._own_cert).cert_id if self._own_cert else ""
        try:
            self.revoking = follow_revocations(
                config, self.revocations, self.transport, self.clock, self.rng,
                me=self.key.peer_id, own_cert_id=own_cert_id, session=lambda: self.agent,
                revoked_record=self.providers.revoked, republish=self._republish,
                drop_session_keys=lambda peer: self.dataplane.sessions.drop_peer(peer),
                on_own_revocation=self._revoked_self)
        except AdmissionError as exc:
            raise NodeError(f"--revocation-list: {exc}") from None
        why = self.revoking.own_revocation() if self.revoking is not None else None
        if why is not None:  # (from the file, or the copy a peer taught us before a restart)
            raise NodeRevoked(f"{why}; the node does not start (exit status {EXIT_REVOKED})")
        self.inflight = InflightTracker()
        self.metrics = NodeMetrics()
        # One set of gossip counters for the node's life: the agent of a later session (after
        # an eviction) keeps counting into it, so exported counters never go back.
        self.gossip_stats = AgentStats()
        # The one owner of sessions, the engine and the loops (node/supervisor.py).
        self.supervisor: NodeSupervisor[GossipAgent, EngineLink] = NodeSupervisor(
            self.clock, self.rng, take_down=self._task_failed)
        self.metrics.watch_tasks(self.supervisor.failures, self.gossip_stats)
        self.peering = Peering(config, self.transport, self.clock, self.rng,
                               session=lambda: self.session, loop=self.supervisor.loop,
                               republish=self._republish)
        self.engines = EngineRole(self)
        self._session_listeners: list[Listener] = []
        self.ingress: IngressLink | None = None
        self._runner: web.AppRunner | None = None
        self._http_listener: asyncio.Server | None = None  # (the front's own, on an ingress)
        self._http_addr = ""  # where this host reaches our HTTP API (banner, tests)
        self._http_bind: tuple[str, int] | None = None  # bound (host, port)
        self._stopped = asyncio.Event()
        self._exit_code = 0
        self._shutdown: asyncio.Task[None] | None = None  # shut_down()'s stop, not a loop
        # The data plane: session keys with ingresses, the pinned HTTPS listener, sealed
        # peer requests (docs/network.md "Data plane").
        self.dataplane = DataPlaneServer(
            self.key, lambda: self.engine, self._is_member,
            max_body_bytes=config.max_body_bytes,
            keepalive=KeepAlive(config.keepalive_idle_s, config.keepalive_interval_s,
                                config.keepalive_count))
        self.metrics.watch_dataplane(self.dataplane.refused, self.dataplane.served,
                                     self.dataplane.handshaking)
        self._alloc_end: float | None = config.alloc_end  # walltime (launch/allocation.py)
        # Pairwise link measurements to peers (RTT, throughput), read by planners.
        self.links = LinkService(self.transport, self.clock, self._live_peers,
                                 probe_targets=self._direct_peers,
                                 interval_s=config.link_probe_interval_s, rng=self.rng)
        self.metrics.watch_failures("links", self.links.prober.errors)
        self.metrics.watch_kv_events(
            lambda: engine.kv_events if (engine := self.engine) is not None else None)
        self.metrics.watch_otlp(lambda: engine.proxy.exporter if (
            (engine := self.engine) is not None and engine.proxy is not None) else None)

    # ---- what others read ----------------------------------------------------------------
    @property
    def agent(self) -> GossipAgent | None:
        """The current session (None before start); replaced only by the supervisor."""
        return self.supervisor.session

    @property
    def engine(self) -> EngineLink | None:
        return self.supervisor.engine

    @property
    def session(self) -> GossipAgent:
        agent = self.supervisor.session
        if agent is None:
            raise NodeError("the node is not started")
        return agent

    @property
    def session_id(self) -> str:
        return self.session.session_id

    @property
    def http_addr(self) -> str:
        return self._http_addr

    @property
    def stopping(self) -> bool:
        """SIGTERM (or a fail-stop) began: no new work."""
        return self.supervisor.stopping

    @property
    def exit_code(self) -> int:
        return self._exit_code

    def add_session_listener(self, listener: Listener) -> None:
        """Call `listener(change)` on every replica change of every session, this one and
        those after an eviction or a release (benchmarks observe convergence this way)."""
        self._session_listeners.append(listener)
        if self.agent is not None:
            self.agent.add_listener(listener)

    # ---- start --------------------------------------------------------------------------
    async def start(self) -> None:
        await self.transport.start()
        await self.change_session(self.meta())
        reader = AgentReplicaReader(lambda: self.session, self.clock, self.providers.identity)
        hosts = self.host_guard()
        app = web.Application(client_max_size=self.config.max_body_bytes + 1, middlewares=[
            host_middleware(hosts, bool(self.config.ingress and self.config.auth))])
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
            if self.ingress.store is not None:
                self.metrics.watch_failures("accounts", self.ingress.store.failures)
            if self.config.api_listen:
                await self.ingress.start_front(
                    self.config.api_listen, ssl=self.tls.context if self.tls else None,
                    limits=front_limits(self.config.front_limits), hosts=hosts)
        self.transport.set_request_handler(PeerApi(
            self.dataplane, self.engines.assign, self.engines.release,
            lambda peer, body: flip_role(self, peer, body), links=self.links,
            refuse=lambda peer: refuse_controller(self, peer),
            revocations=self.revoking.sync if self.revoking is not None else None).handle)
        await self._serve_http(app, hosts)
        if self._http_bind is not None:  # the direct path: HTTPS pinned to our node key
            await self.dataplane.start_https(self._http_bind[0], self.config.dataplane_port)
        if self._alloc_end is None:
            self._alloc_end = await asyncio.to_thread(allocation_end, dict(os.environ))
        self._republish()  # now with our HTTP address and allocation end
        self.transport.on_relays_changed(self.peering.relays_changed)
        # A connection lost without a CLOSE (kill -9, crash): probe that peer at once.
        self.transport.on_peer_lost(
            lambda peer: self.agent.probe_soon(peer) if self.agent is not None else None)
        loop = self.supervisor.loop
        loop("join", self.peering.join)
        loop("forget-evicted", self.peering.sweep_evicted_peers)
        loop("link-probe", self.links.run)
        for name, run in self.revoking.loops() if self.revoking is not None else ():
            loop(name, run)
        if self.ingress is not None:
            ingress = self.ingress
            loop("demand", lambda: self._publish_demand(ingress.demand))
            loop("key-grants", lambda: self._publish_key_grants(ingress))
            if ingress.spend is not None:
                loop("spend", lambda: self._publish_spend(ingress))
        if self.config.process:
            self.engines.start(EngineLink(self.config, self.clock, self.inflight))
        if self._alloc_end is not None:
            loop("walltime", self._walltime(self._alloc_end).run)

    def _walltime(self, end: float) -> WalltimeWatch:
        def moved(new_end: float) -> None:
            self._alloc_end = new_end
            self._republish()

        async def drain() -> None:
            self.shut_down(0, drain=True)

        env = dict(os.environ)
        refresh = None if self.config.alloc_end is not None else (lambda: allocation_end(env))
        return WalltimeWatch(self.clock, end, self.config.drain_lead_s, drain=drain,
                             republish=moved, refresh=refresh)

    def _fleet_auth(self) -> FleetAuth | None:
        """On an ingress with API keys the fleet views need a key (unless the operator
        opted into a public catalog with --public-fleet-info), one without a model
        allowlist: they show every model, which such a key must not learn of."""
        if not (self.config.ingress and self.config.auth) or self.config.public_fleet_info:
            return None

        async def valid(token: str | None) -> bool:
            store = self.ingress.store if self.ingress is not None else None
            key = await store.authenticate(token) if token and store is not None else None
            return key is not None and key.models is None

        return valid

    def host_guard(self) -> HostGuard:
        """The Host names the HTTP listeners answer (front/host_check.py): IP
        addresses, localhost, the machine's name, the names of this node's addresses and
        --allowed-host."""
        c = self.config
        return HostGuard([*c.allowed_hosts, *names_of(
            [c.public_addr, c.public_http_addr, c.http_listen, c.api_listen])])

    async def _serve_http(self, app: web.Application, hosts: HostGuard) -> None:
        host, port = parse_hostport(self.config.http_listen, default_host="127.0.0.1")
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        ssl = self.tls.context if self.tls else None
        if self.ingress is not None and self._runner.server is not None:
            # The lean front takes the OpenAI routes; every other path goes to the app.
            bound_port = await self.ingress.serve_http(
                self._runner.server, host, port, ssl, front_limits(self.config.front_limits),
                hosts)
        else:
            # Not a TCPSite: its TLS handshake limit is asyncio's 60 s, the front's is ours.
            assert self._runner.server is not None  # (set by setup())
            self._http_listener = await asyncio.get_running_loop().create_server(
                self._runner.server, host, port, reuse_address=True, ssl=ssl, backlog=128,
                ssl_handshake_timeout=(front_limits(self.config.front_limits)
                                       .handshake_timeout_s if ssl else None))
            bound_port = int(self._http_listener.sockets[0].getsockname()[1])
        self._http_bind = (host, bound_port)
        shown = "127.0.0.1" if is_wildcard(host) else host
        self._http_addr = f"{shown}:{bound_port}"

    # ---- sessions -------------------------------------------------------------------------
    def _new_agent(self, meta: NodeMeta | None = None, *, serving: bool = False
                   ) -> GossipAgent:
        agent = GossipAgent(
            self.transport, self.clock, self.key, meta if meta is not None else self.meta(),
            config=preset(self.config.preset), seeds=self.peering.seeds, rng=self.rng,
            stats=self.gossip_stats, policy=record_policy(self.providers),
        )
        agent.add_listener(lambda change: self.peering.on_change(agent, change))
        for listener in self._session_listeners:
            agent.add_listener(listener)
        agent.on_evicted(lambda: self._on_evicted(agent))
        if serving:
            agent.set_state(Lifecycle.SERVING)
        return agent

    async def change_session(
        self, meta: NodeMeta, *, serving: bool = False, leave_old: bool = False,
        engine: EngineLink | Keep | None = KEEP, expect: GossipAgent | None = None,
        engine_stop_timeout_s: float | None = 2.0,
    ) -> GossipAgent:
        """Continue under a fresh session with `meta` (and `engine` unless KEEP): one
        operation of the supervisor (a false eviction, an engine restart, a release)."""
        return await self.supervisor.change_session(
            lambda: self._new_agent(meta, serving=serving), leave_old=leave_old,
            engine=engine, expect=expect, engine_stop_timeout_s=engine_stop_timeout_s)

    def _on_evicted(self, agent: GossipAgent) -> None:
        # A false eviction (partition, long pause): rejoin under a new session id.
        if self.stopping or agent is not self.agent:
            return
        log.warning("this session was evicted by the fabric; rejoining with a new session")

        async def rejoin() -> None:
            record = agent.record
            try:
                await self.change_session(record.meta, expect=agent,
                                          serving=record.state is Lifecycle.SERVING)
            except SessionChanged:  # a release or an engine restart replaced (and closed) it
                return

        self.supervisor.loop(f"rejoin-{agent.session_id[:12]}", rejoin, ONE_SHOT)

    def meta(self, **changes: Any) -> NodeMeta:
        """Our record's metadata now (the current session's, with `changes`)."""
        base = self.agent.record.meta if self.agent is not None else None
        cfg = self.config
        roles = tuple(r for r, on in (("ingress", cfg.ingress), ("relay", cfg.relay),
                                      ("assignable", cfg.accept_assignments)) if on)
        hardware = base.hardware if base is not None else discover_hardware(
            gpu=cfg.gpu, gpu_count=cfg.gpu_count, gpu_memory_gb=cfg.gpu_memory_gb)
        peer_addrs = self.transport.advertised_addrs if self._dialable() else ()
        held = self.revocations.current if self.revocations is not None else None
        meta = NodeMeta(
            provider_id=cfg.provider or self.key.peer_id,
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
            pd_plan=base.pd_plan if base is not None else b"",
            spend=base.spend if base is not None else b"",
            labels=tuple(sorted(cfg.labels.items())),
            tier=cfg.tier,
            roles=roles,
            alloc_end=self._alloc_end or 0.0,
            drain_lead_s=cfg.drain_lead_s if self._alloc_end else 0.0,
            cert=self._own_cert,
            revocations_at=held.issued_at if held is not None else 0.0,
            revocations_digest=held.digest if held is not None else b"",
        )
        return dataclasses.replace(meta, **changes)

    def _published_http_addr(self, peer_addrs: tuple[str, ...]) -> str:
        """The HTTP address other nodes may dial directly: reachable from wherever our peer
        addresses are (net/httpaddr.py; docs/node.md)."""
        if self._http_bind is None:
            return ""
        host, port = self._http_bind
        return published_http_addr(host, port, peer_addrs, self.config.public_http_addr)

    def _republish(self) -> None:
        if self.agent is not None and not self.stopping:
            self.agent.update_self(self.meta())

    def _dialable(self) -> bool:
        return self.transport.listen_addr is not None and not self.transport.relays

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

    def _local_view(self) -> dict[str, Any]:
        engine = self.engine
        return {"engine_process": engine.local_view() if engine is not None else None,
                "engine_restarts": self.engines.restarts,
                "tasks": self.supervisor.running(),
                "task_failures": dict(self.supervisor.failures)}

    # ---- what the node publishes --------------------------------------------------------
    async def _publish_demand(self, meter: DemandMeter) -> None:
        """Publish the ingress's observed per-model workload (the fleet controller's input)
        when it moved materially, at most every `demand_interval_s`."""
        while not self.stopping:
            await self.clock.sleep(self.config.demand_interval_s)
            snapshot = meter.snapshot()
            if not self.stopping and demand_moved(self.session.record.meta.demand, snapshot):
                self.session.update_self(self.meta(demand=snapshot))

    async def _publish_key_grants(self, ingress: IngressLink) -> None:
        """Publish our keys' grants (hashes only) when they change, so ingresses that trust us
        as a key issuer accept them, and drop revoked ones within a second (accounts.grants)."""
        while not self.stopping:
            await self.clock.sleep(1.0)
            grants = ingress.key_grants()
            if not self.stopping and grants != self.session.record.meta.keys:
                self.session.update_self(self.meta(keys=grants))

    async def _publish_spend(self, ingress: IngressLink) -> None:
        """Publish what this ingress spent on its budgets when it changed, every second at
        most, so the other ingresses count it (accounts.spend_share)."""
        while not self.stopping and ingress.spend is not None:
            await self.clock.sleep(1.0)
            item = ingress.spend.next()
            if (item is not None and not self.stopping
                    and item != self.session.record.meta.spend):
                self.session.update_self(self.meta(spend=item))

    # ---- revocation lists ------------------------------------------------------------------
    def _revoked_self(self, why: str) -> None:
        """A list in force names this node's key or certificate (node/revocations.py):
        other members refuse us (handshakes, records), so serving on with our last record
        helped nobody and kept the operator's revoked node visibly alive: leave and exit."""
        log.error("%s: this node stops serving, announces LEFT while it can and exits "
                  "with status %d", why, EXIT_REVOKED)
        self.shut_down(EXIT_REVOKED, force=True)

    def reload(self) -> None:
        """SIGHUP: re-read the TLS certificate, the network secret file (a rotation:
        handshakes from now on prove and accept the new pair) and the revocation list. A
        broken file is logged and the previous values stay."""
        if self.revoking is not None:
            self.revoking.reload()
        if self.tls is not None:
            try:
                self.tls.reload()
                log.warning("reloaded the TLS certificate %s", self.tls.cert)
            except (OSError, ValueError) as exc:
                log.error("TLS reload failed, keeping the previous certificate: %s", exc)
        path = self.config.network_secret_file
        if path is not None and isinstance(self.admission, PskAdmission):  # (a secret file)
            try:
                self.admission.set_secrets(*read_secret_file(path))
                log.warning("reloaded the network secret from %s", path)
            except (ConfigError, ValueError) as exc:
                log.error("network secret reload failed, keeping the previous one: %s", exc)

    # ---- stop ---------------------------------------------------------------------------
    async def wait_stopped(self) -> int:
        await self._stopped.wait()
        return self._exit_code

    def shut_down(self, exit_code: int, *, drain: bool = False, force: bool = False) -> None:
        """Stop the node from inside (a failed engine or task, the walltime) with
        `exit_code` (kept if another failure set one first, unless `force`). The stop runs
        in its own task: the supervisor's stop() cancels the loop that asked."""
        if force or self._exit_code == 0:
            self._exit_code = exit_code
        if self._shutdown is None:
            self._shutdown = asyncio.get_running_loop().create_task(
                self.stop(drain=drain), name="node-shutdown")

    def _task_failed(self, name: str, exc: BaseException) -> None:
        log.error("node task %s failed for good (%r); announcing LEFT and exiting with "
                  "status %d", name, exc, EXIT_TASK_FAILED)
        self.shut_down(EXIT_TASK_FAILED)

    async def stop(self, *, drain: bool = True) -> None:
        """Stop taking requests, drain in-flight ones, announce LEFT, stop the engine; then
        the supervisor stops every loop, engine and session it owns. Idempotent; safe while
        a release or rejoin is in flight (it finishes first, and its session leaves)."""
        if not self.supervisor.begin_stop():
            await self._stopped.wait()
            return
        try:
            agent = await self.supervisor.settled_session()
            if agent is not None and agent.record.state < Lifecycle.DOWN:
                agent.set_state(Lifecycle.DOWN)  # ingresses stop routing to us
            self.inflight.close()  # stragglers get 503 and are retried elsewhere
            if drain:
                await self.inflight.drained(self.config.drain_timeout_s)
            if agent is not None:
                await agent.leave()
        finally:
            await self.supervisor.stop(engine_timeout_s=None if drain else 2.0)
            if self.ingress is not None:
                await self.ingress.aclose()
            if self._http_listener is not None:  # no new connections; cleanup ends the rest
                self._http_listener.close()
            if self._runner is not None:
                await self._runner.cleanup()
            await self.dataplane.aclose()
            await self.transport.aclose()
            self._stopped.set()

    def _refresh_metrics(self) -> None:
        if self.agent is not None:
            self.metrics.refresh(self.agent, self.transport, self.inflight)
