"""The ingress's tenancy gate: what a request reserves (hostile fields ignored), and that a
request's hold and slot are settled exactly once whatever happens."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt

import pytest

from llmfabric.accounts.budgets import Budget, BudgetBook
from llmfabric.accounts.fairqueue import FairQueue
from llmfabric.ingress.usage import Usage
from llmfabric.node.config import ConfigError, build_config
from llmfabric.tenancy.accounts_auth import StaticPrincipal
from llmfabric.tenancy.gate import (
    DEFAULT_COMPLETION_RESERVE,
    NameLookup,
    TenancyGate,
    reservation,
    reservation_parts,
)

pytestmark = pytest.mark.unit

NOON = dt.datetime(2026, 3, 31, 12, 0, tzinfo=dt.UTC).timestamp()
MSG = [{"role": "user", "content": "x" * 400}]


def test_reservation_reads_the_completion_cap_and_ignores_hostile_values() -> None:
    prompt = reservation({"messages": MSG}) - DEFAULT_COMPLETION_RESERVE
    assert prompt > 100
    assert reservation({"messages": MSG, "max_tokens": 10}) == prompt + 10
    assert reservation({"messages": MSG, "max_completion_tokens": 7}) == prompt + 7
    assert reservation({"input": "x" * 400, "max_output_tokens": 9}) == prompt - 4 + 9
    assert reservation({"messages": MSG, "max_tokens": 10, "n": 3}) == prompt + 30
    for bad in (True, -5, 0, None, [1], "ten", "nan"):
        assert reservation({"messages": MSG, "max_tokens": bad}) == (
            prompt + DEFAULT_COMPLETION_RESERVE)
    # what an engine's lax int parsing would read (rounded up), clamped
    assert reservation({"messages": MSG, "max_tokens": "100"}) == prompt + 100
    assert reservation({"messages": MSG, "max_tokens": 1.5}) == prompt + 2
    assert reservation({"messages": MSG, "max_tokens": 2**64}) == prompt + 10**8
    for n in (True, 0, -1, "x", None):
        assert reservation({"messages": MSG, "max_tokens": 10, "n": n}) == prompt + 10
    assert reservation({"messages": MSG, "max_tokens": 10, "n": "2"}) == prompt + 20
    # (n is clamped to 1e8)
    assert reservation({"messages": MSG, "max_tokens": 10, "n": 10**9}) == prompt + 10**9


async def test_hold_and_slot_are_settled_once() -> None:
    book = BudgetBook(lambda: NOON)
    book.set(Budget("owner", "alice", 10_000, "day"))
    queue = FairQueue(1, now=lambda: 0.0)
    refused: list[str] = []
    gate = TenancyGate(book, queue, on_refused=refused.append)
    alice = StaticPrincipal("k1")

    async def request(used: int, fail: bool = False) -> None:
        try:
            assert await gate.admit(alice, {"messages": MSG, "max_tokens": 100}) is None
            assert queue.inflight == 1
            if fail:
                raise RuntimeError("engine died")
            gate.used(Usage(used, 0))
        finally:
            gate.settle()
            gate.settle()  # a second settle changes nothing

    book.set(Budget("owner", "k1", 1000, "day"))
    await request(50)
    with pytest.raises(RuntimeError):
        await request(999, fail=True)
    [row] = [r for r in book.status() if r["name"] == "k1"]
    assert row["spent"] == 50 and row["held"] == 0 and queue.inflight == 0
    # a request refused by its budget holds no slot and nothing
    book.set(Budget("owner", "k1", 60, "day"))  # 50 spent: no room for another
    got = await gate.admit(alice, {"messages": MSG})
    assert got is not None and got.status == 429 and got.code == "insufficient_quota"
    assert int(got.headers["Retry-After"]) == 12 * 3600
    gate.settle()
    assert queue.inflight == 0 and refused == ["budget_exceeded"]


async def test_concurrent_tasks_keep_their_own_state() -> None:
    book = BudgetBook(lambda: NOON)
    book.set(Budget("owner", "k1", 100_000, "day"))
    gate = TenancyGate(book, None)

    async def one(used: int) -> None:
        try:
            await gate.admit(StaticPrincipal("k1"), {"messages": MSG, "max_tokens": 10})
            await asyncio.sleep(0)
            gate.used(Usage(used, 1))
        finally:
            gate.settle()

    await asyncio.gather(*(asyncio.create_task(one(i)) for i in range(1, 21)))
    [row] = book.status()
    assert row["spent"] == sum(range(1, 21)) + 20 and row["held"] == 0


def test_node_config_takes_max_inflight() -> None:
    assert build_config({}, {"max_inflight": 8}).max_inflight == 8
    assert build_config({}, {}).max_inflight is None
    with pytest.raises(ConfigError):
        build_config({}, {"max_inflight": 0})


async def test_a_key_another_ingress_issued_is_held_apart_from_the_ledger() -> None:
    """A remote key (its grant's issuer set) settles its owner's spending apart from the
    ledger journal (the ledger cannot tell its owner; accounts.budgets sync); ours not."""
    from llmfabric.accounts.grants import key_of
    from llmfabric.registry.records import KeyGrant

    book = BudgetBook(lambda: NOON)
    book.ledger_batch = lambda: 1
    book.set(Budget("owner", "alice", 10_000, "day"))
    gate = TenancyGate(book)
    remote = key_of(KeyGrant(id="kr", hash="0" * 64, owner="alice"), "ingress-b")
    local = dataclasses.replace(remote, issuer="")
    for principal, used in ((remote, 30), (local, 5)):
        assert await gate.admit(principal, {"messages": MSG, "max_tokens": 10}) is None
        gate.used(Usage(used, 0))
        gate.settle()
    k = ("owner", "alice", "2026-03-31")
    assert book._unattributed == {k: 30} and book._unwritten == {1: {k: 5}}
    book.adopt_ledger({k: 5}, written=1)  # the local key's 5, written and read back
    assert book.spent == {k: 35}


@pytest.mark.hostile
def test_the_reservation_covers_what_the_engine_will_generate() -> None:
    """The engine's own reading of a request (pydantic's lax ints: "5000", 5000.0; chat's
    max_completion_tokens before max_tokens; any n) bounds what it generates, so the
    reservation must be at least that. Before, each of these reserved 1 or 512 tokens (or
    ignored n > 128) while the engine went on to generate thousands."""
    from llmfabric.engines.protocol import ChatRequest

    for extra in ({"max_tokens": 1, "max_completion_tokens": 5000},
                  {"max_tokens": "5000"}, {"max_completion_tokens": " 5_000 "},
                  {"max_tokens": 5000.0}, {"max_tokens": 10, "n": 500},
                  {"max_tokens": 10, "n": "300"}, {"max_tokens": 10, "n": 3.0}):
        doc = {"model": "m", "messages": MSG, **extra}
        req = ChatRequest.model_validate(doc)
        assert req.limit is not None
        _, completion = reservation_parts(doc)
        assert completion >= req.limit * req.n, extra


@pytest.mark.hostile
async def test_many_requests_asking_max_completion_tokens_cannot_overspend() -> None:
    """20 requests at once, each with max_tokens 1 but max_completion_tokens 5,000 (what the
    engine honours), against a budget of 3 such requests: at most 3 are admitted (before:
    all 20, each holding ~1 token, then charged up to 5,000)."""
    book = BudgetBook(lambda: NOON)
    doc = {"messages": MSG, "max_tokens": 1, "max_completion_tokens": 5000}
    book.set(Budget("key", "k1", 3 * (5000 + reservation({"messages": MSG}) - 512), "day"))
    gate = TenancyGate(book)
    admitted = 0
    for _ in range(20):
        got = await gate.admit(StaticPrincipal("k1"), doc)
        admitted += got is None
    assert admitted == 3


@pytest.mark.hostile
async def test_requests_without_a_cap_reserve_the_context_and_say_so() -> None:
    """No cap field: the engine generates up to the model's context, so that is what is
    reserved (512 before: 20 such requests got past a budget for 3 answers of 8,192).
    Bounded by the largest count a request may claim; capped requests are as before."""
    book = BudgetBook(lambda: NOON)
    seen: list[str] = []

    def lookup(model: str, route: object = None, allowed: object = None) -> NameLookup:
        seen.append(model)
        return NameLookup({"big": 8192, "huge": 2**40}.get(model, 0), ())

    prompt = reservation_parts({"messages": MSG})[0]
    book.set(Budget("key", "k1", 3 * (prompt + 8192), "day"))
    gate = TenancyGate(book, lookup=lookup)
    results = [await gate.admit(StaticPrincipal("k1"), {"model": "big", "messages": MSG})
               for _ in range(20)]
    assert sum(r is None for r in results) == 3
    refused = results[-1]
    assert refused is not None and "set max_tokens" in refused.message
    assert "8192" in refused.message
    assert reservation_parts({"messages": MSG}, context=2**40)[1] == 10**8
    assert reservation_parts({"messages": MSG, "n": 2}, context=8192)[1] == 2 * 8192
    assert reservation_parts({"messages": MSG}, context=0)[1] == DEFAULT_COMPLETION_RESERVE
    assert reservation_parts({"messages": MSG, "max_tokens": 10}, context=8192)[1] == 10
    # a capped request neither looks the context up nor reserves it
    seen.clear()
    gate2 = TenancyGate(BudgetBook(lambda: NOON), lookup=lookup)
    gate2.budgets.set(Budget("key", "k2", 10**6, "day"))  # type: ignore[union-attr]
    assert await gate2.admit(StaticPrincipal("k2"), {"model": "big", "messages": MSG,
                                                     "max_tokens": 5}) is None
    gate2.settle()
    # nor does a request that generates nothing (embeddings: the default, as before)
    assert await gate2.admit(StaticPrincipal("k2"), {"model": "big", "input": "x"},
                             "/v1/embeddings") is None
    assert seen == []
    [row] = gate2.budgets.status()  # type: ignore[union-attr]
    assert row["held"] == 1 + DEFAULT_COMPLETION_RESERVE
    gate2.settle()
    assert await gate2.admit(StaticPrincipal("k2"), {"model": "big", "input": "x"},
                             "/v1/responses") is None
    assert seen == ["big"]
    [row] = gate2.budgets.status()  # type: ignore[union-attr]
    assert row["held"] == 1 + 8192
    gate2.settle()


@pytest.mark.hostile
@pytest.mark.parametrize("text", ["中文的文本" * 200, "日本語のテキスト" * 100, "🎉" * 500,
                                  "表情🎉と文字" * 100])
def test_the_prompt_reservation_does_not_undercount_text_outside_ascii(text: str) -> None:
    """Characters / 4 took 1,000 CJK characters (about 1,000 tokens or more) for 250: 20
    such requests at once got past a budget for 5. The bound counts what is not ASCII as a
    token per two UTF-8 bytes (CJK and emoji: 2 a character), ASCII still at 4 characters."""
    for doc in ({"messages": [{"role": "user", "content": text}]}, {"prompt": text},
                {"input": [text]}):
        prompt, _ = reservation_parts(doc)
        assert prompt >= len(text), doc.keys()
    english = {"messages": [{"role": "user", "content": "x" * 400}]}
    assert reservation_parts(english)[0] == 100 + 4  # (unchanged for ASCII)


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


@pytest.mark.hostile
async def test_media_parts_reserve_tokens_and_their_requests_cannot_overspend() -> None:
    """An image reserved nothing (only texts were walked): 20 requests of 8 images and a
    word each got past a budget for 2. Each image, audio, video or file part of a chat
    message, a Responses input or an Anthropic block now reserves MEDIA_PART_TOKENS; the
    billing estimate (characters / 4, documented) is unchanged."""
    from llmfabric.ingress.usage import MEDIA_PART_TOKENS, estimate_prompt_tokens

    chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                                      *[IMAGE] * 8]}], "max_tokens": 10}
    assert reservation_parts(chat)[0] == 8 * MEDIA_PART_TOKENS + 1 + 4
    assert estimate_prompt_tokens(chat) == 1 + 4
    for part in ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                 {"type": "video_url", "video_url": {"url": "https://x/v.mp4"}},
                 {"type": "file", "file": {"file_data": "AAAA"}}):
        doc = {"messages": [{"role": "user", "content": [part]}]}
        assert reservation_parts(doc)[0] == MEDIA_PART_TOKENS + 4, part["type"]
    responses = {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "x" * 40},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]}
    assert reservation_parts(responses)[0] == MEDIA_PART_TOKENS + 10
    anthropic = {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "data": "AAAA"}}]}]}
    assert reservation_parts(anthropic)[0] == MEDIA_PART_TOKENS + 4

    book = BudgetBook(lambda: NOON)
    book.set(Budget("key", "k1", 2 * (8 * MEDIA_PART_TOKENS + 5 + 10), "day"))
    gate = TenancyGate(book)
    admitted = 0
    for _ in range(20):
        admitted += await gate.admit(StaticPrincipal("k1"), chat) is None
    assert admitted == 2


async def test_a_token_limited_key_holds_its_worst_case_until_it_settles() -> None:
    from llmfabric.accounts import ApiKey, RateLimiter
    from llmfabric.testing.fake_clock import FakeClock

    rate = RateLimiter(FakeClock())
    gate = TenancyGate(rate=rate)
    key = ApiKey(id="k1", name="n", owner="o", admin=False, created_at=0.0,
                 tokens_per_min=1000)
    unlimited = dataclasses.replace(key, id="k2", tokens_per_min=None)
    assert gate.admit_at_once(unlimited) and not gate.admit_at_once(key)
    doc = {"messages": MSG, "max_tokens": 400}
    rate.check(key)
    assert await gate.admit(key, doc) is None
    held = reservation(doc)
    assert rate._tokens["k1"].level == 1000 - held
    gate.used(Usage(5, 6))
    rate.add_tokens("k1", 11)  # (what the usage sink charges)
    gate.settle()
    assert rate._tokens["k1"].level == 1000 - 11
    # three requests at once: all pass the check before the body is read (the bucket is
    # positive); holding 504 each, the first two are admitted (989 -> 485 -> -19)
    for _ in range(3):
        rate.check(key)
    for _ in range(2):
        assert await gate.admit(key, doc) is None
    got = await gate.admit(key, doc)
    assert got is not None and got.status == 429 and got.code == "rate_limit_exceeded"
    assert "1000 tokens/min" in got.message and int(got.headers["Retry-After"]) >= 1


async def test_uncapped_requests_of_a_token_limited_key_are_not_run_one_at_a_time() -> None:
    """The tokens/min hold of a request without a cap field is its prompt plus the default
    completion, not the model's context (which the budget reserves): a 131,072-token hold
    emptied a 100,000 tokens/min bucket, so each such request waited for the last to end."""
    from llmfabric.accounts import ApiKey, RateLimiter
    from llmfabric.testing.fake_clock import FakeClock

    rate = RateLimiter(FakeClock())
    gate = TenancyGate(rate=rate, lookup=lambda model, route, allowed: NameLookup(131_072, ()))
    key = ApiKey(id="k1", name="n", owner="o", admin=False, created_at=0.0,
                 tokens_per_min=100_000)
    doc = {"model": "m", "messages": MSG}
    held = reservation_parts(doc)[0] + DEFAULT_COMPLETION_RESERVE
    admitted = 0
    for _ in range(8):
        rate.check(key)
        got = await asyncio.create_task(_admit(gate, key, doc))
        admitted += got is None
    assert admitted == 8
    assert rate._tokens["k1"].level == 100_000 - 8 * held


async def _admit(gate: TenancyGate, key: object, doc: dict[str, object]) -> object:
    # (its own task: each request's gate state lives in its task's context, unsettled)
    return await gate.admit(key, doc)  # type: ignore[arg-type]


@pytest.mark.hostile
async def test_a_reservation_past_the_budget_says_what_it_reserves() -> None:
    """10,000 tiny image parts reserve 40,960,004 tokens: refused with a 429 that said only
    that the "dayly" budget was "used up" (10 tokens of 1,000,000 spent). It now says what
    the request's prompt reserved and why; so does a prompt past the values the bound reads."""
    from llmfabric.ingress.usage import MAX_PROMPT_VALUES, MEDIA_PART_TOKENS

    book = BudgetBook(lambda: NOON)
    book.set(Budget("key", "k1", 1_000_000, "day"))
    gate = TenancyGate(book)
    small = {"messages": MSG, "max_tokens": 5}
    assert await gate.admit(StaticPrincipal("k1"), small) is None
    gate.used(Usage(5, 5))
    gate.settle()
    images = {"messages": [{"role": "user", "content": [{"type": "image_url"}] * 10_000}],
              "max_tokens": 5}
    got = await gate.admit(StaticPrincipal("k1"), images)
    assert got is not None and got.status == 429 and got.code == "insufficient_quota"
    assert got.message.startswith("the daily token budget")
    assert "10000 image, audio, video or file parts" in got.message
    assert f"{10_000 * MEDIA_PART_TOKENS + 4} tokens" in got.message
    tiny = {"messages": [{"role": "user", "content": [{}] * 10_000}] * 11, "max_tokens": 5}
    got = await gate.admit(StaticPrincipal("k1"), tiny)
    assert got is not None and f"more than {MAX_PROMPT_VALUES} values" in got.message
    got = await gate.admit(StaticPrincipal("k1"), {"messages": MSG, "max_tokens": 10**6})
    assert got is not None and "parts" not in got.message and "values" not in got.message


@pytest.mark.hostile
async def test_a_batch_of_prompts_reserves_each_prompt_s_completions() -> None:
    """A completions `prompt` given as a list of prompts is a batch: the engine (vLLM)
    generates up to the cap, times n, for each of them. The reservation counted one: 20
    requests of 100 prompts with max_tokens 100 got past a budget for 2 (each holding ~230
    tokens, then charged up to 10,000)."""
    batch = {"model": "m", "prompt": ["xxxx"] * 100, "max_tokens": 100}
    prompt, completion = reservation_parts(batch)
    assert completion == 100 * 100
    assert reservation_parts({**batch, "n": 2})[1] == 2 * 100 * 100
    assert reservation_parts({**batch, "prompt": [[1, 2, 3]] * 7})[1] == 7 * 100
    assert reservation_parts({**batch, "prompt": [1, 2, 3]})[1] == 100  # one prompt of ids
    assert reservation_parts({**batch, "prompt": "one"})[1] == 100
    book = BudgetBook(lambda: NOON)
    book.set(Budget("key", "k1", 2 * (prompt + completion), "day"))
    gate = TenancyGate(book)
    admitted = 0
    for _ in range(20):
        admitted += await gate.admit(StaticPrincipal("k1"), batch, "/v1/completions") is None
    assert admitted == 2


async def test_each_listed_name_is_resolved_once_for_its_context_and_its_ids() -> None:
    """A budgeted request without a cap field needs each listed name's context and the
    ids it routes to (its price): one lookup gives both (it was one resolution each)."""
    from llmfabric.accounts.prices import Price

    book = BudgetBook(lambda: NOON)
    book.prices = {"big-id": Price(10.0, 10.0)}
    book.set(Budget("key", "k1", 10**9, "day", unit="usd"))
    seen: list[str] = []

    def lookup(model: str, route: object = None, allowed: object = None) -> NameLookup:
        seen.append(model)
        return NameLookup({"big": 8192}.get(model, 0), {"big": ("big-id",)}.get(model, ()))

    gate = TenancyGate(book, lookup=lookup)
    doc = {"model": "small", "messages": MSG}
    assert await gate.admit(StaticPrincipal("k1"), doc, fallbacks=("big", "gone")) is None
    assert seen == ["small", "big", "gone"]
    prompt = reservation_parts(doc)[0]
    assert book.status()[0]["held"] == (prompt + 8192) * 10  # big's context at big-id's price
    gate.settle()
