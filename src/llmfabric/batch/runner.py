"""`BatchRunner`: one asyncio task per ingress that carries every active batch to its end.

Per batch (each in its own task). A line being sent holds one of `concurrency` slots that
all batches share, taken in turn; an owner has at most `concurrency` lines outstanding (sent,
or waiting out a rate limit) over all its batches, and a line waiting for its Retry-After
holds no slot: a rate-limited key (requests/min 1, 50,000 lines) neither starves another
owner's batch nor keeps a task per line asleep.
- validating: the input checked in a thread (validate.py); bad lines fail the batch with
  their line numbers, else it is in_progress with its total.
- in_progress: each line not yet answered (store.done_lines: after a restart only those)
  runs in its own task through the `LineServer` as the batch's principal, looked up again
  before every line (a revoked, expired or deleted key fails the remaining lines with
  `api_key_revoked`). A line the ingress refused itself (no node answered) for a reason
  that passes waits and is sent again (its key looked up again), until the batch is
  cancelled or its window ends (`_retry_wait`): a rate limit (its Retry-After, 1 to 60 s),
  no candidate node (503) or all candidates failed (502) (Retry-After, else 1 s doubling
  to 60 s), and an unknown model (404) in the first `MODEL_GRACE_S` after the runner
  starts (a fabric node's registry is filled by gossip after it); any other answer is the
  line's result, kept at once (store.record_result), with the tokens a successful answer
  reports added to the batch's `usage`.
- a cancel (the status is cancelling), the end of the completion window (the injected
  clock) or answers past `max_output_bytes` (the batch then fails, with its answers) stop
  new lines; a cancel (`wake(batch_id)`) also ends at once the waits of lines waiting out
  a refusal (and a wait never outlasts the window); a line still waiting for a slot when
  the batch stops is not sent; lines in flight finish, lines never sent get an error record
  (`batch_cancelled` / `batch_expired`, as OpenAI's expired lines).
- the output and error files are written from the kept results (ids derived from the batch
  id, so a finalization cut short by a restart is redone, not doubled; they expire as the
  batch's `output_expires_after` says), and the batch ends completed, cancelled or expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from llmfabric.batch.limits import OUTPUT_PURPOSE
from llmfabric.batch.lines import (
    LineServer,
    PrincipalLookup,
    answered,
    body_of,
    error_code,
    not_sent,
    request_body,
    usage_of,
)
from llmfabric.batch.records import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    EXPIRED,
    FAILED,
    FINALIZING,
    IN_PROGRESS,
    VALIDATING,
    BatchRecord,
    FileRecord,
)
from llmfabric.batch.store import BatchStore, output_file_id
from llmfabric.batch.validate import BatchLine, raw_lines, requests_of, validate_input
from llmfabric.clock import Clock
from llmfabric.ingress.errors import Reply
from llmfabric.ingress.protocols import Principal
from llmfabric.untrusted import get_logger, log_due

log = get_logger(__name__)
MAX_RATE_WAIT_S = 60.0  # the longest a rate-limited line sleeps before it is sent again
MIN_RATE_WAIT_S = 1.0  # the shortest (a Retry-After of 0 would send it again at once)
# How long after the runner starts an unknown model (404) is taken for a registry not yet
# filled (a fabric node's replica comes by gossip) and waited out; later it is the answer.
MODEL_GRACE_S = 120.0
# Threads of the runner's own pool (validations, and the bulk steps of a batch's end): not
# the loop's default pool, which the accounts database (key look-ups, the ledger) uses.
RUNNER_THREADS = 2
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _Stop:
    status: str  # the batch's final status
    code: str  # the error of its lines never sent
    message: str
    batch_error: bool = False  # also the batch's `errors` (why it failed)


_CANCEL = _Stop(CANCELLED, "batch_cancelled", "The batch was cancelled before this request "
                "was sent.")
_EXPIRE = _Stop(EXPIRED, "batch_expired", "This request could not be executed before the "
                "completion window expired.")
_FULL = _Stop(FAILED, "batch_output_too_large", "The batch's answers passed this ingress's "
              "limit on one batch's output; this request was not sent (split the batch, or "
              "ask for shorter answers).", batch_error=True)


class BatchRunner:
    def __init__(self, store: BatchStore, serve_line: LineServer, clock: Clock, *,
                 principals: PrincipalLookup | None = None, poll_s: float = 10.0) -> None:
        """`principals`: the key look-up of an ingress with API keys (None: no keys, lines
        run with no principal)."""
        self.store = store
        self.serve_line = serve_line
        self.clock = clock
        self.principals = principals
        self.poll_s = poll_s
        self._slots = asyncio.Semaphore(store.limits.concurrency)  # lines being sent
        self._owners: dict[str, asyncio.Semaphore] = {}  # each owner's lines outstanding
        self.line_errors = 0  # lines failed by the runner itself (a broken key store, a bug)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._batches: dict[str, asyncio.Task[None]] = {}
        self._lines: set[asyncio.Task[None]] = set()
        self._kept: dict[str, int] = {}  # bytes of answers each running batch keeps
        self._stopped: dict[str, _Stop] = {}  # why a batch's waiting line was not sent
        # Set by `wake(batch_id)` (a cancel) for a running batch: its lines waiting out a
        # refusal stop waiting and look whether they may still be sent.
        self._stirred: dict[str, asyncio.Event] = {}
        self._started = clock.now()  # (the grace of an unknown model counts from here)
        # (10 creates on one 96 MiB upload, validated in the default pool, made a call to
        # it wait 5.8 s: every key look-up and ledger write of the ingress behind them)
        self._pool = ThreadPoolExecutor(RUNNER_THREADS, thread_name_prefix="batch-runner")

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="batch-runner")

    def wake(self, batch_id: str = "") -> None:
        """A batch was created or cancelled: look at the active batches now, and end the
        waits of `batch_id`'s lines waiting out a refusal (up to MAX_RATE_WAIT_S: a
        cancelled batch ended only when they woke)."""
        self._wake.set()
        if (stirred := self._stirred.get(batch_id)) is not None:
            stirred.set()

    async def aclose(self) -> None:
        """Stop at once: lines in flight are dropped unanswered (run again after a restart)."""
        tasks = [t for t in (self._task, *self._batches.values(), *self._lines)
                 if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._task = None
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _off(self, fn: Callable[[], _T]) -> _T:
        """`fn` in the runner's own threads."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def _loop(self) -> None:
        while True:
            self.start_active()
            self._wake.clear()
            sleeper = asyncio.ensure_future(self.clock.sleep(self.poll_s))
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({sleeper, woken}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                woken.cancel()

    def start_active(self) -> list[asyncio.Task[None]]:
        """A task for each active batch that has none yet (returns the new ones)."""
        started = []
        for b in self.store.active_batches():
            if b.id not in self._batches:
                task = asyncio.create_task(self._guarded(b.id), name=f"batch-{b.id}")
                self._batches[b.id] = task
                started.append(task)
        return started

    async def _guarded(self, batch_id: str) -> None:
        try:
            await self.run_batch(batch_id)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug or a broken disk: fail this batch, keep the others
            log.exception("batch %s failed in the runner", batch_id)
            self.store.set_status(batch_id, FAILED, self._now(), errors=[{
                "code": "internal_error", "message": "the ingress failed while running "
                "this batch (its log says why)", "param": None, "line": None}])
        finally:
            self._batches.pop(batch_id, None)

    async def run_batch(self, batch_id: str) -> None:
        """Carry one batch from its stored state to its end."""
        b = self.store.get_batch(None, batch_id)
        if b is None or not b.active:
            return
        path = self.store.path_of(b.input_file_id)
        if not path.exists():
            self.store.set_status(b.id, FAILED, self._now(), errors=[{
                "code": "input_file_missing", "message": f"the input file {b.input_file_id} "
                "is gone", "param": "input_file_id", "line": None}])
            return
        if b.in_progress_at is None and b.status in (VALIDATING, CANCELLING):
            limits, endpoint = self.store.limits, b.endpoint
            v = await self._off(lambda: validate_input(raw_lines(path), endpoint, limits))
            if v.errors:
                self.store.set_status(b.id, FAILED, self._now(),
                                      errors=[e.to_json() for e in v.errors])
                return
            current = self.get(batch_id)  # (a cancel may have come while they were read)
            if current.status == CANCELLING:  # (its lines are all written as never sent)
                self.store.set_status(b.id, CANCELLING, current.cancelling_at or self._now(),
                                      total=v.total)
            else:
                self.store.set_status(b.id, IN_PROGRESS, self._now(), total=v.total)
            b = self.get(batch_id)
        if b.status == FINALIZING:  # (a restart cut the finalization short)
            await self._finish(b, None)
            return
        self._kept[b.id] = self.store.kept_bytes(b.id)
        self._stirred[b.id] = asyncio.Event()
        try:
            stop = await self._run_lines(b, path)
        finally:
            self._kept.pop(b.id, None)
            self._stopped.pop(b.id, None)
            self._stirred.pop(b.id, None)
        if stop is not None:  # (up to 50,000 records: parsed and kept in a thread)
            done, endpoint = self.store.done_lines(b.id), b.endpoint
            unsent = ((line.index, not_sent(line.custom_id, stop.code, stop.message))
                      for line in requests_of(path, endpoint, done))
            await self._off(lambda: self.store.record_unsent(b.id, unsent))
        await self._finish(b, stop)

    async def _run_lines(self, b: BatchRecord, path: pathlib.Path) -> _Stop | None:
        """Send every unanswered line; why it stopped early, or None (all answered)."""
        stop: _Stop | None = None
        mine: set[asyncio.Task[None]] = set()
        outstanding = self._owners.setdefault(
            b.owner, asyncio.Semaphore(self.store.limits.concurrency))
        try:
            for line in requests_of(path, b.endpoint, self.store.done_lines(b.id)):
                if (stop := self._stop_of(b)) is not None:
                    break
                await outstanding.acquire()
                if (stop := self._stop_of(b)) is not None:
                    outstanding.release()
                    break
                task = asyncio.create_task(self._line(b, line))
                mine.add(task)
                self._lines.add(task)
                task.add_done_callback(self._line_done)
                task.add_done_callback(lambda _: outstanding.release())
                task.add_done_callback(mine.discard)
            if mine:
                await asyncio.gather(*list(mine))
        finally:
            for t in mine:
                t.cancel()
        # (a line waiting out a refusal when the batch stopped was never sent)
        return stop or self._stopped.pop(b.id, None)

    def get(self, batch_id: str) -> BatchRecord:
        b = self.store.get_batch(None, batch_id)
        if b is None:
            raise LookupError(f"batch {batch_id} is gone from the store")
        return b

    def _line_done(self, task: asyncio.Task[None]) -> None:
        self._lines.discard(task)
        if not task.cancelled() and (e := task.exception()) is not None:
            log.error("a batch line failed in the runner: %r", e)

    def _stop_of(self, b: BatchRecord) -> _Stop | None:
        """Why no further line of `b` may be sent: cancelled, or past its window."""
        current = self.store.get_batch(None, b.id)
        if current is not None and current.status == CANCELLING:
            return _CANCEL
        if self.clock.wall() >= b.expires_at:
            return _EXPIRE
        if self._kept.get(b.id, 0) >= self.store.limits.max_output_bytes:
            return _FULL
        return None

    async def _line(self, b: BatchRecord, line: BatchLine) -> None:
        try:
            await self._send(b, line)
        except Exception as e:  # (a broken key store, a bug): this line's error, not a hole
            self.line_errors += 1
            n = self.line_errors
            if log_due(n):  # (it fails every line of a large batch alike: no log flood)
                log.error("batch %s line %d failed in the runner: %r; %d line(s) so far",
                          b.id, line.index + 1, e, n, exc_info=n == 1)
            self.store.record_result(b.id, line.index, False, not_sent(
                line.custom_id, "internal_error", f"the ingress failed on this request: {e!r}"))

    async def _send(self, b: BatchRecord, line: BatchLine) -> None:
        body = request_body(line.body)
        failures = 0  # the ingress's own transient refusals of this line in a row
        while True:
            principal: Principal | None = None
            if self.principals is not None:  # (again each try: a key revoked while it waits)
                principal = await self.principals(b.key_id)
                if principal is None:
                    self.store.record_result(b.id, line.index, False, not_sent(
                        line.custom_id, "api_key_revoked", f"the API key that created this "
                        f"batch ({b.key_id}) was revoked, has expired or was deleted; its "
                        "requests are no longer sent"))
                    return
            async with self._slots:  # (released while a refused line waits)
                # (a cancel, the window's end or a full output may have come while this
                # line waited for a slot, behind other owners' lines: then it is not sent)
                if (stop := self._stop_of(b)) is not None:
                    self._stopped[b.id] = stop
                    self.store.record_result(b.id, line.index, False,
                                             not_sent(line.custom_id, stop.code, stop.message))
                    return
                reply = await self.serve_line(b.endpoint, body, principal)
            wait = self._retry_wait(reply, failures)
            if wait is None:
                break
            failures += 1
            if (stop := await self._wait_out(b, wait)) is not None:  # (cancelled, expired)
                self._stopped[b.id] = stop
                self.store.record_result(b.id, line.index, False,
                                         not_sent(line.custom_id, stop.code, stop.message))
                return
        body = body_of(reply)
        ok = 200 <= reply.status < 300
        record = answered(line.custom_id, reply, body)
        if self.store.record_result(b.id, line.index, ok, record,
                                    usage_of(body) if ok else None):
            self._kept[b.id] = self._kept.get(b.id, 0) + len(record)

    async def _wait_out(self, b: BatchRecord, seconds: float) -> _Stop | None:
        """Wait `seconds` before a refused line of `b` is sent again, or less when the batch
        is cancelled meanwhile (`wake`) or its window ends first; why the line may no longer
        be sent, or None."""
        seconds = min(seconds, max(0.0, b.expires_at - self.clock.wall()))
        stirred = self._stirred.get(b.id)
        deadline = self.clock.now() + seconds
        while stirred is not None and (left := deadline - self.clock.now()) > 0:
            sleeper = asyncio.ensure_future(self.clock.sleep(left))
            woken = asyncio.ensure_future(stirred.wait())
            try:
                await asyncio.wait({sleeper, woken}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                woken.cancel()
            if sleeper.done() and not sleeper.cancelled():
                break
            if (stop := self._stop_of(b)) is not None:
                return stop
            stirred.clear()  # (woken for nothing; set() released every waiter already)
        if stirred is None:
            await self.clock.sleep(seconds)
        return self._stop_of(b)

    def _retry_wait(self, reply: Reply, failures: int) -> float | None:
        """How long to wait before the line is sent again, or None: the reply is its answer.

        Only the ingress's own refusals (no node answered) are waited out: its rate limit or
        fair queue (429 rate_limit_exceeded, Retry-After, at least 1 s); no candidate node
        (503) or all of them failed (502), as while a model's only node restarts (Retry-After
        if given, else 1, 2, 4 ... 60 s); and, within `MODEL_GRACE_S` of the runner's start,
        an unknown model (404 model_not_found: a fabric node's registry replica is filled by
        gossip after the runner starts). An engine's answer of any status is the line's."""
        if reply.node:
            return None
        code = error_code(reply)
        backoff = min(MAX_RATE_WAIT_S, MIN_RATE_WAIT_S * 2.0 ** min(failures, 6))
        if reply.status == 429 and code == "rate_limit_exceeded":
            backoff = MIN_RATE_WAIT_S
        elif reply.status in (502, 503):
            pass
        elif not (reply.status == 404 and code == "model_not_found"
                  and self.clock.now() - self._started < MODEL_GRACE_S):
            return None
        wait = (reply.headers or {}).get("Retry-After", "")
        given = float(wait) if wait.isascii() and wait.isdigit() else backoff
        return min(MAX_RATE_WAIT_S, max(MIN_RATE_WAIT_S, given))

    async def _finish(self, b: BatchRecord, stop: _Stop | None) -> None:
        if stop is None:
            self.store.set_status(b.id, FINALIZING, self._now())
        out = await self._write_output(b, ok=True)
        err = await self._write_output(b, ok=False)
        more = {"errors": [{"code": stop.code, "message": stop.message, "param": None,
                            "line": None}]} if stop is not None and stop.batch_error else {}
        self.store.set_status(b.id, stop.status if stop is not None else COMPLETED,
                              self._now(), output_file_id=out, error_file_id=err, **more)
        await self._off(lambda: self.store.drop_results(b.id))

    async def _write_output(self, b: BatchRecord, ok: bool) -> str | None:
        """The output (ok) or error file of the batch's kept results; None when empty."""
        kind = "output" if ok else "error"
        file_id = output_file_id(b.id, kind)
        self.store.delete_file(b.owner, file_id)  # (a finalization cut short before)
        final = self.store.path_of(file_id)
        part = final.with_suffix(".part")
        # (gigabytes of answers: read, written and flushed in a thread)
        size, lines = await self._off(lambda: self.store.write_results(b.id, ok, part))
        if lines == 0:
            part.unlink()
            return None
        part.replace(final)
        now = self._now()  # (its expiry is anchored at the file's creation, as OpenAI's)
        expires = now + b.output_expires_after if b.output_expires_after else None
        self.store.add_file(FileRecord(file_id, b.owner, f"{b.id}_{kind}.jsonl",
                                       OUTPUT_PURPOSE, size, now, lines, expires),
                            capped=False)
        return file_id

    def _now(self) -> int:
        return int(self.clock.wall())
