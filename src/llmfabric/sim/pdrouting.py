"""Routing of a prefill/decode-disaggregated deployment by fixed fractions (ThunderServe's X, Y).

`PDRouting(x, y)`: a request goes to prefill replica i with weight x[i], then its KV goes to
decode replica j with weight y[i][j]. Picks are deterministic smooth weighted round robin
(nginx's SWRR: every pick adds each weight to its replica's credit, takes the largest credit
and charges it the total), so after n picks every replica has been chosen within one of
n x its share; `seed` only orders ties. Zero weights are never picked.

`KVLinks` resolves the link (and the contention channel) of a (prefill, decode) pair from one
`Link` or a `LinkMatrix`, and with `contention=True` serializes transfers per channel, first
come first served.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np

from llmfabric.sim.errors import SpecError
from llmfabric.sim.linkmatrix import LinkMatrix
from llmfabric.sim.parallel import Link


class SmoothWRR:
    """Smooth weighted round robin over len(weights) choices."""

    __slots__ = ("_credit", "_rank", "_total", "_weights")

    def __init__(self, weights: Sequence[float], seed: int = 0) -> None:
        w = [float(v) for v in weights]
        if not w or any(not (v >= 0 and math.isfinite(v)) for v in w) or sum(w) <= 0:
            raise SpecError("routing weights must be finite, >= 0, with a positive sum")
        self._weights = w
        self._total = sum(w)
        self._credit = [0.0] * len(w)
        perm = np.random.default_rng(seed).permutation(len(w))
        self._rank = [0] * len(w)
        for r, k in enumerate(perm):
            self._rank[int(k)] = r  # lower rank wins ties

    def pick(self) -> int:
        credit = self._credit
        best = -1
        for k, w in enumerate(self._weights):
            if w <= 0:
                continue
            credit[k] += w
            if best < 0 or credit[k] > credit[best] or (
                    credit[k] == credit[best] and self._rank[k] < self._rank[best]):
                best = k
        credit[best] -= self._total
        return best


class PDRouting:
    """Fixed routing fractions: x (m prefill replicas), y (m x n decode replicas per prefill
    replica). Rows of y for prefill replicas with x[i] = 0 may be all zero."""

    def __init__(self, x: Sequence[float], y: Sequence[Sequence[float]]) -> None:
        self.x = [float(v) for v in x]
        self.y = [[float(v) for v in row] for row in y]
        if not self.x or len(self.y) != len(self.x):
            raise SpecError("PDRouting needs one y row per prefill replica")
        n = len(self.y[0])
        if n == 0 or any(len(row) != n for row in self.y):
            raise SpecError("every y row needs one weight per decode replica")
        SmoothWRR(self.x)  # validates x
        for i, row in enumerate(self.y):
            if any(not (v >= 0 and math.isfinite(v)) for v in row):
                raise SpecError(f"y[{i}] has a negative or non-finite weight")
            if self.x[i] > 0 and sum(row) <= 0:
                raise SpecError(f"prefill replica {i} receives traffic but y[{i}] sends "
                                "it to no decode replica")

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.x), len(self.y[0]))

    def start(self, seed: int = 0) -> PDRouter:
        """Fresh pick state for one run."""
        return PDRouter(self, seed)


class PDRouter:
    """The running pick state of a `PDRouting`."""

    __slots__ = ("_decode", "_prefill")

    def __init__(self, routing: PDRouting, seed: int) -> None:
        self._prefill = SmoothWRR(routing.x, seed)
        self._decode = [SmoothWRR(row, seed + 1 + i) if sum(row) > 0 else None
                        for i, row in enumerate(routing.y)]

    def prefill(self) -> int:
        return self._prefill.pick()

    def decode(self, prefill_index: int) -> int:
        wrr = self._decode[prefill_index]
        if wrr is None:
            raise SpecError(f"prefill replica {prefill_index} has no decode weights")
        return wrr.pick()


class KVLinks:
    """Link and FIFO channel state of every (prefill, decode) pair."""

    __slots__ = ("_free", "contention", "link", "matrix")

    def __init__(self, link: Link | LinkMatrix, m: int, n: int, contention: bool) -> None:
        if isinstance(link, LinkMatrix):
            if link.shape != (m, n):
                raise SpecError(f"the LinkMatrix is {link.shape[0]} x {link.shape[1]} but there "
                                f"are {m} prefill and {n} decode replicas; reduce a GPU-pair "
                                "matrix to replica pairs with LinkMatrix.reduce")
            self.matrix: LinkMatrix | None = link
        elif isinstance(link, Link):
            self.matrix = None
            self.link = link
        else:
            raise SpecError("link must be a Link or a LinkMatrix")
        self.contention = contention
        self._free: dict[Hashable, float] = {}

    @property
    def per_pair(self) -> bool:
        return self.matrix is not None

    def of(self, i: int, j: int | None) -> Link:
        if self.matrix is None:
            return self.link
        assert j is not None
        return self.matrix.link(i, j)

    def start(self, i: int, j: int | None, ready: float, duration: float) -> float:
        """When the transfer ready at `ready` begins (FIFO per channel under contention)."""
        if not self.contention:
            return ready
        key: Hashable = "link" if self.matrix is None else self.matrix.channel(i, j or 0)
        begin = max(ready, self._free.get(key, 0.0))
        self._free[key] = begin + duration
        return begin
