"""The prompt's reservation (ingress/usage.py `prompt_token_bound`) against bodies built to
slip past it: media parts in the forms engines accept without the part types the walk knew,
prompt text outside `text`/`content`, and bodies built to make the walk itself expensive."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from llmfabric.accounts.budgets import Budget, BudgetBook
from llmfabric.accounts.policy import MAX_TOKENS_PER_REQUEST
from llmfabric.ingress.usage import (
    MAX_PROMPT_VALUES,
    MEDIA_PART_TOKENS,
    estimate_prompt_tokens,
    prompt_token_bound,
)
from llmfabric.tenancy.accounts_auth import StaticPrincipal
from llmfabric.tenancy.gate import TenancyGate
from llmfabric.testing.work import python_lines

from .test_model_fallbacks import KEY, MSG, Sink, cand, error_of, gated

pytestmark = pytest.mark.unit

NOON = 1_774_958_400.0  # 2026-03-31 12:00 UTC


def chat(*parts: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [*parts]}]}


# The media parts vLLM's chat parser (entrypoints/chat_utils.py) takes besides the typed
# ones the walk knew: a part without `type` is recognised by its media key, a part that
# carries a `uuid` is read by its media key whatever its `type`, and three more types.
UNSEEN_MEDIA = [
    {"image_url": {"url": "https://x/a.png"}},
    {"image_url": "https://x/a.png"},
    {"audio_url": "https://x/a.wav"},
    {"video_url": {"url": "https://x/a.mp4"}},
    {"input_audio": {"data": "AAAA", "format": "wav"}},
    {"image_embeds": "AAAA"},
    {"audio_embeds": "AAAA"},
    {"prompt_embeds": None, "data": "AAAA"},
    {"type": "image_embeds", "image_embeds": {"image_embeds": "AAAA"}},
    {"type": "audio_embeds", "audio_embeds": "AAAA"},
    {"type": "prompt_embeds", "data": "AAAA"},
    {"type": "text", "text": "hi", "uuid": "u1", "image_url": "https://x/a.png"},
]


@pytest.mark.hostile
@pytest.mark.parametrize("part", UNSEEN_MEDIA)
def test_media_parts_without_a_known_type_still_reserve_their_tokens(part: dict[str, Any]
                                                                     ) -> None:
    """Each of these reserved 4 tokens (the message) while the engine turned it into an
    image, audio or video input (or precomputed embeddings) of hundreds to thousands."""
    assert prompt_token_bound(chat(part)) >= MEDIA_PART_TOKENS + 4, part


@pytest.mark.hostile
async def test_untyped_images_cannot_overspend_a_budget() -> None:
    """20 requests of 8 untyped images against a budget for 2: all 20 were admitted."""
    doc = {**chat(*[{"image_url": {"url": "https://x/a.png"}}] * 8), "max_tokens": 10}
    book = BudgetBook(lambda: NOON)
    book.set(Budget("key", "k1", 2 * (8 * MEDIA_PART_TOKENS + 4 + 10), "day"))
    gate = TenancyGate(book)
    admitted = 0
    for _ in range(20):
        admitted += await gate.admit(StaticPrincipal("k1"), doc) is None
    assert admitted == 2


TEXT = "x" * 40_000  # 10,000 tokens at 4 characters a token

# Prompt text the chat template (or the Responses API) renders, outside `text`/`content`.
UNSEEN_TEXT = [
    {"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": TEXT}}]}]},
    {"messages": [{"role": "assistant", "function_call": {"name": "f", "arguments": TEXT}}]},
    {"messages": [{"role": "assistant", "content": "", "reasoning": TEXT}]},
    {"messages": [{"role": "assistant", "content": "", "reasoning_content": TEXT}]},
    {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f", "description": TEXT,
                                          "parameters": {"type": "object"}}}]},
    {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "object", "properties": {
                "b": {"type": "string", "description": TEXT}}}}}}}]},
    {"messages": [{"role": "user", "content": "hi"}], "functions": [
        {"name": "f", "description": TEXT}]},
    {"input": "hi", "instructions": TEXT},
    {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": TEXT}]},
    {"input": [{"type": "function_call_output", "call_id": "c", "output": TEXT}]},
    {"prompt": [[1] * 10_000]},
    {"input": [[1] * 5_000, [2] * 5_000]},
]


@pytest.mark.hostile
@pytest.mark.parametrize("doc", UNSEEN_TEXT)
def test_prompt_text_outside_text_and_content_is_reserved(doc: dict[str, Any]) -> None:
    """Each of these reserved at most 5 tokens for a prompt of 10,000 (tool call arguments,
    tool definitions, reasoning replayed to the model, native Responses instructions and
    tool outputs, batches of token ids), so concurrent requests overspent as with images."""
    assert prompt_token_bound(doc) >= 10_000, doc


def test_the_bound_is_unchanged_for_ordinary_requests() -> None:
    assert prompt_token_bound({"messages": [{"role": "user", "content": "x" * 400}]}) == 104
    assert prompt_token_bound(chat({"type": "text", "text": "x" * 40},
                                   {"type": "image_url", "image_url": {"url": "u"}})) == (
        10 + MEDIA_PART_TOKENS + 4)
    assert prompt_token_bound({"prompt": "x" * 40}) == 10
    assert prompt_token_bound({"prompt": [1, 2, 3]}) == 3
    # the billing estimate (engines that report no usage) still counts texts only
    assert estimate_prompt_tokens(UNSEEN_TEXT[2]) == 4


# What a walk may run per value it reads (it runs up to 19 now): a walk not bounded by
# MAX_PROMPT_VALUES runs this per value of the whole prompt, and stops at the limit.
LINES_PER_VALUE = 25


@pytest.mark.hostile
@pytest.mark.parametrize("item", [{}, 0, {"type": "image_url"}, [0]])
def test_a_body_of_tiny_values_costs_a_bounded_walk(item: Any) -> None:
    """Tiny values by the million (empty objects, zeros): the prompt bound took 2.6 s of the
    event loop for 8 MiB of empty objects (9 times the parse; for any budgeted key), and the
    billing estimate as much again at the end of every stream. The walk now reads at most
    MAX_PROMPT_VALUES values; a prompt of more reserves the most a request may (it then runs
    only alone, at a budget's start): MAX_TOKENS_PER_REQUEST. Counted, not timed: the Python
    lines of both walks over four times the values they read stay within the bound."""
    doc = {"model": "m", "messages": [{"role": "user", "content": [item] * 10_000}
                                      for _ in range(4 * MAX_PROMPT_VALUES // 10_000)]}
    limit = LINES_PER_VALUE * MAX_PROMPT_VALUES
    bound, _ = python_lines(prompt_token_bound, doc, limit=limit)
    assert bound >= 4 * MAX_PROMPT_VALUES  # (zeros: token ids, counted without a walk)
    if item != 0:
        assert bound == MAX_TOKENS_PER_REQUEST  # (past the values read)
    python_lines(estimate_prompt_tokens, doc, limit=limit)
    # and the estimate's count stops where its reading does
    words = chat(*["xxxx"] * (2 * MAX_PROMPT_VALUES))
    assert estimate_prompt_tokens(words) < MAX_PROMPT_VALUES + 4


def test_a_prompt_within_the_walk_s_reach_is_counted_whole() -> None:
    """The 10,000-item slices of the walk are gone: a content list of 20,000 text parts
    counts all of them (before, the second half reserved nothing)."""
    parts = [{"type": "text", "text": "xxxx"}] * 20_000
    assert prompt_token_bound(chat(*parts)) == 20_000 + 4
    assert MAX_PROMPT_VALUES > 20_000 * 2


@pytest.mark.hostile
@pytest.mark.parametrize("kind", [[], {}, ["image_url"]])
async def test_a_part_whose_type_is_not_a_string_is_not_a_500(kind: Any) -> None:
    """`"type": []` in a content part raised TypeError (unhashable) in the media check, so a
    budgeted key's request failed inside the ingress instead of reaching the engine (which
    answers its own 400)."""
    book = BudgetBook(lambda: NOON)
    book.set(Budget("key", "k1", 10**6, "day"))
    ing, fwd = gated([cand("s1", "small")], book)
    body = orjson.dumps({"model": "small", "max_tokens": 5, "messages": [
        *MSG, {"role": "user", "content": [{"type": kind, "text": "hi"}]}]})
    reply = await ing.serve("/v1/chat/completions", True, f"Bearer {KEY}", None, body, Sink())
    assert reply is not None and reply.status == 200, error_of(reply)
    assert len(fwd.sent) == 1 and book.status()[0]["held"] == 0
