"""GPU and model specs: lookup, YAML, config.json parsing, parameter counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmfabric.sim import (
    SpecError,
    UnknownGPUError,
    UnknownModelError,
    get_gpu,
    get_model,
    load_gpus_yaml,
    model_from_hf_config,
)
from llmfabric.sim.hardware import BUILTIN_GPUS, GPUCatalog

REQUIRED_GPUS = ["A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "GH200", "L40S",
                 "L40", "A40", "RTX-A6000", "RTX-A5000", "RTX-3090", "RTX-3090-Ti", "RTX-4090",
                 "V100", "MI300X"]


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_required_gpus_present(name: str) -> None:
    gpu = get_gpu(name)
    assert gpu.fp16_flops > 0 and gpu.mem_bw > 0 and gpu.mem_bytes > 0


@pytest.mark.parametrize(("alias", "name"), [
    ("h100", "H100-SXM"), ("H100 SXM", "H100-SXM"), ("nvidia h100_sxm", "H100-SXM"),
    ("a100", "A100-80GB"), ("A100-40gb", "A100-40GB"), ("rtx 4090", "RTX-4090"),
    ("GeForce RTX 3090 Ti", "RTX-3090-Ti"), ("mi300x", "MI300X"),
])
def test_gpu_aliases(alias: str, name: str) -> None:
    assert get_gpu(alias).name == name


def test_unknown_gpu_message_says_what_to_do() -> None:
    with pytest.raises(UnknownGPUError, match="load_gpus_yaml"):
        get_gpu("tpu-v5")


def test_builtin_gpus_ordering_sanity() -> None:
    # H200 has more bandwidth than H100 with the same compute; fp8 >= fp16 where supported
    assert get_gpu("H200").mem_bw > get_gpu("H100").mem_bw
    assert get_gpu("H200").fp16_flops == get_gpu("H100").fp16_flops
    for g in BUILTIN_GPUS:
        assert g.fp8_flops == 0 or g.fp8_flops >= g.fp16_flops
        assert g.flops(8) >= g.flops(16) >= g.flops(32) > 0


def test_yaml_gpu_from_base_and_from_scratch(tmp_path: Path) -> None:
    f = tmp_path / "gpus.yaml"
    f.write_text(
        "gpus:\n"
        "  H100-slow:\n    base: H100\n    mem_bw_gbs: 1000\n"
        "  MyCard:\n    fp16_tflops: 100\n    mem_bw_gbs: 500\n    memory_gb: 16\n"
        "    aliases: [mine]\n"
    )
    catalog = GPUCatalog(BUILTIN_GPUS)
    specs = load_gpus_yaml(f, catalog)
    assert [s.name for s in specs] == ["H100-slow", "MyCard"]
    slow = catalog.get("h100-slow")
    assert slow.mem_bw == 1000e9 and slow.fp16_flops == get_gpu("H100").fp16_flops
    assert catalog.get("mine").mem_bytes == 16e9


def test_yaml_rejects_unknown_keys(tmp_path: Path) -> None:
    f = tmp_path / "gpus.yaml"
    f.write_text("gpus:\n  X:\n    fp16_tflops: 1\n    warp_speed: 9\n")
    with pytest.raises(SpecError, match="warp_speed"):
        load_gpus_yaml(f, GPUCatalog())


@pytest.mark.parametrize(("name", "billions"), [
    ("llama-2-7b", 6.74), ("llama-2-13b", 13.0), ("llama-2-70b", 69.0), ("llama-3.1-8b", 8.03),
    ("llama-3.1-70b", 70.6), ("qwen3-1.7b", 1.72), ("qwen3-32b", 32.8), ("mixtral-8x7b", 46.7),
    ("opt-66b", 65.7), ("opt-175b", 174.6), ("llama-30b", 32.5), ("codellama-34b", 33.7),
])
def test_preset_parameter_counts(name: str, billions: float) -> None:
    assert get_model(name).total_params() / 1e9 == pytest.approx(billions, rel=0.03)


def test_mixtral_active_parameters() -> None:
    assert get_model("mixtral-8x7b").active_params() / 1e9 == pytest.approx(12.9, rel=0.03)


@pytest.mark.parametrize("alias", ["Llama-3.1-8B", "meta-llama/Meta-Llama-3-8B", "llama3-8b",
                                   "LLAMA-3.1-8B-Instruct"])
def test_model_aliases(alias: str) -> None:
    assert get_model(alias).name == "llama-3.1-8b"


def test_unknown_model() -> None:
    with pytest.raises(UnknownModelError, match=r"config\.json"):
        get_model("gpt-5")


def test_hf_config_parsing_gqa_tied_and_quant(tmp_path: Path) -> None:
    cfg = {"model_type": "qwen3", "hidden_size": 2048, "num_hidden_layers": 28,
           "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
           "intermediate_size": 6144, "vocab_size": 151936, "tie_word_embeddings": True,
           "max_position_embeddings": 40960,
           "quantization_config": {"quant_method": "awq", "bits": 4}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = get_model(path)
    preset = get_model("qwen3-1.7b")
    assert spec.weight_bits == 4
    assert spec.total_params() == preset.total_params()
    assert spec.kv_dim == 8 * 128 and spec.q_dim == 16 * 128 and spec.tied_embeddings
    assert get_model(tmp_path).n_layers == 28  # directory holding config.json


def test_hf_config_opt_is_not_gated() -> None:
    spec = model_from_hf_config({"model_type": "opt", "hidden_size": 512, "num_hidden_layers": 2,
                                 "num_attention_heads": 8, "ffn_dim": 2048, "vocab_size": 100})
    assert not spec.gated_mlp and spec.n_kv_heads == 8 and spec.tied_embeddings


def test_invalid_model_spec() -> None:
    with pytest.raises(SpecError):
        get_model("llama-2-7b").with_quantization(weight_bits=3)
