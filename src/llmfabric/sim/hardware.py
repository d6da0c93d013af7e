"""GPU specs: peak dense FLOP/s per dtype, HBM bandwidth and size, interconnect, price.

Every built-in row cites its spec source in docs/simulator.md (table "GPU specs"). Figures are
DENSE tensor-core peaks (no 2:4 sparsity). GeForce cards are given with FP32 accumulation, the
mode inference engines use. Bandwidths are bytes/s; intra-node bandwidth is per GPU, one
direction. Users add or override GPUs in YAML with `load_gpus_yaml`, which returns a NEW
catalog: a `GPUCatalog` is immutable and passed explicitly to whoever needs it (the built-in
`DEFAULT_CATALOG` is built once and never changes, so caches keyed on it stay true).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from llmfabric.sim.errors import ADD_GPUS_HINT, SpecError, UnknownGPUError
from llmfabric.yamlfile import YAMLFileError, read_yaml

TERA = 1e12
GB = 1e9
GIB = 1024**3
MIB = 1024**2  # cache sizes: the vendors' "MB" of an on-chip cache is 2^20 bytes


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One accelerator. FLOP/s are dense peaks; 0 means the dtype is not supported natively."""

    name: str
    fp32_flops: float
    fp16_flops: float  # fp16 / bf16 tensor core, dense
    fp8_flops: float
    int8_flops: float
    mem_bw: float  # HBM/GDDR bytes/s
    mem_bytes: float
    interconnect: str  # GPU-to-GPU link: "nvlink", "pcie", "xgmi"
    intra_node_bw: float  # bytes/s per GPU, one direction
    intra_node_latency_s: float = 5e-6
    inter_node_bw: float = 25 * GB  # typical: 200 Gb/s InfiniBand/RoCE per GPU
    inter_node_latency_s: float = 10e-6
    price_per_hour: float | None = None
    aliases: tuple[str, ...] = ()
    l2_bytes: float = 0.0  # last-level on-chip cache (L2; MI300X: Infinity Cache); 0 = unknown
    sm_count: int = 0  # streaming multiprocessors (AMD: compute units); 0 = unknown
    # the built-in GPU whose fitted calibration (efficiency factors, all-reduce) this one uses
    # when it has none of its own: set for YAML GPUs built on `base:`; "" = none
    calibration_of: str = ""
    fp4_flops: float = 0.0  # FP4 (NVFP4/MXFP4) tensor core, dense; 0 = not native (Blackwell+)

    def flops(self, dtype_bits: int) -> float:
        """Peak dense matmul FLOP/s for operands of `dtype_bits` (falls back to a wider dtype)."""
        if dtype_bits <= 4 and self.fp4_flops > 0:
            return self.fp4_flops
        if dtype_bits <= 8:
            best = self.fp8_flops if self.fp8_flops > 0 else self.int8_flops
            return best if best > 0 else self.fp16_flops
        if dtype_bits <= 16:
            return self.fp16_flops if self.fp16_flops > 0 else self.fp32_flops
        return self.fp32_flops


def _g(
    name: str,
    fp32: float,
    fp16: float,
    fp8: float,
    int8: float,
    bw_gbs: float,
    mem_gb: float,
    link: str,
    link_gbs: float,
    price: float | None,
    *aliases: str,
    inter_gbs: float = 25.0,
    l2_mb: float = 0.0,
    sms: int = 0,
    fp4: float = 0.0,
    cuda_mib: float = 0.0,
) -> GPUSpec:
    return GPUSpec(
        name=name,
        fp32_flops=fp32 * TERA,
        fp16_flops=fp16 * TERA,
        fp8_flops=fp8 * TERA,
        int8_flops=int8 * TERA,
        mem_bw=bw_gbs * GB,
        mem_bytes=cuda_mib * MIB if cuda_mib > 0 else mem_gb * GB,
        interconnect=link,
        intra_node_bw=link_gbs * GB,
        intra_node_latency_s=2e-6 if link.startswith("nvlink") or link == "xgmi" else 5e-6,
        inter_node_bw=inter_gbs * GB,
        price_per_hour=price,
        aliases=aliases,
        l2_bytes=l2_mb * MIB,
        sm_count=sms,
        fp4_flops=fp4 * TERA,
    )


# name, fp32, fp16/bf16, fp8, int8 (TFLOP/s dense), HBM GB/s, memory GB, link, link GB/s per
# direction, indicative on-demand $/h (None: not offered by the cited price list), aliases;
# l2_mb: L2 (last-level on-chip) cache in "MB" as the same sources state it, which for caches
# is 2^20 bytes (CUDA reports 52,428,800 bytes for the H100's "50 MB" and 41,943,040 for the
# A100's "40 MB", docs/simulator.md); sms: streaming multiprocessors (MI300X: compute units).
BUILTIN_GPUS: tuple[GPUSpec, ...] = (
    _g("A100-40GB", 19.5, 312, 0, 624, 1555, 40, "nvlink", 300, 1.29,
       "a100-40", "a100-sxm4-40gb", "a100_40gb", l2_mb=40, sms=108),
    _g("A100-80GB", 19.5, 312, 0, 624, 2039, 80, "nvlink", 300, 1.79,
       "a100", "a100-80", "a100-sxm", "a100_sxm", "a100-sxm4-80gb", "a100_80gb",
       l2_mb=40, sms=108),
    _g("H100-SXM", 67, 989, 1979, 1979, 3350, 80, "nvlink", 450, 2.99,
       "h100", "h100-sxm5", "h100_sxm", "h100-80gb-hbm3", l2_mb=50, sms=132),
    _g("H100-PCIe", 51, 756, 1513, 1513, 2000, 80, "pcie", 64, 2.49,
       "h100-pcie-80gb", "h100_pcie", l2_mb=50, sms=114),
    _g("H200", 67, 989, 1979, 1979, 4800, 141, "nvlink", 450, None,
       "h200-sxm", "h200_sxm", "h200-141gb", l2_mb=50, sms=132),
    _g("GH200", 67, 989, 1979, 1979, 4000, 96, "nvlink", 450, 1.49,
       "gh200-96gb", "gh200_480gb", "grace-hopper", l2_mb=50, sms=132),
    # Blackwell. HGX B200 (1000 W) and the B200 of a GB200 NVL72 (1200 W): dense peaks from
    # NVIDIA's HGX/DGX B200 and GB200 NVL72 datasheets (per-GPU = system figure / GPUs, halved
    # for sparsity), tabulated per GPU at https://glennklockwood.com/garden/processors/B200;
    # HBM3e 8 TB/s; B200 180 GB (HGX B200: 1,440 GB for 8 GPUs), GB200 186 GB (NVL72: 13.4 TB
    # for 72); NVLink 5: 1.8 TB/s both directions = 900 GB/s each way; 148 SMs. L2 is left
    # unknown (0): it is used only to predict warm-cache microbenchmarks.
    # Memory: the datasheet's "180 GB" is what CUDA reports in GiB (nvidia-smi: 183,359 MiB =
    # 192.3e9 bytes), not 180e9 bytes; `cuda_mib` is that reported total (the KV cache of a
    # long-output run near the limit depends on those 12 GB).
    _g("B200", 80, 2250, 4500, 4500, 8000, 180, "nvlink", 900, None,
       "b200-sxm", "b200_sxm", "hgx-b200", "b200-180gb", sms=148, fp4=9000, cuda_mib=183359),
    _g("GB200", 90, 2500, 5000, 5000, 8000, 186, "nvlink", 900, None,
       "gb200-nvl72", "gb200_nvl72", "gb200-b200", sms=148, fp4=10000),
    _g("L40S", 91.6, 362, 733, 733, 864, 48, "pcie", 32, None, "l40s-48gb", l2_mb=96, sms=142),
    _g("L40", 90.5, 181, 362, 362, 864, 48, "pcie", 32, None, "l40-48gb", l2_mb=96, sms=142),
    _g("A40", 37.4, 149.7, 0, 299.3, 696, 48, "pcie", 32, None, "a40-48gb", l2_mb=6, sms=84),
    # RTX A6000 / A5000 / 3090 Ti: the datasheets' "48 GB" / "24 GB" are GiB; nvidia-smi
    # reports 49,140 / 24,564 / 24,564 MiB (51.5e9 / 25.8e9 bytes), what vLLM's
    # gpu_memory_utilization is a share of (docs/simulator.md, GPU specs). The A40 keeps 48e9:
    # with ECC on, its data-centre default, nvidia-smi reports 46,068 MiB = 48.3e9 bytes.
    _g("RTX-A6000", 38.7, 154.8, 0, 309.7, 768, 48, "pcie", 32, 0.80,
       "a6000", "rtx a6000", "rtx-a6000-48gb", l2_mb=6, sms=84, cuda_mib=49140),
    _g("RTX-A5000", 27.8, 111.1, 0, 222.2, 768, 24, "pcie", 32, None, "a5000", "rtx a5000",
       l2_mb=6, sms=64, cuda_mib=24564),
    _g("RTX-3090", 35.6, 71, 0, 284, 936, 24, "pcie", 32, None,
       "3090", "rtx3090", "geforce rtx 3090", inter_gbs=1.25, l2_mb=6, sms=82),
    _g("RTX-3090-Ti", 40, 80, 0, 320, 1008, 24, "pcie", 32, None,
       "3090ti", "3090-ti", "rtx3090ti", "geforce rtx 3090 ti", inter_gbs=1.25, l2_mb=6, sms=84,
       cuda_mib=24564),
    _g("RTX-4090", 82.6, 165.2, 330.3, 660.6, 1008, 24, "pcie", 32, None,
       "4090", "rtx4090", "geforce rtx 4090", inter_gbs=1.25, l2_mb=72, sms=128),
    _g("V100-SXM2-32GB", 15.7, 125, 0, 0, 900, 32, "nvlink", 150, None,
       "v100", "v100-32gb", "v100-sxm2", "tesla v100", l2_mb=6, sms=80),
    _g("MI300X", 163.4, 1307.4, 2614.9, 2614.9, 5300, 192, "xgmi", 448, None,
       "mi300", "amd mi300x", "instinct mi300x", l2_mb=256, sms=304),
)


def builtin_gpu(name: str) -> GPUSpec | None:
    """The built-in row named `name` (exact GPUSpec name), whatever the catalog overrides."""
    return next((g for g in BUILTIN_GPUS if g.name == name), None)


def _norm(name: str) -> str:
    """Canonical lookup key: lower case, no spaces/underscores/dashes, no vendor prefix."""
    key = name.strip().lower()
    key = re.sub(r"^(nvidia|amd|geforce|tesla|instinct)[\s_-]+", "", key)
    key = re.sub(r"^(nvidia|amd|geforce|tesla|instinct)[\s_-]+", "", key)
    return re.sub(r"[\s_\-]+", "", key)


class GPUCatalog:
    """Name -> GPUSpec with forgiving, case-insensitive lookup (names and aliases). Immutable:
    `with_gpus` returns a new catalog, so a catalog can key a cache (by identity)."""

    __slots__ = ("_by_key", "_specs")

    def __init__(self, specs: Iterable[GPUSpec] = ()) -> None:
        by_name: dict[str, GPUSpec] = {}
        by_key: dict[str, str] = {}
        for spec in specs:  # a later row with an earlier name overrides it (user over built-in)
            by_name[spec.name] = spec
            for key in (spec.name, *spec.aliases):
                by_key[_norm(key)] = spec.name
        self._specs: Mapping[str, GPUSpec] = MappingProxyType(by_name)
        self._by_key: Mapping[str, str] = MappingProxyType(by_key)

    def with_gpus(self, specs: Iterable[GPUSpec]) -> GPUCatalog:
        """A new catalog: this one plus `specs` (a spec with a known name replaces it)."""
        return GPUCatalog((*self._specs.values(), *specs))

    def get(self, name: str | GPUSpec) -> GPUSpec:
        if isinstance(name, GPUSpec):
            return name
        key = _norm(name)
        if key in self._by_key:
            return self._specs[self._by_key[key]]
        matches = sorted({v for k, v in self._by_key.items() if k.startswith(key)})
        if len(matches) == 1:
            return self._specs[matches[0]]
        hint = f" Did you mean one of {matches}?" if matches else ""
        raise UnknownGPUError(
            f"unknown GPU {name!r}.{hint} Known: {', '.join(self.names())}. {ADD_GPUS_HINT}"
        )

    def names(self) -> list[str]:
        return list(self._specs)

    def specs(self) -> list[GPUSpec]:
        return list(self._specs.values())


DEFAULT_CATALOG = GPUCatalog(BUILTIN_GPUS)


def get_gpu(name: str | GPUSpec, catalog: GPUCatalog = DEFAULT_CATALOG) -> GPUSpec:
    """Look up a GPU by name or alias, e.g. "H100-SXM", "h100", "a100-80gb", "RTX 4090"."""
    return catalog.get(name)


_YAML_FIELDS = {
    "fp32_tflops": ("fp32_flops", TERA),
    "fp16_tflops": ("fp16_flops", TERA),
    "bf16_tflops": ("fp16_flops", TERA),
    "fp8_tflops": ("fp8_flops", TERA),
    "fp4_tflops": ("fp4_flops", TERA),
    "int8_tops": ("int8_flops", TERA),
    "int8_tflops": ("int8_flops", TERA),
    "mem_bw_gbs": ("mem_bw", GB),
    "memory_gb": ("mem_bytes", GB),
    "intra_node_bw_gbs": ("intra_node_bw", GB),
    "inter_node_bw_gbs": ("inter_node_bw", GB),
    "intra_node_latency_us": ("intra_node_latency_s", 1e-6),
    "inter_node_latency_us": ("inter_node_latency_s", 1e-6),
    "l2_mb": ("l2_bytes", MIB),  # as vendors write cache sizes: 2^20 bytes
    "l2_mib": ("l2_bytes", MIB),
    "sm_count": ("sm_count", 1),
    "price_per_hour": ("price_per_hour", 1.0),
    "interconnect": ("interconnect", None),
    "aliases": ("aliases", None),
    "calibration": ("calibration_of", None),  # a built-in GPU name: use its fitted factors
}
# Fields that may be 0: a FLOP/s peak of 0 means "not native" (`GPUSpec.flops` falls back),
# l2/sm 0 mean unknown, a latency or a price may be 0. The others (bandwidths, memory) divide
# or bound the simulation, so they must be > 0.
_ZERO_OK = frozenset({"fp32_flops", "fp16_flops", "fp8_flops", "fp4_flops", "int8_flops",
                      "intra_node_latency_s", "inter_node_latency_s", "l2_bytes", "sm_count",
                      "price_per_hour"})


def _yaml_number(name: str, key: str, raw: Any, field: str, scale: float) -> float:
    """`raw` x `scale`, finite and > 0 (>= 0 for `_ZERO_OK` fields): inf/NaN/negative values
    give nonsense (0 completed requests, negative times) far from the file."""
    if isinstance(raw, bool):  # YAML `yes` / `true`
        raise SpecError(f"GPU {name!r}: {key} must be a number, got {raw!r}")
    try:
        value = float(raw) * scale
    except (TypeError, ValueError, OverflowError) as exc:  # (an int of 400 digits: no float)
        raise SpecError(f"GPU {name!r}: {key} must be a number, got {str(raw)[:40]!r}"
                        ) from exc
    if not math.isfinite(value) or value < 0 or (value == 0 and field not in _ZERO_OK):
        bound = ">= 0" if field in _ZERO_OK else "> 0"
        raise SpecError(f"GPU {name!r}: {key} must be a finite number {bound}, got {raw!r}")
    if field == "sm_count" and not value.is_integer():
        raise SpecError(f"GPU {name!r}: {key} must be a whole number, got {raw!r}")
    return value


def _yaml_aliases(name: str, raw: Any) -> tuple[str, ...]:
    # a bare string would be split into one-letter aliases (`--gpu y` matching `mygpu`)
    if not isinstance(raw, list) or not all(
            isinstance(a, str | int) and not isinstance(a, bool) and str(a).strip()
            for a in raw):
        raise SpecError(f"GPU {name!r}: aliases must be a list of names, e.g. [mygpu], "
                        f"got {raw!r}")
    return tuple(str(a) for a in raw)  # YAML reads `[4090]` as a number


def gpu_from_mapping(name: str, data: Mapping[str, Any], base: GPUSpec | None = None) -> GPUSpec:
    """Build a GPUSpec from YAML-style keys (units in the key names, see _YAML_FIELDS)."""
    values: dict[str, Any] = {}
    for key, raw in data.items():
        if key not in _YAML_FIELDS:
            raise SpecError(f"GPU {name!r}: unknown key {key!r}; use one of {sorted(_YAML_FIELDS)}")
        field, scale = _YAML_FIELDS[key]
        if scale is None:
            values[field] = _yaml_aliases(name, raw) if field == "aliases" else str(raw)
        else:
            value = _yaml_number(name, key, raw, field, scale)
            values[field] = int(value) if field == "sm_count" else value
    if "calibration_of" in values:  # YAML `calibration:` names a built-in (forgiving lookup)
        try:
            values["calibration_of"] = DEFAULT_CATALOG.get(values["calibration_of"]).name
        except UnknownGPUError as exc:
            raise SpecError(f"GPU {name!r}: calibration must name a built-in GPU ({exc})") from exc
    if base is not None:
        # a GPU derived from a built-in keeps that built-in's fitted calibration
        values.setdefault("calibration_of", base.calibration_of or base.name)
        return _with_matmul_peak(dataclasses.replace(base, name=name, **values))
    required = ("fp16_flops", "mem_bw", "mem_bytes")
    missing = [f for f in required if f not in values]
    if missing:
        raise SpecError(
            f"GPU {name!r}: missing {missing}; give fp16_tflops, mem_bw_gbs and memory_gb "
            "(or `base: <known gpu>` to start from a built-in)"
        )
    values.setdefault("fp32_flops", values["fp16_flops"] / 8)
    values.setdefault("fp8_flops", 0.0)
    values.setdefault("int8_flops", 0.0)
    values.setdefault("interconnect", "pcie")
    values.setdefault("intra_node_bw", 32 * GB)
    return _with_matmul_peak(GPUSpec(name=name, **values))


def _with_matmul_peak(spec: GPUSpec) -> GPUSpec:
    # every dtype falls back to the fp16 or fp32 peak: both 0 would divide by zero
    if not spec.flops(16) > 0:
        raise SpecError(f"GPU {spec.name!r}: fp16_tflops or fp32_tflops must be > 0")
    return spec


def read_gpus_yaml(path: str | Path, catalog: GPUCatalog = DEFAULT_CATALOG) -> list[GPUSpec]:
    """The GPUs of a YAML file `{gpus: {NAME: {base: H100, mem_bw_gbs: ...}}}`; a `base:` (and
    a later row's base, which may name an earlier row) is looked up in `catalog`."""
    try:
        doc = read_yaml(path)
    except YAMLFileError as exc:  # (binary file, syntax error, alias bomb: one line)
        raise SpecError(f"GPU file: {exc}") from None
    gpus = doc.get("gpus") if isinstance(doc, dict) else None
    if not isinstance(gpus, dict):
        raise SpecError(f"{path}: expected a mapping `gpus: {{NAME: {{...}}}}`")
    out: list[GPUSpec] = []
    for name, body in gpus.items():
        if not isinstance(body, dict):
            raise SpecError(f"{path}: GPU {name!r} must be a mapping")
        body = dict(body)
        base_name = body.pop("base", None)
        base = catalog.with_gpus(out).get(str(base_name)) if base_name is not None else None
        spec = gpu_from_mapping(str(name), body, base)
        if base is not None and "aliases" not in body:
            spec = dataclasses.replace(spec, aliases=())
        out.append(spec)
    return out


def load_gpus_yaml(path: str | Path, catalog: GPUCatalog = DEFAULT_CATALOG) -> GPUCatalog:
    """A new catalog: `catalog` plus the GPUs of a YAML file (see `read_gpus_yaml`)."""
    return catalog.with_gpus(read_gpus_yaml(path, catalog))
