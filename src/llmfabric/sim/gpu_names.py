"""GPU names in one place, below routing and the agent: routing compares them for the
`metadata.gpu` QoS constraint, the agent publishes discovered GPUs under their catalog name.

Both sides are normalised the same way: lower case, a vendor prefix ("NVIDIA", "AMD",
"GeForce", "Tesla", "Instinct") dropped, spaces, dashes and underscores ignored; a name that
is a catalog name or alias of the GPU table (sim.hardware) (exactly: no prefix guessing) becomes
that catalog name. A wanted name then admits a node when

- it names the same catalog GPU as the node ("H100-SXM", "h100 sxm5", "A100-40GB", "4090"), or
- it is exactly the node's family token: the first token of the node's (catalog) name
  ("H100" admits H100-SXM and H100-PCIe, "A100" both A100s, "RTX" every RTX-* card).

Never by substring: "H200" does not admit GH200 (family "GH200"), "L40" does not admit L40S,
"A10" does not admit A100. Every function takes the GPU catalog explicitly (default: the
built-in `DEFAULT_CATALOG`); catalogs are immutable, so results are cached per (name, catalog)
and a user catalog (`load_gpus_yaml`) can never leave a stale entry behind.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from llmfabric.sim.hardware import DEFAULT_CATALOG, GPUCatalog

# Relative capability of GPU classes, matched as case-insensitive substrings of a GPU name,
# first match wins: the fabric's `weighted` routing policy and the simulator's router of the
# same name both read this one table.
GPU_CLASS_WEIGHTS: tuple[tuple[str, float], ...] = (
    ("gh200", 5.0),
    ("h200", 5.0),
    ("h100", 4.0),
    ("a100", 2.0),
    ("l40", 1.5),
    ("a10", 1.0),
    ("4090", 1.0),
    ("3090", 0.7),
    ("v100", 0.7),
    ("t4", 0.3),
    ("cpu", 0.1),
)

_VENDOR = re.compile(r"^(?:(?:nvidia|amd|geforce|tesla|instinct)(?:[\s_-]+|$))+")
_SEP = re.compile(r"[\s_\-]+")


@dataclass(frozen=True, slots=True)
class GpuName:
    """A GPU name reduced to what matching compares."""

    key: str  # canonical comparison key (catalog name when known), e.g. "h100sxm"
    family: str  # first token of the canonical name, e.g. "h100"; "" for an empty name
    catalog: str | None  # the catalog name when the name is one of the catalog's names/aliases


def tokens(name: str) -> tuple[str, ...]:
    """Lower-case tokens of a GPU name without the vendor prefix: "NVIDIA H100 80GB HBM3"
    -> ("h100", "80gb", "hbm3")."""
    text = _VENDOR.sub("", name.strip().lower())
    return tuple(t for t in _SEP.split(text) if t)


@lru_cache(maxsize=16)
def _catalog_index(catalog: GPUCatalog) -> Mapping[str, str]:
    index: dict[str, str] = {}
    for spec in catalog.specs():
        for alias in (spec.name, *spec.aliases):
            index["".join(tokens(alias))] = spec.name
    return MappingProxyType(index)


@lru_cache(maxsize=1024)
def catalog_name(name: str, catalog: GPUCatalog = DEFAULT_CATALOG) -> str | None:
    """The catalog name for an exact catalog name or alias (normalised), else None."""
    key = "".join(tokens(name))
    return _catalog_index(catalog).get(key) if key else None


@lru_cache(maxsize=1024)
def gpu_name(name: str, catalog: GPUCatalog = DEFAULT_CATALOG) -> GpuName:
    cat = catalog_name(name, catalog)
    toks = tokens(cat if cat is not None else name)
    return GpuName("".join(toks), toks[0] if toks else "", cat)


@lru_cache(maxsize=4096)
def gpu_admits(wanted: str, gpu_model: str, catalog: GPUCatalog = DEFAULT_CATALOG) -> bool:
    """Does the constraint `wanted` admit a node whose GPU is `gpu_model`?"""
    node = gpu_name(gpu_model, catalog)
    if not node.key:
        return False
    want = tokens(wanted)
    if len(want) == 1 and want[0] == node.family:
        return True
    return gpu_name(wanted, catalog).key == node.key


def gpu_matches(gpu_model: str, wanted: tuple[str, ...],
                catalog: GPUCatalog = DEFAULT_CATALOG) -> bool:
    """True when any of the wanted names admits `gpu_model` (see the module docstring)."""
    return any(gpu_admits(w, gpu_model, catalog) for w in wanted)
