"""The queue of fresh changes to disseminate, each sent at most `limit` times (memberlist's
TransmitLimitedQueue). A newer item under the same key (same session record, same author's
fact) replaces the older one. Least-sent items go first; items are packed up to a byte budget.
Hearing an item again from a peer counts as a send, so saturated rumours stop early.
The queue holds at most `max_items` (keys are chosen by whoever signs facts): past that the
most-sent, then oldest, item is dropped; anti-entropy repairs what a dropped rumour missed.
"""

from __future__ import annotations

from collections.abc import Hashable

from llmfabric.gossip.wire import WireItem, item_size


class BroadcastQueue:
    def __init__(self, max_items: int = 4096) -> None:
        # key -> (sent, seq, item, own limit or 0 for the caller's limit)
        self._items: dict[Hashable, tuple[int, int, WireItem, int]] = {}
        self._seq = 0
        self.max_items = max_items
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._items)

    def push(self, key: Hashable, item: WireItem, limit: int = 0) -> None:
        """Queue `item`; `limit` > 0 caps its sends below the queue-wide limit."""
        self._seq += 1
        self._items[key] = (0, self._seq, item, limit)
        if len(self._items) > self.max_items:
            victim = max(self._items, key=lambda k: (self._items[k][0], -self._items[k][1]))
            del self._items[victim]
            self.dropped += 1

    def take(self, budget: int, limit: int) -> list[WireItem]:
        """Items that fit in `budget` bytes, least-sent and newest first; count the send."""
        out: list[WireItem] = []
        used = 0
        for key, (sent, seq, item, own) in sorted(self._items.items(),
                                                  key=lambda kv: (kv[1][0], -kv[1][1])):
            if sent >= (min(own, limit) if own else limit):
                del self._items[key]  # used up by duplicates heard from peers
                continue
            size = item_size(item)
            if used + size > budget:
                continue
            used += size
            out.append(item)
            if sent + 1 >= (min(own, limit) if own else limit):
                del self._items[key]
            else:
                self._items[key] = (sent + 1, seq, item, own)
        return out

    def heard_again(self, key: Hashable, signature: bytes) -> None:
        """A peer sent us an item we already queue: count it as one send (Demers et al.'s
        feedback rumour mongering), so a rumour everybody already has dies out sooner."""
        cur = self._items.get(key)
        if cur is None or cur[2][2] != signature:
            return
        sent, seq, item, own = cur
        self._items[key] = (sent + 1, seq, item, own)

    def clear(self) -> None:
        self._items.clear()
