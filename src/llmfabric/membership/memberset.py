"""MemberSet: the sessions a node probes and gossips with, kept incrementally.

O(1) add, discard, membership test and random pick, so a membership change costs O(1) per
node instead of rebuilding an O(N) list (at 10,000 nodes the rebuild on every join or leave
dominated the simulation). Members sit in numbered slots that do not move: the prober walks
the slots of a round in a random order without copying them (`swim.Prober`). A removed
member leaves its slot vacant; slots are compacted (renumbered, `epoch` bumped) when more
than half of the added ones are vacant.

`MemberSet.shared(members)` builds a base that many sets fork (`fork()`): a fork reads the
base's slots (never writes them) and keeps only its own additions and removals, so N nodes
of a simulation that start with the same N members hold O(changes) each, not O(N).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Member:
    session_id: str
    peer_id: str


class MemberSet:
    __slots__ = (
        "_added",
        "_added_slot",
        "_base",
        "_base_slot",
        "_gone",
        "_len",
        "_vacant",
        "epoch",
    )

    def __init__(self, members: Iterable[Member] = ()) -> None:
        self._base: tuple[Member, ...] = ()
        self._base_slot: Mapping[Member, int] = MappingProxyType({})
        self._gone: set[int] | None = None  # vacant base slots
        self._added: list[Member | None] = []
        self._added_slot: dict[Member, int] = {}
        self._vacant = 0  # vacant slots in _added
        self._len = 0
        self.epoch = 0  # bumped when slots are renumbered
        for m in members:
            self.add(m)

    @classmethod
    def shared(cls, members: Iterable[Member]) -> MemberSet:
        """A base to `fork()` from (fork it before changing it)."""
        out = cls()
        uniq = tuple(dict.fromkeys(members))
        out._base = uniq
        out._base_slot = MappingProxyType({m: i for i, m in enumerate(uniq)})
        out._len = len(uniq)
        return out

    def fork(self) -> MemberSet:
        """A set with the same members that shares this one's base slots (O(own changes))."""
        if self._added:
            raise ValueError("fork() a set made by MemberSet.shared(), not one with additions")
        out = MemberSet()
        out._base, out._base_slot = self._base, self._base_slot
        out._gone = set(self._gone) if self._gone else None
        out._len = self._len
        return out

    # ---- set operations ---------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    def __contains__(self, m: object) -> bool:
        i = self._base_slot.get(m)  # type: ignore[call-overload]
        if i is not None:
            return self._gone is None or i not in self._gone
        return m in self._added_slot

    def __iter__(self) -> Iterator[Member]:
        for i in range(self.slots()):
            m = self.at(i)
            if m is not None:
                yield m

    def add(self, m: Member) -> bool:
        """Add `m`; False if it was there already."""
        i = self._base_slot.get(m)
        if i is not None:
            if self._gone is None or i not in self._gone:
                return False
            self._gone.discard(i)
        elif m in self._added_slot:
            return False
        else:
            self._added_slot[m] = len(self._base) + len(self._added)
            self._added.append(m)
        self._len += 1
        return True

    def discard(self, m: Member) -> bool:
        """Remove `m`; False if it was not there."""
        i = self._base_slot.get(m)
        if i is not None:
            if self._gone is not None and i in self._gone:
                return False
            if self._gone is None:
                self._gone = set()
            self._gone.add(i)
        else:
            j = self._added_slot.pop(m, None)
            if j is None:
                return False
            self._added[j - len(self._base)] = None
            self._vacant += 1
            if self._vacant > 32 and 2 * self._vacant > len(self._added):
                self._compact()
        self._len -= 1
        return True

    def _compact(self) -> None:
        kept = [m for m in self._added if m is not None]
        self._added_slot = {m: len(self._base) + i for i, m in enumerate(kept)}
        self._added = list(kept)
        self._vacant = 0
        self.epoch += 1

    # ---- slots and random picks -----------------------------------------------------------
    def slots(self) -> int:
        """Slot numbers are 0 .. slots() - 1; `at(i)` is None for a vacant slot."""
        return len(self._base) + len(self._added)

    def at(self, i: int) -> Member | None:
        nb = len(self._base)
        if i < nb:
            return None if self._gone is not None and i in self._gone else self._base[i]
        return self._added[i - nb]

    def sample(self, rng: random.Random, k: int, *, skip_peers: Iterable[str] = ()) -> list[Member]:
        """Up to k members picked at random with distinct peer ids, none in `skip_peers`."""
        skip = set(skip_peers)
        out: list[Member] = []
        n = self.slots()
        if n and self._len >= 4 * (k + len(skip)):  # mostly occupied and large: rejection
            tries = 0
            while len(out) < k and tries < 8 * (k + len(skip)) + 64:
                tries += 1
                m = self.at(rng.randrange(n))
                if m is not None and m.peer_id not in skip:
                    skip.add(m.peer_id)
                    out.append(m)
            if len(out) == k:
                return out
        pool = [m for m in self if m.peer_id not in skip]  # small set: exact
        rng.shuffle(pool)
        for m in pool:
            if len(out) == k:
                break
            if m.peer_id not in skip:
                skip.add(m.peer_id)
                out.append(m)
        return out
