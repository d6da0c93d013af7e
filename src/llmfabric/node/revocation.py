"""The node's revocation list file (`--revocation-list FILE`), followed while it runs.

Read at start (a list that cannot be read or verified stops the start: the operator asked
for revocations, and starting without them would admit revoked members). Then the file is
polled every `POLL_S` seconds on the node's clock (its size, mtime and inode; SIGHUP polls
at once): a changed file is read, verified against the operator key and offered to the
shared `Revocations` (identity/revocation.py). A file that fails to read, parse or verify,
or holds a list older than the one in force, is refused with a logged error and the list in
force stays (never an empty one); the error is logged once per version of the file. A list
put in force calls `on_change(list)`, which closes the revoked members' connections and
drops what the node holds of them (node/daemon.py).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable

from llmfabric.clock import Clock
from llmfabric.identity.errors import AdmissionError
from llmfabric.identity.revocation import RevocationList, Revocations
from llmfabric.untrusted import get_logger

log = get_logger(__name__)

POLL_S = 5.0

_Stamp = tuple[int, int, int, int] | None  # (device, inode, size, mtime_ns); None: missing


def _stamp(path: pathlib.Path) -> _Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class RevocationWatch:
    def __init__(
        self, path: pathlib.Path, revocations: Revocations, clock: Clock,
        on_change: Callable[[RevocationList], None], *, interval_s: float = POLL_S,
    ) -> None:
        self.path = path
        self.revocations = revocations
        self.clock = clock
        self.on_change = on_change
        self.interval_s = interval_s
        self._seen: _Stamp = None  # the version of the file last read (good or refused)
        self.refused = 0  # versions of the file refused (tests, logs)

    def load_initial(self) -> RevocationList:
        """Read and verify the list at start; AdmissionError (with the reason) if it fails."""
        self._seen = _stamp(self.path)
        rl = RevocationList.load(self.path)
        self.revocations.offer(rl)
        return rl

    def poll(self) -> bool:
        """Re-read the file if it changed; return whether a new list was put in force."""
        stamp = _stamp(self.path)
        if stamp == self._seen:
            return False
        self._seen = stamp
        if stamp is None:
            self.refused += 1
            log.error("revocation list %s is gone; keeping the list in force", self.path)
            return False
        try:
            rl = RevocationList.load(self.path)
            changed = self.revocations.offer(rl)
        except AdmissionError as exc:
            self.refused += 1
            log.error("revocation list %s refused, keeping the list in force: %s",
                      self.path, exc)
            return False
        log.warning("revocation list %s in force: %d key(s), %d certificate(s) revoked "
                    "(issued at %.0f)", self.path, len(rl.peer_ids), len(rl.cert_ids),
                    rl.issued_at)
        if changed:
            self.on_change(rl)
        return changed

    async def run(self) -> None:
        while True:
            await self.clock.sleep(self.interval_s)
            self.poll()
