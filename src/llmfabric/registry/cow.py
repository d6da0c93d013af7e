"""Copy-on-write containers: a mapping or set over a shared read-only base plus a private delta.

A real node keeps plain dicts and sets. A simulation of N replicas that start converged
(benchmarks/gossip_scale.py) gives every replica `CowDict(base)` / `CowSet(base)` over ONE
base, so a replica costs memory for what it changed, not for all N sessions. The base is only
read, never written (wrap it in `types.MappingProxyType` / `frozenset` to make that a fact);
writes go to the delta, so one replica's writes are never seen by another. The delta is
allocated on the first write. Iteration order: the base's (minus what was removed or
overwritten), then the keys written since, in writing order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping, MutableSet, Set
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")

_MISSING = object()


class CowDict(MutableMapping[K, V]):
    __slots__ = ("_base", "_gone", "_len", "_new")

    def __init__(self, base: Mapping[K, V]) -> None:
        self._base = base
        self._new: dict[K, V] | None = None  # written here (base keys overwritten, new keys)
        self._gone: set[K] | None = None  # base keys deleted here (and not written again)
        self._len = len(base)

    def _in_base(self, key: K) -> bool:
        return key in self._base and (self._gone is None or key not in self._gone)

    def __getitem__(self, key: K) -> V:
        if self._new is not None:
            got = self._new.get(key, _MISSING)
            if got is not _MISSING:
                return got  # type: ignore[return-value]
        if self._gone is not None and key in self._gone:
            raise KeyError(key)
        return self._base[key]

    def get(self, key: K, default: V | T | None = None) -> V | T | None:  # type: ignore[override]
        if self._new is not None:
            got = self._new.get(key, _MISSING)
            if got is not _MISSING:
                return got  # type: ignore[return-value]
        if self._gone is not None and key in self._gone:
            return default
        return self._base.get(key, default)

    def __contains__(self, key: object) -> bool:
        if self._new is not None and key in self._new:
            return True
        return key in self._base and (self._gone is None or key not in self._gone)

    def __setitem__(self, key: K, value: V) -> None:
        if self._new is None:
            self._new = {}
        if key not in self._new and not self._in_base(key):
            self._len += 1
        if self._gone is not None:
            self._gone.discard(key)
        self._new[key] = value

    def __delitem__(self, key: K) -> None:
        in_new = self._new is not None and key in self._new
        in_base = self._in_base(key)
        if not in_new and not in_base:
            raise KeyError(key)
        if in_new:
            del self._new[key]  # type: ignore[union-attr]
        if key in self._base:
            if self._gone is None:
                self._gone = set()
            self._gone.add(key)
        self._len -= 1

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[K]:
        new, gone = self._new or {}, self._gone or ()
        for k in self._base:
            if k not in new and k not in gone:
                yield k
        yield from new

    def delta_size(self) -> int:
        """Keys this copy holds privately (written or deleted): its memory beyond the base."""
        return len(self._new or ()) + len(self._gone or ())


class CowSet(MutableSet[T]):
    __slots__ = ("_added", "_base", "_len", "_removed")

    def __init__(self, base: Set[T]) -> None:
        self._base = base
        self._added: set[T] | None = None
        self._removed: set[T] | None = None
        self._len = len(base)

    def __contains__(self, x: object) -> bool:
        if self._added is not None and x in self._added:
            return True
        return x in self._base and (self._removed is None or x not in self._removed)

    def add(self, x: T) -> None:
        if x in self:
            return
        self._len += 1
        if self._removed is not None and x in self._removed:
            self._removed.discard(x)
            return
        if self._added is None:
            self._added = set()
        self._added.add(x)

    def discard(self, x: T) -> None:
        if x not in self:
            return
        self._len -= 1
        if self._added is not None and x in self._added:
            self._added.discard(x)
            return
        if self._removed is None:
            self._removed = set()
        self._removed.add(x)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[T]:
        removed = self._removed or ()
        for x in self._base:
            if x not in removed:
                yield x
        yield from (self._added or ())

    def delta_size(self) -> int:
        return len(self._added or ()) + len(self._removed or ())
