"""Cache- and session-aware policies with a bound on load imbalance.

Requests carry chain-hash keys of their prompt's leading blocks (`block_keys`: key i covers
blocks 0..i) and a conversation key (`session_key`). Every policy here obeys one bound
(consistent hashing with bounded loads): a candidate may hold at most
ceil((1 + eps) * (in_flight + 1) / n) of this ingress's in-flight requests, so no node takes
more than (1 + eps) times the average however skewed the prompts (or hostile the sketches).
Such a candidate always exists: if all n were at the limit they would hold more than all.

- prefix_bounded: the candidate this ingress last sent the longest matching prefix to (its
  engine's prefix cache likely holds it) when that match covers more than `match_threshold`
  of the prompt; else (cold, or only a shared system prompt matches) the least loaded, ties
  in consistent-hash ring order; past the bound, the next in that order.
- session: the ring owner of the conversation key (the `X-Session-Id` header, else body
  `metadata.session_id`, else `user`); requests without one route as prefix_bounded.
- cache_aware: scores candidates by the leading blocks their gossiped sketch
  (registry/cache_sketch.py) or this ingress's own memory says they hold, minus load and a
  relay-hop cost; cold prompts go to the least loaded. Works across ingresses and clusters
  since the sketches come with the records.

`explain` returns the decision as data (`PrefixPick`); `pick` is its candidate.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmfabric.registry.cache_sketch import matched_blocks
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.errors import InvalidSessionIdError
from llmfabric.routing.request import RouteRequest

BLOCK_CHARS = 256  # ~64 tokens: small enough that a system prompt fills whole blocks
MAX_BLOCKS = 64  # keys per request (16 KiB of prompt): deeper prefixes add little
DEFAULT_EPS = 0.25
MAX_SESSION_CHARS = 256
SESSION_HEADER = "X-Session-Id"
RELAY_COST = 0.1  # score lost for a candidate reached through a relay (one more hop)


def _h64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def block_keys(text: str, block_chars: int = BLOCK_CHARS,
               max_blocks: int = MAX_BLOCKS) -> tuple[int, ...]:
    """Chain hashes of the text's whole blocks (a shorter text: one key for all of it)."""
    data = text.encode()
    if not data:
        return ()
    n = min(max_blocks, max(1, len(data) // block_chars))
    keys: list[int] = []
    prev = b""
    for i in range(n):
        h = hashlib.blake2b(prev + data[i * block_chars:(i + 1) * block_chars], digest_size=8)
        prev = h.digest()
        keys.append(int.from_bytes(prev, "big"))
    return tuple(keys)


def prompt_text(doc: Mapping[str, Any], limit: int = BLOCK_CHARS * MAX_BLOCKS) -> str:
    """The prompt as one string (chat messages: role and text of each), cut at `limit`."""
    msgs = doc.get("messages")
    if isinstance(msgs, list):
        out: list[str] = []
        size = 0
        for m in msgs:
            if not isinstance(m, dict):
                continue
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict)
                                  and isinstance(p.get("text", ""), str))
            if isinstance(content, str):
                part = f"{m.get('role', '')}\x1f{content}"
                out.append(part)
                size += len(part) + 1
                if size >= limit:
                    break
        return "\x1e".join(out)[:limit]
    for key in ("prompt", "input"):
        v = doc.get(key)
        if isinstance(v, list) and v:
            v = v[0]
        if isinstance(v, str):
            return v[:limit]
    return ""


def session_header(value: str | None) -> str:
    """The `X-Session-Id` header as a conversation key ("" when absent or blank). At most
    MAX_SESSION_CHARS printable ASCII characters: anything else (control characters,
    non-ASCII, oversized) raises InvalidSessionIdError rather than being truncated, so two
    different hostile values never silently share (or split) a session."""
    if not value:
        return ""
    sid = value.strip(" \t")  # (HTTP optional whitespace only)
    if len(sid) > MAX_SESSION_CHARS:
        raise InvalidSessionIdError(
            f"{SESSION_HEADER} is longer than {MAX_SESSION_CHARS} characters")
    if not (sid.isascii() and sid.isprintable()):
        raise InvalidSessionIdError(
            f"{SESSION_HEADER} must be printable ASCII (no control or non-ASCII characters)")
    return sid


def session_key(doc: Mapping[str, Any], header: str = "") -> str:
    """The conversation a request belongs to: `header` (a valid X-Session-Id, see
    `session_header`), else metadata.session_id, else the `user` field."""
    if header:
        return header
    meta = doc.get("metadata")
    if isinstance(meta, dict):
        sid = meta.get("session_id")
        if isinstance(sid, str) and sid:
            return sid[:MAX_SESSION_CHARS]
    user = doc.get("user")
    return user[:MAX_SESSION_CHARS] if isinstance(user, str) else ""


def prompt_prefix(doc: Mapping[str, Any], n: int) -> str:
    """The first `n` characters of a request's prompt, for the policies that route on it
    (`needs_prefix`): chat messages' texts joined by \\x1e, else `prompt` or `input` (the
    first of a list)."""
    msgs = doc.get("messages")
    if isinstance(msgs, list):
        out: list[str] = []
        size = 0
        for m in msgs:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):
                # (only string texts: a client's `"text": 5` must not become a TypeError)
                content = "".join(
                    t for p in content if isinstance(p, dict)
                    and isinstance(t := p.get("text", ""), str)
                )
            if isinstance(content, str):
                out.append(content)
                size += len(content)
                if size >= n:
                    break
        return "\x1e".join(out)[:n]
    for key in ("prompt", "input"):
        v = doc.get(key)
        if isinstance(v, list) and v:
            v = v[0]
        if isinstance(v, str):
            return v[:n]
    return ""


def routing_keys(doc: Mapping[str, Any], header: str = "") -> tuple[tuple[int, ...], str]:
    """(block keys of the prompt, conversation key) of a parsed request body (`header`: a
    valid X-Session-Id, which takes precedence)."""
    return block_keys(prompt_text(doc)), session_key(doc, header)


def bounded_limit(in_flight: int, n: int, eps: float) -> int:
    """The most in-flight requests one of `n` candidates may hold after one more arrives."""
    return math.ceil((1.0 + eps) * (in_flight + 1) / n)


@dataclass(frozen=True, slots=True)
class PrefixPick:
    """Why a candidate was chosen."""

    candidate: Candidate
    policy: str
    # "only", "memory", "sketch", "session", "least_loaded" (nothing to follow), or "spill"
    # (the preferred candidate was at the bound)
    reason: str
    preferred: str  # session id the cache/session preference pointed at ("" if none)
    matched_blocks: int  # leading blocks the chosen one is believed to hold
    limit: int  # the bound at this pick


class _BoundedBase:
    """In-flight counts per session, a consistent-hash ring and the bounded walk."""

    name = "prefix_bounded"
    needs_prefix = False
    needs_blocks = True  # the ingress fills RouteRequest.blocks and .session

    def __init__(self, rng: random.Random, eps: float = DEFAULT_EPS, vnodes: int = 64,
                 match_threshold: float = 0.5, memory: int = 65536) -> None:
        if eps < 0:
            raise ValueError("eps must be >= 0")
        self._rng = rng
        self.eps = eps
        self._vnodes = vnodes
        self.match_threshold = match_threshold
        self._rings: dict[tuple[str, ...], tuple[list[int], list[str]]] = {}
        self.outstanding: dict[str, int] = {}
        self._where: OrderedDict[int, str] = OrderedDict()  # block key -> session sent to
        self._memory = memory

    # -- in-flight accounting ------------------------------------------------------------

    def on_request_start(self, candidate: Candidate) -> None:
        sid = candidate.session_id
        self.outstanding[sid] = self.outstanding.get(sid, 0) + 1

    def on_request_end(self, candidate: Candidate, ok: bool) -> None:
        n = self.outstanding.get(candidate.session_id, 0) - 1
        if n > 0:
            self.outstanding[candidate.session_id] = n
        else:
            self.outstanding.pop(candidate.session_id, None)

    # -- pieces --------------------------------------------------------------------------

    def _ring(self, ids: tuple[str, ...]) -> tuple[list[int], list[str]]:
        ring = self._rings.get(ids)
        if ring is None:
            points = sorted((_h64(f"{s}#{v}".encode()), s)
                            for s in ids for v in range(self._vnodes))
            ring = ([p for p, _ in points], [s for _, s in points])
            if len(self._rings) >= 64:
                self._rings.clear()
            self._rings[ids] = ring
        return ring

    def _ring_order(self, by_id: Mapping[str, Candidate], key: int) -> list[str]:
        """Distinct session ids clockwise from `key`."""
        hashes, owners = self._ring(tuple(sorted(by_id)))
        start = bisect.bisect_left(hashes, key)
        order: list[str] = []
        seen: set[str] = set()
        for i in range(len(owners)):
            sid = owners[(start + i) % len(owners)]
            if sid not in seen:
                seen.add(sid)
                order.append(sid)
                if len(order) == len(by_id):
                    break
        return order

    def _ring_key(self, request: RouteRequest) -> int | None:
        if request.blocks:
            return request.blocks[-1]
        if request.prefix:
            return _h64(request.prefix.encode())
        return None

    def _remembered(self, by_id: Mapping[str, Candidate],
                    blocks: Sequence[int]) -> tuple[str, int]:
        """The session this ingress sent the longest known prefix to, and its length."""
        for i in range(len(blocks) - 1, -1, -1):
            sid = self._where.get(blocks[i])
            if sid is not None and sid in by_id:
                return sid, i + 1
        return "", 0

    def _remember(self, blocks: Sequence[int], sid: str) -> None:
        where = self._where
        for key in blocks:
            where[key] = sid
            where.move_to_end(key)
        while len(where) > self._memory:
            where.popitem(last=False)

    def _bounded(self, by_id: Mapping[str, Candidate], order: Sequence[str], limit: int,
                 preferred: str, matched: int, why: str) -> PrefixPick:
        """The first of `order` under the bound (one always is)."""
        out = self.outstanding
        for sid in order:
            if out.get(sid, 0) + 1 <= limit:
                reason = why if sid == preferred or not preferred else "spill"
                return PrefixPick(by_id[sid], self.name, reason, preferred,
                                  matched if sid == preferred else 0, limit)
        least = min(order, key=lambda s: out.get(s, 0))  # unreachable by the argument above
        return PrefixPick(by_id[least], self.name, "spill", preferred, 0, limit)

    def _preference(self, by_id: Mapping[str, Candidate],
                    request: RouteRequest) -> tuple[list[str], str, int, str]:
        """(walk order, preferred session, its matched blocks, reason)."""
        sid, n = self._remembered(by_id, request.blocks)
        order = self._cold_order(by_id, request)
        if sid and self._significant(n, request.blocks):
            return [sid, *(s for s in order if s != sid)], sid, n, "memory"
        return order, "", 0, "least_loaded"

    def _significant(self, matched: int, blocks: Sequence[int]) -> bool:
        """A match worth following: most of the prompt (a shared system prompt is not)."""
        return matched >= 1 and matched > self.match_threshold * len(blocks)

    def _cold_order(self, by_id: Mapping[str, Candidate], request: RouteRequest) -> list[str]:
        """No cache to follow: least in flight first, ties in ring order of the prompt."""
        key = self._ring_key(request)
        ring = self._ring_order(by_id, key if key is not None else 0)
        pos = {s: i for i, s in enumerate(ring)}
        return sorted(ring, key=lambda s: (self.outstanding.get(s, 0), pos[s]))

    # -- Policy ----------------------------------------------------------------------------

    def explain(self, candidates: Sequence[Candidate], request: RouteRequest) -> PrefixPick:
        by_id = {c.session_id: c for c in candidates}
        total = sum(self.outstanding.get(s, 0) for s in by_id)
        limit = bounded_limit(total, len(by_id), self.eps)
        if len(by_id) == 1:
            got = PrefixPick(candidates[0], self.name, "only", "", 0, limit)
        else:
            order, preferred, matched, why = self._preference(by_id, request)
            got = self._bounded(by_id, order, limit, preferred, matched, why)
        if request.blocks:
            self._remember(request.blocks, got.candidate.session_id)
        return got

    def pick(self, candidates: Sequence[Candidate], request: RouteRequest) -> Candidate:
        return self.explain(candidates, request).candidate


class PrefixBoundedPolicy(_BoundedBase):
    name = "prefix_bounded"


class SessionAffinityPolicy(_BoundedBase):
    name = "session"

    def _preference(self, by_id: Mapping[str, Candidate],
                    request: RouteRequest) -> tuple[list[str], str, int, str]:
        if not request.session:
            return super()._preference(by_id, request)
        order = self._ring_order(by_id, _h64(b"session\x00" + request.session.encode()))
        return order, order[0], 0, "session"


class CacheAwarePolicy(_BoundedBase):
    name = "cache_aware"

    def __init__(self, rng: random.Random, eps: float = DEFAULT_EPS, hit_weight: float = 2.0,
                 **kw: Any) -> None:
        super().__init__(rng, eps, **kw)
        self.hit_weight = hit_weight

    def _preference(self, by_id: Mapping[str, Candidate],
                    request: RouteRequest) -> tuple[list[str], str, int, str]:
        blocks = request.blocks
        if not blocks:
            return super()._preference(by_id, request)
        mem_sid, mem_n = self._remembered(by_id, blocks)
        total = sum(self.outstanding.get(s, 0) for s in by_id)
        avg = max(1.0, total / len(by_id))
        scored: list[tuple[float, int, str]] = []
        for sid, c in by_id.items():
            hit = matched_blocks(c.prefix_cache, blocks) if c.prefix_cache else 0
            if sid == mem_sid:
                hit = max(hit, mem_n)
            if not self._significant(hit, blocks):  # (a shared system prompt says little)
                continue
            score = (self.hit_weight * hit / len(blocks)
                     - self.outstanding.get(sid, 0) / avg
                     - (RELAY_COST if c.relays else 0.0))
            scored.append((score, hit, sid))
        ring = self._cold_order(by_id, request)
        if not scored:
            return ring, "", 0, "least_loaded"
        scored.sort(key=lambda t: (-t[0], t[2]))
        best = scored[0]
        head = [sid for _, _, sid in scored]
        return ([*head, *(s for s in ring if s not in set(head))], best[2], best[1],
                "memory" if best[2] == mem_sid and best[1] == mem_n else "sketch")
