from __future__ import annotations

import os
import pathlib
import stat
from collections.abc import Sequence

import pytest

from llmfabric.agent.hardware import discover_hardware, parse_nvidia_smi

SMI = "NVIDIA H100 80GB HBM3, 81559 MiB\nNVIDIA H100 80GB HBM3, 81559 MiB\n"


def fake_run(output: str):  # type: ignore[no-untyped-def]
    def run(argv: Sequence[str]) -> str:
        assert argv[0] == "nvidia-smi"
        return output
    return run


def test_parse_nvidia_smi() -> None:
    gpus = parse_nvidia_smi(SMI + "\n garbage line\n")
    assert [(g.name, g.memory_gb) for g in gpus] == [("NVIDIA H100 80GB HBM3", 85.5)] * 2


def test_gpus_found_and_normalised() -> None:
    hw = discover_hardware(run=fake_run(SMI), use_nvml=False)
    assert hw.gpu_count == 2 and hw.gpu_memory_gb == 85.5
    assert hw.gpu_model in ("H100-SXM", "H100-80GB-HBM3")  # catalog name when sim knows it
    assert hw.cpu_count == (os.cpu_count() or 0)


def test_overrides() -> None:
    hw = discover_hardware(run=fake_run(SMI), use_nvml=False, gpu_count=1, gpu_memory_gb=40)
    assert (hw.gpu_count, hw.gpu_memory_gb) == (1, 40)
    cpu = discover_hardware(run=fake_run(SMI), use_nvml=False, gpu="cpu")
    assert (cpu.gpu_model, cpu.gpu_count) == ("cpu", 0)
    none = discover_hardware(run=fake_run(""), use_nvml=False)
    assert (none.gpu_model, none.gpu_count) == ("cpu", 0)
    forced = discover_hardware(run=fake_run(""), use_nvml=False, gpu="A100-80GB", gpu_count=4)
    assert (forced.gpu_model, forced.gpu_count) == ("A100-80GB", 4)
    assert forced.gpu_memory_gb == 80.0  # from the GPU catalog
    unknown = discover_hardware(run=fake_run(""), use_nvml=False, gpu="NVIDIA H20")
    assert (unknown.gpu_model, unknown.gpu_memory_gb) == ("H20", 0.0)  # not in the catalog


def test_real_nvidia_smi_binary_on_path(tmp_path: pathlib.Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\necho 'NVIDIA A100-SXM4-80GB, 81920 MiB'\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    hw = discover_hardware(use_nvml=False)
    assert hw.gpu_count == 1 and hw.gpu_memory_gb == pytest.approx(85.9, abs=0.1)
    assert "A100" in hw.gpu_model


# Captured-style output of an 8-GPU HGX box (index, uuid, name, memory) and its topology.
SMI8 = "\n".join(f"{i}, GPU-{i:x}a1b2c3d-0000-1111-2222-33334444555{i}, NVIDIA H100 80GB HBM3, "
                 "81559 MiB" for i in range(8)) + "\n"
TOPO_NVLINK = """\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\tNV18\tNV18\t0-55\t0\t\tN/A
GPU1\tNV18\t X \tNV18\tNV18\t0-55\t0\t\tN/A
GPU2\tNV18\tNV18\t X \tNV18\t0-55\t0\t\tN/A
GPU3\tNV18\tNV18\tNV18\t X \t0-55\t0\t\tN/A

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes
  NV#  = Connection traversing a bonded set of # NVLinks
"""
TOPO_PCIE = """\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity
GPU0\t X \tPIX\tSYS\t0-15\t0
GPU1\tPIX\t X \tNV4\t0-15\t0
GPU2\tSYS\tNV4\t X \t16-31\t1
"""


def test_parse_indexed_query_and_topology() -> None:
    from llmfabric.agent.hardware import interconnect_of, parse_topology

    gpus = parse_nvidia_smi(SMI8)
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[3].uuid.startswith("GPU-3a1b2c3d") and gpus[3].name == "NVIDIA H100 80GB HBM3"
    links = parse_topology(TOPO_NVLINK)
    assert links[(0, 3)] == "NV18" and (0, 0) not in links
    assert interconnect_of(links, [0, 1, 2, 3]) == "nvlink"
    pcie = parse_topology(TOPO_PCIE)
    assert interconnect_of(pcie, [0, 1]) == "pcie"
    assert interconnect_of(pcie, [1, 2]) == "nvlink"
    assert interconnect_of(pcie, [2]) == "none"


def _runner(smi: str, topo: str):  # type: ignore[no-untyped-def]
    def run(argv: Sequence[str]) -> str:
        return topo if "topo" in argv else smi
    return run


def test_cuda_visible_devices_respected() -> None:
    run = _runner(SMI8, TOPO_PCIE)
    all8 = discover_hardware(run=run, use_nvml=False, env={})
    assert all8.gpu_count == 8
    two = discover_hardware(run=run, use_nvml=False, env={"CUDA_VISIBLE_DEVICES": "1,2"})
    assert (two.gpu_count, two.interconnect) == (2, "nvlink")  # GPU1-GPU2 are NV4
    pix = discover_hardware(run=run, use_nvml=False, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert (pix.gpu_count, pix.interconnect) == (2, "pcie")
    by_uuid = discover_hardware(run=run, use_nvml=False,
                                env={"CUDA_VISIBLE_DEVICES": "GPU-5a1b2c3d"})
    assert (by_uuid.gpu_count, by_uuid.interconnect) == (1, "none")
    for hidden in ("", "-1", "NoDevFiles"):
        cpu = discover_hardware(run=run, use_nvml=False, env={"CUDA_VISIBLE_DEVICES": hidden})
        assert (cpu.gpu_model, cpu.gpu_count, cpu.gpu_memory_gb) == ("cpu", 0, 0.0), hidden
    # CUDA stops at the first index it cannot resolve
    stop = discover_hardware(run=run, use_nvml=False, env={"CUDA_VISIBLE_DEVICES": "3,99,4"})
    assert stop.gpu_count == 1


def test_unknown_names_fall_back_and_bugs_are_not_swallowed(tmp_path) -> None:
    """Unknown GPUs and models fall back to a default (narrow excepts, not `Exception`)."""
    from llmfabric.agent.hardware import _catalog_memory
    from llmfabric.engines.timing import model_max_context

    assert _catalog_memory("no-such-gpu-9000") == 0.0
    assert _catalog_memory("H100-SXM") > 0
    assert model_max_context("no-such-model-xyz", default=1234) == 1234
    assert model_max_context("llama-3.1-8b") > 4096
    broken = tmp_path / "config.json"
    broken.write_text("{not json")
    assert model_max_context(str(broken), default=77) == 77
