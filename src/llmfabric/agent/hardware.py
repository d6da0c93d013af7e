"""Hardware discovery: GPUs from NVML (pynvml, optional) or `nvidia-smi`, else CPU only.

`discover_hardware(gpu=..., gpu_count=..., gpu_memory_gb=...)` returns a registry Hardware;
explicit values (the `--gpu`, `--gpu-count`, `--gpu-memory` flags) override what was found.
GPU names are normalised to llmfabric.sim's catalog names when it knows them ("NVIDIA H100
80GB HBM3" -> "H100-SXM"), so routing's `metadata.gpu` filter and the scheduler agree.
Discovery runs subprocesses: call it once at startup (or via asyncio.to_thread).
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from llmfabric.registry.records import Hardware
from llmfabric.sim.gpu_names import catalog_name

log = logging.getLogger(__name__)

Runner = Callable[[Sequence[str]], str]


@dataclass(frozen=True, slots=True)
class GpuInfo:
    name: str
    memory_gb: float


def _run(argv: Sequence[str]) -> str:
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=20, check=True
    ).stdout


def parse_nvidia_smi(output: str) -> list[GpuInfo]:
    """Parse `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader` output."""
    gpus = []
    for line in output.splitlines():
        if not line.strip():
            continue
        name, _, mem = line.rpartition(",")
        if not name:
            continue
        parts = mem.split()
        try:
            value = float(parts[0])
        except (IndexError, ValueError):
            continue
        unit = parts[1].lower() if len(parts) > 1 else "mib"
        gb = value * 1024**2 / 1e9 if unit == "mib" else value if unit == "gb" else value / 1e3
        gpus.append(GpuInfo(name.strip(), round(gb, 1)))
    return gpus


def gpus_from_nvidia_smi(run: Runner = _run) -> list[GpuInfo]:
    if shutil.which("nvidia-smi") is None and run is _run:
        return []
    try:
        out = run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("nvidia-smi failed (%s); assuming no GPU", exc)
        return []
    return parse_nvidia_smi(out)


def gpus_from_nvml() -> list[GpuInfo]:
    try:
        nvml: Any = importlib.import_module("pynvml")
    except ImportError:
        return []
    try:
        nvml.nvmlInit()
        try:
            gpus = []
            for i in range(nvml.nvmlDeviceGetCount()):
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                name = nvml.nvmlDeviceGetName(h)
                name = name.decode() if isinstance(name, bytes) else str(name)
                mem = nvml.nvmlDeviceGetMemoryInfo(h).total
                gpus.append(GpuInfo(name, round(float(mem) / 1e9, 1)))
            return gpus
        finally:
            nvml.nvmlShutdown()
    except Exception as exc:  # NVML missing driver etc.
        log.info("NVML unavailable (%s)", exc)
        return []


def normalize_gpu_name(name: str) -> tuple[str, str]:
    """(catalog name, interconnect) for a driver-reported name; unknown names pass through.

    Only exact catalog names and aliases count (case, spaces, dashes and a vendor prefix
    ignored; sim.gpu_names): no prefix guessing, so "NVIDIA H20" stays "H20"
    instead of becoming the catalog's H200.
    """
    raw = name.strip()
    short = raw.removeprefix("NVIDIA ").strip()
    catalog = catalog_name(raw)
    if catalog is not None:
        from llmfabric.sim.hardware import get_gpu

        return catalog, get_gpu(catalog).interconnect
    log.warning("GPU %r is not in llmfabric's GPU catalog; published as %r", raw,
                short.replace(" ", "-"))
    return short.replace(" ", "-"), "pcie"


def _memory_gb() -> float:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)
    except (ValueError, OSError, AttributeError):
        return 0.0


def discover_hardware(
    *,
    gpu: str | None = None,
    gpu_count: int | None = None,
    gpu_memory_gb: float | None = None,
    run: Runner = _run,
    use_nvml: bool = True,
) -> Hardware:
    """The node's hardware, found or overridden. `gpu="cpu"` or `gpu_count=0` means CPU only."""
    found = (gpus_from_nvml() if use_nvml else []) or gpus_from_nvidia_smi(run)
    hw = Hardware(cpu_count=os.cpu_count() or 0, memory_gb=_memory_gb())
    if found:
        model, link = normalize_gpu_name(found[0].name)
        hw = replace(
            hw,
            gpu_model=model,
            gpu_count=len(found),
            gpu_memory_gb=found[0].memory_gb,
            interconnect=link if len(found) > 1 else "none",
        )
    if gpu is not None:
        if gpu.lower() == "cpu":
            return replace(hw, gpu_model="cpu", gpu_count=0, gpu_memory_gb=0.0,
                           interconnect="none")
        model, link = normalize_gpu_name(gpu)
        hw = replace(hw, gpu_model=model, gpu_count=max(hw.gpu_count, 1),
                     interconnect=link if (gpu_count or hw.gpu_count) > 1 else "none")
        if gpu_memory_gb is None and not found:
            hw = replace(hw, gpu_memory_gb=_catalog_memory(model))
    if gpu_count is not None:
        if gpu_count == 0:
            return replace(hw, gpu_model="cpu", gpu_count=0, gpu_memory_gb=0.0,
                           interconnect="none")
        hw = replace(hw, gpu_count=gpu_count)
    if gpu_memory_gb is not None:
        hw = replace(hw, gpu_memory_gb=gpu_memory_gb)
    return hw


def _catalog_memory(model: str) -> float:
    try:
        from llmfabric.sim.hardware import get_gpu

        return round(float(get_gpu(model).mem_bytes) / 1e9, 1)
    except Exception:
        return 0.0
