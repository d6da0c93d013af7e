"""The torch engine's torch-free parts: model configs (presets, HF config.json, hostile files),
the byte tokenizer and the KV block allocator."""

from __future__ import annotations

import json
import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.engines.torchref.blocks import BlockAllocator
from llmfabric.engines.torchref.config import (
    BOS,
    EOS,
    PRESETS,
    ByteTokenizer,
    StreamDecoder,
    from_hf_config,
    load_config,
)

pytestmark = pytest.mark.unit


def test_presets_are_small_and_shard_to_their_widths() -> None:
    tiny = PRESETS["tiny-llama"]
    assert tiny.params() <= 2_000_000
    for w in (1, 2, 4):
        tiny.check_width(w)
    with pytest.raises(ValueError, match="width 8"):
        tiny.check_width(8)
    assert load_config("tiny-llama", seed=7).seed == 7


def test_hf_config_json(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 1024}))
    cfg = load_config(str(path))
    assert (cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim) == (64, 2, 4, 2, 16)
    assert cfg.rope_theta == 500000.0 and cfg.max_model_len == 1024


@pytest.mark.parametrize("body", [
    "[]", "not json at all", json.dumps({"hidden_size": 64}),
    json.dumps({"hidden_size": 60, "num_hidden_layers": 2, "num_attention_heads": 7,
                "intermediate_size": 8}),
    json.dumps({"hidden_size": 64, "num_hidden_layers": 0, "num_attention_heads": 4,
                "intermediate_size": 8}),
    json.dumps({"hidden_size": "x", "num_hidden_layers": 2, "num_attention_heads": 4,
                "intermediate_size": 8}),
])
def test_hostile_config_files_are_rejected(tmp_path: pathlib.Path, body: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(body)
    with pytest.raises(ValueError):
        from_hf_config(path)


def test_unknown_config_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="preset"):
        load_config("gpt-17")


@given(st.text(max_size=200))
def test_tokenizer_round_trips_any_text(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids[0] == BOS and all(0 <= i < 256 for i in ids[1:])
    assert tok.decode(ids) == text
    dec = StreamDecoder()
    assert "".join(dec.piece(i) for i in [*ids, EOS]) + dec.flush() == text


def test_chat_prompt_marks_roles() -> None:
    tok = ByteTokenizer()
    text = tok.decode(tok.chat_prompt([("system", "be brief"), ("user", "hi")]))
    assert text == "<system>be brief\n<user>hi\n<assistant>"


@given(st.lists(st.integers(1, 20), max_size=30))
def test_block_allocator_never_hands_out_a_block_twice(sizes: list[int]) -> None:
    alloc = BlockAllocator(64, 16)
    held: list[list[int]] = []
    for i, n in enumerate(sizes):
        if i % 3 == 2 and held:
            alloc.release(held.pop(0))
        if n <= alloc.free:
            held.append(alloc.allocate(n))
        else:
            with pytest.raises(MemoryError):
                alloc.allocate(n)
        flat = [b for h in held for b in h]
        assert len(flat) == len(set(flat)) and alloc.free == 64 - len(flat)
    assert alloc.blocks_for(33, 1) == 3 and alloc.blocks_for(33, 2) == 2
