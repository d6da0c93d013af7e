"""The CPU reference engine's correctness across layouts: two real gloo engine processes,
each with a full replica, switching between DP (width 1) and TP (width 2) between steps."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("torch")

from llmfabric.engines.torchref.config import PRESETS, ByteTokenizer
from llmfabric.engines.torchref.engine import EngineOptions, FlyingEngine
from llmfabric.engines.torchref.scheduler import Request
from llmfabric.scheduler.switching import (
    Method,
    context_length,
    hysteresis,
    make_policy,
    priority,
)

from ._torchref import to_width

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOK = ByteTokenizer()
PROMPTS = ["Hello, flying world", "The quick brown fox jumps", "0123456789 " * 3,
           "Ünïcödé ✓ prompt"]
BLOCKS, BLOCK_TOKENS = 32, 16  # 512 tokens of KV per engine at width 1


@pytest.fixture(scope="module")
def engine() -> Iterator[FlyingEngine]:
    opts = EngineOptions(dp=2, widths=(1, 2), n_blocks=BLOCKS, block_tokens=BLOCK_TOKENS)
    with FlyingEngine(opts) as eng:
        yield eng


@pytest.fixture(autouse=True)
def dp_layout(engine: FlyingEngine) -> Iterator[None]:
    engine.sched.policy = None
    to_width(engine, 1)
    yield
    engine.sched.policy = None


def run(engine: FlyingEngine, text: str, n: int = 24, **kw: object) -> Request:
    r = engine.submit(TOK.encode(text), n, ignore_eos=True, record_logits=True, **kw)
    engine.run_until_done([r])
    return r


def test_tp_greedy_tokens_and_logits_equal_dp(engine: FlyingEngine) -> None:
    dp = [engine.submit(TOK.encode(t), 24, ignore_eos=True, record_logits=True)
          for t in PROMPTS]
    engine.run_until_done(dp)
    assert {r.home for r in dp} == {(0,), (1,)}  # both DP engines served
    to_width(engine, 2)
    tp = [engine.submit(TOK.encode(t), 24, ignore_eos=True, record_logits=True)
          for t in PROMPTS]
    engine.run_until_done(tp)
    assert all(r.home == (0, 1) for r in tp)
    for a, b in zip(dp, tp, strict=True):
        assert a.output == b.output
        assert len(a.logits) == len(b.logits) == 24
        diff = max(float(np.abs(x - y).max()) for x, y in zip(a.logits, b.logits, strict=True))
        assert diff <= 1e-4


def test_dp_request_paused_by_hard_preempt_finishes_exactly(engine: FlyingEngine) -> None:
    prompt = "A request that a hard preempt will pause"
    base = run(engine, prompt, 32)
    a = engine.submit(TOK.encode(prompt), 32, ignore_eos=True, record_logits=True)
    for _ in range(6):
        engine.step()
    made, tables = len(a.output), {e: list(b) for e, b in a.tables.items()}
    assert 0 < made < 32 and len(a.home or ()) == 1
    engine.switch(2, "hard")
    b = engine.submit(TOK.encode("an urgent request"), 16, ignore_eos=True)
    paused_seen = 0
    while b.finish is None:
        engine.step()
        paused_seen = max(paused_seen, engine.sched.status()["paused"])
        assert len(a.output) == made  # A does not advance while its engine is bound
    assert b.home == (0, 1) and paused_seen == 1 and a.tables == tables
    to_width(engine, 1)
    engine.run_until_done([a])
    assert a.output == base.output
    assert all(np.array_equal(x, y) for x, y in zip(a.logits, base.logits, strict=True))


def test_soft_preempt_folds_and_reprefills_under_tp(engine: FlyingEngine) -> None:
    base_a = run(engine, "the old DP work", 20)
    base_b = run(engine, "a request that wants the whole group", 20)
    a = engine.submit(TOK.encode("the old DP work"), 20, ignore_eos=True)
    engine.step()
    engine.switch(2, "soft")
    b = engine.submit(TOK.encode("a request that wants the whole group"), 20, ignore_eos=True)
    engine.step()
    assert engine.sched.width == 1 and b.soft and len(b.home or ()) == 1  # started in DP
    engine.run_until_done([a, b])
    assert b.folds == 1 and b.home == (0, 1)  # folded, re-prefilled under TP
    assert a.folds == 0 and len(a.home or ()) == 1
    assert a.output == base_a.output and b.output == base_b.output


def test_sequential_binds_only_after_dp_work_is_done(engine: FlyingEngine) -> None:
    base_b = run(engine, "waits for the group", 12)
    a = engine.submit(TOK.encode("DP work to finish first"), 12, ignore_eos=True)
    engine.step()
    engine.switch(2, "sequential")
    b = engine.submit(TOK.encode("waits for the group"), 12, ignore_eos=True)
    while a.finish is None:
        engine.step()
        assert engine.sched.width == 1 and b.home is None  # no admission while draining
    engine.run_until_done([b])
    assert b.home == (0, 1) and b.folds == 0 and b.output == base_b.output


def test_pool_never_reallocated_and_no_group_created_after_startup(
        engine: FlyingEngine) -> None:
    before = engine.status()
    for w in (2, 1, 2, 1):
        to_width(engine, w)
        run(engine, f"width {w}", 4)
    after = engine.status()
    for e0, e1, ready in zip(before["engines"], after["engines"], engine.ready, strict=True):
        assert e1["kv_pool"]["data_ptr"] == e0["kv_pool"]["data_ptr"] == ready["pool_ptr"]
        assert e1["kv_pool"]["numel"] == ready["pool_numel"]
        assert e1["process_groups_created"] == ready["process_groups"] == 2  # world + {0, 1}
    assert after["switches"] >= before["switches"] + 4


def test_weight_views_add_no_storage(engine: FlyingEngine) -> None:
    layers = PRESETS["tiny-llama"].layers
    # every TP view was built before "ready"; only the full parameters own storage
    assert all(info["weight_storages"] == 9 * layers + 3 for info in engine.ready)


def nll(engine: FlyingEngine, prompt: list[int], n: int = 1) -> list[Request]:
    reqs = [engine.submit(prompt, 1, prompt_logprobs=True) for _ in range(n)]
    engine.run_until_done(reqs)
    return reqs


def test_teacher_forced_nll_is_equal_in_every_layout(engine: FlyingEngine) -> None:
    prompt = TOK.encode("Teacher forcing checks the KV layout, not only greedy text. " * 3)
    dp = nll(engine, prompt, 2)
    assert {r.home for r in dp} == {(0,), (1,)}
    to_width(engine, 2)
    tp = nll(engine, prompt)
    to_width(engine, 1)
    dp_again = nll(engine, prompt)
    lps = [np.array(r.token_logprobs) for r in (*dp, *tp, *dp_again)]
    assert all(len(x) == len(prompt) - 1 for x in lps)
    for x in lps[1:]:
        assert float(np.abs(x - lps[0]).max()) <= 1e-4
        assert abs(float(x.sum() - lps[0].sum())) <= 1e-3


def test_context_length_policy_merges_only_for_requests_one_engine_cannot_hold(
        engine: FlyingEngine) -> None:
    engine.sched.policy = context_length()
    small = engine.submit(TOK.encode("fits one engine"), 8, ignore_eos=True)
    while small.finish is None:
        engine.step()
        assert engine.sched.width == 1
    big_prompt = TOK.encode("x" * 400)
    big = engine.submit(big_prompt, 200, ignore_eos=True)  # 601 tokens > 512 per engine
    assert big.min_width == 2
    engine.run_until_done([big])
    assert big.home == (0, 1) and len(big.output) == 200
    for _ in range(5):
        engine.step()
    assert engine.sched.width == 1  # released once no wide request runs or waits


def test_static_dp_cannot_hold_what_two_engines_can(engine: FlyingEngine) -> None:
    big = engine.submit(TOK.encode("y" * 400), 200, ignore_eos=True)
    for _ in range(20):
        engine.step()
    assert big.home is None and engine.sched.width == 1  # waits: no DP engine holds it
    to_width(engine, 2)
    engine.run_until_done([big])
    assert big.home == (0, 1)
    with pytest.raises(ValueError, match="KV cache"):
        engine.submit(TOK.encode("z" * 1000), 100)  # beyond even the widest group


def test_priority_policy_hard_preempts_and_dp_resumes(engine: FlyingEngine) -> None:
    base = run(engine, "background work", 24)
    a = engine.submit(TOK.encode("background work"), 24, ignore_eos=True, record_logits=True)
    for _ in range(4):
        engine.step()
    engine.sched.policy = priority(p_hi=1)
    urgent = engine.submit(TOK.encode("urgent"), 8, ignore_eos=True, priority=5)
    engine.run_until_done([urgent])
    assert urgent.home == (0, 1) and a.finish is None
    engine.run_until_done([a])
    assert engine.sched.width == 1 and a.output == base.output


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_hysteresis_policy_drives_the_engine_on_its_clock(engine: FlyingEngine) -> None:
    sched = engine.sched
    real_clock = sched.clock
    clock = FakeClock(real_clock())
    sched.clock = clock
    try:
        sched.mode_since = clock.now
        sched.policy = hysteresis(mu_tp=8.0, dwell_s=2.0)
        engine.step()
        assert sched.width == 1  # within the dwell time of the last switch
        clock.now += 3.0
        engine.step()  # idle and past the dwell: bind
        assert sched.width == 2 and sched.switches[-1].after == ((0, 1),)
        burst = [engine.submit(TOK.encode(f"burst {i}"), 8, ignore_eos=True)
                 for i in range(8)]
        engine.step()
        assert sched.width == 2 and all(r.home == (0, 1) for r in burst)  # dwell holds
        clock.now += 3.0
        more = [engine.submit(TOK.encode(f"more {i}"), 8, ignore_eos=True) for i in range(8)]
        engine.run_until_done(burst)  # 8 waiting >= 3W: release after the TP work drains
        engine.run_until_done(more)
        assert sched.width == 1 and {r.home for r in more} == {(0,), (1,)}
    finally:
        sched.policy = None
        sched.clock = real_clock


def check_invariants(engine: FlyingEngine) -> None:
    sched = engine.sched
    queued = [r for q in sched.queues for r in q]
    assert not set(map(id, queued)) & set(map(id, sched.running))
    for e, alloc in enumerate(sched.alloc):
        held = [b for r in sched.running for b in r.tables.get(e, [])]
        assert len(held) == len(set(held)) and alloc.free + len(held) == alloc.n_blocks
    assert sorted(x for g in sched.groups for x in g) == list(range(sched.n))
    for r in sched.running:
        assert r.home is not None and set(r.tables) == set(r.home)
        if r.home not in sched.groups:
            assert len(r.home) == 1  # only DP requests are ever paused


@pytest.mark.parametrize(("seed", "policy"), [(1, None), (2, None), (3, "priority"),
                                             (4, "context_length"), (5, "load_threshold")])
def test_random_switches_keep_every_invariant_and_every_output(
        engine: FlyingEngine, seed: int, policy: str | None) -> None:
    rng = np.random.default_rng(seed)
    prompts = [f"random {seed}-{i} " + "q" * int(rng.integers(1, 40)) for i in range(10)]
    lengths = [int(rng.integers(4, 30)) for _ in prompts]
    if policy == "context_length":  # two requests no single engine can hold
        prompts += [f"wide {seed}-{i} " + "w" * 400 for i in range(2)]
        lengths += [150, 150]
    refs = {}
    for p, n in zip(prompts, lengths, strict=True):
        if len(p) + 1 + n > BLOCKS * BLOCK_TOKENS:
            to_width(engine, 2)
        refs[p] = run(engine, p, n).output
        to_width(engine, 1)
    engine.sched.policy = None if policy is None else make_policy(policy)
    reqs: list[Request] = []
    pending = list(zip(prompts, lengths, strict=True))
    methods: list[Method] = ["sequential", "soft", "hard"]
    for _ in range(400):
        op = rng.random()
        if op < 0.15 and pending:
            p, n = pending.pop()
            reqs.append(engine.submit(TOK.encode(p), n, ignore_eos=True,
                                      priority=int(rng.integers(0, 2))))
        elif op < 0.25:
            engine.switch(int(rng.choice([1, 2])), methods[int(rng.integers(0, 3))])
        else:
            engine.step()
        check_invariants(engine)
        if not pending and all(r.finish is not None for r in reqs):
            break
    if policy != "context_length":
        engine.sched.policy = None
        to_width(engine, 1)  # paused DP requests resume
    engine.run_until_done(reqs)
    check_invariants(engine)
    assert len(reqs) == len(prompts)
    assert {TOK.decode(r.prompt): r.output for r in reqs} == refs
    assert all(a.free == a.n_blocks for a in engine.sched.alloc)
