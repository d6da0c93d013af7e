"""Push-pull anti-entropy whose idle cost does not grow with the cluster.

Round, started every sync interval by A towards a random peer B:
1. A -> B  SYNC_ROOT(root, count): 12 bytes of root hash. Equal roots end the round (B sends
   nothing back), so an idle cluster pays one ~60-byte message per node per interval.
2. B -> A  SYNC_BUCKETS(32 bucket hashes): sent only when roots differ.
3. A -> B  SYNC_DIGEST(differing buckets, A's (session id, 8-byte digest) pairs in them).
4. B -> A  SYNC_DELTAS(B's items A lacks or holds differently, want = sessions B lacks or
   holds differently); A answers `want` with SYNC_DELTAS. Merge is idempotent, so entries
   that differ are simply sent both ways. Every message is split to fit max_message_bytes.
Compacted (tombstoned) sessions are outside digests and never wanted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from llmfabric.gossip.wire import (
    Message,
    SyncBuckets,
    SyncDeltas,
    SyncDigest,
    SyncRoot,
    WireItem,
    item_size,
)
from llmfabric.net.transport import PeerId
from llmfabric.registry.entry import items_of
from llmfabric.registry.replica import Replica, item_parts

DIGEST_PAIR_BYTES = 80  # generous upper bound of one (session id, digest) pair on the wire


def chunk_items(items: list[WireItem], budget: int) -> Iterator[list[WireItem]]:
    cur: list[WireItem] = []
    used = 0
    for it in items:
        size = item_size(it)
        if cur and used + size > budget:
            yield cur
            cur, used = [], 0
        cur.append(it)
        used += size
    if cur:
        yield cur


class AntiEntropy:
    def __init__(
        self, replica: Replica, send: Callable[[PeerId, Message], None], max_bytes: int
    ) -> None:
        self._replica = replica
        self._send = send
        self._budget = max_bytes - 512
        self.rounds = 0
        self.repairs = 0

    def start(self, peer: PeerId) -> None:
        self.rounds += 1
        self._send(peer, SyncRoot(self._replica.root(), len(self._replica.entries)))

    def on_root(self, peer: PeerId, msg: SyncRoot) -> None:
        if msg.root != self._replica.root():
            self._send(peer, SyncBuckets(tuple(self._replica.bucket_hashes())))

    def on_buckets(self, peer: PeerId, msg: SyncBuckets) -> None:
        mine = self._replica.bucket_hashes()
        if len(msg.hashes) != len(mine):
            diff = list(range(len(mine)))
        else:
            diff = [i for i, (a, b) in enumerate(zip(mine, msg.hashes, strict=True)) if a != b]
        if not diff:
            return
        self.repairs += 1
        per_msg = max(1, self._budget // DIGEST_PAIR_BYTES)
        batch: list[int] = []
        pairs: list[tuple[str, bytes]] = []
        for b in diff:  # split by buckets so each message covers whole buckets
            d = sorted(self._replica.digests_in([b]).items())
            if batch and len(pairs) + len(d) > per_msg:
                self._send(peer, SyncDigest(tuple(batch), tuple(pairs)))
                batch, pairs = [], []
            batch.append(b)
            pairs.extend(d)
        self._send(peer, SyncDigest(tuple(batch), tuple(pairs)))

    def on_digest(self, peer: PeerId, msg: SyncDigest) -> None:
        theirs = dict(msg.digests)
        mine = self._replica.digests_in(msg.buckets)
        send = [sid for sid, d in mine.items() if theirs.get(sid) != d]
        want = tuple(sid for sid, d in theirs.items()
                     if mine.get(sid) != d and sid not in self._replica.tombstones)
        self._send_items(peer, send, want)

    def on_deltas(self, peer: PeerId, msg: SyncDeltas) -> None:
        if msg.want:
            self._send_items(peer, [s for s in msg.want if s in self._replica.entries], ())

    def _send_items(self, peer: PeerId, sids: list[str], want: tuple[str, ...]) -> None:
        items: list[WireItem] = []
        for sid in sorted(sids):
            entry = self._replica.entries.get(sid)
            if entry is not None:
                items.extend(item_parts(it) for it in items_of(entry))
        # keep `want` bounded too: session ids are <= 64 chars
        want_budget = max(1, self._budget // 2 // 72)
        wants = [want[i:i + want_budget] for i in range(0, len(want), want_budget)] or [()]
        chunks = list(chunk_items(items, self._budget // 2)) or [[]]
        for i in range(max(len(chunks), len(wants))):
            c = chunks[i] if i < len(chunks) else []
            w = wants[i] if i < len(wants) else ()
            if c or w:
                self._send(peer, SyncDeltas(tuple(c), tuple(w)))
