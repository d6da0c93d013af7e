"""Hardware discovery: GPUs from NVML (pynvml, optional) or `nvidia-smi`, else CPU only.

Only the GPUs this node may use count: CUDA_VISIBLE_DEVICES (indices or GPU UUIDs, also
abbreviated ones; empty or -1 means none) filters what the driver reports, so a Slurm job
given 2 of 8 GPUs advertises 2. The interconnect comes from `nvidia-smi topo -m`: "nvlink"
when every pair of the visible GPUs is joined by NVLink (NV#), else "pcie"; one GPU: "none".

`discover_hardware(gpu=..., gpu_count=..., gpu_memory_gb=...)` returns a registry Hardware;
explicit values (the `--gpu`, `--gpu-count`, `--gpu-memory` flags) override what was found.
GPU names are normalised to llmfabric.sim's catalog names when it knows them ("NVIDIA H100
80GB HBM3" -> "H100-SXM"), so routing's `metadata.gpu` filter and the scheduler agree.
Discovery runs subprocesses: call it once at startup (or via asyncio.to_thread).
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from llmfabric.registry.records import Hardware
from llmfabric.sim.gpu_names import catalog_name
from llmfabric.untrusted import get_logger

log = get_logger(__name__)

Runner = Callable[[Sequence[str]], str]


@dataclass(frozen=True, slots=True)
class GpuInfo:
    name: str
    memory_gb: float
    index: int | None = None
    uuid: str = ""


def _run(argv: Sequence[str]) -> str:
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=20, check=True
    ).stdout


SMI_QUERY = ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader"]


def parse_nvidia_smi(output: str) -> list[GpuInfo]:
    """Parse `nvidia-smi --query-gpu=[index,uuid,]name,memory.total --format=csv,noheader`."""
    gpus = []
    for line in output.splitlines():
        if not line.strip():
            continue
        name, _, mem = line.rpartition(",")
        if not name:
            continue
        index: int | None = None
        uuid = ""
        fields = [f.strip() for f in name.split(",")]
        if len(fields) >= 3 and fields[0].isdigit() and fields[1].upper().startswith(
                ("GPU-", "MIG-")):
            index, uuid, name = int(fields[0]), fields[1], ",".join(fields[2:])
        parts = mem.split()
        try:
            value = float(parts[0])
        except (IndexError, ValueError):
            continue
        unit = parts[1].lower() if len(parts) > 1 else "mib"
        gb = value * 1024**2 / 1e9 if unit == "mib" else value if unit == "gb" else value / 1e3
        gpus.append(GpuInfo(name.strip(), round(gb, 1), index, uuid))
    return gpus


def visible_gpus(gpus: list[GpuInfo], cuda_visible: str | None) -> list[GpuInfo]:
    """The GPUs CUDA_VISIBLE_DEVICES lets this node use, in its order (None: all).

    CUDA stops at the first entry it cannot resolve, and so do we."""
    if cuda_visible is None:
        return gpus
    out: list[GpuInfo] = []
    for raw in cuda_visible.split(","):
        item = raw.strip()
        if not item or item.startswith("-"):
            break
        if item.isdigit():
            match = [g for g in gpus if g.index == int(item)] or (
                [gpus[int(item)]] if all(g.index is None for g in gpus)
                and int(item) < len(gpus) else [])
        else:
            match = [g for g in gpus if g.uuid and g.uuid.lower().startswith(item.lower())]
        if len(match) != 1 or match[0] in out:
            break
        out.append(match[0])
    return out


def parse_topology(output: str) -> dict[tuple[int, int], str]:
    """`nvidia-smi topo -m` -> {(i, j): link} for GPU pairs ("NV12", "PIX", "SYS", ...)."""
    rows = [line.split() for line in output.splitlines() if line.strip()]
    if not rows:
        return {}
    header = [h for h in rows[0] if h.startswith("GPU")]
    links: dict[tuple[int, int], str] = {}
    for row in rows[1:]:
        if not row or not row[0].startswith("GPU") or not row[0][3:].isdigit():
            continue
        i = int(row[0][3:])
        for col, cell in zip(header, row[1:], strict=False):
            if col[3:].isdigit() and int(col[3:]) != i:
                links[(i, int(col[3:]))] = cell
    return links


def interconnect_of(links: dict[tuple[int, int], str], indices: list[int]) -> str:
    """"nvlink" when every pair of `indices` has an NV# link, "pcie" otherwise; "none" for
    fewer than two GPUs."""
    if len(indices) < 2:
        return "none"
    pairs = [(a, b) for a in indices for b in indices if a != b]
    if pairs and all(links.get(p, "").upper().startswith("NV") for p in pairs):
        return "nvlink"
    return "pcie"


def gpus_from_nvidia_smi(run: Runner = _run) -> list[GpuInfo]:
    if shutil.which("nvidia-smi") is None and run is _run:
        return []
    try:
        out = run(SMI_QUERY)
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("nvidia-smi failed (%s); assuming no GPU", exc)
        return []
    return parse_nvidia_smi(out)


def topology(run: Runner = _run) -> dict[tuple[int, int], str]:
    if shutil.which("nvidia-smi") is None and run is _run:
        return {}
    try:
        return parse_topology(run(["nvidia-smi", "topo", "-m"]))
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("nvidia-smi topo -m failed (%s); interconnect from the GPU catalog", exc)
        return {}


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
                uuid = nvml.nvmlDeviceGetUUID(h)
                uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
                gpus.append(GpuInfo(name, round(float(mem) / 1e9, 1), i, uuid))
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
    env: dict[str, str] | None = None,
) -> Hardware:
    """The node's hardware, found or overridden. `gpu="cpu"` or `gpu_count=0` means CPU only."""
    environ = os.environ if env is None else env
    every = (gpus_from_nvml() if use_nvml else []) or gpus_from_nvidia_smi(run)
    found = visible_gpus(every, environ.get("CUDA_VISIBLE_DEVICES"))
    if every and not found:
        log.info("CUDA_VISIBLE_DEVICES=%r hides all %d GPUs: advertising a CPU-only node",
                 environ.get("CUDA_VISIBLE_DEVICES"), len(every))
    hw = Hardware(cpu_count=os.cpu_count() or 0, memory_gb=_memory_gb())
    if found:
        model, link = normalize_gpu_name(found[0].name)
        if len(found) > 1:
            links = topology(run)
            indices = [g.index for g in found if g.index is not None]
            if links and len(indices) == len(found):
                link = interconnect_of(links, indices)
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
    """The catalog's memory for an exact catalog name or alias; 0.0 (unknown) otherwise: no
    prefix guessing, which would give an H20 (96 GB) the H200's 141 GB."""
    from llmfabric.sim.hardware import get_gpu

    name = catalog_name(model)
    return round(float(get_gpu(name).mem_bytes) / 1e9, 1) if name is not None else 0.0
