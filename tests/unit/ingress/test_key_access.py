"""What a key may reach through the request core: its model allowlist (by id, alias, pin or
LoRA adapter of an allowed model; nothing else, whatever name or fallback list asks, and no
answer naming models it may not see) and its expiry (401 `expired_api_key`, saying when).
The real core over a static candidate list and a scripted forwarder (test_model_fallbacks)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from llmfabric.accounts import AccountStore
from llmfabric.accounts.budgets import Budget, BudgetBook
from llmfabric.accounts.prices import Price
from llmfabric.ingress import IngressConfig, StaticCandidateSource
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.errors import Reply
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate
from llmfabric.tenancy.accounts_auth import AccountsAuth, StaticKeys, StaticPrincipal
from llmfabric.tenancy.gate import reservation_parts
from llmfabric.testing.fake_clock import FakeClock

from .test_model_fallbacks import (
    KEY,
    MSG,
    NOON,
    Scripted,
    Sink,
    Up,
    ask,
    cand,
    error_of,
    gated,
)

NOW = 1_800_000_000.0
ALLOWED = frozenset({"small"})


def lora(sid: str, model: str, adapters: tuple[str, ...]) -> Candidate:
    return Candidate(sid, f"peer-{sid}", "p", "127.0.0.1:1", (), Hardware("A100", 1),
                     ServedModel(model, adapters=adapters), LoadHints())


FLEET = [cand("s1", "small", aliases=("tiny", "shared")),
         cand("b1", "big", aliases=("large", "shared")),
         lora("l1", "llama", ("sql",)), lora("l2", "secret", ("hr",))]


def restricted(models: frozenset[str] = ALLOWED, cands: list[Candidate] | None = None,
               **config: Any) -> tuple[Ingress, Scripted]:
    """An ingress whose key KEY may use only `models`."""
    fwd = Scripted()
    keys = StaticKeys({})
    keys._keys[KEY] = StaticPrincipal("k1", models=models)
    config.setdefault("max_retries", 1)
    ing = Ingress(IngressConfig(**config), StaticCandidateSource(cands or FLEET), fwd,
                  auth=keys, usage_sink=keys)
    return ing, fwd


def refused_403(reply: Reply | None, model: str) -> None:
    err = error_of(reply)
    assert reply is not None and reply.status == 403, err
    assert err["code"] == "model_not_found" and err["param"] == "model"
    assert repr(model) in err["message"]
    rest = err["message"].replace(repr(model), "")
    for hidden in ("big", "large", "secret", "hr"):  # never a model the key may not see
        assert hidden not in rest


async def test_an_allowed_model_is_served_by_id_and_by_alias() -> None:
    ing, fwd = restricted()
    for name in ("small", "tiny"):
        reply = await ask(ing, {"model": name})
        assert reply is not None and reply.status == 200
    assert [doc["model"] for _, doc in fwd.sent] == ["small", "small"]  # (its id upstream)


@pytest.mark.hostile
async def test_a_disallowed_model_is_refused_by_id_alias_or_unknown_name_alike() -> None:
    ing, fwd = restricted()
    for name in ("big", "large", "no-such-model"):  # a 404 would tell the unknown apart
        refused_403(await ask(ing, {"model": name}), name)
    assert fwd.sent == []


@pytest.mark.hostile
async def test_an_alias_shared_with_a_disallowed_model_reaches_neither() -> None:
    ing, fwd = restricted()
    refused_403(await ask(ing, {"model": "shared"}), "shared")  # (409 for others: ambiguous)
    ing2, _ = restricted(frozenset({"small", "big"}))
    reply = await ask(ing2, {"model": "shared"})
    assert reply is not None and reply.status == 409  # both allowed: ambiguous, as for all
    assert fwd.sent == []


@pytest.mark.hostile
async def test_lora_adapters_follow_their_base_model() -> None:
    ing, fwd = restricted(frozenset({"llama"}))
    for name in ("sql", "llama:sql"):
        reply = await ask(ing, {"model": name})
        assert reply is not None and reply.status == 200
    for name in ("hr", "secret:hr", "secret"):
        refused_403(await ask(ing, {"model": name}), name)
    assert [(sid, doc["model"]) for sid, doc in fwd.sent] == [("l1", "sql"), ("l1", "sql")]


@pytest.mark.hostile
async def test_a_fallback_list_cannot_smuggle_a_disallowed_model() -> None:
    ing, fwd = restricted()
    refused_403(await ask(ing, {"model": "nope", "models": ["big", "large"]}), "large")
    assert fwd.sent == []
    # a disallowed primary moves on to the allowed fallback
    reply = await ask(ing, {"model": "big", "models": ["tiny"]})
    assert reply is not None and reply.status == 200 and fwd.nodes() == ["s1"]
    # an allowed primary failing is never handed to a disallowed fallback
    fwd2 = Scripted(lambda c, doc: Up(503, b"{}"))
    ing.forwarder = fwd2
    reply = await ask(ing, {"model": "small", "models": ["big"]})
    assert reply is not None and reply.status != 200
    assert {sid for sid, _ in fwd2.sent} == {"s1"}


async def test_an_allowed_model_without_nodes_is_answered_as_for_any_key() -> None:
    ing, _ = restricted(frozenset({"small", "gone"}))
    reply = await ask(ing, {"model": "gone"})
    assert reply is not None and reply.status == 404  # its own id: nothing to hide


async def test_models_lists_only_the_allowed_ones() -> None:
    ing, _ = restricted(frozenset({"small", "llama"}))
    reply = await ing.models_reply(f"Bearer {KEY}")
    data = orjson.loads(reply.body)["data"]
    assert [(m["id"], m["aliases"], m["adapters"]) for m in data] == [
        ("llama", [], ["sql"]), ("small", ["tiny"], [])]
    everyone = StaticKeys({"sk-all": "k2"})
    ing.auth = everyone
    ing._auth_cached = everyone.cached
    reply = await ing.models_reply("Bearer sk-all")
    assert len(orjson.loads(reply.body)["data"]) == 4  # a key without an allowlist: all


async def test_budgets_hold_and_settle_across_a_skipped_fallback() -> None:
    book = BudgetBook(lambda: NOON)
    book.set(Budget("owner", "k1", 10_000_000, "day"))
    ing, fwd = gated([cand("s1", "small"), cand("b1", "big")], book)
    ing.auth._keys[KEY] = StaticPrincipal("k1", models=ALLOWED)  # type: ignore[union-attr]
    ing._auth_cached = ing.auth.cached  # type: ignore[union-attr]
    reply = await ask(ing, {"model": "big", "models": ["small"]})
    assert reply is not None and reply.status == 200 and fwd.nodes() == ["s1"]
    row = book.status()[0]
    assert row["held"] == 0 and row["spent"] == 5  # settled at what small used
    refused_403(await ask(ing, {"model": "big"}), "big")
    assert book.status()[0]["held"] == 0  # the refused request's hold released


def restricted_gated(book: BudgetBook) -> tuple[Ingress, Scripted]:
    """`gated` over small (4096 tokens of context) and big (32768), its key limited to
    small."""
    ing, fwd = gated([cand("s1", "small", context=4096), cand("b1", "big", context=32768)],
                     book)
    ing.auth._keys[KEY] = StaticPrincipal("k1", models=ALLOWED)  # type: ignore[union-attr]
    ing._auth_cached = ing.auth.cached  # type: ignore[union-attr]
    return ing, fwd


@pytest.mark.hostile
async def test_a_disallowed_model_is_refused_403_before_its_budget_is_looked_at() -> None:
    book = BudgetBook(lambda: NOON)
    book.set(Budget("owner", "k1", 5, "day"))
    ing, fwd = restricted_gated(book)
    first = await ask(ing, {"model": "small"})  # spends the 5 tokens: the budget used up
    assert first is not None and first.status == 200 and fwd.nodes() == ["s1"]
    for doc in ({"model": "big"}, {"model": "big", "max_tokens": 10},
                {"model": "large", "models": ["big"]}):
        reply = await ask(ing, doc)
        refused_403(reply, doc["models"][-1] if "models" in doc else doc["model"])
    over = await ask(ing, {"model": "small", "models": ["big"]})  # allowed: its budget's 429
    err = error_of(over)
    assert over is not None and over.status == 429 and err["code"] == "insufficient_quota"
    assert "(4096 tokens)" in err["message"] and "32768" not in err["message"]
    assert fwd.nodes() == ["s1"] and book.status()[0]["held"] == 0


async def test_a_disallowed_fallback_neither_prices_nor_sizes_the_hold() -> None:
    book = BudgetBook(lambda: NOON)
    book.prices = {"big": Price(10.0, 10.0), "small": Price(1.0, 1.0)}
    book.set(Budget("owner", "k1", 10**9, "day", unit="usd"))
    ing, fwd = restricted_gated(book)
    held: list[int] = []
    fwd.on_open = lambda: held.append(book.status()[0]["held"])  # type: ignore[arg-type]
    reply = await ask(ing, {"model": "small", "models": ["big"], "max_tokens": 100})
    assert reply is not None and reply.status == 200 and fwd.nodes() == ["s1"]
    prompt, _ = reservation_parts({"messages": MSG, "max_tokens": 100})
    assert held == [(prompt + 100) * 1]  # small's price, not big's 10
    # a token budget, no cap field: small's context, not big's
    tokens = BudgetBook(lambda: NOON)
    tokens.set(Budget("owner", "k1", 10_000_000, "day"))
    ing, fwd = restricted_gated(tokens)
    held.clear()
    fwd.on_open = lambda: held.append(tokens.status()[0]["held"])  # type: ignore[arg-type]
    reply = await ask(ing, {"model": "big", "models": ["small", "large"]})
    assert reply is not None and reply.status == 200 and fwd.nodes() == ["s1"]
    assert held == [reservation_parts({"messages": MSG})[0] + 4096]


# -- expiry ------------------------------------------------------------------------------


@pytest.fixture
async def store_clock() -> AsyncIterator[tuple[AccountStore, FakeClock]]:
    clock = FakeClock(wall_start=NOW)
    s = await AccountStore.open(":memory:", clock=clock, background=False)
    yield s, clock
    await s.aclose()


@pytest.mark.hostile
async def test_an_expired_key_gets_401_saying_when(
    store_clock: tuple[AccountStore, FakeClock],
) -> None:
    store, clock = store_clock
    _, plain = await store.create_key("app", "alice", expires_at=NOW + 60,
                                      models=["small"])
    ing = Ingress(IngressConfig(), StaticCandidateSource(FLEET), Scripted(),
                  auth=AccountsAuth(store))
    body = orjson.dumps({"model": "small", "messages": []})

    async def send() -> Reply | None:
        return await ing.serve("/v1/chat/completions", True, f"Bearer {plain}", None, body,
                               Sink())

    first = await send()
    assert first is not None and first.status == 200
    assert (await send()) is not None  # now remembered: the cached path
    await clock.advance(60)
    for _ in range(2):  # the first refusal and the remembered one
        err = error_of(await send())
        assert err["code"] == "expired_api_key"
        assert "expired at 2027-01-15T08:01:00Z" in err["message"]
    # counted under the code the reply carried (both refusals came by authenticate_header's path)
    assert ing.metrics.errors.get(("401", "expired_api_key")) == 2
    assert ("401", "invalid_api_key") not in ing.metrics.errors
    models = await ing.models_reply(f"Bearer {plain}")
    assert models.status == 401 and b"expired_api_key" in models.body
    assert ing.key_refused("lf-knope-nothing").status == 401
