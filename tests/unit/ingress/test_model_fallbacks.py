"""Model fallbacks (the body's `models`, ingress/request_body.py): the request core tries the
listed models in order while the one tried is unknown, has no route, lost every candidate
node or got an engine's 429/5xx, and never once output reached the client; caller errors
come back at once. The real core over a static candidate list and a scripted forwarder."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncGenerator, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from llmfabric.accounts.budgets import Budget, BudgetBook
from llmfabric.accounts.prices import Price
from llmfabric.apis.api_routes import ApiRoutes
from llmfabric.front.fast_wire import reply_bytes
from llmfabric.ingress import IngressConfig, StaticCandidateSource, Timeouts
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.errors import Reply, UpstreamError
from llmfabric.ingress.request_body import (
    MAX_FALLBACKS,
    InvalidModels,
    falls_back,
    requested_models,
)
from llmfabric.registry.records import Hardware, LoadHints, ModelRole, ServedModel
from llmfabric.routing.candidates import Candidate
from llmfabric.telemetry.node_hop import NO_HOP
from llmfabric.tenancy.accounts_auth import StaticKeys
from llmfabric.tenancy.attach import budget_lookup
from llmfabric.tenancy.gate import TenancyGate, reservation_parts
from llmfabric.testing.sinks import MemorySink as Sink
from llmfabric.testing.work import python_lines

CHAT = "/v1/chat/completions"
KEY = "sk-test"
NOON = dt.datetime(2026, 3, 31, 12, 0, tzinfo=dt.UTC).timestamp()
MSG = [{"role": "user", "content": "hello"}]


def cand(sid: str, model: str, provider: str = "p", context: int = 4096,
         role: ModelRole = ModelRole.BOTH, aliases: tuple[str, ...] = ()) -> Candidate:
    return Candidate(sid, f"peer-{sid}", provider, "127.0.0.1:1", (), Hardware("A100", 1),
                     ServedModel(model, aliases=aliases, max_context=context, role=role),
                     LoadHints())


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chunk(text: str, finish: str | None = None) -> bytes:
    return _event({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "x",
                   "choices": [{"index": 0, "delta": {"content": text},
                                "finish_reason": finish}]})


class Up:
    """One scripted upstream answer: a status and body, or a stream that may be cut."""

    hop = NO_HOP

    def __init__(self, status: int = 200, body: bytes = b"", stream: tuple[bytes, ...] = (),
                 cut: bool = False) -> None:
        self.status = status
        self.body = body
        self.stream = stream
        self.cut = cut
        self.content_type = "text/event-stream" if stream else "application/json"

    async def read(self) -> bytes:
        return self.body

    async def read_capped(self, limit: int) -> bytes:
        return self.body

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        for c in self.stream:
            yield c
        if self.cut:
            raise aiohttp.ClientPayloadError("the node died mid-stream")

    def socket_relay(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def completion(model: str) -> bytes:
    return orjson.dumps({
        "id": "c1", "object": "chat.completion", "created": 1, "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": f"from {model}"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})


def served(doc: dict[str, Any]) -> Up:
    """A working engine's answer: a short stream, or a completion."""
    if doc.get("stream"):
        return Up(stream=(chunk("hi"), chunk("", "stop"), b"data: [DONE]\n\n"))
    return Up(body=completion(doc["model"]))


Script = Callable[[Candidate, dict[str, Any]], Up]


class Scripted:
    """The forwarder: each node answers as `script` says (default: a 200 completion, or a
    short stream); every request sent is kept as (node, body)."""

    enforces_timeouts = False

    def __init__(self, script: Script | None = None) -> None:
        self.script = script
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.raw: list[bytes] = []
        self.paths: list[str] = []
        self.on_open: Callable[[], None] | None = None

    async def open(self, candidate: Candidate, path: str, body: bytes,
                   timeouts: Timeouts) -> Up:
        doc = orjson.loads(body)
        self.sent.append((candidate.session_id, doc))
        self.raw.append(body)
        self.paths.append(path)
        if self.on_open is not None:
            self.on_open()
        if self.script is not None:
            return self.script(candidate, doc)
        return served(doc)

    def nodes(self) -> list[str]:
        return [sid for sid, _ in self.sent]

    async def aclose(self) -> None:
        return None


FLEET = [cand("b1", "big", context=32768), cand("s1", "small", "q"),
         cand("s2", "small", "r")]


def ingress(cands: list[Candidate] | None = None, script: Script | None = None,
            **config: Any) -> tuple[Ingress, Scripted, StaticKeys]:
    fwd = Scripted(script)
    keys = StaticKeys({KEY: "k1"})
    src = StaticCandidateSource(FLEET if cands is None else cands)
    config.setdefault("max_retries", 1)
    return Ingress(IngressConfig(**config), src, fwd, auth=keys, usage_sink=keys), fwd, keys


async def ask(ing: Ingress, doc: dict[str, Any], *, providers: str | None = None,
              stream: bool = False, sink: Sink | None = None,
              path: str = CHAT) -> Reply | None:
    body = orjson.dumps({"messages": MSG, **doc, **({"stream": True} if stream else {})})
    return await ing.serve(path, True, f"Bearer {KEY}", providers, body, sink or Sink())


def error_of(reply: Reply | None) -> dict[str, Any]:
    assert reply is not None
    err: dict[str, Any] = orjson.loads(reply.body)["error"]
    return err


def fallback_counts(ing: Ingress) -> dict[tuple[str, str], int]:
    return dict(ing.metrics.fallbacks)


# -- the list ------------------------------------------------------------------------------


def test_the_list_is_read_in_order_and_repeats_are_skipped() -> None:
    assert requested_models("a", ["b", "a", "c", "b"]) == ("a", ("b", "c"))
    assert requested_models(None, ["a", "b"]) == ("a", ("b",))  # no model: the first leads
    assert requested_models("a", None) == ("a", ())
    assert requested_models(None, []) == (None, ())
    assert requested_models(5, ["b"]) == (5, ("b",))  # (the caller refuses the bad primary)
    assert requested_models("a", ["a", "b", "c", "d"]) == ("a", ("b", "c", "d"))
    for bad in ("b", {"m": 1}, 3, [1], [None], [""], [["b"]], ["x" * 513],
                ["b", "c", "d", "e"], ["b", "c", "d", "e", "a"]):
        with pytest.raises(InvalidModels):
            requested_models("a", bad)
    assert falls_back(429) and falls_back(500) and falls_back(501) and falls_back(503)
    assert not any(falls_back(s) for s in (200, 400, 401, 404, 408, 409, 422))


# -- which failures move on ----------------------------------------------------------------


async def test_an_unknown_primary_is_served_by_its_fallback() -> None:
    ing, fwd, keys = ingress()
    reply = await ask(ing, {"model": "gone", "models": ["small"]})
    assert reply is not None and reply.status == 200
    assert reply.model == "small"  # -> X-Fabric-Model
    assert fwd.nodes() in (["s1"], ["s2"])
    sent = fwd.sent[0][1]
    assert "models" not in sent and sent["model"] == "small"
    # counted once, as the model served; the fallback by its pair (an unknown name: other)
    reqs = ing.metrics.requests
    assert reqs == {("small", "200"): 1}
    assert fallback_counts(ing) == {("other", "small"): 1}
    assert keys.usage == {("k1", "small"): [3, 2, 1, 0]}


async def test_without_model_the_first_entry_is_the_primary() -> None:
    ing, fwd, _ = ingress()
    reply = await ask(ing, {"models": ["gone", "big"]})
    assert reply is not None and reply.status == 200 and reply.model == "big"
    assert fwd.nodes() == ["b1"] and fwd.sent[0][1]["model"] == "big"
    assert "models" not in fwd.sent[0][1]


async def test_a_primary_without_a_route_falls_back() -> None:
    # known, but its only node is outside the caller's allowlist (503 filtered without a list)
    ing, fwd, _ = ingress()
    alone = await ask(ing, {"model": "big"}, providers="q")
    assert alone is not None and alone.status == 503
    reply = await ask(ing, {"model": "big", "models": ["small"]}, providers="q")
    assert reply is not None and reply.status == 200 and reply.model == "small"
    assert fwd.nodes() == ["s1"]  # the allowlist applies to the fallback too: never s2 ("r")
    assert fallback_counts(ing) == {("big", "small"): 1}

    # known, but no node routable (none SERVING now): 503 no_candidates alone
    class Known(StaticCandidateSource):
        def is_known(self, model: str) -> bool:
            return model == "resting" or super().is_known(model)

    fwd2 = Scripted()
    ing2 = Ingress(IngressConfig(auth_enabled=False), Known(FLEET), fwd2)
    body = orjson.dumps({"model": "resting", "models": ["big"], "messages": MSG})
    got = await ing2.serve(CHAT, True, "", None, body, Sink())
    assert got is not None and got.status == 200 and got.model == "big"


async def test_a_primary_whose_nodes_all_fail_falls_back() -> None:
    def script(c: Candidate, doc: dict[str, Any]) -> Up:
        if c.model.id == "big":
            raise UpstreamError(f"node {c.session_id} refused the connection")
        return served(doc)

    cands = [cand("b1", "big"), cand("b2", "big"), cand("s1", "small")]
    ing, fwd, keys = ingress(cands, script)
    reply = await ask(ing, {"model": "big", "models": ["small"]})
    assert reply is not None and reply.status == 200 and reply.model == "small"
    assert sorted(fwd.nodes()[:2]) == ["b1", "b2"] and fwd.nodes()[2:] == ["s1"]
    assert keys.usage == {("k1", "small"): [3, 2, 1, 0]}  # billed as the model served
    assert ing.metrics.failed_attempts == {"b1": 1, "b2": 1}


@pytest.mark.parametrize("status", [429, 500, 501, 503])
async def test_an_engine_429_or_5xx_falls_back(status: int) -> None:
    def script(c: Candidate, doc: dict[str, Any]) -> Up:
        if c.model.id == "big":
            return Up(status, b'{"error": {"message": "busy"}}')
        return served(doc)

    for stream in (False, True):
        ing, fwd, _ = ingress([cand("b1", "big"), cand("s1", "small")], script)
        sink = Sink()
        reply = await ask(ing, {"model": "big", "models": ["small"]}, stream=stream,
                          sink=sink)
        assert fwd.nodes() == ["b1", "s1"], (status, stream)
        if stream:
            assert reply is None and sink.started == ("text/event-stream", "s1", "small")
        else:
            assert reply is not None and reply.status == 200 and reply.model == "small"
        assert ing.metrics.requests == {("small", "200"): 1}


async def test_the_last_models_error_is_answered_when_every_model_fails() -> None:
    def script(c: Candidate, doc: dict[str, Any]) -> Up:
        return Up(501, b'{"error": {"message": "not implemented"}}')

    ing, fwd, _ = ingress([cand("b1", "big"), cand("s1", "small")], script)
    reply = await ask(ing, {"model": "big", "models": ["small", "gone"]})
    assert error_of(reply)["code"] == "model_not_found" and "'gone'" in error_of(reply)[
        "message"]
    assert fwd.nodes() == ["b1", "s1"]
    reply = await ask(ing, {"model": "gone", "models": ["big"]})
    assert reply is not None and reply.status == 501 and reply.model == "big"
    # one request, one count: the answer given (no count for the models passed over)
    assert ing.metrics.requests == {("other", "404"): 1, ("big", "501"): 1}


async def test_caller_errors_come_back_at_once() -> None:
    def script(c: Candidate, doc: dict[str, Any]) -> Up:
        if c.model.id == "big":
            return Up(400, b'{"error": {"message": "too long", "code": "context"}}')
        return served(doc)

    ing, fwd, _ = ingress([cand("b1", "big"), cand("s1", "small")], script)
    reply = await ask(ing, {"model": "big", "models": ["small"]})
    assert reply is not None and reply.status == 400 and fwd.nodes() == ["b1"]
    fwd.sent.clear()  # (a stream: the engine's 400 comes before any byte is relayed)
    reply = await ask(ing, {"model": "big", "models": ["small"]}, stream=True)
    assert reply is not None and reply.status == 400 and fwd.nodes() == ["b1"]
    assert fallback_counts(ing) == {}
    # an alias two models list (409) is the caller's to resolve, first or in the list
    amb = [cand("a1", "one", aliases=("dup",)), cand("a2", "two", aliases=("dup",)),
           cand("s1", "small")]
    ing2, fwd2, _ = ingress(amb)
    for doc in ({"model": "dup", "models": ["small"]}, {"model": "gone", "models": ["dup",
                                                                                     "small"]}):
        assert error_of(await ask(ing2, doc))["code"] == "ambiguous_model"
    assert fwd2.sent == []
    # bad metadata, a bad stream flag, a bad key: refused before any model is tried
    for doc in ({"model": "gone", "models": ["small"], "metadata": {"gpu": 5}},
                {"model": "gone", "models": ["small"], "stream": "yes"}):
        reply = await ask(ing2, doc)
        assert reply is not None and reply.status == 400
    body = orjson.dumps({"model": "gone", "models": ["small"], "messages": MSG})
    reply = await ing2.serve(CHAT, True, "Bearer nope", None, body, Sink())
    assert reply is not None and reply.status == 401 and fwd2.sent == []


async def test_a_committed_stream_never_moves_to_another_model() -> None:
    cut = (chunk("par"),)

    def script(c: Candidate, doc: dict[str, Any]) -> Up:
        if c.session_id == "b1":
            return Up(stream=cut, cut=True)  # bytes reached the client, then the node died
        if c.model.id == "big":  # the continuation of the same model on another node
            return Up(stream=(chunk("tial", "stop"), b"data: [DONE]\n\n"))
        raise AssertionError("the fallback model must not be asked")

    # without a continuation (opted out): the error event ends the stream, no fallback
    ing, fwd, _ = ingress([cand("b1", "big"), cand("s1", "small")], script)
    sink = Sink()
    reply = await ask(ing, {"model": "big", "models": ["small"],
                            "metadata": {"continuation": False}}, stream=True, sink=sink)
    assert reply is None and fwd.nodes() == ["b1"]
    assert b"par" in sink.data and b"upstream_failed" in sink.data
    # with continuation: another node of the same model finishes it, never the fallback
    ing, fwd, _ = ingress([cand("b1", "big"), cand("b2", "big"), cand("s1", "small")], script,
                          policy="round_robin")
    sink = Sink()
    reply = await ask(ing, {"model": "big", "models": ["small"]}, stream=True, sink=sink)
    assert reply is None and "s1" not in fwd.nodes() and fwd.nodes()[-1] == "b2"
    assert b"par" in sink.data and b"tial" in sink.data
    assert sink.started is not None and sink.started[2] == "big"
    assert fallback_counts(ing) == {}


async def test_the_prefill_decode_path_falls_back_per_model() -> None:
    handle = orjson.dumps({"id": "p", "choices": [], "kv_transfer_params": {
        "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [1]}})

    def script(c: Candidate, doc: dict[str, Any]) -> Up:
        if c.session_id == "pre":
            return Up(body=handle)
        if c.session_id == "dec":
            raise UpstreamError("the decode node is gone")
        return served(doc)

    cands = [cand("pre", "big", role=ModelRole.PREFILL),
             cand("dec", "big", role=ModelRole.DECODE), cand("s1", "small")]
    ing, fwd, _ = ingress(cands, script)
    reply = await ask(ing, {"model": "big", "models": ["small"]})
    assert reply is not None and reply.status == 200 and reply.model == "small"
    assert fwd.nodes()[0] == "pre" and fwd.nodes()[-1] == "s1"
    assert "kv_transfer_params" not in fwd.sent[-1][1]
    assert ing.metrics.requests == {("small", "200"): 1}
    # the last model's own failure is still its 502
    reply = await ask(ing, {"model": "big"})
    assert error_of(reply)["code"] == "upstream_failed"


# -- the body, the answer and the bill -------------------------------------------------------


async def test_the_engine_gets_no_models_field_and_the_served_name() -> None:
    ing, fwd, _ = ingress([cand("s1", "small-8b", aliases=("small",)), cand("b1", "big")])
    reply = await ask(ing, {"model": "gone", "models": ["gone", "small", "small"]})
    assert reply is not None and reply.model == "small"  # the name as asked (the list entry)
    assert fwd.sent[0][1]["model"] == "small-8b"  # the engine knows the model by its id
    assert "models" not in fwd.sent[0][1]
    assert fallback_counts(ing) == {("other", "small"): 1}  # repeats skipped: one step
    # a null list is no list, and still never reaches the engine
    fwd.sent.clear()
    reply = await ask(ing, {"model": "big", "models": None})
    assert reply is not None and reply.status == 200 and fwd.sent[0][1].keys() == {
        "model", "messages"}
    # a request without the field is relayed byte for byte (no re-serialization)
    fwd.raw.clear()
    body = orjson.dumps({"model": "big", "messages": MSG})
    await ing.serve(CHAT, True, f"Bearer {KEY}", None, body, Sink())
    assert fwd.raw == [body]


async def test_the_served_model_is_said_in_a_header_on_both_fronts_wires() -> None:
    ing, _, _ = ingress()
    reply = await ask(ing, {"model": "gone", "models": ["big"]})
    assert reply is not None
    wire = reply_bytes({}, reply, True, False)
    assert b"\r\nX-Fabric-Model: big\r\n" in wire and b"X-Fabric-Node: b1" in wire
    plain = await ask(ing, {"model": "big"})  # every answer an engine gave carries it
    assert plain is not None and plain.model == "big"
    hostile = Reply(200, b"{}", node="n", model="m\r\nSet-Cookie: x=1")
    assert b"\r\nSet-Cookie" not in reply_bytes({}, hostile, True, False)
    refused = await ask(ing, {"model": "gone"})
    assert refused is not None and refused.model == ""  # the ingress's own errors: none


async def test_the_usage_row_trace_and_metrics_name_the_served_model() -> None:
    events: list[Any] = []
    ing, _, keys = ingress(trace_hook=events.append)
    for stream in (False, True):
        await ask(ing, {"model": "gone", "models": ["small"]}, stream=stream)
    assert [e.model for e in events] == ["small", "small"]
    assert keys.usage[("k1", "small")][2] == 2 and ("k1", "gone") not in keys.usage
    assert {m for m, _, _ in ing.metrics.tokens} == {"small"}


# -- budgets ---------------------------------------------------------------------------------


def gated(cands: list[Candidate], book: BudgetBook,
          script: Script | None = None) -> tuple[Ingress, Scripted]:
    ing, fwd, _ = ingress(cands, script)
    ing.use_gate(TenancyGate(book, lookup=budget_lookup(ing)))  # (as attach_tenancy does)
    return ing, fwd


async def test_the_reservation_covers_the_largest_listed_context() -> None:
    book = BudgetBook(lambda: NOON)
    book.set(Budget("owner", "k1", 10_000_000, "day"))
    cands = [cand("s1", "small", context=4096), cand("b1", "big", context=32768)]
    ing, fwd = gated(cands, book)
    held: list[int] = []
    fwd.on_open = lambda: held.append(book.status()[0]["held"])  # type: ignore[arg-type]
    prompt, _ = reservation_parts({"messages": MSG})
    reply = await ask(ing, {"model": "small", "models": ["gone", "big"]})
    assert reply is not None and reply.status == 200
    assert held == [prompt + 32768]  # not only the primary's 4096
    row = book.status()[0]
    assert row["held"] == 0 and row["spent"] == 5  # settled: what the served model used
    # a budget the primary's context fits but the fallback's does not: refused up front
    book.set(Budget("owner", "k1", 5 + prompt + 10_000, "day"))
    reply = await ask(ing, {"model": "small", "models": ["big"]})
    assert reply is not None and reply.status == 429
    assert error_of(reply)["code"] == "insufficient_quota"
    assert "largest context of its models (32768 tokens)" in error_of(reply)["message"]
    assert (await ask(ing, {"model": "small"})) is not None  # alone it fits
    assert book.status()[0]["held"] == 0


async def test_a_spend_budget_reserves_the_dearest_and_bills_the_model_served() -> None:
    book = BudgetBook(lambda: NOON)
    book.prices = {"big": Price(10.0, 10.0), "small": Price(1.0, 1.0)}
    book.set(Budget("owner", "k1", 10**9, "day", unit="usd"))

    def script(c: Candidate, doc: dict[str, Any]) -> Up:
        if c.model.id == "big":
            return Up(503, b"{}")
        return served(doc)

    ing, fwd = gated([cand("b1", "big"), cand("s1", "small")], book, script)
    held: list[int] = []
    fwd.on_open = lambda: held.append(book.status()[0]["held"])  # type: ignore[arg-type]
    reply = await ask(ing, {"model": "small", "models": ["big"], "max_tokens": 100})
    assert reply is not None and reply.status == 200
    prompt, _ = reservation_parts({"messages": MSG, "max_tokens": 100})
    assert held == [(prompt + 100) * 10]  # the dearer fallback's price, not the primary's
    assert book.status()[0]["spent"] == 3 + 2  # served by small: small's price
    reply = await ask(ing, {"model": "big", "models": ["small"], "max_tokens": 100})
    assert reply is not None and reply.model == "small"
    assert book.status()[0]["spent"] == 10  # not big's 50


@pytest.mark.hostile
async def test_an_alias_or_a_pin_is_billed_as_the_model_that_runs_it() -> None:
    """Spend budgets priced the name the client asked for: "fast", an alias of a model
    priced at $10 per million tokens, was charged $0, and so was a LoRA adapter's name. The
    hold is now at the dearest of the name and the ids it routes to, and the usage row and
    the settlement name the id of the model that served."""
    book = BudgetBook(lambda: NOON)
    book.prices = {"big": Price(10.0, 10.0)}
    book.set(Budget("owner", "k1", 10**9, "day", unit="usd"))
    ing, fwd = gated([cand("b1", "big", aliases=("fast",))], book)
    _, _, keys = ingress()  # (a usage sink of its own)
    ing.usage_sink = keys
    held: list[int] = []
    fwd.on_open = lambda: held.append(book.status()[0]["held"])  # type: ignore[arg-type]
    reply = await ask(ing, {"model": "fast", "max_tokens": 100})
    assert reply is not None and reply.status == 200
    prompt, _ = reservation_parts({"messages": MSG, "max_tokens": 100})
    assert held == [(prompt + 100) * 10]  # big's price, not 0
    assert book.status()[0]["spent"] == (3 + 2) * 10
    assert keys.usage[("k1", "big")][2] == 1 and ("k1", "fast") not in keys.usage
    # a spend budget too small for big's price refuses the alias up front
    book.set(Budget("owner", "k1", 10, "day", unit="usd"))
    reply = await ask(ing, {"model": "fast", "max_tokens": 100})
    assert reply is not None and reply.status == 429


# -- the translated APIs --------------------------------------------------------------------


async def api(ing: Ingress, path: str, doc: dict[str, Any], sink: Sink | None = None
              ) -> tuple[int, Any]:
    reply = await ApiRoutes(ing).serve(path, f"Bearer {KEY}", None, orjson.dumps(doc),
                                       sink or Sink())
    if reply is None:
        return 200, None
    return reply.status, orjson.loads(reply.body)


async def test_anthropic_fallbacks_map_onto_models() -> None:
    ing, fwd, keys = ingress()
    msg = {"model": "gone", "max_tokens": 5, "messages": MSG}
    status, body = await api(ing, "/v1/messages", {**msg, "fallbacks": [{"model": "small"}]})
    assert status == 200 and body["type"] == "message"
    assert fwd.paths == [CHAT] and fwd.sent[0][1]["model"] == "small"
    assert not {"models", "fallbacks"} & fwd.sent[0][1].keys()
    assert keys.usage[("k1", "small")][2] == 1
    status, _ = await api(ing, "/v1/messages", {**msg, "models": ["small"]})  # as on OpenAI's
    assert status == 200
    sink = Sink()  # a stream says the model that answers in its message_start
    await api(ing, "/v1/messages", {**msg, "fallbacks": [{"model": "small"}], "stream": True},
              sink)
    assert sink.started is not None and sink.started[2] == "small"
    assert b'"model":"small"' in sink.data.split(b"\n\n")[0]
    fwd.sent.clear()
    for bad in ({"fallbacks": [{"model": "small"}], "models": ["big"]},
                {"fallbacks": [{"model": "small", "max_tokens": 9}]},
                {"fallbacks": ["small"]}, {"fallbacks": "default"},
                {"fallbacks": [{"model": "small"}] * 10_000}, {"fallbacks": [{"model": 5}]}):
        status, body = await api(ing, "/v1/messages", {**msg, **bad})
        assert status == 400 and body["type"] == "error", bad
        assert body["error"]["type"] == "invalid_request_error"
    assert fwd.sent == []


async def test_responses_take_models_translated_and_passed_through() -> None:
    ing, fwd, _ = ingress(native_responses_models=("big", "small"))
    status, body = await api(ing, "/v1/responses", {"model": "gone", "models": ["small"],
                                                    "input": "hi"})
    assert status == 200 and body["object"] == "response"
    assert fwd.paths == [CHAT] and fwd.sent[0][1]["model"] == "small"  # (gone: not native)
    status, _ = await api(ing, "/v1/responses", {"models": ["gone", "small"], "input": "hi"})
    assert status == 200 and fwd.sent[-1][1]["model"] == "small"
    # every listed model native: passed through, the list cut before the engine
    fwd.sent.clear()
    fwd.paths.clear()
    reply = await ApiRoutes(ing).serve("/v1/responses", f"Bearer {KEY}", None, orjson.dumps(
        {"model": "big", "models": ["small"], "input": "hi"}), Sink())
    assert reply is not None and reply.status == 200 and reply.model == "big"
    assert fwd.paths == ["/v1/responses"] and "models" not in fwd.sent[0][1]
    assert fwd.sent[0][1]["input"] == "hi"
    status, body = await api(ing, "/v1/responses", {"model": "big", "models": [1],
                                                    "input": "hi"})
    assert status == 400 and body["error"]["code"] == "invalid_models"


# -- hostile lists ---------------------------------------------------------------------------


@pytest.mark.hostile
async def test_hostile_lists_are_refused_fast_and_send_nothing() -> None:
    ing, fwd, _ = ingress()
    cases: list[Any] = [
        ["small"] * 10_000,
        [f"m{i}" for i in range(MAX_FALLBACKS + 1)],
        ["small", 5],
        ["small", ""],
        ["x" * (1 << 20)],
        "small",
        {"model": "small"},
        [[[["small"]]]],
    ]
    nested: Any = "small"
    for _ in range(100):
        nested = [nested]
    cases.append(nested)
    for models in cases:
        reply = await ask(ing, {"model": "gone", "models": models})
        err = error_of(reply)
        assert reply is not None and reply.status == 400 and err["code"] == "invalid_models"
        assert err["param"] == "models"
        # refused after a few entries, whatever the list's length (counted, not timed)
        with pytest.raises(InvalidModels):
            python_lines(requested_models, "gone", models, limit=100)
    deep = b'{"model": "gone", "models": ' + b"[" * 300 + b"]" * 300 + b"}"  # (orjson
    reply = await ing.serve(CHAT, True, f"Bearer {KEY}", None, deep, Sink())  # writes 254)
    assert error_of(reply)["code"] == "json_too_deep"
    assert fwd.sent == [] and fallback_counts(ing) == {}


async def test_a_request_cancelled_while_on_a_fallback_settles_its_hold() -> None:
    book = BudgetBook(lambda: NOON)
    book.set(Budget("owner", "k1", 10_000_000, "day"))
    started = asyncio.Event()

    async def never(*_: Any) -> None:
        started.set()
        await asyncio.sleep(3600)

    ing, fwd = gated([cand("s1", "small")], book)
    fwd.open = never  # type: ignore[assignment,method-assign]
    task = asyncio.create_task(ask(ing, {"model": "gone", "models": ["small"]}))
    await started.wait()
    assert book.status()[0]["held"] > 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert book.status()[0]["held"] == 0
