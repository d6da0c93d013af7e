"""The layout laws on a TRAINED tiny model: a checkpoint trained for a few seconds on CPU
(engines/torchref/train.py) continues its training text, and DP and TP agree on it token for
token, before and after a switch, with a DP request paused across a TP episode."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

from llmfabric.engines.torchref.config import ByteTokenizer, ModelConfig, load_config
from llmfabric.engines.torchref.engine import EngineOptions, FlyingEngine
from llmfabric.engines.torchref.scheduler import Request
from llmfabric.engines.torchref.train import DEFAULT_TEXT, save_checkpoint, train
from llmfabric.engines.torchref.weights import init_weights, weights_to_state

from ._torchref import to_width

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOK = ByteTokenizer()
HEAD, N = 40, 32  # prompt: the text's first 40 bytes; then 32 generated


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> ModelConfig:
    cfg = load_config("tiny-llama")
    res = train(cfg, steps=200)
    assert res.final_loss < 0.05 < res.first_loss  # it learned the text
    path = tmp_path_factory.mktemp("ckpt") / "tiny.pt"
    save_checkpoint(res.weights, path)
    return replace(cfg, checkpoint=str(path))


@pytest.fixture(scope="module")
def engine(trained: ModelConfig) -> Iterator[FlyingEngine]:
    with FlyingEngine(EngineOptions(config=trained, dp=2, widths=(1, 2), n_blocks=32,
                                    block_tokens=16)) as eng:
        yield eng


def run(engine: FlyingEngine, text: str, n: int = N) -> Request:
    r = engine.submit(TOK.encode(text), n, ignore_eos=True, record_logits=True)
    engine.run_until_done([r])
    return r


def test_the_checkpoint_continues_its_text_at_every_width(engine: FlyingEngine) -> None:
    want = list(DEFAULT_TEXT.encode())[HEAD:HEAD + N]
    to_width(engine, 1)
    dp = run(engine, DEFAULT_TEXT[:HEAD])
    to_width(engine, 2)
    tp = run(engine, DEFAULT_TEXT[:HEAD])
    # the engine's paged, sharded forward is the maths the trainer used
    assert dp.output == want and tp.output == want
    assert max(float(np.abs(a - b).max()) for a, b in zip(dp.logits, tp.logits, strict=True)
               ) <= 1e-4
    to_width(engine, 1)


def test_dp_and_tp_agree_on_other_prompts_before_and_after_switches(
        engine: FlyingEngine) -> None:
    prompts = ["Flying", "tensor parallel groups and", "zzz unseen bytes \u2713"]
    to_width(engine, 1)
    before = [run(engine, p) for p in prompts]
    to_width(engine, 2)
    tp = [run(engine, p) for p in prompts]
    to_width(engine, 1)
    after = [run(engine, p) for p in prompts]
    for a, b, c in zip(before, tp, after, strict=True):
        assert a.output == b.output == c.output
        assert all(np.array_equal(x, y) for x, y in zip(a.logits, c.logits, strict=True))
        assert max(float(np.abs(x - y).max()) for x, y in zip(a.logits, b.logits, strict=True)
                   ) <= 1e-4


def test_a_paused_dp_request_finishes_exactly_on_the_trained_model(
        engine: FlyingEngine) -> None:
    to_width(engine, 1)
    base = run(engine, DEFAULT_TEXT[:HEAD])
    a = engine.submit(TOK.encode(DEFAULT_TEXT[:HEAD]), N, ignore_eos=True, record_logits=True)
    for _ in range(6):
        engine.step()
    made = len(a.output)
    assert 0 < made < N
    engine.switch(2, "hard")
    b = engine.submit(TOK.encode("releases them"), 8, ignore_eos=True)
    while b.finish is None:
        engine.step()
        assert len(a.output) == made  # paused with its KV while the group runs
    to_width(engine, 1)
    engine.run_until_done([a])
    assert a.output == base.output
    assert all(np.array_equal(x, y) for x, y in zip(a.logits, base.logits, strict=True))


def test_a_checkpoint_of_the_wrong_shape_is_refused(tmp_path: pathlib.Path) -> None:
    micro = load_config("micro-llama")
    path = tmp_path / "micro.pt"
    torch.save(weights_to_state(init_weights(micro)), str(path))
    with pytest.raises(ValueError, match="missing"):  # tiny-llama has 4 layers, micro 2
        init_weights(replace(load_config("tiny-llama"), checkpoint=str(path)))
    state = weights_to_state(init_weights(micro))
    state["norm"] = torch.ones(3)
    torch.save(state, str(path))
    with pytest.raises(ValueError, match="shape"):
        init_weights(replace(micro, checkpoint=str(path)))
    torch.save([1, 2], str(path))
    with pytest.raises(ValueError, match="named tensors"):
        init_weights(replace(micro, checkpoint=str(path)))
    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="readable"):
        init_weights(replace(micro, checkpoint=str(path)))


def test_the_cli_refuses_a_bad_checkpoint_before_starting_engines(
        tmp_path: pathlib.Path) -> None:
    from click.testing import CliRunner

    from llmfabric.cli.engine import command

    path = tmp_path / "bad.pt"
    path.write_bytes(b"garbage")
    out = CliRunner().invoke(command, ["torch", "--checkpoint", str(path), "--port", "1"])
    assert out.exit_code != 0 and "not a readable checkpoint" in out.output
