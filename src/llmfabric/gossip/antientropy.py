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

A member could make a node send far more than it asked for: SYNC_BUCKETS or SYNC_DIGEST
nobody asked for (a 74-byte digest naming every bucket pulled the whole registry), or one
session id repeated 1,700 times in `want` (26 MB for 58 KB). So each step is answered only
within a round: SYNC_BUCKETS only from a peer we sent SYNC_ROOT, SYNC_DIGEST only from one
we sent SYNC_BUCKETS, `want` only from one we sent SYNC_DIGEST (within `round_timeout_s`);
within a round each bucket and each wanted session is answered once; and the rounds a peer
starts with us (a SYNC_ROOT we answer) are rate limited per peer (`rounds_burst` at once,
then one per `round_interval_s`), so a member pulls the registry at most that often.
Refusals are counted (`refused`).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
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
from llmfabric.registry.guard import AuthorLimiter
from llmfabric.registry.replica import Replica, item_parts

DIGEST_PAIR_BYTES = 80  # generous upper bound of one (session id, digest) pair on the wire
MAX_ROUNDS_TRACKED = 4096  # peers with a round in progress (oldest forgotten first)


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


class _Rounds:
    """Peers we expect a given answer from, until a deadline, with what each round already
    answered (bounded, oldest first out)."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout = timeout_s
        self._open: OrderedDict[PeerId, tuple[float, set[object]]] = OrderedDict()

    def expect(self, peer: PeerId, now: float) -> None:
        """A round with `peer` opens now (a new one replaces its last)."""
        self._open.pop(peer, None)
        self._open[peer] = (now + self._timeout, set())
        if len(self._open) > MAX_ROUNDS_TRACKED:
            self._open.popitem(last=False)
        # Rounds get one timeout, so insertion order is deadline order: the expired ones
        # leave from the front (only the last timeout's rounds are held).
        while self._open:
            _, (first, _) = next(iter(self._open.items()))
            if first >= now:
                break
            self._open.popitem(last=False)

    def answered(self, peer: PeerId, now: float) -> set[object] | None:
        """What this peer's open round already answered (None: no round open)."""
        got = self._open.get(peer)
        if got is None:
            return None
        if got[0] < now:
            del self._open[peer]
            return None
        return got[1]


class AntiEntropy:
    def __init__(
        self, replica: Replica, send: Callable[[PeerId, Message], None], max_bytes: int, *,
        now: Callable[[], float] | None = None, round_timeout_s: float = 30.0,
        round_interval_s: float = 2.0, rounds_burst: float = 8.0,
    ) -> None:
        self._replica = replica
        self._send = send
        self._budget = max_bytes - 512
        self._now = now or (lambda: 0.0)
        self._started = _Rounds(round_timeout_s)  # we sent SYNC_ROOT: SYNC_BUCKETS may come
        self._bucketed = _Rounds(round_timeout_s)  # sent SYNC_BUCKETS: SYNC_DIGEST (per bucket)
        self._digested = _Rounds(round_timeout_s)  # sent SYNC_DIGEST: `want` (per session)
        self._rounds_in = AuthorLimiter(1.0 / round_interval_s, rounds_burst)
        self.rounds = 0
        self.repairs = 0
        self.refused: Counter[str] = Counter()

    def _round(self, rounds: _Rounds, peer: PeerId, what: str) -> set[object] | None:
        done = rounds.answered(peer, self._now())
        if done is None:
            self.refused[f"unasked_{what}"] += 1
        return done

    def start(self, peer: PeerId) -> None:
        self.rounds += 1
        self._started.expect(peer, self._now())
        self._send(peer, SyncRoot(self._replica.root(), len(self._replica.entries)))

    def on_root(self, peer: PeerId, msg: SyncRoot) -> None:
        if msg.root == self._replica.root():
            return
        if not self._rounds_in.allow(peer, self._now()):  # a round can pull the registry
            self.refused["rate_limited"] += 1
            return
        self._bucketed.expect(peer, self._now())
        self._send(peer, SyncBuckets(tuple(self._replica.bucket_hashes())))

    def on_buckets(self, peer: PeerId, msg: SyncBuckets) -> None:
        done = self._round(self._started, peer, "buckets")
        if done is None or done:
            return  # (one answer per round)
        done.add("buckets")
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
        self._digested.expect(peer, self._now())
        for b in diff:  # split by buckets so each message covers whole buckets
            d = sorted(self._replica.digests_in([b]).items())
            if batch and len(pairs) + len(d) > per_msg:
                self._send(peer, SyncDigest(tuple(batch), tuple(pairs)))
                batch, pairs = [], []
            batch.append(b)
            pairs.extend(d)
        self._send(peer, SyncDigest(tuple(batch), tuple(pairs)))

    def on_digest(self, peer: PeerId, msg: SyncDigest) -> None:
        done = self._round(self._bucketed, peer, "digest")
        if done is None:
            return
        buckets = [b for b in dict.fromkeys(msg.buckets) if b not in done]  # each once a round
        done.update(buckets)
        theirs = dict(msg.digests)
        mine = self._replica.digests_in(buckets)
        send = [sid for sid, d in mine.items() if theirs.get(sid) != d]
        want = tuple(sid for sid, d in theirs.items()
                     if mine.get(sid) != d and sid not in self._replica.tombstones)
        self._send_items(peer, send, want)

    def on_deltas(self, peer: PeerId, msg: SyncDeltas) -> None:
        if not msg.want:
            return
        done = self._round(self._digested, peer, "want")
        if done is None:
            return
        wanted = [s for s in dict.fromkeys(msg.want)
                  if s not in done and s in self._replica.entries]  # each once a round
        done.update(wanted)
        self._send_items(peer, wanted, ())

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
