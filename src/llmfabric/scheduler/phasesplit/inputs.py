"""Loaders for `llmfabric plan pd`: the cluster YAML (instances of GPUs), the workload YAML
(rate, mean lengths, SLO), the GPU-pair link CSV or a topology YAML. Hostile documents raise
SpecError with what to fix."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from llmfabric.scheduler.errors import SpecError
from llmfabric.scheduler.phasesplit.problem import GPU, CloudCluster, PDWorkload
from llmfabric.sim.errors import SimError, naming_file
from llmfabric.sim.hardware import DEFAULT_CATALOG, GPUCatalog
from llmfabric.sim.linkmatrix import LinkMatrix
from llmfabric.sim.results import SLO
from llmfabric.sim.topology import Topology
from llmfabric.yamlfile import YAMLFileError, read_yaml, unknown_key


def _read(path: str | Path) -> Any:
    try:
        return read_yaml(path)
    except YAMLFileError as e:  # (binary file, syntax error, alias bomb: one line)
        raise SpecError(str(e)) from None


# Upper bounds of the workload's numbers: `.inf` or 10**100 lengths went on to numpy casts
# ("invalid value encountered in cast" on stderr, then "request lengths must be >= 1 token"),
# an `.inf` seed to an OverflowError traceback. Far above real loads.
_MAX = {"rate": 1e6, "mean_in": 1e7, "mean_out": 1e7, "cv": 100.0, "seed": 2.0**63 - 1,
        "ttft_s": 1e6, "tpot_s": 1e6, "e2e_s": 1e6}


def _num(doc: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    v = doc.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or v != v:
        raise SpecError(f"{where}: {key} must be a number")
    top = _MAX.get(key, math.inf)
    if not -top <= v <= top:  # (inf and 10**100 included; each field's sign is checked later)
        raise SpecError(f"{where}: {key} must be a finite number of at most {top:g}, got "
                        f"{str(v)[:40]}")  # (not {v:g}: an int of 400 digits is no float)
    return float(v)


def _known(doc: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    """Refuse keys the loader does not read: a typo (`ttft: 1.5`, `hots: a`) was ignored and
    the plan made without it (no SLO, a default host), as `plan`'s files already refuse."""
    if (unknown := unknown_key(doc, keys)) is not None:
        raise SpecError(f"{where}: unknown key {unknown!r} (the keys: {', '.join(keys)})")


def load_gpus(path: str | Path, catalog: GPUCatalog = DEFAULT_CATALOG) -> list[GPU]:
    """instances: [{gpu: RTX-A6000, count: 4, host: a6000-0}, ...]; GPU ids 0.. in order;
    GPU names are looked up in `catalog`."""
    doc = _read(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("instances"), list) or \
            not doc["instances"]:
        raise SpecError(f"{path}: expected `instances:` with a list of {{gpu, count, host}}")
    _known(doc, ("instances",), str(path))
    gpus: list[GPU] = []
    hosts: set[str] = set()
    for k, inst in enumerate(doc["instances"]):
        if not isinstance(inst, dict):
            raise SpecError(f"{path}: instance {k} must be a mapping")
        _known(inst, ("gpu", "count", "host"), f"{path}: instance {k}")
        count = inst.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 64:
            raise SpecError(f"{path}: instance {k}: count must be an int in 1..64")
        try:
            gpu_type = catalog.get(str(inst.get("gpu"))).name
        except SimError as e:
            raise SpecError(f"{path}: instance {k}: {e}") from None
        host = str(inst.get("host", f"inst{k}"))
        if host in hosts:
            raise SpecError(f"{path}: host {host!r} appears twice")
        hosts.add(host)
        gpus += [GPU(len(gpus) + i, gpu_type, host) for i in range(count)]
    return gpus


def load_cluster(cluster_path: str | Path | None, links_path: str | Path | None,
                 topology_path: str | Path | None,
                 catalog: GPUCatalog = DEFAULT_CATALOG) -> CloudCluster:
    """The cluster of a topology YAML, or of a cluster YAML and a link CSV; its GPU types are
    names of `catalog` (the built-in one, or one with the user's `--gpus-yaml` GPUs)."""
    if topology_path is not None:
        if links_path is not None:
            raise SpecError("give --links or --topology, not both")
        try:
            return CloudCluster.from_topology(Topology.from_yaml(topology_path), catalog)
        except SimError as e:
            raise SpecError(naming_file(topology_path, str(e))) from None
    if cluster_path is None or links_path is None:
        raise SpecError("give --cluster with --links, or --topology")
    gpus = load_gpus(cluster_path, catalog)
    try:
        links = LinkMatrix.from_csv(links_path)
    except SimError as e:
        raise SpecError(naming_file(links_path, str(e))) from None
    return CloudCluster.from_links(gpus, links, catalog)


def load_workload(path: str | Path, *, slo_ttft: float | None = None,
                  slo_tpot: float | None = None, rate: float | None = None) -> PDWorkload:
    """rate, mean_in, mean_out[, cv, samples, seed][, slo: {ttft_s, tpot_s, e2e_s}]."""
    doc = _read(path)
    where = str(path)
    if not isinstance(doc, dict):
        raise SpecError(f"{where}: expected a mapping with rate, mean_in, mean_out")
    _known(doc, ("rate", "mean_in", "mean_out", "cv", "samples", "seed", "slo"), where)
    slo_doc = doc.get("slo") or {}
    if not isinstance(slo_doc, dict):
        raise SpecError(f"{where}: slo must be a mapping")
    _known(slo_doc, ("ttft_s", "tpot_s", "e2e_s"), f"{where}: slo")
    slo_vals = {}
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        if slo_doc.get(key) is not None:
            slo_vals[key] = _num(slo_doc, key, where)
    if slo_ttft is not None:
        slo_vals["ttft_s"] = slo_ttft
    if slo_tpot is not None:
        slo_vals["tpot_s"] = slo_tpot
    try:
        slo = SLO(**slo_vals)
    except SimError as e:
        raise SpecError(f"{where}: {e}") from None
    samples = int(_num(doc, "samples", where, 256))
    if not 1 <= samples <= 100_000:
        raise SpecError(f"{where}: samples must be in 1..100000")
    try:
        return PDWorkload.from_means(rate if rate is not None else _num(doc, "rate", where),
                                     _num(doc, "mean_in", where), _num(doc, "mean_out", where),
                                     cv=_num(doc, "cv", where, 0.5), slo=slo, n=samples,
                                     seed=int(_num(doc, "seed", where, 0)))
    except (SimError, SpecError) as e:  # (rate <= 0, lengths < 1, a negative seed: name the file)
        raise SpecError(f"{where}: {e}") from None
