"""The queue of fresh changes to disseminate, each sent at most `limit` times (memberlist's
TransmitLimitedQueue). A newer item under the same key (same session record, same author's
fact) replaces the older one. Least-sent items go first, the newest first among equals;
items are packed up to a byte budget. Hearing an item again from a peer counts as a send, so
saturated rumours stop early: a take drops an item sent or heard `limit` times (the limit
of that take, or the item's own if lower). The queue holds at most `max_items` (keys are
chosen by whoever signs facts): past that the most-sent, then oldest, item is dropped;
anti-entropy repairs what a dropped rumour missed.

Every message a node sends or receives with fresh items takes from the queue. A short queue
(the usual case) is sorted on each take, which is cheapest there. Past `heap_above` items,
the order is kept in two heaps (least-sent first for `take`, most-sent first for the victim)
with lazy deletion: an entry whose item was sent, heard, replaced or dropped since is skipped
when it surfaces, and the heaps are rebuilt once stale entries outnumber live ones. A take
then costs O(log n) per item it looks at (sorting cost 1.1 ms at 4,096 items, on every
message, while a flood of rumours kept the queue full): it stops once the budget left is
below the smallest item queued, or after `max_skips` items that do not fit. So in a long
queue an item heard its limit's worth of times stays until a take reaches it (it is never
sent again: each send checks). The heaps are dropped when the queue is short again.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable

from llmfabric.gossip.wire import WireItem, item_size

# (sent, -seq, seq, key) orders `take`: least sent, newest first; seq is unique, so
# comparisons never reach the key. The victim heap holds (-sent, seq, seq, key).
_Entry = tuple[int, int, int, Hashable]
_State = tuple[int, int, WireItem, int]  # (sent, seq, item, own limit or 0)


class BroadcastQueue:
    def __init__(self, max_items: int = 4096, *, heap_above: int = 64,
                 max_skips: int = 256) -> None:
        self._items: dict[Hashable, _State] = {}
        self._seq = 0
        self.max_items = max_items
        self.heap_above = heap_above
        self.max_skips = max_skips
        self.dropped = 0
        self._heaped = False
        self._next: list[_Entry] = []
        self._victims: list[_Entry] = []
        self._smallest = 0  # (heaped) no queued item is smaller: a take stops below it

    def __len__(self) -> int:
        return len(self._items)

    def push(self, key: Hashable, item: WireItem, limit: int = 0) -> None:
        """Queue `item`; `limit` > 0 caps its sends below the queue-wide limit."""
        self._seq += 1
        self._items[key] = (0, self._seq, item, limit)
        if self._heaped:
            self._smallest = min(self._smallest, item_size(item))
            self._file(key, 0, self._seq)
        elif len(self._items) > self.heap_above:
            self._rebuild()
        while len(self._items) > self.max_items:
            self._drop_one()

    def _drop_one(self) -> None:
        if not self._heaped:
            items = self._items
            del items[max(items, key=lambda k: (items[k][0], -items[k][1]))]
            self.dropped += 1
            return
        while self._victims:
            neg_sent, seq, _, victim = heapq.heappop(self._victims)
            if self._live(victim, -neg_sent, seq):
                del self._items[victim]
                self.dropped += 1
                return

    def take(self, budget: int, limit: int) -> list[WireItem]:
        """Items that fit in `budget` bytes, least-sent and newest first; count the send."""
        if not self._heaped:
            return self._take_sorted(budget, limit)
        out = self._take_heaped(budget, limit)
        if len(self._items) <= self.heap_above // 2:
            self._heaped = False
            self._next, self._victims = [], []
        return out

    def _take_sorted(self, budget: int, limit: int) -> list[WireItem]:
        out: list[WireItem] = []
        used = 0
        for key, _ in sorted(self._items.items(), key=lambda kv: (kv[1][0], -kv[1][1])):
            size, item = self._send(key, limit, budget - used)
            if item is not None:
                used += size
                out.append(item)
        return out

    def _take_heaped(self, budget: int, limit: int) -> list[WireItem]:
        out: list[WireItem] = []
        skipped: list[_Entry] = []  # popped but not sent: back into `_next` after the loop
        sent_now: list[tuple[Hashable, int, int]] = []  # filed anew after the loop
        used = 0
        while (self._next and len(skipped) < self.max_skips
               and budget - used >= self._smallest):
            entry = heapq.heappop(self._next)
            sent, _, seq, key = entry
            if not self._live(key, sent, seq):
                continue
            size, item = self._send(key, limit, budget - used)
            if item is None:
                if size == 0:
                    skipped.append(entry)
                continue
            used += size
            out.append(item)
            if key in self._items:
                sent_now.append((key, sent + 1, seq))
        for entry in skipped:  # (after the loop: an item goes out once per take)
            heapq.heappush(self._next, entry)
        for key, sent, seq in sent_now:
            self._file(key, sent, seq)
        return out

    def _send(self, key: Hashable, limit: int, room: int) -> tuple[int, WireItem | None]:
        """Offer `key`'s item to a message with `room` bytes left, under `limit` sends (or its
        own, if lower): (its size, the item) when it goes out, the send counted (and the item
        dropped at its last); (0, None) when it does not fit; (-1, None) when it was used up
        already (under a lower limit than before, or heard often enough): dropped."""
        sent, seq, item, own = self._items[key]
        cap = min(own, limit) if own else limit
        if sent >= cap:
            del self._items[key]
            return -1, None
        size = item_size(item)
        if size > room:
            return 0, None
        if sent + 1 >= cap:
            del self._items[key]
        else:
            self._items[key] = (sent + 1, seq, item, own)
        return size, item

    def heard_again(self, key: Hashable, signature: bytes) -> None:
        """A peer sent us an item we already queue: count it as one send (Demers et al.'s
        feedback rumour mongering), so a rumour everybody already has dies out sooner."""
        cur = self._items.get(key)
        if cur is None or cur[2][2] != signature:
            return
        sent, seq, item, own = cur
        self._items[key] = (sent + 1, seq, item, own)
        if self._heaped:
            self._file(key, sent + 1, seq)

    def clear(self) -> None:
        self._items.clear()
        self._heaped = False
        self._next, self._victims = [], []

    # ---- the heaps (long queues) --------------------------------------------------------
    def _live(self, key: Hashable, sent: int, seq: int) -> bool:
        cur = self._items.get(key)
        return cur is not None and cur[0] == sent and cur[1] == seq

    def _file(self, key: Hashable, sent: int, seq: int) -> None:
        heapq.heappush(self._next, (sent, -seq, seq, key))
        heapq.heappush(self._victims, (-sent, seq, seq, key))
        bound = 2 * len(self._items) + 64  # stale entries outnumber live ones: rebuild
        if len(self._next) > bound or len(self._victims) > bound:
            self._rebuild()

    def _rebuild(self) -> None:
        self._heaped = True
        self._next = [(s, -q, q, k) for k, (s, q, _, _) in self._items.items()]
        self._victims = [(-s, q, q, k) for k, (s, q, _, _) in self._items.items()]
        heapq.heapify(self._next)
        heapq.heapify(self._victims)
        self._smallest = min((item_size(it) for _, _, it, _ in self._items.values()),
                             default=0)
