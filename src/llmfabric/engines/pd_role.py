"""Prefill/decode roles of the simulated engine (ThunderServe, COMPANIONS.md §1.6 item 3).

The wire protocol is vLLM's disaggregated one (its NixlConnector and toy proxy): the proxy
sends the prefill call with `max_tokens=1` and `kv_transfer_params = {"do_remote_decode":
true}`; the prefill engine answers with the first token and `kv_transfer_params` naming where
the KV lives (`remote_engine_id`, `remote_request_id`, ...); the proxy hands those params to
the decode engine with the original request, and the decode engine pulls the KV and streams
the whole completion. Here the KV itself is a stand-in: the handle carries its token count and
wire bytes (exact KIVI accounting from kvcompress at `--kv-bits`, fp16 otherwise), and the
decode engine waits the alpha-beta time of its configured link (ThunderServe eq. 1) instead
of moving bytes. Everything else is the real path: the role gate, the handle validation,
the two calls through the ingress.

A role is a routing hint, not a capability: like vLLM with `kv_role=kv_both`, every role
serves plain (colocated) requests, so a flip (`POST /sim/role`) needs no restart and the
ingress can fall back to any node. An engine refuses only the PD phase its role does not
take, with a retryable 503, so the ingress moves that phase to another node.
"""

from __future__ import annotations

import itertools
import math
import secrets
from dataclasses import dataclass
from typing import Any

from llmfabric.clock import Clock
from llmfabric.kvcompress.accounting import BITS, model_kv_bytes

ROLES = ("prefill", "decode", "both")
# fp16 K and V of a llama-3-8B-shaped model (32 layers x 8 KV heads x 128), for unknown models
_DEFAULT_KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2
_MAX_ID_CHARS = 128
_MAX_KV_BYTES = 1 << 40


class PDRequestError(ValueError):
    """A malformed `kv_transfer_params` (answered 400)."""


@dataclass(frozen=True, slots=True)
class KVLink:
    """The link the KV arrives over (eq. 1: latency + bytes / bandwidth)."""

    gbps: float = 40.0
    latency_s: float = 0.001

    def __post_init__(self) -> None:
        if not (self.gbps > 0 and math.isfinite(self.gbps)) or not (
                0 <= self.latency_s < 60):
            raise ValueError("a KV link needs gbps > 0 and 0 <= latency_s < 60")

    def transfer_s(self, n_bytes: int) -> float:
        return self.latency_s + n_bytes * 8 / (self.gbps * 1e9)


def validate_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


def kv_bytes(model: str, tokens: int, bits: int | None, group: int = 64) -> int:
    """Wire bytes of one request's KV: fp16, or packed `bits` codes + per-group metadata."""
    from llmfabric.sim.errors import SimError
    from llmfabric.sim.models import get_model

    try:
        spec: Any = get_model(model)
    except SimError:  # (a model llmfabric.sim does not know: an 8B-shaped default)
        spec = None
    if bits is None or bits >= 16:
        if spec is None:
            return tokens * _DEFAULT_KV_BYTES_PER_TOKEN
        return int(spec.n_layers * spec.n_kv_heads * spec.head_dim * 2 * 2 * tokens)
    if spec is None:
        ratio = bits / 16 + 2 / group  # bits/8 + 4/G bytes per fp16 (2-byte) element
        return math.ceil(tokens * _DEFAULT_KV_BYTES_PER_TOKEN * ratio)
    return model_kv_bytes(spec, tokens, bits, group)


def phase_of(extra: dict[str, Any] | None) -> str | None:
    """"prefill", "decode" or None (a plain request) from a request's kv_transfer_params."""
    params = (extra or {}).get("kv_transfer_params")
    if params is None:
        return None
    if not isinstance(params, dict):
        raise PDRequestError("kv_transfer_params must be an object")
    remote_decode = params.get("do_remote_decode") is True
    remote_prefill = params.get("do_remote_prefill") is True
    if remote_decode and remote_prefill:
        raise PDRequestError("kv_transfer_params: do_remote_decode and do_remote_prefill "
                             "cannot both be true")
    return "prefill" if remote_decode else "decode" if remote_prefill else None


@dataclass(frozen=True, slots=True)
class Handoff:
    """What a decode engine learns from the handle: whose KV, how many tokens, how many bytes."""

    engine_id: str
    request_id: str
    tokens: int
    n_bytes: int
    bits: int


def parse_handoff(extra: dict[str, Any], prompt_tokens: int, model: str) -> Handoff:
    """Validate a decode call's handle (hostile input: bounded ids, sizes that match)."""
    p = extra["kv_transfer_params"]
    eid, rid = p.get("remote_engine_id"), p.get("remote_request_id")
    tokens, n_bytes, bits = p.get("kv_tokens"), p.get("kv_bytes"), p.get("kv_bits", 16)
    for name, v in (("remote_engine_id", eid), ("remote_request_id", rid)):
        if not isinstance(v, str) or not 0 < len(v) <= _MAX_ID_CHARS:
            raise PDRequestError(f"kv_transfer_params.{name} must be a string of 1-"
                                 f"{_MAX_ID_CHARS} characters")
    for name, v in (("kv_tokens", tokens), ("kv_bytes", n_bytes), ("kv_bits", bits)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise PDRequestError(f"kv_transfer_params.{name} must be a non-negative integer")
    assert isinstance(tokens, int) and isinstance(n_bytes, int) and isinstance(bits, int)
    if bits not in (*BITS, 16):
        raise PDRequestError(f"kv_transfer_params.kv_bits must be one of {(*BITS, 16)}")
    if n_bytes > _MAX_KV_BYTES:
        raise PDRequestError("kv_transfer_params.kv_bytes is out of range")
    if tokens != prompt_tokens:
        raise PDRequestError(f"the KV handle holds {tokens} tokens but the prompt has "
                             f"{prompt_tokens}: not this request's KV")
    # The bytes follow from the tokens, bits and model: a prefill node's claim of anything
    # else (1 TiB: minutes of link time the decode waited out; a truncated or foreign KV)
    # is refused, not waited for.
    want = kv_bytes(model, tokens, bits)
    if n_bytes != want:
        raise PDRequestError(f"kv_transfer_params.kv_bytes is {n_bytes}, but {tokens} tokens "
                             f"of {bits}-bit KV of this model are {want} bytes")
    assert isinstance(eid, str) and isinstance(rid, str)
    return Handoff(eid, rid, tokens, n_bytes, bits)


class PDRole:
    """An engine's role, its KV handles out (prefill) and KV arrivals in (decode)."""

    def __init__(self, role: str, clock: Clock, link: KVLink | None = None,
                 kv_bits: int | None = None) -> None:
        if kv_bits is not None and kv_bits not in BITS:
            raise ValueError(f"kv_bits must be one of {BITS} (or unset: fp16)")
        self.role = validate_role(role)
        self.clock = clock
        self.link = link or KVLink()
        self.kv_bits = kv_bits
        self.engine_id = "sim-" + secrets.token_hex(6)
        self._ids = itertools.count(1)
        self.flips = 0
        self.prefills = self.decodes = 0
        self.kv_bytes_out = self.kv_bytes_in = 0
        self.transfer_s = 0.0

    def set_role(self, role: str) -> None:
        if validate_role(role) != self.role:
            self.role, self.flips = role, self.flips + 1

    def refusal(self, phase: str) -> str | None:
        """Why this engine does not take `phase` now (None: it does)."""
        if self.role in (phase, "both"):
            return None
        return f"this engine's role is {self.role}; it does not take {phase} calls"

    def handle(self, model: str, prompt_tokens: int) -> dict[str, Any]:
        """The prefill answer's kv_transfer_params: where the decode engine finds the KV."""
        n_bytes = kv_bytes(model, prompt_tokens, self.kv_bits)
        self.prefills += 1
        self.kv_bytes_out += n_bytes
        return {"do_remote_decode": False, "do_remote_prefill": True,
                "remote_engine_id": self.engine_id,
                "remote_request_id": f"{self.engine_id}-{next(self._ids)}",
                "kv_tokens": prompt_tokens, "kv_bytes": n_bytes,
                "kv_bits": self.kv_bits or 16}

    async def receive(self, handoff: Handoff) -> float:
        """Wait while the KV arrives over this engine's link; returns the seconds waited."""
        t = self.link.transfer_s(handoff.n_bytes)
        await self.clock.sleep(t)
        self.decodes += 1
        self.kv_bytes_in += handoff.n_bytes
        self.transfer_s += t
        return t

    def stats(self) -> dict[str, Any]:
        return {"role": self.role, "flips": self.flips, "prefills": self.prefills,
                "decodes": self.decodes, "kv_bytes_out": self.kv_bytes_out,
                "kv_bytes_in": self.kv_bytes_in, "kv_transfer_s": round(self.transfer_s, 6),
                "kv_bits": self.kv_bits or 16, "link_gbps": self.link.gbps}
