"""Prefill/decode roles of the simulated engine: the vLLM-style two-call protocol, the role
gate, KV handles (hostile ones refused), the KV link time, and the role flip."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmfabric.engines.batcher import Batcher
from llmfabric.engines.pd_role import (
    CLOCK_SKEW_S,
    HANDLE_TTL_S,
    HandleReused,
    KVLink,
    PDRequestError,
    PDRole,
    TakenHandles,
    kv_bytes,
    parse_handoff,
    phase_of,
    prompt_digest,
)
from llmfabric.engines.sim_server import SimEngine, SimEngineConfig
from llmfabric.engines.timing import TableTiming
from llmfabric.testing.fake_clock import FakeClock

MODEL = "llama-3.1-8b"
MSG = [{"role": "user", "content": "tell me about disaggregated serving"}]
NOW = 1_700_000_000.0
DIGEST = prompt_digest("chat", "user: x")
Client = TestClient[web.Request, web.Application]


async def _client(role: str, **kw: Any) -> Client:
    engine = SimEngine(SimEngineConfig(models=(MODEL,), role=role, speed=200.0, **kw))
    client: Client = TestClient(TestServer(engine.app()))
    await client.start_server()
    return client


@pytest.fixture
async def engines() -> AsyncIterator[tuple[Client, Client]]:
    pre = await _client("prefill")
    dec = await _client("decode", kv_bits=4, kv_link=KVLink(gbps=400.0, latency_s=0.0))
    yield pre, dec
    await pre.close()
    await dec.close()


async def _prefill(client: Client, max_tokens: int = 8) -> dict[str, Any]:
    r = await client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": MSG, "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True}})
    assert r.status == 200, await r.text()
    return dict(await r.json())


async def test_two_calls_prefill_then_decode_stream_the_whole_answer(
    engines: tuple[Client, Client],
) -> None:
    pre, dec = engines
    first = await _prefill(pre)
    params = first["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["kv_bits"] == 16
    assert params["kv_tokens"] == first["usage"]["prompt_tokens"]
    assert first["usage"]["completion_tokens"] == 1
    # the same request, plain (colocated), for the expected text
    plain = await (await dec.post("/v1/chat/completions", json={
        "model": MODEL, "messages": MSG, "max_tokens": 6, "ignore_eos": True})).json()
    r = await dec.post("/v1/chat/completions", json={
        "model": MODEL, "messages": MSG, "max_tokens": 6, "ignore_eos": True, "stream": True,
        "kv_transfer_params": params})
    assert r.status == 200
    events = [orjson.loads(line[6:]) for line in (await r.text()).splitlines()
              if line.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert text == plain["choices"][0]["message"]["content"]
    stats = await (await dec.get("/sim/stats")).json()
    assert stats["pd"]["decodes"] == 1 and stats["pd"]["kv_bytes_in"] == params["kv_bytes"]
    pstats = await (await pre.get("/sim/role")).json()
    assert pstats["prefills"] == 1 and pstats["kv_bytes_out"] == params["kv_bytes"]


async def test_roles_refuse_the_other_phase_with_a_retryable_503_and_flip(
    engines: tuple[Client, Client],
) -> None:
    pre, dec = engines
    r = await dec.post("/v1/chat/completions", json={
        "model": MODEL, "messages": MSG, "kv_transfer_params": {"do_remote_decode": True}})
    assert r.status == 503 and (await r.json())["error"]["code"] == "wrong_role"
    params = (await _prefill(pre))["kv_transfer_params"]
    r = await pre.post("/v1/chat/completions", json={
        "model": MODEL, "messages": MSG, "kv_transfer_params": params})
    assert r.status == 503
    # every role serves plain requests (vLLM kv_both): the colocated fallback
    assert (await pre.post("/v1/chat/completions", json={
        "model": MODEL, "messages": MSG, "max_tokens": 3})).status == 200
    listed = await (await pre.get("/v1/models")).json()
    assert listed["data"][0]["role"] == "prefill"
    flip = await pre.post("/sim/role", json={"role": "decode"})
    assert flip.status == 200 and (await flip.json())["flips"] == 1
    assert (await (await pre.get("/v1/models")).json())["data"][0]["role"] == "decode"
    r = await pre.post("/v1/chat/completions", json={
        "model": MODEL, "messages": MSG, "kv_transfer_params": params})
    assert r.status == 200
    for bad in (b"{", b"[]", b'{"role": "leader"}', b"{}"):
        assert (await pre.post("/sim/role", data=bad)).status == 400


@pytest.mark.parametrize("mutate", [
    {"kv_tokens": 3}, {"kv_bytes": -1}, {"kv_bytes": 1 << 50}, {"kv_bits": 5},
    {"remote_engine_id": ""}, {"remote_request_id": "x" * 500}, {"kv_tokens": True},
    {"do_remote_decode": True},
])
async def test_a_forged_or_foreign_handle_is_a_400(
    engines: tuple[Client, Client], mutate: dict[str, Any],
) -> None:
    pre, dec = engines
    params = {**(await _prefill(pre))["kv_transfer_params"], **mutate}
    r = await dec.post("/v1/chat/completions", json={
        "model": MODEL, "messages": MSG, "kv_transfer_params": params})
    assert r.status == 400, await r.text()
    r = await dec.post("/v1/chat/completions", json={
        "model": MODEL, "messages": MSG, "kv_transfer_params": "yes"})
    assert r.status == 400


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.dictionaries(st.sampled_from(["do_remote_decode", "do_remote_prefill",
                                        "remote_engine_id", "remote_request_id", "kv_tokens",
                                        "kv_bytes", "kv_bits", "kv_prompt_digest",
                                        "kv_expires_at"]),
                       st.one_of(st.none(), st.booleans(), st.integers(-5, 1 << 41),
                                 st.floats(), st.just(DIGEST), st.just(NOW + 60),
                                 st.text(max_size=200), st.lists(st.integers(), max_size=3))))
def test_any_params_parse_or_raise_only_pd_request_error(params: dict[str, Any]) -> None:
    extra = {"kv_transfer_params": params}
    try:
        if phase_of(extra) == "decode":
            h = parse_handoff(extra, 7, MODEL, DIGEST, NOW)
            assert h.tokens == 7 and h.n_bytes == kv_bytes(MODEL, 7, h.bits)
            assert NOW < h.expires_at <= NOW + HANDLE_TTL_S + CLOCK_SKEW_S
    except PDRequestError:
        pass


def test_kv_bytes_4bit_is_the_kivi_ratio_and_the_link_is_alpha_beta() -> None:
    fp16, q4 = kv_bytes(MODEL, 1024, None), kv_bytes(MODEL, 1024, 4)
    assert fp16 == 32 * 8 * 128 * 2 * 2 * 1024  # llama-3.1-8b: 32 layers, 8 KV heads x 128
    assert fp16 / q4 == pytest.approx(16 / 4.5, rel=1e-3)  # 4 bits + 4 bytes per 64
    assert kv_bytes("unknown-model", 64, None) == 64 * 131072
    link = KVLink(gbps=8.0, latency_s=0.002)
    assert link.transfer_s(10**9) == pytest.approx(1.002)
    with pytest.raises(ValueError):
        KVLink(gbps=0)
    with pytest.raises(ValueError):
        PDRole("leader", FakeClock())
    with pytest.raises(ValueError):
        PDRole("both", FakeClock(), kv_bits=5)


async def test_a_prefilled_sequence_skips_the_prefill_and_joins_the_decode_batch() -> None:
    timing = TableTiming(prefill_base_s=1.0, prefill_per_token_s=0.0, step_base_s=0.01,
                         step_per_seq_s=0.0, step_per_ctx_token_s=0.0)
    clock = FakeClock()
    b = Batcher(timing, clock)
    got = []

    async def run() -> None:
        async for i in b.generate(100, 3, prefilled=True):
            got.append((i, round(clock.now(), 3)))

    task = asyncio.create_task(run())
    await clock.run_until(task.done, within=5.0, step=0.001)
    assert got == [(0, 0.01), (1, 0.02), (2, 0.03)]  # no 1 s prefill
    assert b.active == 0


@pytest.mark.hostile
@pytest.mark.parametrize("mutate", [
    {"kv_bytes": 1 << 40},  # 1 TiB: 22 s on the fixture's 400 Gbps link, 220 s on 40 Gbps
    {"kv_bytes": 1},  # shorter than the KV the prompt needs: a truncated hand-off
    {"kv_bits": 4},  # the bytes of fp16 KV declared as 4-bit codes
])
async def test_a_handle_whose_bytes_do_not_match_its_tokens_is_a_400_at_once(
    engines: tuple[Client, Client], mutate: dict[str, Any],
) -> None:
    """A hostile prefill node's handle sized for nothing its prompt holds: the decode engine
    waited out the declared bytes on its link (a 1 TiB claim held every request it prefilled
    for minutes, past the ingress's retries) instead of refusing it."""
    pre, dec = engines
    params = {**(await _prefill(pre))["kv_transfer_params"], **mutate}
    async with asyncio.timeout(5):
        r = await dec.post("/v1/chat/completions", json={
            "model": MODEL, "messages": MSG, "max_tokens": 2, "kv_transfer_params": params})
    assert r.status == 400, await r.text()
    assert "kv_bytes" in (await r.json())["error"]["message"]


@pytest.mark.hostile
def test_a_handle_for_another_model_is_refused() -> None:
    """The same prompt's KV for a model of another shape: its bytes give it away."""
    tokens = 40
    foreign = kv_bytes("llama-3.1-70b", tokens, None)
    assert foreign != kv_bytes(MODEL, tokens, None)
    extra = {"kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": "e",
                                    "remote_request_id": "r", "kv_tokens": tokens,
                                    "kv_bytes": foreign, "kv_bits": 16,
                                    "kv_prompt_digest": DIGEST, "kv_expires_at": NOW + 1}}
    with pytest.raises(PDRequestError, match="kv_bytes"):
        parse_handoff(extra, tokens, MODEL, DIGEST, NOW)
    extra["kv_transfer_params"]["kv_bytes"] = kv_bytes(MODEL, tokens, None)
    assert parse_handoff(extra, tokens, MODEL, DIGEST, NOW).n_bytes == kv_bytes(
        MODEL, tokens, None)


# Single use and binding (docs/security.md, the KV hand-off, its second follow-up).

async def _decode(dec: Client, params: dict[str, Any], messages: list[dict[str, str]] = MSG,
                  ) -> tuple[int, dict[str, Any]]:
    r = await dec.post("/v1/chat/completions", json={
        "model": MODEL, "messages": messages, "max_tokens": 2, "kv_transfer_params": params})
    return r.status, dict(await r.json())


@pytest.mark.hostile
async def test_a_replayed_handle_is_refused_with_409(engines: tuple[Client, Client]) -> None:
    """A handle was taken as often as it was sent: any holder (a member that saw it, a local
    user on the engine's port) could decode against the same hand-off again and again."""
    pre, dec = engines
    params = (await _prefill(pre))["kv_transfer_params"]
    assert (await _decode(dec, params))[0] == 200
    status, doc = await _decode(dec, params)
    assert status == 409, doc
    assert doc["error"]["code"] == "kv_handle_reused"
    assert "single-use" in doc["error"]["message"]
    stats = (await (await dec.get("/sim/stats")).json())["pd"]
    assert stats["decodes"] == 1 and stats["handles_reused"] == 1
    assert stats["handles_held"] == 1
    # a fresh handle for the same prompt is taken as before
    assert (await _decode(dec, (await _prefill(pre))["kv_transfer_params"]))[0] == 200


@pytest.mark.hostile
async def test_concurrent_replays_of_one_handle_pass_once(
    engines: tuple[Client, Client],
) -> None:
    pre, dec = engines
    params = (await _prefill(pre))["kv_transfer_params"]
    got = await asyncio.gather(*(_decode(dec, params) for _ in range(8)))
    assert sorted(s for s, _ in got) == [200] + [409] * 7


@pytest.mark.hostile
async def test_a_handle_is_bound_to_its_prompt(engines: tuple[Client, Client]) -> None:
    """A handle was taken for any prompt of its token count: with real KV, another prompt's
    request would have decoded against the first prompt's cache."""
    pre, dec = engines
    first = await _prefill(pre)
    other = [{"role": "user", "content": "tell me about disaggregated routing"}]
    plain = await (await dec.post("/v1/chat/completions", json={
        "model": MODEL, "messages": other, "max_tokens": 1})).json()
    assert plain["usage"]["prompt_tokens"] == first["usage"]["prompt_tokens"]  # same length
    status, doc = await _decode(dec, first["kv_transfer_params"], other)
    assert status == 400 and "another prompt" in doc["error"]["message"]
    # the refusal did not use the handle up: its own prompt still takes it
    assert (await _decode(dec, first["kv_transfer_params"]))[0] == 200


@pytest.mark.hostile
@pytest.mark.parametrize("drop", ["kv_prompt_digest", "kv_expires_at"])
async def test_a_handle_without_binding_fields_is_refused(
    engines: tuple[Client, Client], drop: str,
) -> None:
    """A prefill engine older than single-use handles sends neither field; taking such
    handles would let anyone strip them off a current one, so they are 400s (the ingress
    serves the request colocated)."""
    pre, dec = engines
    params = dict((await _prefill(pre))["kv_transfer_params"])
    del params[drop]
    status, doc = await _decode(dec, params)
    assert status == 400 and drop in doc["error"]["message"]


@pytest.mark.hostile
@pytest.mark.parametrize("shift", [-1.0, HANDLE_TTL_S + CLOCK_SKEW_S + 1, float("inf")])
def test_an_expired_or_far_future_handle_is_refused(shift: float) -> None:
    extra = {"kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": "e",
                                    "remote_request_id": "r", "kv_tokens": 7,
                                    "kv_bytes": kv_bytes(MODEL, 7, None),
                                    "kv_prompt_digest": DIGEST, "kv_expires_at": NOW + shift}}
    with pytest.raises(PDRequestError, match=r"kv_expires_at|expired"):
        parse_handoff(extra, 7, MODEL, DIGEST, NOW)


def _handoff(rid: str, expires_at: float) -> Any:
    extra = {"kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": "e",
                                    "remote_request_id": rid, "kv_tokens": 7,
                                    "kv_bytes": kv_bytes(MODEL, 7, None),
                                    "kv_prompt_digest": DIGEST, "kv_expires_at": expires_at}}
    return parse_handoff(extra, 7, MODEL, DIGEST, NOW)


@pytest.mark.hostile
def test_taken_handles_are_held_until_they_expire_and_capped() -> None:
    taken = TakenHandles(cap=3)
    taken.take(_handoff("a", NOW + 10), NOW)
    with pytest.raises(HandleReused):
        taken.take(_handoff("a", NOW + 10), NOW + 5)
    taken.take(_handoff("a", NOW + 20), NOW + 10)  # expired and forgotten: memory is bounded
    assert len(taken) == 1
    for rid, exp in (("b", NOW + 30), ("c", NOW + 40), ("d", NOW + 50)):
        taken.take(_handoff(rid, exp), NOW + 11)
    # over the cap: the handle closest to its expiry ("a") was forgotten, the rest are held
    assert len(taken) == 3 and taken.evicted == 1
    taken.take(_handoff("a", NOW + 20), NOW + 11)
    for rid in "cd":
        with pytest.raises(HandleReused):
            taken.take(_handoff(rid, NOW + 60), NOW + 11)
    with pytest.raises(ValueError):
        TakenHandles(cap=0)


@pytest.mark.hostile
def test_a_flood_of_handles_is_bounded() -> None:
    role = PDRole("decode", FakeClock(wall_start=NOW))
    role.taken = TakenHandles(cap=1000)
    for i in range(5000):
        role.take(_handoff(f"r{i}", NOW + 100))
    assert len(role.taken) == 1000 and role.taken.evicted == 4000
    with pytest.raises(HandleReused):
        role.take(_handoff("r4999", NOW + 100))
    assert role.stats()["handles_reused"] == 1
