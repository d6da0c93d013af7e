"""`FairShare`: a bounded set of holders, each counted against one party, that under pressure
gives every party an equal share (max-min fairness) instead of first come, first served;
`relay_party`, the party a relay registration counts against.

A relay registers at most `capacity` clients. While there is room, any registration is
taken. When it is full, a newcomer whose party holds at least two fewer registrations than
the largest party takes the place of that party's least recently used registration; any
other newcomer is refused. So one party cannot keep more than its share of a full relay: a
newcomer from a party with nothing gets a place while some party holds two or more, and a
party holding no more than the newcomer's party plus one is never evicted (in particular a
party with a single registration never is). "Two fewer", not "fewer": taking one of a party
holding just one more would only swap who holds more, and the two would evict each other
for ever as they retried.

Every operation is O(1): holders are kept per party in least-recently-used order, parties
per count (`_by_count`), and the largest count (`_top`) moves by at most one per change.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict


class FairShare:
    """Up to `capacity` holders (None: no cap) with max-min fair shares per party when full."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self._party_of: dict[str, str] = {}
        self._held: dict[str, OrderedDict[str, None]] = {}  # party -> holders, LRU first
        self._by_count: dict[int, dict[str, None]] = {}  # n -> parties holding n (in order)
        self._top = 0  # the most any party holds
        self.evicted = 0  # holders that made room for a party holding fewer

    def __len__(self) -> int:
        return len(self._party_of)

    def __contains__(self, holder: object) -> bool:
        return holder in self._party_of

    def held(self, party: str) -> int:
        held = self._held.get(party)
        return len(held) if held is not None else 0

    @property
    def largest(self) -> int:
        """The most registrations any one party holds."""
        return self._top

    def admit(self, holder: str, party: str) -> tuple[bool, str | None]:
        """Take `holder` for `party`: (True, None) with room or when it is held already,
        (True, the holder it displaced) when full and `party` holds at least two fewer than
        the largest party, else (False, None)."""
        if holder in self._party_of:
            self.touch(holder)
            return True, None
        if self.capacity is not None and len(self._party_of) >= self.capacity:
            if self.held(party) + 2 > self._top:
                return False, None
            victim_party = next(iter(self._by_count[self._top]))
            victim = next(iter(self._held[victim_party]))
            self.remove(victim)
            self.evicted += 1
            self._add(holder, party)
            return True, victim
        self._add(holder, party)
        return True, None

    def touch(self, holder: str) -> None:
        """`holder` was used: the last of its party's holders to be evicted."""
        party = self._party_of.get(holder)
        if party is not None:
            self._held[party].move_to_end(holder)

    def remove(self, holder: str) -> None:
        """Forget `holder` (nothing when it is not held)."""
        party = self._party_of.pop(holder, None)
        if party is None:
            return
        held = self._held[party]
        n = len(held)
        del held[holder]
        self._move(party, n, n - 1)
        if not held:
            del self._held[party]
        if n == self._top and n not in self._by_count:
            self._top = n - 1  # (this party now holds n - 1, so some party does)

    def _add(self, holder: str, party: str) -> None:
        held = self._held.setdefault(party, OrderedDict())
        n = len(held)
        held[holder] = None
        self._party_of[holder] = party
        self._move(party, n, n + 1)
        self._top = max(self._top, n + 1)

    def _move(self, party: str, old: int, new: int) -> None:
        if old:
            bucket = self._by_count[old]
            del bucket[party]
            if not bucket:
                del self._by_count[old]
        if new:
            self._by_count.setdefault(new, {})[party] = None


def relay_party(member: str, source: str) -> str:
    """The party a relay registration counts against: on a certificate network the member
    its certificate vouches for (the provider it names, else its peer id: sybils cost an
    operator's signature each), on a PSK network (keys are free) its source's /24 (IPv4) or
    /48 (IPv6), the widest prefix one site or customer is commonly given, so a member with
    many addresses of one network still counts as one party. `source` is
    `source_slots.source_of`'s (an IPv4 address or an IPv6 /64); "" when unknown."""
    if member:
        return "member:" + member
    try:
        net = ipaddress.ip_network(source, strict=False)
    except ValueError:
        return "source:" + source
    wide = 24 if net.version == 4 else 48
    if net.prefixlen > wide:
        net = net.supernet(new_prefix=wide)
    return "net:" + str(net)
