"""BatchRunner against hostile key holders: an owner whose key is rate limited (its lines
wait their Retry-After) must not take the runner's shared slots from other owners' batches,
and the end of a large batch (cancelled: every unsent line written as never sent; finished:
its output file) must not block the event loop for seconds."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import time
from typing import Any

import orjson
import pytest

from llmfabric.batch.limits import BatchLimits
from llmfabric.batch.records import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    VALIDATING,
    BatchRecord,
    FileRecord,
)
from llmfabric.batch.runner import BatchRunner
from llmfabric.batch.store import BatchStore
from llmfabric.ingress.errors import Reply, error_reply
from llmfabric.ingress.protocols import Principal
from llmfabric.testing.fake_clock import FakeClock

pytestmark = [pytest.mark.unit, pytest.mark.hostile]
CHAT = "/v1/chat/completions"
DAY = 24 * 3600


class Key:
    def __init__(self, key_id: str) -> None:
        self.id = key_id
        self.record_trace = True


def lines_of(n: int, prompt: str = "p") -> bytes:
    return b"".join(orjson.dumps({"custom_id": f"c{i}", "method": "POST", "url": CHAT,
                                  "body": {"model": "m", "messages": [
                                      {"role": "user", "content": prompt}]}}) + b"\n"
                    for i in range(n))


def add_batch(store: BatchStore, clock: FakeClock, owner: str, data: bytes,
              status: str = VALIDATING) -> str:
    f = FileRecord(store.new_file_id(), owner, "in.jsonl", "batch", len(data), 1,
                   data.count(b"\n"))
    store.path_of(f.id).write_bytes(data)
    store.add_file(f)
    now = int(clock.wall())
    b = BatchRecord(store.new_batch_id(), owner, f"key-{owner}", CHAT, f.id, "24h", status,
                    now, now + DAY)
    store.add_batch(b)
    return b.id


async def test_a_rate_limited_owner_does_not_hold_the_slots_of_other_owners(
        tmp_path: pathlib.Path) -> None:
    # Mallory's key allows ~1 request a minute: every line of her 200-line batch is refused
    # with Retry-After 60. Alice's 20 lines must still run at once (the clock never moves:
    # a slot held through a rate-limit wait would never come back).
    clock = FakeClock()
    store = BatchStore(tmp_path, BatchLimits(concurrency=4))
    calls: dict[str, int] = {"key-mallory": 0, "key-alice": 0}

    async def serve(path: str, body: bytes, principal: Principal | None) -> Reply:
        assert principal is not None
        calls[principal.id] += 1
        for _ in range(3):
            await asyncio.sleep(0)
        if principal.id == "key-mallory":
            return error_reply(429, "rate limit exceeded for this key; retry after 60 s",
                               "rate_limit_exceeded", headers={"Retry-After": "60"})
        return Reply(200, b"{}")

    async def principals(key_id: str) -> Principal | None:
        return Key(key_id)  # type: ignore[return-value]

    runner = BatchRunner(store, serve, clock, principals=principals)
    mallory = add_batch(store, clock, "mallory", lines_of(200))
    alice = add_batch(store, clock, "alice", lines_of(20))
    slow = asyncio.create_task(runner.run_batch(mallory))
    for _ in range(50):  # (validation runs in a thread)
        await asyncio.sleep(0.01)
    try:
        await asyncio.wait_for(runner.run_batch(alice), 10)
        b = store.get_batch("alice", alice)
        assert b is not None and b.status == COMPLETED and b.completed == 20
        # and Mallory's waiting lines are bounded (not one sleeping task per line)
        assert calls["key-mallory"] <= 4, calls
    finally:
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        store.close()


async def _max_gap(work: Any) -> tuple[float, Any]:
    """The longest the event loop did not run a 5 ms ticker while `work` ran."""
    gaps: list[float] = []
    loop = asyncio.get_running_loop()

    async def tick() -> None:
        last = loop.time()
        while True:
            await asyncio.sleep(0.005)
            now = loop.time()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.02)
    try:
        got = await work
        await asyncio.sleep(0.05)
    finally:
        ticker.cancel()
    return max(gaps), got


async def test_cancelling_a_50000_line_batch_does_not_block_the_loop(
        tmp_path: pathlib.Path) -> None:
    # Cancelled before any line was sent: all 50,000 lines are written as never sent and the
    # error file built (3.0 s with the loop blocked, measured before the fix).
    clock = FakeClock()
    store = BatchStore(tmp_path, BatchLimits())

    async def serve(path: str, body: bytes, principal: Principal | None) -> Reply:
        raise AssertionError("a cancelled batch sends nothing")

    runner = BatchRunner(store, serve, clock)
    bid = add_batch(store, clock, "", lines_of(50_000), status=CANCELLING)
    t0 = time.perf_counter()
    gap, _ = await _max_gap(runner.run_batch(bid))
    took = time.perf_counter() - t0
    b = store.get_batch("", bid)
    assert b is not None and b.status == CANCELLED and b.failed == 50_000
    store.close()
    assert gap < 0.5, f"the loop was blocked {gap:.2f} s (the whole cancel took {took:.2f} s)"


async def test_writing_a_large_output_file_does_not_block_the_loop(
        tmp_path: pathlib.Path) -> None:
    # 4,000 answers of 50 KB (200 MB of output): writing, flushing and dropping the kept
    # answers blocked the loop 1.7 s before the fix.
    clock = FakeClock()
    store = BatchStore(tmp_path, BatchLimits(concurrency=64))
    answer = orjson.dumps({"choices": [{"message": {"content": "y" * 50_000}}]})

    async def serve(path: str, body: bytes, principal: Principal | None) -> Reply:
        return Reply(200, answer)

    runner = BatchRunner(store, serve, clock)
    bid = add_batch(store, clock, "", lines_of(4_000))
    await runner.run_batch(bid)  # (lines, then the output: measured below on a rerun)
    b = store.get_batch("", bid)
    assert b is not None and b.status == COMPLETED and b.output_file_id is not None
    # The finalization again, as after a restart that cut it short: the answers are kept.
    for i in range(4_000):
        store.record_result(bid, i, True, answer)
    store.set_status(bid, "finalizing", int(clock.wall()))
    gap, _ = await _max_gap(runner.run_batch(bid))
    b = store.get_batch("", bid)
    assert b is not None and b.status == COMPLETED
    size = store.path_of(b.output_file_id or "").stat().st_size
    store.close()
    assert size > 200_000_000
    assert gap < 0.5, f"the loop was blocked {gap:.2f} s"


async def test_a_batch_s_answers_are_bounded(tmp_path: pathlib.Path) -> None:
    # Each line asks for a huge completion: the answers a batch keeps (then its output file)
    # grew without bound, counted against no cap (50,000 answers of 128 KB: 6.4 GB, twice:
    # in SQLite, then the file). Past `max_output_bytes` no further line is sent; the lines
    # not sent are in the error file and the batch fails saying why, with its answers.
    clock = FakeClock()
    store = BatchStore(tmp_path, BatchLimits(concurrency=2, max_output_bytes=100_000))
    answer = orjson.dumps({"choices": [{"message": {"content": "y" * 10_000}}]})
    sent = 0

    async def serve(path: str, body: bytes, principal: Principal | None) -> Reply:
        nonlocal sent
        sent += 1
        await asyncio.sleep(0)
        return Reply(200, answer)

    runner = BatchRunner(store, serve, clock)
    bid = add_batch(store, clock, "", lines_of(500))
    await runner.run_batch(bid)
    b = store.get_batch("", bid)
    assert b is not None and b.status == "failed", b
    assert sent <= 12, sent
    assert (b.completed, b.failed, b.total) == (sent, 500 - sent, 500)
    assert [e["code"] for e in b.errors] == ["batch_output_too_large"]
    assert b.output_file_id is not None and b.error_file_id is not None
    assert store.path_of(b.output_file_id).stat().st_size <= 100_000 + 2 * 10_200
    errs = store.path_of(b.error_file_id).read_bytes().splitlines()
    assert {orjson.loads(e)["error"]["code"] for e in errs} == {"batch_output_too_large"}
    store.close()


@pytest.mark.parametrize("node", ["", "nEngine"])
async def test_a_429_without_a_real_wait_does_not_spin(tmp_path: pathlib.Path,
                                                       node: str) -> None:
    # A 429 rate_limit_exceeded with Retry-After 0 was sent again at once: 62,746 sends of
    # one line in 2 s. An engine's (a provider's) 429 of that code, which reaches the runner
    # without headers, was retried every second for the batch's 24 hours. Only the ingress's
    # own refusal (no node) is waited out, at least 1 s; an engine's is the line's answer.
    clock = FakeClock()
    store = BatchStore(tmp_path, BatchLimits(concurrency=1))
    sends = 0

    async def serve(path: str, body: bytes, principal: Principal | None) -> Reply:
        nonlocal sends
        sends += 1
        r = error_reply(429, "slow down", "rate_limit_exceeded",
                        headers={"Retry-After": "0"} if not node else None)
        return Reply(r.status, r.body, node=node, headers=r.headers)

    runner = BatchRunner(store, serve, clock)
    bid = add_batch(store, clock, "", lines_of(1))
    task = asyncio.create_task(runner.run_batch(bid))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if sends:
            break
    try:
        if node:
            await asyncio.wait_for(task, 5)
            b = store.get_batch("", bid)
            assert b is not None and b.status == COMPLETED and b.failed == 1
        else:
            await asyncio.sleep(0.1)
            # (a wait of 0 fires again and again within one advance: bounded here)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(clock.advance(0.5), 2)
            assert sends == 1, sends
            await asyncio.wait_for(clock.advance(0.5), 2)
            assert sends == 2, sends
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        store.close()


async def test_a_body_nested_too_deep_to_send_fails_at_validation(
        tmp_path: pathlib.Path) -> None:
    # A line whose body nests 300 levels parses (orjson reads 1,024) but cannot be sent
    # again (orjson writes 254): it passed validation, then every such line was an
    # `internal_error` ("the ingress failed"), counted and logged as the runner's own bug.
    from tests.unit.batch.test_runner import Env, request

    env = Env(tmp_path)
    deep = request(1)[:-2] + b', "tools": ' + b"[" * 300 + b"]" * 300 + b"}}"
    bid = env.batch(request(0) + b"\n" + deep + b"\n")
    await env.runner.run_batch(bid)
    b = env.get(bid)
    assert b.status == "failed" and env.serve.calls == [] and env.runner.line_errors == 0
    assert [(e["line"], e["code"], e["param"]) for e in b.errors] == [
        (2, "invalid_request", "body")]


async def test_a_provider_answer_nested_too_deep_is_kept_as_text(
        tmp_path: pathlib.Path) -> None:
    # A provider's 200 answer nesting 300 levels parsed, then could not be written into
    # the line's record: the answer was lost, the line an `internal_error` of the ingress.
    from tests.unit.batch.test_runner import Env, lines_of

    env = Env(tmp_path)
    deep = b'{"usage": {"prompt_tokens": 3}, "x": ' + b"[" * 300 + b"]" * 300 + b"}"
    env.serve.script = lambda doc: Reply(200, deep, node="n1")
    bid = env.batch(lines_of(1))
    await env.runner.run_batch(bid)
    b = env.get(bid)
    assert env.runner.line_errors == 0 and (b.completed, b.failed) == (1, 0)
    rec, = env.lines(b.output_file_id)
    assert rec["response"]["status_code"] == 200 and rec["response"]["body"] == deep.decode()
    assert b.usage.input_tokens == 3


async def test_validations_do_not_take_the_loop_s_default_threads(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An owner's batch creates were each validated in the event loop's default thread
    # pool, which the accounts database (key look-ups, the ledger) runs in too: 10 creates
    # on one 96 MiB upload made a call to that pool wait 5.8 s (2 cores: 6 threads), and
    # creating again after each failed validation kept it so. Here the pool has 2 threads
    # and the validations of 4 batches hold theirs until released.
    import concurrent.futures
    import threading

    from tests.unit.batch.test_runner import Env, lines_of

    import llmfabric.batch.runner as runner_mod

    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(2))
    release, entered = threading.Event(), []
    real = runner_mod.validate_input

    def held(*args: Any) -> Any:
        entered.append(1)
        release.wait(10)
        return real(*args)

    monkeypatch.setattr(runner_mod, "validate_input", held)
    env = Env(tmp_path)
    tasks = [asyncio.create_task(env.runner.run_batch(env.batch(lines_of(1))))
             for _ in range(4)]
    try:
        for _ in range(200):
            if len(entered) >= 1:
                break
            await asyncio.sleep(0.01)
        assert await asyncio.wait_for(asyncio.to_thread(lambda: 1), 2.0) == 1
    finally:
        release.set()
        await asyncio.gather(*tasks)
        await env.runner.aclose()
    assert len(entered) == 4
