"""The node's subscription to its engine's KV-cache events (vLLM `--kv-events-config`).

When the engine publishes events (the flag in its command, or the node's own
`--kv-events-config` for an engine whose command does not show it), the node's prefix-cache
sketch is `HeldPrefixes` (routing/held_prefixes.py): the prompt blocks the engine holds, fed
by the forwarded prompts and by these events. Otherwise it stays `ServedPrefixes` (what the node
served), unchanged.

The socket is opened before the engine starts (a publisher that connects finds it bound).
Every message is decoded under bounds (routing/kv_events.py: at most `MAX_PAYLOAD_BYTES`,
also enforced by the socket's maximum message size, and a bounded receive queue); a message
that cannot be used is counted by reason and dropped, a gap in the sequence numbers is
counted, and nothing a publisher sends can stop the loop or the node.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable
from typing import Any

from llmfabric.agent.kv_events_config import (
    KvEventsConfigError,
    KvEventsEndpoint,
    from_argv,
    parse,
)
from llmfabric.net.httpaddr import is_loopback
from llmfabric.routing.held_prefixes import HeldPrefixes
from llmfabric.routing.kv_events import MAX_PAYLOAD_BYTES, KvEventError, decode_message
from llmfabric.untrusted import get_logger, log_due

log = get_logger(__name__)
RCV_HWM = 10_000  # messages queued in the socket before the publisher's drop


class KvEventsLink:
    def __init__(self, endpoint: KvEventsEndpoint, held: HeldPrefixes) -> None:
        self.endpoint = endpoint
        self.held = held
        self.received = 0
        self.applied = 0
        self.gaps = 0
        self.dropped: Counter[str] = Counter()  # reason -> messages
        self._last_seq: int | None = None
        self._ctx: Any = None
        self._sock: Any = None
        self._task: asyncio.Task[None] | None = None

    def open(self) -> None:
        """Open the socket (bind or connect, the publisher's opposite) and start receiving."""
        import zmq  # (only nodes whose engine publishes events load pyzmq)
        import zmq.asyncio

        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, RCV_HWM)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_PAYLOAD_BYTES + 1024)  # the peer is cut past it
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, self.endpoint.topic.encode())
        where = self.endpoint.subscriber_endpoint
        if not self.endpoint.publisher_binds and not _loopback_endpoint(where):
            # We would bind: anyone who reaches that address could publish forged events
            # (and attract traffic with a sketch the engine does not hold).
            sock.close()
            self._ctx.term()
            raise KvEventsConfigError(
                f"the engine's KV-cache events would make the node bind {where}, which is not "
                "a loopback address; use tcp://127.0.0.1:PORT (or a wildcard, which the engine "
                "binds)")
        if self.endpoint.publisher_binds:
            sock.connect(where)
        else:
            sock.bind(where)
        self._sock = sock
        self._task = asyncio.get_running_loop().create_task(self._receive())
        log.info(
            "following the engine's KV-cache events on %s (topic %r)", where, self.endpoint.topic
        )

    async def _receive(self) -> None:
        while True:
            try:
                frames = await self._sock.recv_multipart(copy=True)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a closed socket or a ZMQ error: counted, go on
                self.dropped["socket"] += 1
                if self.dropped["socket"] <= 3 or self.dropped["socket"] % 600 == 0:
                    log.warning("receiving KV-cache events failed (%d times): %s",
                                self.dropped["socket"], exc)
                await asyncio.sleep(1.0)
                continue
            self.handle(frames)
            # recv returns at once while messages are queued: without a yield, a flood of
            # events starved gossip, health checks and the data plane (6.6 s gaps)
            await asyncio.sleep(0)

    def handle(self, frames: list[bytes]) -> None:
        """Decode and apply one message (anything wrong: counted and dropped)."""
        self.received += 1
        try:
            batch = decode_message(frames, self.endpoint.topic.encode())
        except KvEventError as exc:
            self.dropped["malformed"] += 1
            if self.dropped["malformed"] <= 3:  # (a hostile stream must not flood the log)
                log.warning("dropped a KV-cache event message: %s", exc)
            return
        if self._last_seq is not None and batch.seq != self._last_seq + 1:
            self.gaps += 1  # missed messages: the held set may be stale until evictions
        self._last_seq = batch.seq
        try:
            self.held.apply(batch)
        except Exception as exc:  # a bug in the tracker must not stop the events
            self.dropped["apply"] += 1
            n = self.dropped["apply"]
            if log_due(n):  # (it would fail again on each of the engine's many messages)
                log.error("applying KV-cache events (batch seq %d) failed: %r; %d message(s) "
                          "dropped so far", batch.seq, exc, n, exc_info=n == 1)
            return
        self.applied += 1

    def view(self) -> dict[str, object]:
        """For the node's local view (`/v1/fabric/self`)."""
        s = self.held.stats
        return {
            "endpoint": self.endpoint.subscriber_endpoint,
            "received": self.received,
            "applied": self.applied,
            "gaps": self.gaps,
            "dropped": dict(self.dropped),
            "held_keys": len(self.held),
            "blocks_stored": s.stored,
            "blocks_removed": s.removed,
            "unclaimed_runs": s.unclaimed,
        }

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None


def kv_events_for(
    process: tuple[str, ...], configured: str | None, now: Callable[[], float]
) -> KvEventsLink | None:
    """The subscription for an engine that publishes events (its command's flag first, then
    the node's `kv_events_config`), or None: the sketch stays what the node served. A flag
    in the engine command that cannot be read is logged and ignored (the engine will say
    more)."""
    try:
        endpoint = from_argv(process) if process else None
    except KvEventsConfigError as exc:
        log.warning(
            "the engine command's KV-events flag is not usable (%s): the prefix "
            "sketch follows the served prompts",
            exc,
        )
        endpoint = None
    if endpoint is None and configured:
        endpoint = parse(configured)
    return KvEventsLink(endpoint, HeldPrefixes(now)) if endpoint is not None else None


def _loopback_endpoint(endpoint: str) -> bool:
    """ipc:// and inproc:// are local; tcp:// only on a loopback host."""
    if not endpoint.startswith("tcp://"):
        return True
    return is_loopback(endpoint[len("tcp://"):].rsplit(":", 1)[0])
