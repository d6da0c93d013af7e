"""How long the Batch API keeps files and batches, as OpenAI's: a file's `expires_after`
(`{"anchor": "created_at", "seconds": N}`, 1 hour to 30 days) at upload, a batch's
`output_expires_after` for its output and error files, and the operator's retention
(`--batch-retention`, `retention_s`): every file expires at most that long after its
creation, and a batch that ended that long ago is deleted with its output and error files.

A file is not found (404) from its expiry on (`BatchStore` reads only live files);
`RetentionSweep` then deletes it (unless an active batch reads it: then after that batch)
and the old batches, at most `rows` of each a sweep: their rows in one transaction on the
event loop (indexed, milliseconds), their bytes unlinked in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from typing import Any

from llmfabric.accounts.expiry import parse_duration
from llmfabric.batch.store import BatchStore
from llmfabric.clock import Clock
from llmfabric.untrusted import get_logger, log_due

log = get_logger(__name__)
MIN_EXPIRES_AFTER_S = 3600  # OpenAI's bounds on `seconds`: 1 hour ...
MAX_EXPIRES_AFTER_S = 30 * 86_400  # ... to 30 days
SWEEP_INTERVAL_S = 60.0
BUSY_SWEEP_S = 1.0  # the pause before the next sweep when one found more than it may take
SWEEP_ROWS = 200  # files, and batches, one sweep deletes at most


def expires_after_s(policy: Any, name: str) -> int | str:
    """The seconds of an OpenAI expiration policy (`{"anchor": "created_at", "seconds":
    N}`; from a multipart form, `seconds` is text), or why it is none (a 400's message)."""
    if not isinstance(policy, dict) or set(policy) != {"anchor", "seconds"}:
        return f"'{name}' is an object {{\"anchor\": \"created_at\", \"seconds\": N}}"
    if policy["anchor"] != "created_at":
        return f"'{name}.anchor' must be \"created_at\""
    seconds = policy["seconds"]
    if isinstance(seconds, str) and seconds.isascii() and seconds.isdigit() \
            and len(seconds) <= 9:
        seconds = int(seconds)
    if not isinstance(seconds, int) or isinstance(seconds, bool) \
            or not MIN_EXPIRES_AFTER_S <= seconds <= MAX_EXPIRES_AFTER_S:
        return (f"'{name}.seconds' is an integer from {MIN_EXPIRES_AFTER_S} (1 hour) to "
                f"{MAX_EXPIRES_AFTER_S} (30 days)")
    return seconds


def parse_retention(text: str) -> int:
    """Seconds of an operator's retention (`--batch-retention`: 12h, 30d, 2w); ValueError
    for anything else."""
    if (seconds := parse_duration(text)) is None:
        raise ValueError(f"cannot read the retention {text!r}: give a duration such as "
                         "12h, 30d or 2w")
    return seconds


class RetentionSweep:
    """Deletes what has expired (`BatchStore.forget_expired`) every `interval_s`, a bounded
    number of rows at a time; a sweep that took all it may is followed by another soon."""

    def __init__(self, store: BatchStore, clock: Clock, *,
                 interval_s: float = SWEEP_INTERVAL_S, rows: int = SWEEP_ROWS) -> None:
        self.store = store
        self.clock = clock
        self.interval_s = interval_s
        self.rows = rows
        self.files = 0  # files deleted so far (expired, or past the retention)
        self.batches = 0  # batches deleted so far (ended past the retention)
        self.errors = 0  # sweeps that raised (logged at the 1st, 2nd, 4th...)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="batch-retention")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def sweep(self) -> bool:
        """One bounded sweep; whether it took as much as it may (more may be left)."""
        gone, files, batches = self.store.forget_expired(self.clock.wall(), self.rows)
        if gone:  # (a file of a gigabyte may take a while to unlink)
            await asyncio.to_thread(_unlink_all, gone)
        self.files += files
        self.batches += batches
        return files >= self.rows or batches >= self.rows

    async def _loop(self) -> None:
        while True:
            try:
                full = await self.sweep()
            except Exception as e:  # (a broken disk: try again later, keep serving)
                full = False
                self.errors += 1
                if log_due(self.errors):
                    log.error("the batch retention sweep failed: %r; %d time(s) so far", e,
                              self.errors, exc_info=self.errors == 1)
            await self.clock.sleep(BUSY_SWEEP_S if full else self.interval_s)


def _unlink_all(paths: list[pathlib.Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
