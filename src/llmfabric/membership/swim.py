"""SWIM probing with indirect probes and Lifeguard local health.

Each period (probe_interval * LHM) the prober picks the next member of a randomised
round-robin (a random walk over the member set's slots, see `_new_round`) and pings it.
If no ack arrives within probe_timeout * LHM it asks
`indirect_probes` (k = 3) other members to ping the target on its behalf (three independent
paths). Only if no ack comes back by the end of the period is the target reported through
`on_suspect` (the agent turns that into a signed SUSPECT fact), and not even then if any other
message from the target session arrived during the probe (it is alive, the ack was lost). If our
own timers fired late (our event loop is starved, so an ack may be sitting unread: Lifeguard's
point that the slow node should not accuse others) the target gets one more direct ping first,
and while our local health score is above half its maximum we accuse nobody.
Nothing irreversible happens here: eviction is decided later from the replicated suspicion
(see membership.suspicion).

The prober is pure logic over injected callbacks, the clock and a seeded rng; it never touches
sockets. Helpers answer PING_REQ by pinging the target with their own sequence number and
relaying the ack.
"""

from __future__ import annotations

import asyncio
import math
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from llmfabric.clock import Clock, with_timeout
from llmfabric.membership.health import LocalHealth
from llmfabric.membership.memberset import Member, MemberSet
from llmfabric.membership.messages import Ack, Ping, PingReq, SwimMessage, WireItem
from llmfabric.membership.params import ProbeParams
from llmfabric.net.transport import PeerId

# Outstanding indirect probes we relay for others; a member flooding PING_REQs gets no more.
MAX_RELAYS = 1024
# ...and for any one asker: an honest member asks k helpers per failed direct probe, once a
# probe period, and a relay lives two periods, so it has a few outstanding with us at most.
MAX_RELAYS_PER_ASKER = 32


@dataclass(slots=True)
class ProbeStats:
    probes: int = 0
    acks: int = 0
    indirect: int = 0
    failures: int = 0
    ping_reqs_served: int = 0
    spared_heard: int = 0  # no ack, but other traffic from the peer arrived during the probe
    spared_lag: int = 0  # our own timers fired late (starved loop): one more ping was sent
    loop_lag: int = 0  # probe periods that started late (each raises the local health score)
    spared_unhealthy: int = 0  # no accusation while our own health score is above half its max
    ping_reqs_refused: int = 0  # PING_REQs beyond MAX_RELAYS (or one asker's share) relays
    acks_refused: int = 0  # acks from a peer that was not asked (a forged liveness claim)


class Prober:
    def __init__(
        self,
        clock: Clock,
        config: ProbeParams,
        rng: random.Random,
        *,
        local_peer: PeerId,
        members: Callable[[], list[Member] | MemberSet],
        send: Callable[[PeerId, SwimMessage], None],
        piggyback: Callable[[], tuple[WireItem, ...]],
        on_suspect: Callable[[Member], None],
        heard_from: Callable[[Member], float] | None = None,
        members_version: Callable[[], int] | None = None,
    ) -> None:
        """`members_version()`, when given, changes whenever `members()` may have: the prober
        then rescans the member list only on a change, not on every probe (at N members a
        rescan hashes N members; at 10,000 it dominated a node's idle CPU)."""
        self._clock = clock
        self._cfg = config
        self._rng = rng
        self._local_peer = local_peer
        self._members = members
        self._send = send
        self._piggyback = piggyback
        self._on_suspect = on_suspect
        self._heard_from = heard_from
        self._members_version = members_version
        self._seen_version: int | None = None
        self._own = MemberSet()  # mirrors members() when it returns a plain list
        self._set = self._own
        self._round_set: MemberSet | None = None
        self._round_epoch = self._round_n = self._round_a = self._round_s = 0
        self._round_i = self._seen_slots = 0
        self._joined: list[Member] = []  # joined during the round, not yet probed
        self._urgent: list[Member] = []  # probe_next(): before the rest of the round
        self._probed_early: set[Member] = set()  # probed through probe_next this round
        self.health = LocalHealth(config.max_health)
        self.stats = ProbeStats()
        # An ack counts only from a peer that may send it (the target, then the helpers we
        # asked); sequence numbers are random, so a member cannot ack a probe it never saw.
        # (A member acking the next numbers on a dead node's behalf kept it routable.)
        self._pending: dict[int, tuple[asyncio.Future[None], set[PeerId]]] = {}
        # our seq -> (asker, its seq, until, the target that must answer)
        self._relays: dict[int, tuple[PeerId, int, float, PeerId]] = {}
        self._seqs = random.Random(secrets.randbits(64))  # (seeded from the OS once)
        self.paused = False

    def _next_seq(self) -> int:
        # (not from the injected rng: a sequence number changes no decision, and drawing it
        # there would shift every later probe choice of a seeded run; 32 bits: 5 bytes on
        # the wire, as a long-running counter; the sender check, not the number, is what
        # keeps others' acks out)
        while True:
            seq = self._seqs.getrandbits(32)
            if seq not in self._pending and seq not in self._relays:
                return seq

    def _member_set(self) -> MemberSet:
        version = None if self._members_version is None else self._members_version()
        if version is None or version != self._seen_version:
            self._seen_version = version
            got = self._members()
            if isinstance(got, MemberSet):
                self._set = got
            else:  # a plain list: mirror it into our own set (O(N), on a change only)
                want = set(got)
                for m in [m for m in self._own if m not in want]:
                    self._own.discard(m)
                for m in got:
                    self._own.add(m)
                self._set = self._own
        return self._set

    def _new_round(self, ms: MemberSet) -> None:
        """A random walk over every slot: start a and stride s coprime with the slot count
        visit each slot once (no O(N) shuffled copy per node; each node has its own a, s)."""
        n = ms.slots()
        self._round_set, self._round_epoch, self._round_n = ms, ms.epoch, n
        self._round_a = self._rng.randrange(n) if n else 0
        s = 1
        if n > 2:
            s = self._rng.randrange(1, n)
            while math.gcd(s, n) != 1:
                s = self._rng.randrange(1, n)
        self._round_s = s
        self._round_i = 0
        self._seen_slots = n
        self._joined = []
        self._probed_early = set()

    def _next_target(self) -> Member | None:
        ms = self._member_set()
        if ms is not self._round_set or ms.epoch != self._round_epoch:
            self._new_round(ms)
        # Members that joined during this round go in at random positions (as memberlist
        # does), so a fresh node is probed within about one round, not after the next one.
        n = ms.slots()
        while self._seen_slots < n:
            m = ms.at(self._seen_slots)
            self._seen_slots += 1
            if m is not None:
                self._joined.append(m)
        while self._urgent:
            m = self._urgent.pop()
            if m in ms:
                self._probed_early.add(m)  # its turn in this round is taken
                return m
        for _ in range(2):
            while self._round_i < self._round_n or self._joined:
                left = self._round_n - self._round_i
                if self._joined and self._rng.randrange(left + len(self._joined)) < len(
                        self._joined):
                    m = self._joined.pop(self._rng.randrange(len(self._joined)))
                else:
                    slot = (self._round_a + self._round_i * self._round_s) % self._round_n
                    self._round_i += 1
                    m = ms.at(slot)
                if m is not None and m in ms:
                    if m in self._probed_early:
                        self._probed_early.discard(m)
                        continue
                    return m
            if not len(ms):
                return None
            self._new_round(ms)
        return None

    def probe_next(self, targets: list[Member]) -> None:
        """Probe these members in the coming periods, ahead of the rest of the round (the
        transport lost its connection to them: the process may have died)."""
        for m in targets:
            if m in self._urgent:
                self._urgent.remove(m)
            self._urgent.append(m)  # _next_target pops from the end

    async def run(self) -> None:
        """Probe forever, one member per period; cancel the task to stop."""
        while True:
            start = self._clock.now()
            period = self.health.scale(self._cfg.probe_interval_s)
            target = None if self.paused else self._next_target()
            if target is not None:
                await self.probe(target, period)
            wake = max(start + period, self._clock.now())
            await self._clock.sleep(wake - self._clock.now())
            if self._clock.now() - wake > self._lag_threshold():
                self.stats.loop_lag += 1
                self.health.bad()  # our own loop is late: probe less eagerly for a while

    async def probe(self, target: Member, period: float | None = None) -> bool:
        """Ping `target` directly, then through k helpers; True if any ack came back."""
        period = period if period is not None else self.health.scale(self._cfg.probe_interval_s)
        timeout = self.health.scale(self._cfg.probe_timeout_s)
        seq = self._next_seq()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        acked_by = {target.peer_id}
        self._pending[seq] = (fut, acked_by)
        self.stats.probes += 1
        started = self._clock.now()
        try:
            self._send(target.peer_id, Ping(seq, target.session_id, self._piggyback()))
            if await self._wait(fut, timeout):
                self.health.good()
                self.stats.acks += 1
                return True
            helpers = self._member_set().sample(
                self._rng, self._cfg.indirect_probes,
                skip_peers=(target.peer_id, self._local_peer))
            for h in sorted(m.peer_id for m in helpers):
                self.stats.indirect += 1
                acked_by.add(h)
                self._send(h, PingReq(seq, target.peer_id, target.session_id))
            indirect_wait = max(period - timeout, timeout)
            if await self._wait(fut, indirect_wait):
                self.stats.acks += 1
                return True
            self.health.bad()
            self.stats.failures += 1
            if self._heard_from is not None and self._heard_from(target) >= started:
                self.stats.spared_heard += 1
                return False
            overrun = (self._clock.now() - started) - (timeout + indirect_wait)
            if overrun > self._lag_threshold():
                # Our timers fired late: our event loop is starved, so the ack may be sitting
                # unread. Give the target one more direct ping before accusing it.
                self.stats.spared_lag += 1
                self._send(target.peer_id, Ping(seq, target.session_id, ()))
                if await self._wait(fut, 2 * timeout):
                    self.stats.acks += 1
                    return True
                if self._heard_from is not None and self._heard_from(target) >= started:
                    self.stats.spared_heard += 1
                    return False
            if self.health.score > self._cfg.max_health // 2:
                # We keep failing probes and running late: most likely we are the sick one.
                # Accusing others now would only add refutation traffic to an overloaded node.
                self.stats.spared_unhealthy += 1
                return False
            self._on_suspect(target)
            return False
        finally:
            self._pending.pop(seq, None)

    def _lag_threshold(self) -> float:
        return max(0.05, 0.5 * self._cfg.probe_timeout_s)

    async def _wait(self, fut: asyncio.Future[None], seconds: float) -> bool:
        if fut.done():
            return True
        try:
            await with_timeout(self._clock, asyncio.shield(fut), seconds)
        except TimeoutError:
            return fut.done()
        return True

    # ---- incoming -----------------------------------------------------------------------
    def on_ack(self, sender: PeerId, seq: int) -> None:
        """An ack from the (authenticated) peer `sender`: it counts for our probe only from
        the target or a helper we asked, for a relayed probe only from its target."""
        pending = self._pending.get(seq)
        if pending is not None:
            fut, acked_by = pending
            if sender in acked_by and not fut.done():
                fut.set_result(None)
            elif sender not in acked_by:
                self.stats.acks_refused += 1
            return
        relay = self._relays.get(seq)
        if relay is None:
            return
        if sender != relay[3]:
            self.stats.acks_refused += 1
            return
        del self._relays[seq]
        if relay[2] >= self._clock.now():
            self._send(relay[0], Ack(relay[1], ()))

    def on_ping_req(self, asker: PeerId, req: PingReq) -> None:
        now = self._clock.now()
        asked = 0
        for s, (who, _, until, _) in list(self._relays.items()):
            if until < now:
                del self._relays[s]
            elif who == asker:
                asked += 1
        # A flood of PING_REQs: serve no more for now; one member gets a share only, so it
        # cannot take every slot and starve the honest members' indirect probes.
        if len(self._relays) >= MAX_RELAYS or asked >= MAX_RELAYS_PER_ASKER:
            self.stats.ping_reqs_refused += 1
            return
        seq = self._next_seq()
        self._relays[seq] = (asker, req.seq, now + self._cfg.probe_interval_s * 2,
                             req.target_peer)
        self.stats.ping_reqs_served += 1
        self._send(req.target_peer, Ping(seq, req.target_session, ()))
