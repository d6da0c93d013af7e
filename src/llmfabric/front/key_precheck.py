"""The lean front's API key check before any request body is buffered (fast_front.py).

When the head of a POST is complete on an ingress with API keys: no key -> 401 at once (the
body is not read, the connection closes after the answer); a key seen valid within
`FrontLimits.auth_memo_s` (`KeyMemo`, front_limits.py) passes; any other pauses reading the
connection until the key store answered: a valid key resumes it (with the 100 Continue a
client may wait for), an invalid one, or a store that failed, gets 401 (the rest of its body
unread). So clients without a valid key never get a body buffered. The request core still
authenticates every request it serves (revocations included).
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from llmfabric.front.fast_wire import FrontRequest
from llmfabric.front.front_limits import KeyMemo
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.errors import Reply, error_reply
from llmfabric.ingress.protocols import bearer_of
from llmfabric.untrusted import get_logger, log_due

log = get_logger(__name__)


class CheckedConnection(Protocol):
    """What the check needs of a front connection."""

    loop: asyncio.AbstractEventLoop
    cur: FrontRequest | None  # the request being read
    closed: bool
    client: str  # the client's IP address (for the log)

    def refuse_early(self, cur: FrontRequest, reply: Reply) -> None:
        """Answer `cur` with `reply` in turn; read nothing more, and close after."""

    def pause_for_auth(self, pause: bool) -> None:
        """Pause (or resume) reading while the store is asked."""

    def send_continue(self) -> None:
        """100 Continue for the request being read."""


class KeyPrecheck:
    """The check for one front: `ingress.auth` (the key store) and the keys seen valid."""

    def __init__(self, ingress: Ingress, seen: KeyMemo) -> None:
        self.ingress = ingress
        self.seen = seen

    def begin(self, conn: CheckedConnection, cur: FrontRequest) -> bool:
        """Check the key of `cur` (its head just complete); False when it was refused."""
        token = bearer_of(cur.auth)
        if not token:
            conn.refuse_early(cur, error_reply(
                401, "missing API key: send 'Authorization: Bearer <key>'", "invalid_api_key"))
            return False
        if self.seen.fresh(token, time.monotonic()):
            return True
        cur.auth_wait = True
        conn.pause_for_auth(True)
        conn.loop.create_task(self._ask_store(conn, cur, token))
        return True

    async def _ask_store(self, conn: CheckedConnection, cur: FrontRequest, token: str) -> None:
        auth = self.ingress.auth
        try:
            ok = auth is not None and await auth.authenticate(token) is not None
        except Exception as exc:  # (the store failing: refused, as the core would refuse it)
            metrics = self.ingress.metrics
            metrics.key_check_errors += 1
            n = metrics.key_check_errors
            if log_due(n):  # (any client can send keys while the store fails: no log flood)
                log.error("front: checking an API key from %s failed: %r; %d failure(s) so far "
                          "(llmfabric_ingress_key_check_errors)", conn.client or "?", exc, n,
                          exc_info=n == 1)
            ok = False
        cur.auth_wait = False
        if ok:
            self.seen.remember(token, time.monotonic())
            conn.pause_for_auth(False)
            if cur is conn.cur and cur.expect:
                conn.send_continue()
            return
        if conn.closed:
            return
        refusal = self.ingress.key_refused(token)  # (saying when, if it expired)
        if cur is conn.cur:  # its body is still coming: refuse now, read no more of it
            conn.refuse_early(cur, refusal)
        elif cur.error is None:
            cur.error = refusal  # queued already (the body came with the head)
            cur.close = True
        conn.pause_for_auth(False)
