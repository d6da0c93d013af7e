"""An uncapped request's completion hold (tenancy/gate.py `HeldCompletion`): a
replica whose context is larger than what the request held on its budget gets the request
capped at the hold, on every path that reaches an engine (the colocated attempts, a stream's
continuation, the prefill/decode path's decode), in each API's cap fields; a replica whose
context is within the hold, a request with a cap field and one without a budget are sent as
the client wrote them. The real core over static candidates and a scripted forwarder (the
helpers of test_model_fallbacks.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from llmfabric.accounts.budgets import Budget, BudgetBook
from llmfabric.apis.api_routes import ApiRoutes
from llmfabric.ingress.app import Ingress
from llmfabric.registry.records import ModelRole
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.request import RouteRequest
from llmfabric.tenancy.gate import (
    HeldCompletion,
    NameLookup,
    TenancyGate,
    reservation_parts,
)

from .test_model_fallbacks import (
    KEY,
    MSG,
    NOON,
    Scripted,
    Sink,
    Up,
    ask,
    cand,
    chunk,
    ingress,
    served,
)

pytestmark = pytest.mark.unit

HELD = 8192  # the context the request's model advertised at admission
BIG = 131_072  # the context of the replica that serves it
CAPS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def at_admission(model: str, route: RouteRequest | None,
                 allowed: frozenset[str] | None) -> NameLookup:
    """The gate's lookup as the replicas were at admission: `HELD` tokens of context."""
    return NameLookup(HELD, (model,))


def budgeted(cands: list[Candidate], script: Any = None, budget_for: str = "k1",
             **config: Any) -> tuple[Ingress, Scripted, BudgetBook]:
    ing, fwd, _ = ingress(cands, script, **config)
    book = BudgetBook(lambda: NOON)
    book.set(Budget("key", budget_for, 10**9, "day"))
    ing.use_gate(TenancyGate(book, lookup=at_admission))
    return ing, fwd, book


def caps(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: doc[k] for k in CAPS if k in doc}


def test_a_replica_is_capped_only_when_its_context_is_above_the_hold() -> None:
    held = HeldCompletion(HELD, 100 + HELD, ("max_tokens", "max_completion_tokens"))
    assert not held.binds(cand("a", "big", context=100 + HELD))  # (prompt and completion fit)
    assert held.binds(cand("b", "big", context=101 + HELD))
    assert held.binds(cand("c", "big", context=0))  # (unknown: it may be any size)
    assert held.capped({"model": "big", "max_tokens": None}, "big-id") == {
        "model": "big-id", "max_tokens": HELD, "max_completion_tokens": HELD}


async def test_each_api_is_capped_in_the_fields_its_engines_read() -> None:
    ing, fwd, book = budgeted([cand("w1", "big", context=BIG)],
                              native_responses_models=("big",))
    assert (await ask(ing, {"model": "big"})) is not None
    assert caps(fwd.sent[-1][1]) == {"max_tokens": HELD, "max_completion_tokens": HELD}
    await ask(ing, {"model": "big", "prompt": "hi"}, path="/v1/completions")
    assert caps(fwd.sent[-1][1]) == {"max_tokens": HELD}
    reply = await ApiRoutes(ing).serve("/v1/responses", f"Bearer {KEY}", None, orjson.dumps(
        {"model": "big", "input": "hi"}), Sink())
    assert reply is not None and fwd.paths[-1] == "/v1/responses"
    assert caps(fwd.sent[-1][1]) == {"max_output_tokens": HELD}
    # n completions: each capped at its share of the hold (the hold is n times it)
    await ask(ing, {"model": "big", "n": 3, "max_tokens": None})
    assert caps(fwd.sent[-1][1]) == {"max_tokens": HELD, "max_completion_tokens": HELD}
    assert reservation_parts({"messages": MSG, "n": 3}, context=HELD)[1] == 3 * HELD
    assert book.status()[0]["held"] == 0


async def test_a_replica_within_the_hold_a_capped_request_and_one_without_budget_go_as_sent(
        ) -> None:
    prompt = reservation_parts({"messages": MSG})[0]
    ing, fwd, _ = budgeted([cand("a1", "big", context=prompt + HELD)])
    await ask(ing, {"model": "big"})
    assert caps(fwd.sent[-1][1]) == {}
    ing, fwd, _ = budgeted([cand("w1", "big", context=BIG)])
    await ask(ing, {"model": "big", "max_tokens": 100})
    assert caps(fwd.sent[-1][1]) == {"max_tokens": 100}
    ing, fwd, _ = budgeted([cand("w1", "big", context=BIG)], budget_for="someone-else")
    await ask(ing, {"model": "big"})
    assert caps(fwd.sent[-1][1]) == {}
    ing, fwd, _ = ingress([cand("w1", "big", context=BIG)])  # no gate at all
    await ask(ing, {"model": "big"})
    assert caps(fwd.sent[-1][1]) == {}


async def test_a_replica_advertising_no_context_gets_the_request_capped() -> None:
    """A static engine that reports no context (and no --max-context) advertises 0: it could
    generate to any length, so a budgeted uncapped request is capped at its hold there."""
    ing, fwd, book = budgeted([cand("u1", "big", context=0)])
    assert (await ask(ing, {"model": "big"})) is not None
    assert caps(fwd.sent[-1][1]) == {"max_tokens": HELD, "max_completion_tokens": HELD}
    assert book.status()[0]["held"] == 0
    ing, fwd, _ = budgeted([cand("u1", "big", context=0)], budget_for="someone-else")
    await ask(ing, {"model": "big"})
    assert caps(fwd.sent[-1][1]) == {}  # (no budget: sent as written)


async def test_a_batch_of_8_prompts_is_capped_where_a_short_prompt_could_take_more() -> None:
    # 7 short prompts and a long one: on a replica of the whole batch's prompt bound plus
    # HELD, each short prompt's completion could take nearly that context, 8 of them far
    # past the 8 * HELD held; within the hold's share per completion, none can.
    prompts = ["hello there"] * 7 + ["word " * 400]
    sent = {"messages": MSG, "prompt": prompts}  # (as `ask` sends it)
    bound = reservation_parts(sent)[0]
    share = (bound + 8 * HELD) // 8
    assert share < bound + HELD
    for context, capped in ((bound + HELD, {"max_tokens": HELD}), (share + 1, {"max_tokens": HELD}),
                            (share, {})):
        ing, fwd, book = budgeted([cand("w1", "big", context=context)])
        reply = await ask(ing, {"model": "big", "prompt": prompts}, path="/v1/completions")
        assert reply is not None and reply.status == 200
        assert caps(fwd.sent[-1][1]) == capped, context
        assert book.status()[0]["held"] == 0


async def test_a_continuation_on_a_larger_context_gets_what_is_left_of_the_hold() -> None:
    def script(c: Candidate, doc: dict[str, Any]) -> Up:
        if c.session_id == "w1":  # two chunks reach the client, then the node dies
            return Up(stream=(chunk("a"), chunk("b")), cut=True)
        return served(doc)

    ing, fwd, _ = budgeted([cand("w1", "big", context=BIG), cand("w2", "big", context=BIG)],
                           script, policy="round_robin")
    sink = Sink()
    assert (await ask(ing, {"model": "big"}, stream=True, sink=sink)) is None
    assert fwd.nodes() == ["w1", "w2"] and b"hi" in sink.data
    assert caps(fwd.sent[0][1]) == {"max_tokens": HELD, "max_completion_tokens": HELD}
    assert caps(fwd.sent[1][1]) == {"max_tokens": HELD - 2,
                                    "max_completion_tokens": HELD - 2}


async def test_the_decode_of_a_larger_context_is_capped_too() -> None:
    handle = orjson.dumps({"id": "p", "choices": [], "kv_transfer_params": {
        "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [1]}})

    def script(c: Candidate, doc: dict[str, Any]) -> Up:
        return Up(body=handle) if c.session_id == "pre" else served(doc)

    ing, fwd, _ = budgeted([cand("pre", "big", context=BIG, role=ModelRole.PREFILL),
                            cand("dec", "big", context=BIG, role=ModelRole.DECODE)], script)
    reply = await ask(ing, {"model": "big"})
    assert reply is not None and reply.status == 200 and fwd.nodes() == ["pre", "dec"]
    assert caps(fwd.sent[0][1]) == {"max_tokens": 1}  # (the prefill's own)
    decode = fwd.sent[1][1]
    assert "kv_transfer_params" in decode and decode["model"] == "big"
    assert caps(decode) == {"max_tokens": HELD, "max_completion_tokens": HELD}

