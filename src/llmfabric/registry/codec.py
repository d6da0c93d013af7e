"""Canonical msgpack encoding of NodeRecord bodies, signing and verified decoding.

The signature covers the exact body bytes, which travel with it (`SignedRecord.body`): a
receiver verifies the bytes it got, then decodes them, ignoring map keys it does not know. A
newer node may therefore add fields to NodeMeta without breaking older replicas, and a record
is forwarded byte for byte. Bodies are msgpack maps with sorted keys, floats as float64.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import msgpack

from llmfabric.identity.admission import MAX_CERT_BYTES
from llmfabric.registry.cache_sketch import sketch_problem
from llmfabric.registry.errors import InvalidRecord, NotOwner
from llmfabric.registry.records import (
    Hardware,
    KeyGrant,
    Lifecycle,
    LoadHints,
    ModelDemand,
    ModelRole,
    NodeMeta,
    NodeRecord,
    ServedModel,
)
from llmfabric.registry.signing import (
    Signer,
    peer_id_matches,
    session_matches_key,
    verify_signature,
)

RECORD_DOMAIN = b"llmfabric/record/v1\x00"
MAX_BODY_BYTES = 16 * 1024
MAX_STR = 512
MAX_ITEMS = 256
MAX_CERT = MAX_CERT_BYTES  # a membership certificate naming up to a few dozen models
# Names a record's models answer to in all (id, aliases, adapters, base:adapter for every
# base and adapter): each list is capped, but aliases x adapters is not, and one 15 KB record
# made 596,488 routing names (7.5 s and 246 MB to index on an ingress). vLLM with dozens of
# LoRA adapters and a few aliases per model stays far below.
MAX_NAMES = 4096


@dataclass(frozen=True, slots=True)
class SignedRecord:
    """A verified NodeRecord with the exact body bytes its signature covers."""

    record: NodeRecord
    body: bytes

    @property
    def session_id(self) -> str:
        return self.record.session_id

    @property
    def signature(self) -> bytes:
        return self.record.signature


def _canon(value: Any) -> Any:
    """Dataclasses -> maps with sorted keys, tuples -> lists, enums -> plain values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _canon(getattr(value, f.name)) for f in sorted(
            dataclasses.fields(value), key=lambda f: f.name)}
    if isinstance(value, tuple | list):
        return [_canon(v) for v in value]
    if isinstance(value, ModelRole):
        return str(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


# Optional NodeMeta fields left out of the body while unset: records of nodes that do not use
# them keep their size and bytes (older nodes write the same body).
_OMIT_WHEN_ZERO = ("alloc_end", "drain_lead_s", "prefix_cache", "pd_plan", "spend",
                   "revocations_at", "revocations_digest")
MAX_PD_PLAN = 8 * 1024  # the PD plan item (routing/pd_plan.py parses what is inside)
MAX_SPEND = 2 * 1024  # an ingress's spend item (accounts/spend_share.py parses it)
MAX_REVOCATIONS_DIGEST = 32  # (identity.revocation.list_digest: 8 bytes)


def encode_body(record: NodeRecord) -> bytes:
    meta = _canon(record.meta)
    for key in _OMIT_WHEN_ZERO:
        if not meta[key]:
            del meta[key]
    body = {
        "i": record.incarnation,
        "k": record.public_key,
        "m": meta,
        "p": record.peer_id,
        "s": record.session_id,
        "st": int(record.state),
        "t": float(record.updated_at),
        "v": record.version,
    }
    return bytes(msgpack.packb(body, use_bin_type=True))


def sign_record(signer: Signer, record: NodeRecord) -> SignedRecord:
    """Sign `record` as its owner; raise NotOwner if `signer` is not the session's key."""
    if record.peer_id != signer.peer_id or record.public_key != signer.public_bytes:
        raise NotOwner(
            f"record of session {record.session_id} names peer {record.peer_id}; "
            f"sign it with that node's key, not {signer.peer_id}"
        )
    if not session_matches_key(record.session_id, record.public_key):
        raise NotOwner(
            f"session id {record.session_id!r} was not minted for this key; "
            "create it with registry.signing.new_session_id(public_key)"
        )
    body = encode_body(record)
    sig = signer.sign(RECORD_DOMAIN + body)
    return SignedRecord(dataclasses.replace(record, signature=sig), body)


# ---- validated decoding -------------------------------------------------------------------


def _fail(detail: str) -> InvalidRecord:
    return InvalidRecord("schema", detail)


def _str(v: Any, name: str, max_len: int = MAX_STR) -> str:
    if not isinstance(v, str) or len(v) > max_len:
        raise _fail(f"{name} must be a string of at most {max_len} chars")
    return v


def _int(v: Any, name: str, lo: int = 0, hi: int = 2**63 - 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _fail(f"{name} must be an integer in [{lo}, {hi}]")
    return v


def _float(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or v != v:
        raise _fail(f"{name} must be a number")
    return float(v)


def _list(v: Any, name: str) -> list[Any]:
    if not isinstance(v, list) or len(v) > MAX_ITEMS:
        raise _fail(f"{name} must be a list of at most {MAX_ITEMS} items")
    return v


def _map(v: Any, name: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _fail(f"{name} must be a map")
    return v


def _strs(v: Any, name: str) -> tuple[str, ...]:
    return tuple(_str(x, name) for x in _list(v, name))


def _hardware(d: dict[str, Any]) -> Hardware:
    h = Hardware()
    return Hardware(
        gpu_model=_str(d.get("gpu_model", h.gpu_model), "gpu_model"),
        gpu_count=_int(d.get("gpu_count", h.gpu_count), "gpu_count", 0, 1 << 20),
        gpu_memory_gb=_float(d.get("gpu_memory_gb", h.gpu_memory_gb), "gpu_memory_gb"),
        interconnect=_str(d.get("interconnect", h.interconnect), "interconnect"),
        cpu_count=_int(d.get("cpu_count", h.cpu_count), "cpu_count", 0, 1 << 20),
        memory_gb=_float(d.get("memory_gb", h.memory_gb), "memory_gb"),
    )


def _model(d: dict[str, Any]) -> ServedModel:
    try:
        role = ModelRole(_str(d.get("role", "both"), "role"))
    except ValueError:
        raise _fail("role must be one of both/prefill/decode") from None
    return ServedModel(
        id=_str(d.get("id"), "model id"),
        aliases=_strs(d.get("aliases", []), "aliases"),
        quantization=_str(d.get("quantization", "bf16"), "quantization"),
        quant_bits=_int(d.get("quant_bits", 16), "quant_bits", 0, 64),
        max_context=_int(d.get("max_context", 4096), "max_context"),
        role=role,
        adapters=_strs(d.get("adapters", []), "adapters"),
    )


def _load(d: dict[str, Any]) -> LoadHints:
    return LoadHints(
        inflight=_int(d.get("inflight", 0), "inflight"),
        queued=_int(d.get("queued", 0), "queued"),
        tokens_per_s=_float(d.get("tokens_per_s", 0.0), "tokens_per_s"),
        running=_int(d.get("running", 0), "running"),
        kv_usage=min(1.0, max(0.0, _float(d.get("kv_usage", 0.0), "kv_usage"))),
        prefix_hit_rate=min(1.0, max(0.0, _float(d.get("prefix_hit_rate", 0.0),
                                                 "prefix_hit_rate"))),
    )


def _demand(d: dict[str, Any]) -> ModelDemand:
    rate = _float(d.get("rate", 0.0), "demand rate")
    mean_in = _float(d.get("mean_in", 0.0), "demand mean_in")
    mean_out = _float(d.get("mean_out", 0.0), "demand mean_out")
    if not all(0.0 <= x < 1e12 for x in (rate, mean_in, mean_out)):
        raise _fail("demand rate and token means must be finite and >= 0")
    return ModelDemand(_str(d.get("model"), "demand model"), rate, mean_in, mean_out)


def _bounded(v: Any, name: str) -> float:
    x = _float(v, name)
    if not 0.0 <= x < 1e12:
        raise _fail(f"{name} must be finite and >= 0")
    return x


def _grant(d: dict[str, Any]) -> KeyGrant:
    revoked = _float(d.get("revoked_at", 0.0), "key revoked_at")
    if not 0.0 <= revoked < 1e12:
        raise _fail("key revoked_at must be a time")
    return KeyGrant(
        id=_str(d.get("id"), "key id", 32),
        hash=_str(d.get("hash"), "key hash", 64),
        owner=_str(d.get("owner"), "key owner", 200),
        requests_per_min=_int(d.get("requests_per_min", 0), "key requests_per_min"),
        tokens_per_min=_int(d.get("tokens_per_min", 0), "key tokens_per_min"),
        revoked_at=revoked,
    )


def _pairs(v: Any) -> tuple[tuple[str, str], ...]:
    out = []
    for p in _list(v, "labels"):
        pl = _list(p, "label")
        if len(pl) != 2:
            raise _fail("a label is a [key, value] pair")
        out.append((_str(pl[0], "label key"), _str(pl[1], "label value")))
    return tuple(out)


def name_count(models: tuple[ServedModel, ...]) -> int:
    """Sum of `len(m.names())`, without building the names."""
    return sum((1 + len(m.aliases)) * (1 + len(m.adapters)) + len(m.adapters) for m in models)


def _models(v: Any) -> tuple[ServedModel, ...]:
    models = tuple(_model(_map(x, "model")) for x in _list(v, "models"))
    names = name_count(models)
    if names > MAX_NAMES:
        raise _fail(f"the models answer to {names} names; at most {MAX_NAMES} per record")
    return models


def decode_meta(d: dict[str, Any]) -> NodeMeta:
    m = NodeMeta()
    return NodeMeta(
        provider_id=_str(d.get("provider_id", m.provider_id), "provider_id"),
        peer_addrs=_strs(d.get("peer_addrs", []), "peer_addrs"),
        http_addr=_str(d.get("http_addr", m.http_addr), "http_addr"),
        relays=_strs(d.get("relays", []), "relays"),
        hardware=_hardware(_map(d.get("hardware", {}), "hardware")),
        engine=_str(d.get("engine", m.engine), "engine"),
        models=_models(d.get("models", [])),
        load=_load(_map(d.get("load", {}), "load")),
        labels=_pairs(d.get("labels", [])),
        tier=_str(d.get("tier", m.tier), "tier"),
        roles=_strs(d.get("roles", []), "roles"),
        demand=tuple(_demand(_map(x, "demand")) for x in _list(d.get("demand", []), "demand")),
        alloc_end=_bounded(d.get("alloc_end", 0.0), "alloc_end"),
        drain_lead_s=_bounded(d.get("drain_lead_s", 0.0), "drain_lead_s"),
        cert=_str(d.get("cert", m.cert), "cert", MAX_CERT),
        keys=tuple(_grant(_map(x, "key")) for x in _list(d.get("keys", []), "keys")),
        prefix_cache=_sketch(d.get("prefix_cache", b"")),
        pd_plan=_opaque(d.get("pd_plan", b""), "pd_plan", MAX_PD_PLAN),
        spend=_opaque(d.get("spend", b""), "spend", MAX_SPEND),
        revocations_at=_bounded(d.get("revocations_at", 0.0), "revocations_at"),
        revocations_digest=_opaque(d.get("revocations_digest", b""), "revocations_digest",
                                   MAX_REVOCATIONS_DIGEST),
    )


def _opaque(v: Any, name: str, max_len: int) -> bytes:
    if not isinstance(v, bytes) or len(v) > max_len:
        raise _fail(f"{name} must be at most {max_len} bytes")
    return v


def _sketch(v: Any) -> bytes:
    if not isinstance(v, bytes):
        raise _fail("prefix_cache must be bytes")
    problem = sketch_problem(v)
    if problem is not None:
        raise _fail(problem)
    return v


def unpack_limited(data: bytes, max_len: int) -> Any:
    """msgpack.unpackb with size limits; raise InvalidRecord('garbled', ...) on bad bytes."""
    if len(data) > max_len:
        raise InvalidRecord("oversized", f"{len(data)} bytes > {max_len}")
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True,
            max_str_len=max_len, max_bin_len=max_len,
            max_array_len=4096, max_map_len=4096,
        )
    except Exception as exc:  # msgpack raises many types for garbage input
        raise InvalidRecord("garbled", f"not msgpack: {type(exc).__name__}") from None


def peek_record_header(body: bytes) -> tuple[str, tuple[int, int, int]]:
    """(session id, order key) of a record body without decoding its metadata (unverified)."""
    d = unpack_limited(body, MAX_BODY_BYTES)
    if not isinstance(d, dict):
        raise _fail("a record is a map")
    return (_str(d.get("s"), "session_id", 64),
            (_int(d.get("st"), "state", 0, 3), _int(d.get("i"), "incarnation"),
             _int(d.get("v"), "version")))


def decode_record_body(body: bytes) -> NodeRecord:
    """Decode (without verifying) a record body; raise InvalidRecord on bad shape."""
    d = _map(unpack_limited(body, MAX_BODY_BYTES), "record")
    pk = d.get("k")
    if not isinstance(pk, bytes) or len(pk) != 32:
        raise _fail("public key must be 32 bytes")
    try:
        state = Lifecycle(_int(d.get("st"), "state", 0, 3))
    except ValueError:
        raise _fail("unknown lifecycle state") from None
    return NodeRecord(
        session_id=_str(d.get("s"), "session_id", 64),
        peer_id=_str(d.get("p"), "peer_id", 128),
        public_key=pk,
        state=state,
        incarnation=_int(d.get("i"), "incarnation"),
        version=_int(d.get("v"), "version"),
        updated_at=_float(d.get("t"), "updated_at"),
        meta=decode_meta(_map(d.get("m", {}), "meta")),
    )


def verify_record(body: bytes, signature: bytes) -> SignedRecord:
    """Decode and verify a signed record; raise InvalidRecord(reason) if anything is off."""
    rec = decode_record_body(body)
    if not peer_id_matches(rec.peer_id, rec.public_key):
        raise InvalidRecord("peer_id", f"peer id {rec.peer_id} does not derive from the key")
    if not session_matches_key(rec.session_id, rec.public_key):
        raise InvalidRecord("session", f"session {rec.session_id} is not bound to the key")
    if not verify_signature(rec.public_key, RECORD_DOMAIN + body, signature):
        raise InvalidRecord("signature", f"bad signature on session {rec.session_id}")
    return SignedRecord(dataclasses.replace(rec, signature=signature), body)
