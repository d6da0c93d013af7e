"""An in-memory network of Transport endpoints on one (fake) clock, for tests and benchmarks.

`MemNet(clock, seed=..., loss=..., delay=..., duplicate=..., reorder=...)` hands out
`MemTransport`s by peer id. Every message may be lost, duplicated, delayed (a fixed delay,
a (low, high) uniform range or a callable `rng -> seconds`), or given extra random delay
(reordering). `partition(groups...)` cuts the network into groups that cannot talk;
`cut(a, b)` breaks one link; `heal()` reconnects; `kill(peer)` silences a peer (like kill -9)
and `revive(peer)` brings it back. `link_delay(src, dst) -> seconds`, when given, is added to
every message's delay (sites: a fixed latency between two groups of peers). Everything random
draws from one seeded `random.Random`, so runs are reproducible.

Deliveries are batched on `quantum`-second ticks so that thousands of in-flight messages
need only a handful of clock timers.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable

from llmfabric.clock import Clock
from llmfabric.net.transport import MessageHandler, PeerId
from llmfabric.untrusted import get_logger, log_due

log = get_logger(__name__)

DelaySpec = float | tuple[float, float] | Callable[[random.Random], float]


class MemTransport:
    def __init__(self, net: MemNet, peer_id: PeerId) -> None:
        self._net = net
        self._id = peer_id
        self.handler: MessageHandler | None = None

    @property
    def local_id(self) -> PeerId:
        return self._id

    def send(self, peer: PeerId, payload: bytes) -> None:
        self._net._send(self._id, peer, payload)

    def set_handler(self, handler: MessageHandler) -> None:
        self.handler = handler


class MemNet:
    def __init__(
        self,
        clock: Clock,
        *,
        seed: int = 0,
        loss: float = 0.0,
        delay: DelaySpec = 0.0,
        duplicate: float = 0.0,
        reorder: float = 0.0,
        reorder_extra: float = 0.05,
        quantum: float = 0.001,
        link_delay: Callable[[PeerId, PeerId], float] | None = None,
    ) -> None:
        self.clock = clock
        self.rng = random.Random(seed)
        self.loss = loss
        self.delay = delay
        self.duplicate = duplicate
        self.reorder = reorder
        self.reorder_extra = reorder_extra
        self.quantum = quantum
        self.link_delay = link_delay
        self._peers: dict[PeerId, MemTransport] = {}
        self._dead: set[PeerId] = set()
        self._group: dict[PeerId, int] = {}
        self._cut: set[frozenset[PeerId]] = set()
        self._batches: dict[float, list[tuple[PeerId, PeerId, bytes]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent: Counter[PeerId] = Counter()
        self.bytes_sent: Counter[PeerId] = Counter()
        self.delivered: Counter[PeerId] = Counter()
        self.dropped: Counter[str] = Counter()
        self.handler_errors = 0

    # ---- topology -----------------------------------------------------------------------
    def transport(self, peer_id: PeerId) -> MemTransport:
        t = self._peers.get(peer_id)
        if t is None:
            t = self._peers[peer_id] = MemTransport(self, peer_id)
        return t

    @property
    def peers(self) -> list[PeerId]:
        return list(self._peers)

    def partition(self, *groups: Iterable[PeerId]) -> None:
        """Only peers in the same group can talk; peers in no group form one more group."""
        self._group = {p: i + 1 for i, g in enumerate(groups) for p in g}

    def heal(self) -> None:
        """Undo partitions and link cuts."""
        self._group = {}
        self._cut.clear()

    def cut(self, a: PeerId, b: PeerId) -> None:
        """Cut the link between `a` and `b` (both ways); other paths stay up."""
        self._cut.add(frozenset((a, b)))

    def kill(self, peer_id: PeerId) -> None:
        self._dead.add(peer_id)

    def revive(self, peer_id: PeerId) -> None:
        self._dead.discard(peer_id)

    def can_talk(self, a: PeerId, b: PeerId) -> bool:
        return (
            a not in self._dead and b not in self._dead and b in self._peers
            and self._group.get(a, 0) == self._group.get(b, 0)
            and (not self._cut or frozenset((a, b)) not in self._cut)
        )

    # ---- delivery -----------------------------------------------------------------------
    def _sample_delay(self) -> float:
        d = self.delay
        if callable(d):
            base = float(d(self.rng))
        elif isinstance(d, tuple):
            base = self.rng.uniform(d[0], d[1])
        else:
            base = float(d)
        if self.reorder and self.rng.random() < self.reorder:
            base += self.rng.uniform(0.0, self.reorder_extra)
        return max(0.0, base)

    def _send(self, src: PeerId, dst: PeerId, payload: bytes) -> None:
        self.sent[src] += 1
        self.bytes_sent[src] += len(payload)
        if not self.can_talk(src, dst):
            self.dropped["unreachable"] += 1
            return
        if self.loss and self.rng.random() < self.loss:
            self.dropped["loss"] += 1
            return
        copies = 2 if self.duplicate and self.rng.random() < self.duplicate else 1
        for _ in range(copies):
            d = self._sample_delay()
            if self.link_delay is not None:
                d += self.link_delay(src, dst)
            if d <= 0:
                asyncio.get_running_loop().call_soon(self._deliver, src, dst, payload)
                continue
            deadline = math.ceil((self.clock.now() + d) / self.quantum) * self.quantum
            batch = self._batches.get(deadline)
            if batch is None:
                batch = self._batches[deadline] = []
                task = asyncio.get_running_loop().create_task(self._fire(deadline))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            batch.append((src, dst, payload))

    async def _fire(self, deadline: float) -> None:
        await self.clock.sleep(deadline - self.clock.now())
        for src, dst, payload in self._batches.pop(deadline, []):
            self._deliver(src, dst, payload)

    def _deliver(self, src: PeerId, dst: PeerId, payload: bytes) -> None:
        if not self.can_talk(src, dst):
            self.dropped["unreachable"] += 1
            return
        handler = self._peers[dst].handler
        if handler is None:
            self.dropped["no_handler"] += 1
            return
        self.delivered[dst] += 1
        try:
            handler(src, payload)
        except Exception as exc:  # a buggy handler must not take the network down; count it
            self.handler_errors += 1
            if log_due(self.handler_errors):  # (as the TLS transport: seen, not a flood)
                log.error("memnet: handler of %s failed on a %d-byte message from %s: %r; %d "
                          "failure(s) so far", dst, len(payload), src, exc,
                          self.handler_errors, exc_info=self.handler_errors == 1)

    async def aclose(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._batches.clear()
