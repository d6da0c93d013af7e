"""Wire format of gossip and membership messages: a versioned msgpack envelope.

``[version, kind, sender_session, body]`` where `kind` is a `MsgKind` (append-only IntEnum)
and `body` a kind-specific array. Registry items travel as ``[item_kind, body, signature]``
and are verified by the replica, not here. `decode` checks length, version, kind and shape
and raises `WireError(reason)`; the agent drops the message and counts the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import msgpack

from llmfabric.membership.messages import Ack, Ping, PingReq, WireItem

VERSION = 1
MAX_MESSAGE_BYTES = 60_000
ITEM_OVERHEAD = 8  # msgpack framing per item beyond body + signature

__all__ = [  # Ack, Ping, PingReq and WireItem are defined in membership.messages
    "ITEM_OVERHEAD", "MAX_MESSAGE_BYTES", "VERSION", "Ack", "Gossip", "Message", "MsgKind",
    "Ping", "PingReq", "SyncBuckets", "SyncDeltas", "SyncDigest", "SyncRoot", "WireError",
    "WireItem", "decode", "encode", "item_size",
]


class MsgKind(IntEnum):  # append-only: never renumber or reuse
    PING = 1
    ACK = 2
    PING_REQ = 3
    GOSSIP = 4
    SYNC_ROOT = 5
    SYNC_BUCKETS = 6
    SYNC_DIGEST = 7
    SYNC_DELTAS = 8


class WireError(Exception):
    """A message could not be decoded; `reason` is the drop-counter key."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Gossip:
    items: tuple[WireItem, ...]


@dataclass(frozen=True, slots=True)
class SyncRoot:
    root: int
    count: int


@dataclass(frozen=True, slots=True)
class SyncBuckets:
    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SyncDigest:
    buckets: tuple[int, ...]
    digests: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class SyncDeltas:
    items: tuple[WireItem, ...]
    want: tuple[str, ...] = ()


Message = Ping | Ack | PingReq | Gossip | SyncRoot | SyncBuckets | SyncDigest | SyncDeltas

_KIND_OF: dict[type, MsgKind] = {
    Ping: MsgKind.PING, Ack: MsgKind.ACK, PingReq: MsgKind.PING_REQ, Gossip: MsgKind.GOSSIP,
    SyncRoot: MsgKind.SYNC_ROOT, SyncBuckets: MsgKind.SYNC_BUCKETS,
    SyncDigest: MsgKind.SYNC_DIGEST, SyncDeltas: MsgKind.SYNC_DELTAS,
}


def item_size(item: WireItem) -> int:
    return len(item[1]) + len(item[2]) + ITEM_OVERHEAD


def _items(items: tuple[WireItem, ...]) -> list[list[Any]]:
    return [[k, b, s] for k, b, s in items]


def _body(msg: Message) -> list[Any]:
    match msg:
        case Ping():
            return [msg.seq, msg.target_session, _items(msg.items)]
        case Ack():
            return [msg.seq, _items(msg.items)]
        case PingReq():
            return [msg.seq, msg.target_peer, msg.target_session]
        case Gossip():
            return [_items(msg.items)]
        case SyncRoot():
            return [msg.root, msg.count]
        case SyncBuckets():
            return [list(msg.hashes)]
        case SyncDigest():
            return [list(msg.buckets), [[s, d] for s, d in msg.digests]]
        case SyncDeltas():
            return [_items(msg.items), list(msg.want)]


def encode(msg: Message, sender_session: str) -> bytes:
    return bytes(msgpack.packb([VERSION, int(_KIND_OF[type(msg)]), sender_session, _body(msg)],
                               use_bin_type=True))


# ---- decoding ---------------------------------------------------------------------------


def _schema(detail: str) -> WireError:
    return WireError("schema", detail)


def _int(v: Any, lo: int = 0, hi: int = 2**64 - 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _schema("expected an integer")
    return v


def _str(v: Any, max_len: int = 128) -> str:
    if not isinstance(v, str) or len(v) > max_len:
        raise _schema("expected a short string")
    return v


def _list(v: Any, n: int | None = None) -> list[Any]:
    if not isinstance(v, list) or (n is not None and len(v) != n):
        raise _schema("expected an array" + (f" of {n}" if n is not None else ""))
    return v


def _witems(v: Any) -> tuple[WireItem, ...]:
    out = []
    for it in _list(v):
        k, b, s = _list(it, 3)
        if not (isinstance(b, bytes) and isinstance(s, bytes)):
            raise _schema("an item is [kind, body bytes, signature bytes]")
        out.append((_int(k, 0, 255), b, s))
    return tuple(out)


def _decode_body(kind: MsgKind, b: list[Any]) -> Message:
    match kind:
        case MsgKind.PING:
            seq, target, items = _list(b, 3)
            return Ping(_int(seq), _str(target), _witems(items))
        case MsgKind.ACK:
            seq, items = _list(b, 2)
            return Ack(_int(seq), _witems(items))
        case MsgKind.PING_REQ:
            seq, peer, target = _list(b, 3)
            return PingReq(_int(seq), _str(peer), _str(target))
        case MsgKind.GOSSIP:
            (items,) = _list(b, 1)
            return Gossip(_witems(items))
        case MsgKind.SYNC_ROOT:
            root, count = _list(b, 2)
            return SyncRoot(_int(root), _int(count))
        case MsgKind.SYNC_BUCKETS:
            (hashes,) = _list(b, 1)
            return SyncBuckets(tuple(_int(h) for h in _list(hashes)))
        case MsgKind.SYNC_DIGEST:
            buckets, pairs = _list(b, 2)
            digests = []
            for p in _list(pairs):
                sid, d = _list(p, 2)
                if not isinstance(d, bytes) or len(d) != 8:
                    raise _schema("a digest is 8 bytes")
                digests.append((_str(sid), d))
            return SyncDigest(tuple(_int(x, 0, 255) for x in _list(buckets)), tuple(digests))
        case MsgKind.SYNC_DELTAS:
            items, want = _list(b, 2)
            return SyncDeltas(_witems(items), tuple(_str(s) for s in _list(want)))
    raise WireError("kind", f"no decoder for {kind}")  # pragma: no cover


def decode(data: bytes, max_len: int = MAX_MESSAGE_BYTES) -> tuple[str, Message]:
    """(sender_session, message); raise WireError(reason) for anything malformed."""
    if len(data) > max_len:
        raise WireError("oversized", f"{len(data)} > {max_len} bytes")
    try:
        env = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True,
                              max_str_len=max_len, max_bin_len=max_len,
                              max_array_len=max_len, max_map_len=64)
    except Exception:  # msgpack raises several exception types for garbage
        raise WireError("garbled") from None
    if not isinstance(env, list) or len(env) != 4:
        raise WireError("garbled", "envelope is not a 4-array")
    version, kind, sender, body = env
    if version != VERSION:
        raise WireError("version", f"got {version!r}, speak {VERSION}")
    try:
        mkind = MsgKind(kind)
    except (ValueError, TypeError):
        raise WireError("kind", f"unknown message kind {kind!r}") from None
    try:
        return _str(sender), _decode_body(mkind, _list(body))
    except ValueError:  # unpacking a list of the wrong length
        raise _schema("wrong arity") from None
