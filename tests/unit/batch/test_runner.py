"""BatchRunner over a fake `serve` on a FakeClock: lines in bounded concurrency as the
batch's principal (re-checked per line), stream forced off, rate-limited lines retried,
cancel and expiry with partial output, resume after a restart without a line answered
twice, and a finalization cut short redone without doubling the output."""

from __future__ import annotations

import asyncio
import logging
import pathlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from llmfabric.batch.limits import BatchLimits
from llmfabric.batch.records import (
    CANCELLED,
    COMPLETED,
    EXPIRED,
    FAILED,
    FINALIZING,
    IN_PROGRESS,
    VALIDATING,
    BatchRecord,
    FileRecord,
)
from llmfabric.batch.runner import MODEL_GRACE_S, BatchRunner
from llmfabric.batch.store import BatchStore
from llmfabric.ingress.errors import Reply, error_reply
from llmfabric.ingress.protocols import Principal
from llmfabric.testing.fake_clock import FakeClock

pytestmark = pytest.mark.unit
CHAT = "/v1/chat/completions"
DAY = 24 * 3600


@dataclass(frozen=True)
class Key:
    id: str
    record_trace: bool = True


class FakeServe:
    """Answers each line with 200 {"echo": its prompt}, or as `script` says; `hold` keeps
    every call waiting until it is set."""

    def __init__(self, script: Callable[[dict[str, Any]], Reply] | None = None) -> None:
        self.script = script
        self.calls: list[tuple[str, dict[str, Any], Principal | None]] = []
        self.hold: asyncio.Event | None = None
        self.in_flight = self.peak = 0

    async def __call__(self, path: str, body: bytes, principal: Principal | None) -> Reply:
        doc = orjson.loads(body)
        self.calls.append((path, doc, principal))
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if self.hold is not None:
                await self.hold.wait()
            for _ in range(3):  # (a real answer takes a while: others run meanwhile)
                await asyncio.sleep(0)
            if self.script is not None:
                return self.script(doc)
            return Reply(200, orjson.dumps({"echo": doc["messages"][0]["content"]}))
        finally:
            self.in_flight -= 1

    def prompts(self) -> list[str]:
        return [doc["messages"][0]["content"] for _, doc, _ in self.calls]


def request(i: int, **body: Any) -> bytes:
    return orjson.dumps({"custom_id": f"c{i}", "method": "POST", "url": CHAT, "body": {
        "model": "m", "messages": [{"role": "user", "content": f"p{i}"}], **body}})


class Env:
    def __init__(self, tmp: pathlib.Path, concurrency: int = 2) -> None:
        self.clock = FakeClock()
        self.store = BatchStore(tmp, BatchLimits(concurrency=concurrency))
        self.serve = FakeServe()
        self.keys: dict[str, Principal | None] = {"k1": Key("k1")}
        self.lookups = 0
        self.runner = BatchRunner(self.store, self.serve, self.clock, principals=self.lookup)

    async def lookup(self, key_id: str) -> Principal | None:
        self.lookups += 1
        return self.keys.get(key_id)

    def batch(self, data: bytes, status: str = VALIDATING, total: int = 0) -> str:
        f = FileRecord(self.store.new_file_id(), "alice", "in.jsonl", "batch", len(data),
                       1, data.count(b"\n"))
        self.store.path_of(f.id).write_bytes(data)
        self.store.add_file(f)
        now = int(self.clock.wall())
        b = BatchRecord(self.store.new_batch_id(), "alice", "k1", CHAT, f.id, "24h", status,
                        now, now + DAY)
        self.store.add_batch(b)
        if total:
            self.store.set_status(b.id, status, now, total=total)
        return b.id

    def get(self, batch_id: str) -> BatchRecord:
        b = self.store.get_batch("alice", batch_id)
        assert b is not None
        return b

    def lines(self, file_id: str | None) -> list[dict[str, Any]]:
        assert file_id is not None
        return [orjson.loads(x) for x in self.store.path_of(file_id).read_bytes().splitlines()]


def lines_of(n: int, **body: Any) -> bytes:
    return b"".join(request(i, **body) + b"\n" for i in range(n))


async def test_a_batch_runs_to_completed_within_its_concurrency(tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path, concurrency=2)
    bid = env.batch(lines_of(5))
    await env.runner.run_batch(bid)
    b = env.get(bid)
    assert b.status == COMPLETED and (b.total, b.completed, b.failed) == (5, 5, 0)
    assert b.in_progress_at and b.finalizing_at and b.completed_at
    assert env.serve.peak == 2 and env.lookups == 5
    assert {p for _, _, p in env.serve.calls} == {Key("k1")}
    out = env.lines(b.output_file_id)
    assert [r["custom_id"] for r in out] == [f"c{i}" for i in range(5)]  # input order
    assert out[0]["response"]["status_code"] == 200 and out[0]["error"] is None
    assert out[0]["response"]["body"] == {"echo": "p0"}
    assert out[0]["id"].startswith("batch_req_")
    assert b.error_file_id is None
    f = env.store.get_file("alice", b.output_file_id or "")
    assert f is not None and f.purpose == "batch_output" and f.lines == 5
    assert env.store.done_lines(bid) == set()  # (kept results dropped once written)


async def test_a_line_never_streams(tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path)
    await env.runner.run_batch(env.batch(lines_of(1, stream=True,
                                                  stream_options={"include_usage": True})))
    (_, sent, _), = env.serve.calls
    assert "stream" not in sent and "stream_options" not in sent


async def test_bad_input_fails_the_batch_and_sends_nothing(tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path)
    bid = env.batch(request(0) + b"\n{broken\n" + request(0) + b"\n")
    await env.runner.run_batch(bid)
    b = env.get(bid)
    assert b.status == FAILED and env.serve.calls == []
    assert [(e["line"], e["code"]) for e in b.errors] == [
        (2, "invalid_json_line"), (3, "duplicate_custom_id")]
    assert b.to_json()["errors"]["object"] == "list"


async def test_a_revoked_key_fails_the_remaining_lines(tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path, concurrency=1)

    def script(doc: dict[str, Any]) -> Reply:
        if len(env.serve.calls) == 2:
            env.keys["k1"] = None  # revoked while the batch runs
        return Reply(200, b"{}")

    env.serve.script = script
    bid = env.batch(lines_of(5))
    await env.runner.run_batch(bid)
    b = env.get(bid)
    assert b.status == COMPLETED and (b.completed, b.failed) == (2, 3)
    errs = env.lines(b.error_file_id)
    assert [e["custom_id"] for e in errs] == ["c2", "c3", "c4"]
    assert {e["error"]["code"] for e in errs} == {"api_key_revoked"}
    assert all(e["response"] is None for e in errs)


async def test_a_rate_limited_line_waits_its_retry_after(tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path, concurrency=1)
    limited = [True]

    def script(doc: dict[str, Any]) -> Reply:
        if limited.pop() if limited else False:
            return error_reply(429, "slow down", "rate_limit_exceeded",
                               headers={"Retry-After": "5"})
        return Reply(200, b"{}")

    env.serve.script = script
    bid = env.batch(lines_of(1))
    task = asyncio.create_task(env.runner.run_batch(bid))
    for _ in range(100):  # (validation runs in a thread)
        await asyncio.sleep(0.01)
        if env.serve.calls:
            break
    await env.clock.advance(4)
    assert len(env.serve.calls) == 1
    await env.clock.advance(2)
    await task
    assert len(env.serve.calls) == 2 and env.get(bid).completed == 1


async def test_other_errors_are_the_lines_answers(tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path, concurrency=1)
    env.serve.script = lambda doc: error_reply(429, "budget", "insufficient_quota")
    bid = env.batch(lines_of(2))
    await env.runner.run_batch(bid)
    b = env.get(bid)
    assert (b.status, b.completed, b.failed, b.output_file_id) == (COMPLETED, 0, 2, None)
    errs = env.lines(b.error_file_id)
    assert errs[0]["response"]["status_code"] == 429 and errs[0]["error"] is None


async def _in_flight(env: Env, n: int) -> None:
    for _ in range(200):
        await asyncio.sleep(0.01)
        if env.serve.in_flight == n:
            return
    raise AssertionError(f"{env.serve.in_flight} lines in flight, not {n}")


async def test_cancel_stops_new_lines_and_keeps_partial_output(tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path, concurrency=2)
    env.serve.hold = asyncio.Event()
    bid = env.batch(lines_of(6))
    task = asyncio.create_task(env.runner.run_batch(bid))
    await _in_flight(env, 2)
    assert env.store.request_cancel("alice", bid, int(env.clock.wall())) is not None
    env.serve.hold.set()
    await task
    b = env.get(bid)
    assert b.status == CANCELLED and b.cancelling_at and b.cancelled_at
    assert (b.completed, b.failed) == (2, 4) and len(env.serve.calls) == 2
    assert [r["custom_id"] for r in env.lines(b.output_file_id)] == ["c0", "c1"]
    errs = env.lines(b.error_file_id)
    assert {e["error"]["code"] for e in errs} == {"batch_cancelled"} and len(errs) == 4


async def test_expiry_stops_new_lines(tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path, concurrency=1)
    env.serve.hold = asyncio.Event()
    bid = env.batch(lines_of(4))
    task = asyncio.create_task(env.runner.run_batch(bid))
    await _in_flight(env, 1)
    await env.clock.advance(DAY)
    env.serve.hold.set()
    await task
    b = env.get(bid)
    assert b.status == EXPIRED and b.expired_at and (b.completed, b.failed) == (1, 3)
    errs = env.lines(b.error_file_id)
    assert [e["custom_id"] for e in errs] == ["c1", "c2", "c3"]
    assert {e["error"]["code"] for e in errs} == {"batch_expired"}


async def test_a_restart_resumes_with_the_lines_not_yet_answered(
        tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path)
    bid = env.batch(lines_of(4), IN_PROGRESS, total=4)
    for i in (0, 2):  # answered before the restart
        env.store.record_result(bid, i, True, orjson.dumps({"custom_id": f"c{i}", "old": 1}))
    env.store.close()
    env.store = BatchStore(tmp_path, BatchLimits())
    runner = BatchRunner(env.store, env.serve, env.clock, principals=env.lookup)
    assert runner.start_active() != []  # (the loop's pick-up of active batches)
    for _ in range(200):
        await asyncio.sleep(0.01)
        if env.get(bid).status == COMPLETED:
            break
    b = env.get(bid)
    assert b.status == COMPLETED and (b.completed, b.failed) == (4, 0)
    assert env.serve.prompts() == ["p1", "p3"]
    assert [r["custom_id"] for r in env.lines(b.output_file_id)] == ["c0", "c1", "c2", "c3"]
    await runner.aclose()


async def test_a_cut_finalization_is_redone_not_doubled(tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path)
    bid = env.batch(lines_of(2), IN_PROGRESS, total=2)
    for i in range(2):
        env.store.record_result(bid, i, True, orjson.dumps({"custom_id": f"c{i}"}))
    env.store.set_status(bid, FINALIZING, 5)
    await env.runner._write_output(env.get(bid), ok=True)  # written, then the crash
    await env.runner.run_batch(bid)
    b = env.get(bid)
    assert b.status == COMPLETED and env.serve.calls == []
    outputs = env.store.list_files("alice", "batch_output", None, 10)[0]
    assert [f.id for f in outputs] == [b.output_file_id]
    assert len(env.lines(b.output_file_id)) == 2


async def test_a_missing_input_file_fails_the_batch(tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path)
    bid = env.batch(lines_of(1))
    env.store.path_of(env.get(bid).input_file_id).unlink()
    await env.runner.run_batch(bid)
    b = env.get(bid)
    assert b.status == FAILED and b.errors[0]["code"] == "input_file_missing"


async def test_the_loop_runs_new_batches_and_a_crash_fails_only_that_batch(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = Env(tmp_path)
    env.runner.start()
    good = env.batch(lines_of(2))
    env.runner.wake()  # (what a create does)
    await _until(lambda: env.get(good).status == COMPLETED)
    run = env.runner.run_batch

    async def crashing(batch_id: str) -> None:
        if batch_id == broken:
            raise OSError("disk gone")
        await run(batch_id)

    monkeypatch.setattr(env.runner, "run_batch", crashing)
    broken = env.batch(lines_of(1))
    other = env.batch(lines_of(1))
    env.runner.wake()
    await _until(lambda: not env.get(broken).active and not env.get(other).active)
    assert env.get(broken).status == FAILED
    assert env.get(broken).errors[0]["code"] == "internal_error"
    assert env.get(other).status == COMPLETED
    await env.runner.aclose()


async def test_a_failing_key_check_is_that_lines_error(tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path, concurrency=1)

    async def broken_lookup(key_id: str) -> Principal | None:
        raise ConnectionError("accounts database unreachable")

    env.runner.principals = broken_lookup
    bid = env.batch(lines_of(2))
    await env.runner.run_batch(bid)
    b = env.get(bid)
    assert (b.status, b.failed) == (COMPLETED, 2)
    assert {e["error"]["code"] for e in env.lines(b.error_file_id)} == {"internal_error"}


async def test_a_key_check_failing_on_every_line_logs_a_few_lines_not_one_per_line(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    env = Env(tmp_path, concurrency=1)

    async def broken_lookup(key_id: str) -> Principal | None:
        raise ConnectionError("accounts database unreachable")

    env.runner.principals = broken_lookup
    bid = env.batch(lines_of(5))
    with caplog.at_level(logging.ERROR, logger="llmfabric.batch.runner"):
        await env.runner.run_batch(bid)
    b = env.get(bid)
    assert (b.status, b.failed) == (COMPLETED, 5) and env.runner.line_errors == 5
    logged = [r for r in caplog.records if "failed in the runner" in r.getMessage()]
    assert len(logged) == 3  # the 1st, 2nd and 4th line
    assert f"batch {bid} line 1" in logged[0].getMessage()
    assert "ConnectionError('accounts database unreachable')" in logged[0].getMessage()
    assert logged[0].exc_info and not logged[1].exc_info


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(300):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not in time")


async def test_a_batch_cancelled_before_it_was_validated_sends_nothing(
        tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path)
    bid = env.batch(lines_of(3))
    env.store.request_cancel("alice", bid, 7)  # (before the runner got to it)
    await env.runner.run_batch(bid)
    b = env.get(bid)
    assert (b.status, b.total, b.completed, b.failed) == (CANCELLED, 3, 0, 3)
    assert env.serve.calls == [] and b.cancelling_at == 7 and b.in_progress_at is None
    assert {e["error"]["code"] for e in env.lines(b.error_file_id)} == {"batch_cancelled"}


async def test_a_cancel_while_the_lines_are_validated_is_kept(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = Env(tmp_path)
    bid = env.batch(lines_of(2))

    async def validating(fn: Callable[[], Any]) -> Any:
        env.store.request_cancel("alice", bid, 9)  # (the HTTP route, meanwhile)
        return fn()  # (the runner's later steps in threads take the same path)

    monkeypatch.setattr(env.runner, "_off", validating)
    await env.runner.run_batch(bid)
    b = env.get(bid)
    assert (b.status, b.total, b.failed) == (CANCELLED, 2, 2) and env.serve.calls == []


async def _sent(env: Env, n: int) -> None:
    for _ in range(200):
        await env.clock.settle()
        await asyncio.sleep(0.01)
        if len(env.serve.calls) >= n:
            return
    raise AssertionError(f"{len(env.serve.calls)} sends, not {n}")


def _refusals(env: Env, *replies: Reply) -> None:
    """The ingress answers the first sends with `replies`, then 200."""
    queue = list(replies)
    env.serve.script = lambda doc: queue.pop(0) if queue else Reply(200, b"{}")


async def test_no_candidates_or_all_failed_are_waited_out(tmp_path: pathlib.Path) -> None:
    # A model's only node restarting: the ingress's own 503 (Retry-After) and 502 (none:
    # 2 s, then 4 s) were the line's final answer, so every remaining line failed.
    env = Env(tmp_path, concurrency=1)
    _refusals(env, error_reply(503, "none", "no_candidates", headers={"Retry-After": "7"}),
              error_reply(502, "all failed", "upstream_failed"),
              error_reply(502, "all failed", "upstream_failed"))
    bid = env.batch(lines_of(1))
    task = asyncio.create_task(env.runner.run_batch(bid))
    await _sent(env, 1)
    await env.clock.advance(6.5)
    assert len(env.serve.calls) == 1
    await env.clock.advance(1)  # t 7.5: sent again, 502: 2 s (its second refusal)
    await _sent(env, 2)
    await env.clock.advance(1)
    assert len(env.serve.calls) == 2
    await env.clock.advance(1.5)  # t 10: sent again, 502: 4 s
    await _sent(env, 3)
    await env.clock.advance(2.5)
    assert len(env.serve.calls) == 3
    await env.clock.advance(2)  # t 14.5
    await task
    b = env.get(bid)
    assert len(env.serve.calls) == 4 and (b.completed, b.failed) == (1, 0)


async def test_an_engine_s_503_is_the_line_s_answer(tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path, concurrency=1)
    r = error_reply(503, "busy", "engine_busy")
    env.serve.script = lambda doc: Reply(r.status, r.body, node="n1")
    bid = env.batch(lines_of(1))
    await asyncio.wait_for(env.runner.run_batch(bid), 5)
    assert env.get(bid).failed == 1 and len(env.serve.calls) == 1


async def test_an_unknown_model_is_waited_out_only_just_after_the_start(
        tmp_path: pathlib.Path) -> None:
    # A fabric node's runner starts before gossip fills its registry: a resumed batch was
    # written off as 404. Later a 404 is the answer (a typo'd model fails fast).
    env = Env(tmp_path, concurrency=1)
    unknown = error_reply(404, "no such model", "model_not_found", "model")
    _refusals(env, unknown)
    bid = env.batch(lines_of(1))
    task = asyncio.create_task(env.runner.run_batch(bid))
    await _sent(env, 1)
    await env.clock.advance(1)
    await task
    assert len(env.serve.calls) == 2 and env.get(bid).completed == 1
    await env.clock.advance(MODEL_GRACE_S)
    env.serve.script = lambda doc: unknown
    bid = env.batch(lines_of(1))
    await asyncio.wait_for(env.runner.run_batch(bid), 5)
    assert len(env.serve.calls) == 3 and env.get(bid).failed == 1


async def test_a_key_revoked_while_its_line_waits_is_not_used(tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path, concurrency=1)
    _refusals(env, error_reply(503, "none", "no_candidates"))
    bid = env.batch(lines_of(1))
    task = asyncio.create_task(env.runner.run_batch(bid))
    await _sent(env, 1)
    env.keys["k1"] = None
    await env.clock.advance(1)
    await task
    b = env.get(bid)
    assert len(env.serve.calls) == 1 and b.failed == 1
    assert env.lines(b.error_file_id)[0]["error"]["code"] == "api_key_revoked"


async def test_a_line_waiting_when_the_batch_is_cancelled_is_not_sent_again(
        tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path, concurrency=1)
    _refusals(env, error_reply(503, "none", "no_candidates", headers={"Retry-After": "30"}))
    bid = env.batch(lines_of(1))
    task = asyncio.create_task(env.runner.run_batch(bid))
    await _sent(env, 1)
    assert env.store.request_cancel("alice", bid, int(env.clock.wall())) is not None
    await env.clock.advance(30)
    await task
    b = env.get(bid)
    assert b.status == CANCELLED and len(env.serve.calls) == 1
    assert env.lines(b.error_file_id)[0]["error"]["code"] == "batch_cancelled"


async def test_a_batch_s_usage_sums_its_lines_answered_successfully(
        tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path, concurrency=2)
    answers = {
        "p0": Reply(200, orjson.dumps({"usage": {
            "prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
            "prompt_tokens_details": {"cached_tokens": 4},
            "completion_tokens_details": {"reasoning_tokens": 2}}})),
        "p1": Reply(200, orjson.dumps({"usage": {"prompt_tokens": 7, "completion_tokens": 1}})),
        "p2": Reply(200, b"{}"),  # (no usage)
        "p3": Reply(200, b"not json"),
        "p4": Reply(200, orjson.dumps({"usage": {"prompt_tokens": -9, "completion_tokens": "x"}})),
        # (an error's tokens are not the batch's: OpenAI sums the lines that succeeded)
        "p5": Reply(400, orjson.dumps({"error": {"code": "bad"},
                                       "usage": {"prompt_tokens": 100}}), node="n1"),
    }
    env.serve.script = lambda doc: answers[doc["messages"][0]["content"]]
    bid = env.batch(lines_of(6))
    await env.runner.run_batch(bid)
    b = env.get(bid)
    assert (b.status, b.completed, b.failed) == (COMPLETED, 5, 1)
    want = {"input_tokens": 17, "input_tokens_details": {"cached_tokens": 4},
            "output_tokens": 6, "output_tokens_details": {"reasoning_tokens": 2},
            "total_tokens": 23}
    assert b.to_json()["usage"] == want
    env.store.close()
    reopened = BatchStore(tmp_path, BatchLimits())  # (a restarted ingress)
    got = reopened.get_batch("alice", bid)
    assert got is not None and got.to_json()["usage"] == want
    reopened.close()


async def test_a_cancel_ends_the_wait_of_a_line_waiting_out_a_refusal(
        tmp_path: pathlib.Path) -> None:
    # A line waiting out a Retry-After (up to 60 s) slept through a cancel: the batch stayed
    # cancelling that long. The cancel's wake ends the wait; no time passes on the clock.
    env = Env(tmp_path, concurrency=2)
    env.serve.script = lambda doc: error_reply(503, "none", "no_candidates",
                                               headers={"Retry-After": "60"})
    bid = env.batch(lines_of(3))
    task = asyncio.create_task(env.runner.run_batch(bid))
    await _sent(env, 2)
    assert env.store.request_cancel("alice", bid, int(env.clock.wall())) is not None
    env.runner.wake(bid)  # (what the cancel route does)
    await asyncio.wait_for(task, 5)
    b = env.get(bid)
    assert b.status == CANCELLED and env.clock.now() == 0 and len(env.serve.calls) == 2
    assert (b.completed, b.failed) == (0, 3)
    errs = env.lines(b.error_file_id)
    assert [e["error"]["code"] for e in errs] == ["batch_cancelled"] * 3


async def test_a_wake_that_is_no_cancel_leaves_the_wait_as_it_was(
        tmp_path: pathlib.Path) -> None:
    env = Env(tmp_path, concurrency=1)
    _refusals(env, error_reply(503, "none", "no_candidates", headers={"Retry-After": "20"}))
    bid = env.batch(lines_of(1))
    task = asyncio.create_task(env.runner.run_batch(bid))
    await _sent(env, 1)
    await env.clock.advance(5)
    env.runner.wake(bid)  # (woken for nothing: the batch still runs)
    await env.clock.advance(14)
    assert len(env.serve.calls) == 1 and not task.done()
    await env.clock.advance(1)  # t 20: sent again
    await asyncio.wait_for(task, 5)
    assert len(env.serve.calls) == 2 and env.get(bid).completed == 1


async def test_a_line_waiting_for_a_slot_when_its_batch_is_cancelled_is_not_sent(
        tmp_path: pathlib.Path) -> None:
    # Two owners share the ingress's slots: bob's lines wait for a slot behind alice's
    # lines in flight. A cancel of bob's batch meanwhile: his lines were sent anyway once
    # alice's finished.
    env = Env(tmp_path, concurrency=2)
    env.serve.hold = asyncio.Event()
    first = env.batch(lines_of(2))
    data = lines_of(2)
    f = FileRecord(env.store.new_file_id(), "bob", "in.jsonl", "batch", len(data), 1, 2)
    env.store.path_of(f.id).write_bytes(data)
    env.store.add_file(f)
    now = int(env.clock.wall())
    second = BatchRecord(env.store.new_batch_id(), "bob", "k1", CHAT, f.id, "24h",
                         VALIDATING, now, now + DAY)
    env.store.add_batch(second)
    alice = asyncio.create_task(env.runner.run_batch(first))
    await _in_flight(env, 2)
    bob = asyncio.create_task(env.runner.run_batch(second.id))
    await _until(lambda: len(env.runner._lines) == 4)  # (bob's lines queued for a slot)
    assert len(env.serve.calls) == 2
    assert env.store.request_cancel("bob", second.id, int(env.clock.wall())) is not None
    env.serve.hold.set()
    await asyncio.wait_for(asyncio.gather(alice, bob), 5)
    assert env.get(first).completed == 2 and len(env.serve.calls) == 2
    b = env.store.get_batch("bob", second.id)
    assert b is not None and b.status == CANCELLED and (b.completed, b.failed) == (0, 2)
    errs = env.lines(b.error_file_id)
    assert [e["error"]["code"] for e in errs] == ["batch_cancelled"] * 2
    assert env.runner._stopped == {}  # (why each batch stopped is not kept past its end)


async def test_a_line_waiting_out_a_refusal_ends_with_the_window(
        tmp_path: pathlib.Path) -> None:
    # A Retry-After of 60 s ten seconds before the 24 h window ends: the batch stayed
    # in progress 50 s past its window (and then expired anyway).
    env = Env(tmp_path, concurrency=1)
    env.serve.script = lambda doc: error_reply(503, "none", "no_candidates",
                                               headers={"Retry-After": "60"})
    bid = env.batch(lines_of(1))
    await env.clock.advance(DAY - 10)
    task = asyncio.create_task(env.runner.run_batch(bid))
    await _sent(env, 1)
    await env.clock.advance(10)
    await asyncio.wait_for(task, 5)
    b = env.get(bid)
    assert b.status == EXPIRED and len(env.serve.calls) == 1
    assert env.lines(b.error_file_id)[0]["error"]["code"] == "batch_expired"
