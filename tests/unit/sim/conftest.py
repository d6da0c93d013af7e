from __future__ import annotations

import pytest

from llmfabric.sim import Efficiency, GPUSpec, ModelSpec


@pytest.fixture
def tiny() -> ModelSpec:
    """A small known config for hand-computed FLOPs and bytes."""
    return ModelSpec(name="tiny", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16,
                     ffn_hidden=128, vocab=100)


@pytest.fixture
def unit_gpu() -> GPUSpec:
    """1 TFLOP/s tensor, 0.1 TFLOP/s vector, 1 GB/s: easy arithmetic."""
    return GPUSpec(name="unit", fp32_flops=1e11, fp16_flops=1e12, fp8_flops=0, int8_flops=0,
                   mem_bw=1e9, mem_bytes=1e9, interconnect="pcie", intra_node_bw=1e9,
                   intra_node_latency_s=1e-6)


@pytest.fixture
def ideal() -> Efficiency:
    return Efficiency(compute=1.0, memory=1.0, vector=1.0, attention=1.0,
                      kernel_overhead_s=0.0, attention_overhead_s=0.0, step_overhead_s=0.0)
