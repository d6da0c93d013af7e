"""A matrix of alpha-beta links: one `Link` per (prefill replica, decode replica) or per GPU
pair (ThunderServe's measured bandwidth matrix, App. C).

`LinkMatrix(bandwidth, latency_s)` holds an m x n matrix of bytes/s and one of seconds (or one
latency for all). Build it directly, `uniform(link, m, n)`, `from_topology(topo, rows, cols)`,
or `from_csv(path)`; fold a GPU-pair matrix into a replica-pair one with `reduce(row_groups,
col_groups)` (bottleneck bandwidth and worst latency over the two replicas' GPUs, as
ThunderServe's beta_ab = min bandwidth between the stages' GPUs).

CSV, long form: a header naming the endpoints (`src,dst` or `i,j`), the bandwidth in exactly
one column `gbs` (GB/s, also `GB/s`), `gbps` (Gbit/s, also `Gbps`) or `bytes_per_s`, and
optionally `latency_s`, `latency_ms` or `latency_us`; a pair given one way is symmetric.
Any other column is refused (a misspelt latency column must not read as zero latency).
CSV, square form: a first header cell naming the unit (`gbs`, `gbps` or `bytes_per_s`), then
the column ids; each row an id and its bandwidths (the diagonal is ignored). Every pair must
be present; ids are kept as strings unless all are integers.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Hashable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from llmfabric.sim.errors import SpecError, not_utf8
from llmfabric.sim.parallel import Link
from llmfabric.sim.topology import NodeId, Topology

FloatArray = npt.NDArray[np.float64]

_UNITS = {"gbs": 1e9, "gb/s": 1e9, "gbps": 1e9 / 8, "gbit/s": 1e9 / 8, "bytes_per_s": 1.0}
_LATENCY = {"latency_s": 1.0, "latency_ms": 1e-3, "latency_us": 1e-6}
_LONG_COLUMNS = frozenset({"src", "dst", "i", "j", "from", "to", *_UNITS, *_LATENCY})


class LinkMatrix:
    """m x n links; `link(i, j)` (or `matrix[i, j]`) is the Link from row i to column j."""

    __slots__ = ("_links", "_named", "bandwidth", "col_ids", "latency_s", "row_ids")

    def __init__(self, bandwidth: npt.ArrayLike, latency_s: npt.ArrayLike = 0.0, *,
                 row_ids: Sequence[Hashable] | None = None,
                 col_ids: Sequence[Hashable] | None = None) -> None:
        bw = np.array(bandwidth, dtype=np.float64)
        if bw.ndim != 2 or bw.size == 0:
            raise SpecError("a LinkMatrix needs a non-empty 2-D bandwidth matrix")
        lat = np.broadcast_to(np.asarray(latency_s, dtype=np.float64), bw.shape).copy()
        self.row_ids = list(row_ids) if row_ids is not None else list(range(bw.shape[0]))
        self.col_ids = list(col_ids) if col_ids is not None else list(range(bw.shape[1]))
        if len(self.row_ids) != bw.shape[0] or len(self.col_ids) != bw.shape[1]:
            raise SpecError("row_ids/col_ids do not match the matrix shape")
        # a cell whose row and column name the same GPU is not a link (any value allowed)
        links = np.ones(bw.shape, dtype=bool)
        self._named = row_ids is not None and col_ids is not None
        if self._named:
            links = np.array([[r != c for c in self.col_ids] for r in self.row_ids])
        if not np.all(bw[links] > 0) or not np.all(np.isfinite(bw[links])):
            raise SpecError("every link needs a finite bandwidth > 0 bytes/s")
        if not np.all(lat[links] >= 0) or not np.all(np.isfinite(lat[links])):
            raise SpecError("every link needs a finite latency >= 0 s")
        self.bandwidth: FloatArray = bw
        self.latency_s: FloatArray = lat
        self._links: dict[tuple[int, int], Link] = {}

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.bandwidth.shape[0]), int(self.bandwidth.shape[1]))

    def link(self, i: int, j: int) -> Link:
        got = self._links.get((i, j))
        if got is None:
            m, n = self.shape
            if not (0 <= i < m and 0 <= j < n):
                raise SpecError(f"link ({i}, {j}) is outside the {m} x {n} matrix")
            bw = float(self.bandwidth[i, j])
            if self._named and self.row_ids[i] == self.col_ids[j]:
                raise SpecError(f"link ({i}, {j}) joins GPU {self.row_ids[i]!r} to itself")
            got = Link(bw, float(self.latency_s[i, j]))
            self._links[(i, j)] = got
        return got

    def __getitem__(self, ij: tuple[int, int]) -> Link:
        return self.link(*ij)

    def channel(self, i: int, j: int) -> Hashable:
        """Transfers on the same channel share the link (`link_contention`): one per pair."""
        return (i, j)

    # --- constructors ------------------------------------------------------------------
    @classmethod
    def uniform(cls, link: Link, m: int, n: int) -> LinkMatrix:
        if m < 1 or n < 1:
            raise SpecError("a LinkMatrix needs m, n >= 1")
        return cls(np.full((m, n), link.bandwidth), link.latency_s)

    @classmethod
    def from_topology(cls, topo: Topology, rows: Sequence[NodeId] | None = None,
                      cols: Sequence[NodeId] | None = None, *, n_bytes: float = 1 << 20,
                      widest: bool = False) -> LinkMatrix:
        """`topo.pair_link(r, c)` for every row and column GPU (default: all GPUs both ways;
        a GPU to itself gets an infinitely fast link's stand-in: the diagonal is unusable)."""
        r_ids = list(rows) if rows is not None else topo.gpus()
        c_ids = list(cols) if cols is not None else topo.gpus()
        bw = np.full((len(r_ids), len(c_ids)), math.inf)
        lat = np.zeros_like(bw)
        for a, ra in enumerate(r_ids):
            for b, cb in enumerate(c_ids):
                if ra != cb:
                    link = topo.pair_link(ra, cb, n_bytes=n_bytes, widest=widest)
                    bw[a, b], lat[a, b] = link.bandwidth, link.latency_s
        return cls(bw, lat, row_ids=r_ids, col_ids=c_ids)

    def reduce(self, row_groups: Sequence[Sequence[int]],
               col_groups: Sequence[Sequence[int]]) -> LinkMatrix:
        """One link per (row group, column group): the smallest bandwidth and the largest
        latency between their members (e.g. GPU pairs -> replica pairs)."""
        if not row_groups or not col_groups or any(not g for g in (*row_groups, *col_groups)):
            raise SpecError("reduce needs non-empty groups")
        bw = np.empty((len(row_groups), len(col_groups)))
        lat = np.empty_like(bw)
        for a, rg in enumerate(row_groups):
            for b, cg in enumerate(col_groups):
                if set(rg) & set(cg):
                    raise SpecError(f"groups {a} and {b} share a GPU: no link between them")
                bw[a, b] = self.bandwidth[np.ix_(list(rg), list(cg))].min()
                lat[a, b] = self.latency_s[np.ix_(list(rg), list(cg))].max()
        return LinkMatrix(bw, lat)

    @classmethod
    def from_csv(cls, path: str | Path) -> LinkMatrix:
        """Read a long-form or square CSV (see the module docstring)."""
        try:
            with Path(path).open(newline="") as f:
                rows = [r for r in csv.reader(f) if r and any(c.strip() for c in r)]
        except OSError as exc:
            raise SpecError(f"cannot read link matrix {path}: {exc}") from None
        # a binary file (or one with a NUL byte) passed by mistake: was a traceback
        except UnicodeDecodeError as exc:
            raise SpecError(f"{path} is not a CSV file: {not_utf8(exc)}") from None
        except csv.Error as exc:
            raise SpecError(f"{path} is not a valid CSV file: {exc}") from None
        if len(rows) < 2:
            raise SpecError(f"{path}: a link matrix needs a header and at least one row")
        header = [h.strip().lower() for h in rows[0]]
        try:
            if header[0] in _UNITS:
                return cls._from_square(header, rows[1:])
            return cls._from_long(header, rows[1:])
        except (ValueError, IndexError) as exc:
            raise SpecError(f"{path}: bad link matrix row: {exc}") from None

    @classmethod
    def _from_square(cls, header: list[str], body: list[list[str]]) -> LinkMatrix:
        unit = _UNITS[header[0]]
        ids = _ids([h.strip() for h in header[1:]])
        _unique(ids, [h.strip() for h in header[1:]])
        if len(body) != len(ids):
            raise SpecError("a square link matrix needs one row per column id")
        bw = np.full((len(ids), len(ids)), math.inf)
        for a, row in enumerate(body):
            if _ids([row[0].strip()])[0] != ids[a]:
                raise SpecError(f"row {a} is {row[0]!r}, expected {ids[a]!r} (same order)")
            if len(row) != len(ids) + 1:
                raise SpecError(f"row {row[0]!r} needs {len(ids)} values")
            for b in range(len(ids)):
                if a != b:
                    bw[a, b] = _bandwidth(row[b + 1], unit, ids[a], ids[b])
        return cls(bw, 0.0, row_ids=ids, col_ids=ids)

    @classmethod
    def _from_long(cls, header: list[str], body: list[list[str]]) -> LinkMatrix:
        def col(*names: str) -> int | None:
            hits = [header.index(n) for n in names if n in header]
            return hits[0] if hits else None

        src, dst = col("src", "i", "from"), col("dst", "j", "to")
        units = [(header.index(u), f) for u, f in _UNITS.items() if u in header]
        lats = [(header.index(u), f) for u, f in _LATENCY.items() if u in header]
        if src is None or dst is None or len(units) != 1 or len(lats) > 1:
            raise SpecError("a long-form link CSV needs src,dst (or i,j), exactly one of "
                            "gbs/gbps/bytes_per_s and at most one latency column")
        # An unknown column is refused, not skipped: a misspelt latency column (latency_usec)
        # would otherwise give every link zero latency without a word.
        unknown = [h for h in header if h not in _LONG_COLUMNS]
        if unknown:
            raise SpecError(f"unknown column {unknown[0]!r}; a long-form link CSV has the "
                            f"columns {', '.join(sorted(_LONG_COLUMNS))}")
        (ucol, ufac), lat = units[0], lats[0] if lats else None
        cells: dict[tuple[str, str], tuple[float, float]] = {}
        keys: dict[str, int] = {}  # label -> index, in order of appearance (O(1) membership)
        width = max(src, dst, ucol, lat[0] if lat is not None else 0) + 1
        for row in body:
            if len(row) < width:
                raise SpecError(f"row {row} has {len(row)} cells, expected {width}")
            a, b = row[src].strip(), row[dst].strip()
            if a == b:
                continue
            for x in (a, b):
                keys.setdefault(x, len(keys))
            if (a, b) in cells:  # (the last row won silently)
                raise SpecError(f"the pair {a} -> {b} appears twice")
            cells[(a, b)] = (_bandwidth(row[ucol], ufac, a, b),
                             _latency(row[lat[0]], lat[1], a, b) if lat is not None else 0.0)
        order = list(keys)
        ids = _ids(order)
        _unique(ids, order)
        n = len(ids)
        bw = np.full((n, n), math.inf)
        latm = np.zeros_like(bw)
        for (a, b), (v, t) in cells.items():
            bw[keys[a], keys[b]], latm[keys[a], keys[b]] = v, t
            if (b, a) not in cells:
                bw[keys[b], keys[a]], latm[keys[b], keys[a]] = v, t
        missing = [(ids[r], ids[c]) for r in range(n) for c in range(n)
                   if r != c and math.isinf(bw[r, c])]
        if missing:
            raise SpecError(f"the link CSV lacks pairs, e.g. {missing[:3]}")
        return cls(bw, latm, row_ids=ids, col_ids=ids)

    def to_csv(self, path: str | Path) -> None:
        """Write the long form (src, dst, gbs, latency_s) of every off-diagonal cell."""
        with Path(path).open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["src", "dst", "gbs", "latency_s"])
            for a, ra in enumerate(self.row_ids):
                for b, cb in enumerate(self.col_ids):
                    if np.isfinite(self.bandwidth[a, b]) and ra != cb:
                        w.writerow([ra, cb, repr(float(self.bandwidth[a, b]) / 1e9),
                                    repr(float(self.latency_s[a, b]))])


def _number(raw: str, what: str, a: Hashable, b: Hashable) -> float:
    try:
        return float(raw)
    except ValueError:
        raise SpecError(f"{what} of {a} -> {b} is not a number: {raw!r}") from None


def _bandwidth(raw: str, unit: float, a: Hashable, b: Hashable) -> float:
    value = _number(raw, "the bandwidth", a, b) * unit
    # inf would be taken for a missing pair (and a link of zero, negative or NaN speed is none)
    if not (value > 0 and math.isfinite(value)):
        raise SpecError(f"the bandwidth of {a} -> {b} must be finite and > 0, got {raw!r}")
    return value


def _latency(raw: str, unit: float, a: Hashable, b: Hashable) -> float:
    value = _number(raw, "the latency", a, b) * unit
    if not (value >= 0 and math.isfinite(value)):
        raise SpecError(f"the latency of {a} -> {b} must be finite and >= 0, got {raw!r}")
    return value


def _unique(ids: Sequence[Hashable], labels: Sequence[str]) -> None:
    """Refuse labels that name the same id ("1" and "01" are both GPU 1)."""
    seen: dict[Hashable, str] = {}
    for node, label in zip(ids, labels, strict=True):
        if node in seen:
            raise SpecError(f"ids {seen[node]!r} and {label!r} are the same GPU {node!r}")
        seen[node] = label


def _ids(labels: Sequence[str]) -> list[Hashable]:
    if all(s.lstrip("-").isdigit() for s in labels):
        return [int(s) for s in labels]
    return list(labels)
