"""A batch line through the real request core: `Ingress.serve(principal=...)` runs it as a
known key without any bearer token (usage, rate limits apply to it), the body never
streams; `AccountStore.active_key` is the per-line re-check of that key; an answer's usage,
whatever an engine sends."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import AsyncGenerator
from typing import Any

import orjson
import pytest

from llmfabric.accounts.store import AccountStore
from llmfabric.batch.lines import (
    MAX_LINE_TOKENS,
    answered,
    error_code,
    not_sent,
    request_body,
    serve_through,
    usage_of,
)
from llmfabric.batch.records import Usage
from llmfabric.ingress import IngressConfig, StaticCandidateSource, Timeouts
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.errors import Reply
from llmfabric.ingress.protocols import Principal
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate
from llmfabric.telemetry.node_hop import NO_HOP
from llmfabric.tenancy.accounts_auth import StaticKeys, StaticPrincipal
from llmfabric.testing.sinks import NoSink

pytestmark = pytest.mark.unit
CHAT = "/v1/chat/completions"
ANSWER = orjson.dumps({"id": "c1", "object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})


class Up:
    status = 200
    content_type = "application/json"
    hop = NO_HOP

    async def read(self) -> bytes:
        return ANSWER

    async def read_capped(self, limit: int) -> bytes:
        return ANSWER

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        yield ANSWER

    def socket_relay(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


class Forwarder:
    enforces_timeouts = True

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def open(self, candidate: Candidate, path: str, body: bytes,
                   timeouts: Timeouts) -> Up:
        self.sent.append(orjson.loads(body))
        return Up()

    async def aclose(self) -> None:
        return None


class LimitedKeys(StaticKeys):
    """Static keys whose key "slow" is always over its rate limit."""

    def check_rate(self, principal: Principal) -> float | None:
        return 7.0 if principal.id == "slow" else None


def _ingress() -> tuple[Ingress, Forwarder, LimitedKeys]:
    keys = LimitedKeys({"sk-live": "k1"})
    fwd = Forwarder()
    cand = Candidate("s1", "peer-s1", "p", "127.0.0.1:1", (), Hardware("A100", 1),
                     ServedModel("m"), LoadHints())
    ing = Ingress(IngressConfig(), StaticCandidateSource([cand]), fwd, auth=keys,
                  usage_sink=keys)
    return ing, fwd, keys


async def test_a_line_runs_as_its_principal_without_a_token() -> None:
    ing, fwd, keys = _ingress()
    serve = serve_through(ing)
    body = request_body({"model": "m", "messages": [], "stream": True,
                         "stream_options": {"include_usage": True}})
    reply = await serve(CHAT, body, StaticPrincipal("k1"))
    assert reply.status == 200 and orjson.loads(reply.body)["id"] == "c1"
    assert "stream" not in fwd.sent[0] and "stream_options" not in fwd.sent[0]
    assert keys.usage[("k1", "m")] == [3, 2, 1, 0]  # billed to the batch's key
    limited = await serve(CHAT, body, StaticPrincipal("slow"))
    assert limited.status == 429 and limited.headers == {"Retry-After": "7"}
    assert error_code(limited) == "rate_limit_exceeded"


async def test_without_a_principal_the_bearer_is_still_required() -> None:
    ing, _, _ = _ingress()
    body = b'{"model": "m", "messages": []}'
    reply = await ing.serve(CHAT, False, "", None, body, NoSink())
    assert reply is not None and reply.status == 401
    reply = await ing.serve(CHAT, False, "Bearer sk-live", None, body, NoSink())
    assert reply is not None and reply.status == 200


def test_the_records_of_the_output_and_error_files() -> None:
    rec = orjson.loads(answered("q1", Reply(200, ANSWER)))
    assert rec["custom_id"] == "q1" and rec["error"] is None
    assert rec["response"]["status_code"] == 200 and rec["response"]["body"]["id"] == "c1"
    assert rec["response"]["request_id"].startswith("req_")
    text = orjson.loads(answered("q2", Reply(502, b"not json")))
    assert text["response"]["body"] == "not json"
    gone = orjson.loads(not_sent("q3", "batch_expired", "too late"))
    assert gone["response"] is None and gone["error"] == {"code": "batch_expired",
                                                          "message": "too late"}
    assert error_code(Reply(400, b"[]")) == "" and error_code(Reply(400, b"{")) == ""


async def test_active_key_sees_a_revocation_and_an_unknown_id(tmp_path: pathlib.Path) -> None:
    store = await AccountStore.open(str(tmp_path / "a.db"), background=False)
    try:
        key, _ = await store.create_key("k", "alice")
        got = await store.active_key(key.id)
        assert got is not None and got.owner == "alice"
        await store.revoke(key.id, by=None)
        assert await store.active_key(key.id) is None
        assert await store.active_key("k0000000000000000") is None
        granted = dataclasses.replace(key, id="kremote", revoked_at=None, issuer="peer")
        store.remote = {"kremote": granted}.get  # (a key another ingress vouches for)
        assert await store.active_key("kremote") == granted
        other = await AccountStore.open(str(tmp_path / "a.db"), background=False)
        try:  # (another process's store: from the database, not its cache)
            assert await other.active_key(key.id) is None
        finally:
            await other.aclose()
    finally:
        await store.aclose()


def _usage(doc: Any) -> dict[str, Any]:
    return usage_of(doc).to_json()


def test_an_answer_s_usage_in_openai_s_batch_shape() -> None:
    body = {"usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14,
                      "prompt_tokens_details": {"cached_tokens": 6},
                      "completion_tokens_details": {"reasoning_tokens": 3}}}
    assert _usage(body) == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 6},
                            "output_tokens": 4,
                            "output_tokens_details": {"reasoning_tokens": 3},
                            "total_tokens": 14}
    responses = {"usage": {"input_tokens": 2, "output_tokens": 1,
                           "input_tokens_details": {"cached_tokens": 1}}}
    assert usage_of(responses) == Usage(2, 1, 1, 0)
    embeddings = {"usage": {"prompt_tokens": 5, "total_tokens": 5}}
    assert usage_of(embeddings) == Usage(5, 0, 0, 0)


@pytest.mark.hostile
@pytest.mark.parametrize("body", [
    None, "text", [], {}, {"usage": None}, {"usage": "12"}, {"usage": []},
    {"usage": {"prompt_tokens": "7", "completion_tokens": 2.5}},
    {"usage": {"prompt_tokens": True, "completion_tokens": None}},
    {"usage": {"prompt_tokens": -5, "completion_tokens": -1, "total_tokens": -6}},
    {"usage": {"prompt_tokens_details": {"cached_tokens": -3},
               "completion_tokens_details": "x"}},
])
def test_an_answer_without_a_usable_usage_counts_nothing(body: Any) -> None:
    assert usage_of(body) == Usage()


@pytest.mark.hostile
def test_an_engine_s_odd_counts_are_clamped() -> None:
    huge = {"usage": {"prompt_tokens": 10**30, "completion_tokens": 3,
                      "prompt_tokens_details": {"cached_tokens": 10**40},
                      "completion_tokens_details": {"reasoning_tokens": 9}}}
    # (cached tokens are part of the input, reasoning tokens of the output)
    assert usage_of(huge) == Usage(MAX_LINE_TOKENS, MAX_LINE_TOKENS, 3, 3)


@pytest.mark.hostile
def test_a_line_s_usage_is_bounded_as_the_ledger_bills_it() -> None:
    # A provider claiming 10**12 prompt tokens is billed 100,000,000 (the ledger's bound per
    # count, accounts/policy.py); the batch's usage showed 4,294,967,296 for the same line.
    from llmfabric.accounts.policy import clamp_tokens
    from llmfabric.ingress.usage import usage_from_body

    body = {"usage": {"prompt_tokens": 10**12, "completion_tokens": 10**11}}
    billed = usage_from_body(orjson.dumps(body))
    got = usage_of(body)
    assert billed == (clamp_tokens(10**12), clamp_tokens(10**11))
    assert (got.input_tokens, got.output_tokens) == billed
