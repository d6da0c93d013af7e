"""Model fallbacks (`models`, ingress/request_body.py) against hostile clients and providers:
how many upstream attempts one request can cause, whom a fallback may be sent to, and what
a budget reserves for it. The real core over static candidates and a scripted forwarder
(the helpers of test_model_fallbacks.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from llmfabric.accounts.budgets import Budget, BudgetBook
from llmfabric.accounts.prices import Price
from llmfabric.ingress import StaticCandidateSource
from llmfabric.ingress.errors import UpstreamError
from llmfabric.registry.records import ModelRole
from llmfabric.routing.candidates import Candidate
from llmfabric.tenancy.gate import reservation_parts

from .test_model_fallbacks import (
    CHAT,
    KEY,
    MSG,
    NOON,
    Sink,
    Up,
    ask,
    cand,
    chunk,
    error_of,
    gated,
    ingress,
    served,
)

pytestmark = [pytest.mark.unit, pytest.mark.hostile]

MODELS = ["m0", "m1", "m2", "m3"]  # the primary and the most fallbacks a request may list


def fleet(per_model: int = 5, role: ModelRole = ModelRole.BOTH) -> list[Candidate]:
    return [cand(f"{m}-{i}", m, role=role) for m in MODELS for i in range(per_model)]


async def test_one_request_causes_at_most_max_retries_plus_one_attempts_per_listed_model(
        ) -> None:
    """Guarantee kept: a client listing 4 models whose every node fails (or a hostile
    provider failing every attempt) causes (1 + max_retries) upstream attempts per model,
    12 with the default 2, never more, however many nodes serve them; an engine's 5xx that
    is not retried (501) moves on after one. A stream cut once committed adds only its
    continuation's (1 + max_retries), on the model that committed."""
    def down(c: Candidate, doc: dict[str, Any]) -> Up:
        raise UpstreamError(f"node {c.session_id} refused")

    ing, fwd, _ = ingress(fleet(), down, max_retries=2)
    reply = await ask(ing, {"model": "m0", "models": MODELS[1:]})
    assert error_of(reply)["code"] == "upstream_failed" and len(fwd.sent) == 4 * 3
    assert [d["model"] for _, d in fwd.sent] == [m for m in MODELS for _ in range(3)]

    ing, fwd, _ = ingress(fleet(), lambda c, d: Up(501, b"{}"), max_retries=2)
    reply = await ask(ing, {"model": "m0", "models": MODELS[1:]})
    assert reply is not None and reply.status == 501 and len(fwd.sent) == 4

    # a stream committed on the last model's last attempt, then cut: its continuation adds
    # at most 1 + max_retries more (on that model), 15 in all
    seen: dict[str, int] = {}

    def last_cut(c: Candidate, doc: dict[str, Any]) -> Up:
        n = seen[c.model.id] = seen.get(c.model.id, 0) + 1
        if c.model.id == "m3" and n == 3:
            return Up(stream=(chunk("par"),), cut=True)
        raise UpstreamError(f"node {c.session_id} refused")

    ing, fwd, _ = ingress(fleet(8), last_cut, max_retries=2)
    sink = Sink()
    reply = await ask(ing, {"model": "m0", "models": MODELS[1:]}, stream=True, sink=sink)
    assert reply is None and b"par" in sink.data and b"upstream_failed" in sink.data
    assert seen == {"m0": 3, "m1": 3, "m2": 3, "m3": 6} and len(fwd.sent) == 15


async def test_the_prefill_decode_path_bounds_its_attempts_per_model_too() -> None:
    """Guarantee kept: on the prefill/decode path a model costs at most 3 x (1 + max_retries)
    attempts (prefill, decode, then the colocated path when a decode node refuses the
    handle), 36 for 4 models with the default 2, whatever its nodes answer."""
    handle = orjson.dumps({"id": "p", "choices": [], "kv_transfer_params": {
        "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [1]}})
    seen: dict[str, int] = {}

    def worst(c: Candidate, doc: dict[str, Any]) -> Up:
        """Each phase fails all but its last attempt, then a decode refuses the handle and
        the colocated path fails on every node."""
        n = seen[c.model.id] = seen.get(c.model.id, 0) + 1
        if "kv_transfer_params" not in doc:  # the colocated path
            raise UpstreamError("down")
        if doc["kv_transfer_params"].get("do_remote_decode"):  # a prefill
            if n < 3:
                raise UpstreamError("down")
            return Up(body=handle)
        if n < 6:
            raise UpstreamError("down")
        return Up(400, b'{"error": {"message": "bad handle"}}')

    cands = [*fleet(3, ModelRole.PREFILL), *fleet(3, ModelRole.DECODE)]
    ing, fwd, _ = ingress(cands, worst, max_retries=2)
    reply = await ask(ing, {"model": "m0", "models": MODELS[1:]})
    assert error_of(reply)["code"] == "upstream_failed"
    assert seen == {m: 9 for m in MODELS} and len(fwd.sent) == 36


async def test_no_fallback_reaches_a_provider_outside_the_callers_trust() -> None:
    """Guarantee kept: a member (`evil`) serving every listed name, as its model id or as an
    alias, gets none of a request whose allowlist (header or metadata) names only `q`; nor
    does one serving a name the operator pinned (--model-alias) to another model's id."""
    evil = [cand(f"e{i}", m, "evil", aliases=("m3",)) for i, m in enumerate(MODELS[:3])]
    honest = [cand("q3", "m3", "q"), cand("q9", "small", "q")]
    ing, fwd, _ = ingress([*evil, *honest])
    for how in ({"providers": "q"}, {"meta": {"providers": ["q"]}}):
        fwd.sent.clear()
        doc: dict[str, Any] = {"model": "m0", "models": MODELS[1:]}
        if "meta" in how:
            doc["metadata"] = how["meta"]
        reply = await ask(ing, doc, providers=how.get("providers"))
        assert reply is not None and reply.status == 200 and reply.model == "m3"
        assert fwd.nodes() == ["q3"], how

    pinned, fwd2, _ = ingress([cand("e", "fast", "evil"), cand("s1", "small", "q")],
                              model_aliases=(("fast", "small"),))
    reply = await ask(pinned, {"model": "gone", "models": ["fast"]})
    assert reply is not None and reply.status == 200 and fwd2.nodes() == ["s1"]
    assert fwd2.sent[0][1]["model"] == "small"


async def test_a_served_name_cannot_write_response_headers_on_either_front() -> None:
    """Guarantee kept: the name X-Fabric-Model carries is the list entry a member served,
    and a member may serve any id: CR/LF and non-ASCII in it never reach the wire (both
    fronts, streamed and not)."""
    from aiohttp.test_utils import make_mocked_request

    from llmfabric.front.fast_wire import reply_bytes, response_head
    from llmfabric.front.web_sink import WebSink, web_response

    name = "m\r\nSet-Cookie: a=1\x00é"
    ing, _, _ = ingress([cand("h", name)])
    reply = await ask(ing, {"model": "gone", "models": [name]})
    assert reply is not None and reply.status == 200 and reply.model == name
    wire = reply_bytes({}, reply, True, False)
    assert b"\r\nX-Fabric-Model: mSet-Cookie: a=1\r\n" in wire
    assert wire.count(b"\r\n\r\n") == 1 and b"\nSet-Cookie" not in wire
    head = bytes(response_head(200, "text/event-stream", "h", None, False, name))
    assert head.count(b"\r\n") == 3 and b"\nSet-Cookie" not in head
    assert web_response(reply).headers["X-Fabric-Model"] == "mSet-Cookie: a=1"
    sink = WebSink(make_mocked_request("POST", CHAT))
    await sink.start("text/event-stream", "h", name)
    assert sink.response is not None
    assert sink.response.headers["X-Fabric-Model"] == "mSet-Cookie: a=1"


async def test_an_uncapped_request_reserves_the_context_of_the_replicas_it_may_reach(
        ) -> None:
    """An uncapped request reserved the upper median of every replica's context, whichever
    the caller may reach: with two replicas of `big` at 8,192 and one at 131,072, a client
    restricting itself to the large one (an allowlist naming its provider, or
    `metadata.min_context`) reserved 8,192 and was served by an engine generating up to
    131,072: 20 such requests at once against a budget for 2 were all admitted. The
    reservation now takes the replicas the request's own filters leave, for each listed
    model."""
    cands = [cand("a1", "big", "p", context=8192), cand("a2", "big", "p", context=8192),
             cand("w1", "big", "wide", context=131_072), cand("s1", "small", "p")]
    prompt = reservation_parts({"messages": MSG})[0]
    never = asyncio.Event()

    async def stuck(*_: Any) -> Up:
        nonlocal opened
        opened += 1
        await never.wait()
        raise AssertionError

    for doc, providers in (({"model": "big"}, "wide"),
                           ({"model": "big", "metadata": {"min_context": 100_000}}, None),
                           ({"model": "small", "models": ["big"]}, "wide")):
        book = BudgetBook(lambda: NOON)
        book.set(Budget("key", "k1", 2 * (prompt + 131_072), "day"))
        ing, fwd = gated(cands, book)
        opened = 0
        fwd.open = stuck  # type: ignore[assignment,method-assign]
        tasks = [asyncio.create_task(ask(ing, doc, providers=providers)) for _ in range(20)]
        for _ in range(500):  # (until each is refused or waits on its engine)
            await asyncio.sleep(0.01)
            if opened + sum(t.done() for t in tasks) == 20:
                break
        refused = [t.result() for t in tasks if t.done()]
        assert opened == 2 and len(refused) == 18, (doc, opened)
        assert all(error_of(r)["code"] == "insufficient_quota" for r in refused)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert book.status()[0]["held"] == 0


async def test_a_request_with_fallbacks_is_admitted_once_and_settled_once() -> None:
    """Guarantee kept: a request that moves through 4 models (each failing) holds one
    reservation for all of them, and gives it back once (nothing spent)."""
    book = BudgetBook(lambda: NOON)
    book.set(Budget("key", "k1", 10**6, "day"))

    def down(c: Candidate, doc: dict[str, Any]) -> Up:
        assert book.status()[0]["held"] > 0
        raise UpstreamError("down")

    ing, fwd = gated(fleet(1), book, down)
    body = orjson.dumps({"model": "m0", "models": MODELS[1:], "messages": MSG,
                         "max_tokens": 5})
    reply = await ing.serve(CHAT, True, f"Bearer {KEY}", None, body, Sink())
    assert error_of(reply)["code"] == "upstream_failed" and len(fwd.sent) == 4
    [row] = book.status()
    assert row["held"] == 0 and row["spent"] == 0


class HeldPrimary:
    """The forwarder's engines: the primary ("small") answers 503 (-> the fallbacks), but
    only once `admitted` is set, so every request is admitted first and the registry can
    change under it; any other model answers with `answer(candidate, doc)`."""

    def __init__(self, fwd: Any, answer: Callable[[Candidate, dict[str, Any]], Up]) -> None:
        self.admitted = asyncio.Event()
        self.opened = 0

        async def open_(c: Candidate, path: str, body: bytes, timeouts: Any) -> Up:
            doc = orjson.loads(body)
            fwd.sent.append((c.session_id, doc))
            if c.model.id == "small":
                self.opened += 1
                await self.admitted.wait()
                return Up(503, b"{}")
            return answer(c, doc)

        fwd.open = open_

    async def all_waiting(self, n: int) -> None:
        """Until `n` requests are admitted and wait on the primary's engine."""
        for _ in range(500):
            if self.opened == n:
                return
            await asyncio.sleep(0.01)
        assert self.opened == n


async def test_a_dearer_model_that_comes_up_after_admission_never_serves_the_request(
        ) -> None:
    """A request's names resolve at admission, its spend hold at the dearest model they
    routed to then. A replica of a dearer model coming up under a listed alias afterwards
    (here while the primary's engine answers 503) served the fallback at its price: 20
    requests each holding $1-per-million-tokens' worth spent $100-per-million-tokens' worth,
    past the budget. Now a candidate priced above the hold is skipped: with nothing else
    under the name, the next listed model is tried, or the client gets the 503 of a model
    no node serves (`no_candidates`, Retry-After), saying why; a retry reserves at the
    dearer price and is served."""
    book = BudgetBook(lambda: NOON)
    book.prices = {"small": Price(1.0, 1.0), "mid": Price(1.0, 1.0),
                   "big": Price(100.0, 100.0)}
    prompt, completion = reservation_parts({"messages": MSG, "max_tokens": 100})
    hold = prompt + completion  # micro-USD at $1 per million tokens
    book.set(Budget("key", "k1", 20 * hold, "day", unit="usd"))
    ing, fwd = gated([cand("s1", "small"), cand("m1", "mid", aliases=("fast",))], book)
    src = ing.source
    assert isinstance(src, StaticCandidateSource)
    primary = HeldPrimary(fwd, lambda c, doc: served(doc))  # (5 tokens)
    alone = {"model": "small", "models": ["fast"], "max_tokens": 100}
    then_mid = {"model": "small", "models": ["fast", "mid"], "max_tokens": 100}
    tasks = [asyncio.create_task(ask(ing, alone if i % 2 else then_mid)) for i in range(20)]
    await primary.all_waiting(20)
    assert book.status()[0]["held"] == 20 * hold
    # the registry changes: mid's aliased replica leaves, big comes up under "fast"
    src.replace([cand("s1", "small"), cand("b1", "big", aliases=("fast",)),
                 cand("m2", "mid")])
    primary.admitted.set()
    replies = await asyncio.gather(*tasks)
    assert "b1" not in fwd.nodes()
    row = book.status()[0]
    assert row["held"] == 0 and row["spent"] <= 20 * hold
    for i, reply in enumerate(replies):
        if i % 2:
            err = error_of(reply)
            assert reply is not None and reply.status == 503 and "Retry-After" in reply.headers
            assert err["code"] == "no_candidates"
            assert "model serving it now ('big') costs more" in err["message"]
        else:  # skipped "fast" for the next listed model, within the hold
            assert reply is not None and reply.status == 200 and reply.model == "mid"
    assert ing.metrics.fallbacks[("fast", "mid")] == 10
    # a new request reserves at big's price, and is served by it
    book.set(Budget("key", "k1", 10**9, "day", unit="usd"))
    reply = await ask(ing, alone)
    assert reply is not None and reply.status == 200 and fwd.nodes()[-1] == "b1"
    assert book.status()[0]["spent"] == row["spent"] + 5 * 100


def generating(context: int) -> Any:
    """An engine of `context` tokens answering an uncapped request as vLLM does: up to
    its context less the prompt (3 tokens here), or up to the cap it was sent."""
    def answer(doc: dict[str, Any]) -> Up:
        cap = doc.get("max_completion_tokens") or doc.get("max_tokens") or context - 3
        made = min(cap, context - 3)
        return Up(body=orjson.dumps({
            "id": "c1", "object": "chat.completion", "created": 1, "model": doc["model"],
            "choices": [{"index": 0, "finish_reason": "length",
                         "message": {"role": "assistant", "content": "..."}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": made,
                      "total_tokens": 3 + made}}))
    return answer


async def test_a_larger_context_that_comes_up_after_admission_generates_no_more_than_held(
        ) -> None:
    """A request without a cap field reserves, on a budget, the context its names' replicas
    advertised at admission. A replica of a larger context coming up under a listed alias
    afterwards (here while the primary's engine answered 503) served the fallback uncapped:
    20 requests each holding 4,096 completion tokens generated up to 131,072 each, 30
    times the budget. Now such a replica gets the request with the cap it was held at
    (`max_tokens` and `max_completion_tokens`, as engines read them), and the budget holds;
    replicas whose context is within the hold get the request as the client sent it."""
    book = BudgetBook(lambda: NOON)
    prompt, completion = reservation_parts({"messages": MSG}, context=4096)
    assert completion == 4096
    book.set(Budget("key", "k1", 20 * (prompt + completion), "day"))
    ing, fwd = gated([cand("s1", "small"), cand("m1", "mid", aliases=("fast",))], book)
    src = ing.source
    assert isinstance(src, StaticCandidateSource)
    primary = HeldPrimary(fwd, lambda c, doc: generating(c.model.max_context)(doc))
    tasks = [asyncio.create_task(ask(ing, {"model": "small", "models": ["fast"]}))
             for _ in range(20)]
    await primary.all_waiting(20)
    assert book.status()[0]["held"] == 20 * (prompt + completion)
    # the registry changes: mid's aliased replica leaves, a 131,072-token one comes up
    src.replace([cand("s1", "small"), cand("b1", "big", context=131_072, aliases=("fast",))])
    primary.admitted.set()
    replies = await asyncio.gather(*tasks)
    assert all(r is not None and r.status == 200 and r.model == "fast" for r in replies)
    to_big = [d for sid, d in fwd.sent if sid == "b1"]
    assert len(to_big) == 20
    assert all(d["max_tokens"] == d["max_completion_tokens"] == 4096 for d in to_big)
    assert all("max_tokens" not in d and "max_completion_tokens" not in d
               for sid, d in fwd.sent if sid == "s1")  # (4,096: within the hold)
    row = book.status()[0]
    assert row["held"] == 0 and row["spent"] == 20 * (3 + 4096) <= row["tokens"]
