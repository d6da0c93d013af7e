"""Drop an attempt still waiting on a node the membership now doubts.

`with AbandonIfDown(source, cand): ...` wraps the part of an attempt before any byte reached
the client (connect, headers, first chunk; a whole non-streamed exchange). When the source's
membership view marks the node suspected or gone meanwhile (`CandidateSource.watch_down`),
the waiting task is cancelled and the block raises `NodeDown`, an `UpstreamError`: the
request path counts the attempt as failed on that node and retries another, exactly as after
a timeout, without waiting out the connect and first-byte timeouts (seconds, when a site is
cut off and its packets are dropped).

Only that part: once bytes reached the client, suspicion does not cut the stream. A
suspicion can be false (a slow probe path, a partition on the prober's side), and a cut
mid-stream costs the relayed work and a continuation; a node that really died ends the
stream by itself (keepalive, idle timeout) and continuation.py finishes it elsewhere.

Costs nothing on a source with no membership (`watch_down` answers None: standalone
ingress); otherwise one watch registered and removed per attempt, no task created.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from llmfabric.ingress.errors import UpstreamError
from llmfabric.ingress.protocols import CandidateSource
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.liveness import GONE, Unwatch


class NodeDown(UpstreamError):
    """The node became suspected (or left) while the attempt waited for its first byte.
    `gone`: it left or was evicted; otherwise it is only suspected, and may be fine (the
    request path tries it again as a last resort: app.py)."""

    def __init__(self, message: str, *, gone: bool) -> None:
        super().__init__(message)
        self.gone = gone


class AbandonIfDown:
    __slots__ = ("_cancelling", "_cand", "_fired", "_source", "_task", "_unwatch")

    def __init__(self, source: CandidateSource, cand: Candidate) -> None:
        self._source = source
        self._cand = cand
        self._unwatch: Unwatch | None = None
        self._task: asyncio.Task[object] | None = None
        self._fired = 0
        self._cancelling = 0

    def __enter__(self) -> None:
        self._unwatch = self._source.watch_down(self._cand, self._on_down)
        if self._unwatch is not None:
            self._task = asyncio.current_task()
            if self._task is None:  # (not in a task: nothing to cancel)
                self._unwatch()
                self._unwatch = None
            else:
                self._cancelling = self._task.cancelling()

    def _on_down(self, level: int) -> None:
        # Called from the task that merged the change (gossip), never from the waiting one:
        # the cancellation reaches the waiting task at its current await, inside the block.
        task = self._task
        if task is not None and not self._fired and not task.done():
            self._fired = level
            task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._unwatch is None:
            return
        self._unwatch()  # (no leak: the watch ends with the wait, however it ends)
        self._unwatch = None
        if not self._fired or self._task is None:
            return
        # Ours only: a cancellation from elsewhere too (client gone) stays a cancellation.
        if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            why = "left the fabric" if self._fired >= GONE else "became suspected"
            raise NodeDown(
                f"node {self._cand.session_id} {why} before its first byte; "
                "moving on without waiting for its timeouts",
                gone=self._fired >= GONE,
            ) from exc
