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
from llmfabric.sim.calibration import CALIBRATED, DEFAULT_EFFICIENCY, efficiency_for
from llmfabric.sim.collectives import FITTED, allreduce_model, fitted_allreduce, ring_model
from llmfabric.sim.gpu_names import catalog_name
from llmfabric.sim.hardware import BUILTIN_GPUS, DEFAULT_CATALOG, GPUCatalog, read_gpus_yaml

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
    catalog = load_gpus_yaml(f)
    assert catalog.names()[-2:] == ["H100-slow", "MyCard"]
    slow = catalog.get("h100-slow")
    assert slow.mem_bw == 1000e9 and slow.fp16_flops == get_gpu("H100").fp16_flops
    assert catalog.get("mine").mem_bytes == 16e9
    assert get_gpu("mine", catalog) is catalog.get("mine")


def test_loading_gpus_leaves_the_default_catalog_alone(tmp_path: Path) -> None:
    """Catalogs are immutable: a YAML file gives a new catalog; the built-in one (and every
    cache keyed on it, e.g. sim.gpu_names) never sees the user's GPUs."""
    f = tmp_path / "gpus.yaml"
    f.write_text("gpus:\n  H100-SXM:\n    base: H100-SXM\n    mem_bw_gbs: 1\n"
                 "  Zcard:\n    base: H100-SXM\n    aliases: [zc]\n"
                 "  Zcard-2:\n    base: zc\n    memory_gb: 7\n")
    before = DEFAULT_CATALOG.specs()
    catalog = load_gpus_yaml(f)
    assert DEFAULT_CATALOG.specs() == before and get_gpu("H100-SXM").mem_bw == 3350e9
    assert catalog.get("H100-SXM").mem_bw == 1e9  # a user row overrides a built-in name
    assert catalog.get("Zcard-2").mem_bytes == 7e9  # a base may name an earlier row
    assert [g.name for g in read_gpus_yaml(f)] == ["H100-SXM", "Zcard", "Zcard-2"]
    with pytest.raises(UnknownGPUError):
        get_gpu("Zcard")
    assert catalog_name("zc") is None and catalog_name("zc", catalog) == "Zcard"
    assert not hasattr(catalog, "register")


def test_yaml_gpu_on_a_base_inherits_its_calibration(tmp_path: Path) -> None:
    """A GPU built on `base: H100-SXM` uses the H100's fitted efficiency factors (they are
    fractions of its own peaks) and, while it keeps the H100's NVLink, its fitted all-reduce;
    a different link is priced by the ring formula. `calibration:` names a row explicitly."""
    f = tmp_path / "gpus.yaml"
    f.write_text(
        "gpus:\n"
        "  H100-NVL-ish:\n    base: H100-SXM\n    mem_bw_gbs: 3900\n    memory_gb: 94\n"
        "  H100-bridge:\n    base: H100-SXM\n    interconnect: pcie\n"
        "    intra_node_bw_gbs: 64\n"
        "  Own:\n    fp16_tflops: 300\n    mem_bw_gbs: 2000\n    memory_gb: 80\n"
        "    calibration: a100\n"
        "  Plain:\n    fp16_tflops: 300\n    mem_bw_gbs: 2000\n    memory_gb: 80\n"
    )
    catalog = load_gpus_yaml(f, GPUCatalog(BUILTIN_GPUS))
    nvl, bridge = catalog.get("H100-NVL-ish"), catalog.get("H100-bridge")
    assert nvl.calibration_of == "H100-SXM" and nvl.mem_bw == 3900e9
    assert efficiency_for(nvl) is CALIBRATED["H100-SXM"]
    assert efficiency_for(bridge) is CALIBRATED["H100-SXM"]
    assert fitted_allreduce(nvl) is FITTED["H100-SXM"]
    assert fitted_allreduce(bridge) is None  # PCIe, not the H100's NVLink: ring formula
    assert allreduce_model(bridge) == ring_model(64e9, bridge.intra_node_latency_s)
    assert efficiency_for(catalog.get("Own")) is CALIBRATED["A100-80GB"]
    assert efficiency_for(catalog.get("Plain")) is DEFAULT_EFFICIENCY
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus:\n  X:\n    base: H100\n    calibration: tpu-v9\n")
    with pytest.raises(SpecError, match="calibration"):
        load_gpus_yaml(bad, GPUCatalog(BUILTIN_GPUS))


def test_gh200_gpus_talk_over_nvlink_4() -> None:
    """GH200's NVLink-C2C (900 GB/s) links its Grace CPU to its Hopper GPU; GPU to GPU
    (NVL2, NVLink Switch systems) goes over the Hopper's NVLink 4 ports: 900 GB/s both
    directions, 450 GB/s each way, as on H100 SXM."""
    gh200, h100 = get_gpu("GH200"), get_gpu("H100-SXM")
    assert gh200.interconnect == "nvlink" and gh200.intra_node_bw == h100.intra_node_bw == 450e9


@pytest.mark.parametrize(("name", "mib"), [("RTX-A6000", 49140), ("RTX-A5000", 24564),
                                         ("RTX-3090-Ti", 24564)])
def test_gddr_cards_hold_the_cuda_reported_memory(name: str, mib: int) -> None:
    """nvidia-smi's total (what gpu_memory_utilization is a share of), not 48e9 / 24e9."""
    assert get_gpu(name).mem_bytes == mib * 2**20
    assert get_gpu(name).mem_bytes > (48e9 if mib > 40000 else 24e9) * 1.07


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


@pytest.mark.parametrize(("body", "match"), [
    ("base: H100\n    mem_bw_gbs: 0", "'X': mem_bw_gbs must be a finite number > 0, got 0"),
    ("base: H100\n    mem_bw_gbs: -100", "'X': mem_bw_gbs must be a finite number > 0"),
    ("base: H100\n    mem_bw_gbs: .nan", "'X': mem_bw_gbs must be a finite number > 0"),
    ("base: H100\n    memory_gb: .inf", "'X': memory_gb must be a finite number > 0"),
    ("base: H100\n    sm_count: .inf", "'X': sm_count must be a finite number >= 0"),
    ("base: H100\n    sm_count: 1.5", "'X': sm_count must be a whole number"),
    ("base: H100\n    price_per_hour: true", "'X': price_per_hour must be a number"),
    ("base: H100\n    aliases: 5", "'X': aliases must be a list of names"),
    ("base: H100\n    aliases: mygpu", "'X': aliases must be a list of names"),
    ("base: H100\n    aliases: [ok, {a: 1}]", "'X': aliases must be a list of names"),
    ("base: H100\n    fp16_tflops: 0\n    fp32_tflops: 0", "'X': fp16_tflops or fp32_tflops"),
    ("fp16_tflops: 0\n    mem_bw_gbs: 1\n    memory_gb: 1", "'X': fp16_tflops or fp32_tflops"),
])
def test_yaml_refuses_bad_numbers_and_aliases(tmp_path: Path, body: str, match: str) -> None:
    f = tmp_path / "gpus.yaml"
    f.write_text(f"gpus:\n  X:\n    {body}\n")
    with pytest.raises(SpecError, match=match):
        load_gpus_yaml(f, GPUCatalog(BUILTIN_GPUS))


def test_yaml_zero_means_unknown_or_not_native(tmp_path: Path) -> None:
    f = tmp_path / "gpus.yaml"
    f.write_text("gpus:\n  X:\n    base: H100\n    fp8_tflops: 0\n    sm_count: 0\n"
                 "    l2_mb: 0\n    price_per_hour: 0\n    aliases: [my-x, 5090]\n")
    x = load_gpus_yaml(f, GPUCatalog(BUILTIN_GPUS)).get("5090")
    assert (x.name, x.fp8_flops, x.sm_count, x.aliases) == ("X", 0.0, 0, ("my-x", "5090"))
