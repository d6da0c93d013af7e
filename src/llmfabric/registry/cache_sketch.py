"""A node's prefix-cache summary as it travels in its record: a small Bloom filter of block keys.

A block key is a 64-bit chain hash of a prompt prefix cut into fixed blocks
(routing/prefix.py): key i covers blocks 0..i, so "key i is in the filter" means "the node
holds (or recently served) this whole prefix". Readers walk a request's keys from the first
and stop at the first miss; a false positive can only lengthen the estimated hit.

Bounds (hostile members): at most `MAX_SKETCH_BYTES`, a power of two; a filter fuller than
`MAX_FILL` is ignored (it would claim to hold every prefix to attract requests). The sketch is
signed with the rest of the record, and bounded-load routing caps what any node can attract.
"""

from __future__ import annotations

from collections.abc import Iterable

SKETCH_BYTES = 512  # 4096 bits: ~400 keys at a ~4% false-positive rate with K=3
MAX_SKETCH_BYTES = 2048
K_HASHES = 3
MAX_FILL = 0.6  # a filter of SKETCH_BYTES holding 400 keys is ~25% full


def _positions(key: int, nbits: int) -> tuple[int, ...]:
    """K bit positions by double hashing the two 32-bit halves of the key."""
    h1 = key & 0xFFFFFFFF
    h2 = (key >> 32) | 1
    return tuple((h1 + i * h2) % nbits for i in range(K_HASHES))


def build_sketch(keys: Iterable[int], nbytes: int = SKETCH_BYTES) -> bytes:
    """The filter bytes for `keys` (b"" when there are none)."""
    bits = bytearray(nbytes)
    nbits = nbytes * 8
    any_key = False
    for key in keys:
        any_key = True
        for p in _positions(key, nbits):
            bits[p >> 3] |= 1 << (p & 7)
    return bytes(bits) if any_key else b""


def sketch_contains(sketch: bytes, key: int) -> bool:
    if not sketch:
        return False
    nbits = len(sketch) * 8
    return all(sketch[p >> 3] & (1 << (p & 7)) for p in _positions(key, nbits))


def sketch_fill(sketch: bytes) -> float:
    """Fraction of bits set."""
    if not sketch:
        return 0.0
    return sum(b.bit_count() for b in sketch) / (len(sketch) * 8)


def sketch_problem(sketch: bytes) -> str | None:
    """Why a received sketch cannot be stored (None: it can); the codec rejects the record."""
    n = len(sketch)
    if n > MAX_SKETCH_BYTES:
        return f"prefix_cache sketch of {n} bytes is over the limit of {MAX_SKETCH_BYTES}"
    if n and n & (n - 1):
        return f"prefix_cache sketch length {n} is not a power of two"
    return None


def usable_sketch(sketch: bytes) -> bytes:
    """The sketch to route by: b"" for one too full to mean anything."""
    return b"" if sketch_fill(sketch) > MAX_FILL else sketch


def matched_blocks(sketch: bytes, keys: Iterable[int]) -> int:
    """How many leading block keys of a request the sketch claims (stops at the first miss)."""
    n = 0
    for key in keys:
        if not sketch_contains(sketch, key):
            break
        n += 1
    return n
