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

A handle is single-use and bound to its request: it carries `kv_prompt_digest` (a digest of
the prompt the prefill engine saw) and `kv_expires_at` (Unix seconds, `HANDLE_TTL_S` after
the prefill). A decode engine refuses a handle for another prompt, an expired one, one that
claims a life past `HANDLE_TTL_S + CLOCK_SKEW_S` from its own clock, or one without these
fields (a prefill engine older than them: the ingress then serves the request colocated),
all with 400; and it remembers the handles it has taken (engine and request id) until they
expire, refusing a second use with 409 `kv_handle_reused`. Memory is bounded by
`MAX_TAKEN_HANDLES`: past it, the handle closest to its expiry is forgotten first (counted in
`/sim/stats` as `handles_evicted`), and a replay of a forgotten handle is taken again, as one
is after its expiry once its (unauthenticated) `kv_expires_at` is rewritten.

A role is a routing hint, not a capability: like vLLM with `kv_role=kv_both`, every role
serves plain (colocated) requests, so a flip (`POST /sim/role`) needs no restart and the
ingress can fall back to any node. An engine refuses only the PD phase its role does not
take, with a retryable 503, so the ingress moves that phase to another node.
"""

from __future__ import annotations

import hashlib
import heapq
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
HANDLE_TTL_S = 120.0  # a handle's life from its prefill (the ingress decodes at once)
CLOCK_SKEW_S = 60.0  # how far ahead of the decode engine's clock a prefill engine's may run
MAX_TAKEN_HANDLES = 65_536  # handles a decode engine remembers (single use) until they expire
_DIGEST_CHARS = 32


class PDRequestError(ValueError):
    """A malformed `kv_transfer_params` (answered 400)."""


class HandleReused(PDRequestError):
    """A handle this decode engine has already taken (answered 409 `kv_handle_reused`)."""


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


def prompt_digest(kind: str, prompt: str) -> str:
    """What binds a handle to its request: a digest of the prompt as the engine reads it
    (`kind` "chat" or "text"; the engine's stand-in for the prompt's token ids)."""
    h = hashlib.sha256(kind.encode())
    h.update(b"\n")
    h.update(prompt.encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:_DIGEST_CHARS]


@dataclass(frozen=True, slots=True)
class Handoff:
    """What a decode engine learns from the handle: whose KV, how many tokens, how many bytes,
    until when."""

    engine_id: str
    request_id: str
    tokens: int
    n_bytes: int
    bits: int
    expires_at: float


def parse_handoff(extra: dict[str, Any], prompt_tokens: int, model: str, digest: str,
                  now_wall: float) -> Handoff:
    """Validate a decode call's handle (hostile input: bounded ids, sizes that match, this
    request's prompt, alive on `now_wall`, the decode engine's Unix time)."""
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
    # Bound to one prompt and one stretch of time. A handle without these fields comes from
    # a prefill engine older than them; taking it would let anyone strip them off a current
    # handle, so it is refused like any other (the ingress then serves the request colocated).
    got = p.get("kv_prompt_digest")
    if not isinstance(got, str):
        raise PDRequestError("kv_transfer_params.kv_prompt_digest is missing: the prefill "
                             "engine is older than single-use handles")
    if got != digest:
        raise PDRequestError("the KV handle was made for another prompt: not this request's KV")
    exp = p.get("kv_expires_at")
    if not isinstance(exp, int | float) or isinstance(exp, bool) or not math.isfinite(exp):
        raise PDRequestError("kv_transfer_params.kv_expires_at must be a number (Unix "
                             "seconds; missing: the prefill engine is older than single-use "
                             "handles)")
    if exp <= now_wall:
        raise PDRequestError("the KV handle has expired")
    if exp > now_wall + HANDLE_TTL_S + CLOCK_SKEW_S:
        raise PDRequestError(f"kv_transfer_params.kv_expires_at is more than "
                             f"{HANDLE_TTL_S + CLOCK_SKEW_S:.0f} s ahead of this engine's clock")
    assert isinstance(eid, str) and isinstance(rid, str)
    return Handoff(eid, rid, tokens, n_bytes, bits, float(exp))


class TakenHandles:
    """The handles a decode engine has taken, each until it expires (single use).

    At most `cap`: past it, the one closest to its expiry is forgotten (`evicted` counts
    them), so a flood of handles costs at most `cap` entries, and what it buys is that the
    oldest handles can be replayed before their expiry."""

    def __init__(self, cap: int = MAX_TAKEN_HANDLES) -> None:
        if cap < 1:
            raise ValueError("cap must be >= 1")
        self.cap = cap
        self._held: set[bytes] = set()  # 16-byte digests of (engine id, request id)
        self._by_expiry: list[tuple[float, bytes]] = []
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._held)

    def take(self, handoff: Handoff, now_wall: float) -> None:
        """Record the handle as used; raise HandleReused if it already was."""
        heap = self._by_expiry
        while heap and heap[0][0] <= now_wall:
            self._held.discard(heapq.heappop(heap)[1])
        key = hashlib.blake2b(f"{handoff.engine_id}\0{handoff.request_id}".encode(
            "utf-8", "surrogatepass"), digest_size=16).digest()
        if key in self._held:
            raise HandleReused(f"the KV handle {handoff.request_id!r} of engine "
                               f"{handoff.engine_id!r} was already used: a handle is "
                               "single-use")
        while len(self._held) >= self.cap:
            self._held.discard(heapq.heappop(heap)[1])
            self.evicted += 1
        self._held.add(key)
        heapq.heappush(heap, (handoff.expires_at, key))


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
        self.taken = TakenHandles()
        self.reused = 0

    def set_role(self, role: str) -> None:
        if validate_role(role) != self.role:
            self.role, self.flips = role, self.flips + 1

    def refusal(self, phase: str) -> str | None:
        """Why this engine does not take `phase` now (None: it does)."""
        if self.role in (phase, "both"):
            return None
        return f"this engine's role is {self.role}; it does not take {phase} calls"

    def handle(self, model: str, prompt_tokens: int, digest: str) -> dict[str, Any]:
        """The prefill answer's kv_transfer_params: where the decode engine finds the KV,
        for which prompt (`prompt_digest`) and until when."""
        n_bytes = kv_bytes(model, prompt_tokens, self.kv_bits)
        self.prefills += 1
        self.kv_bytes_out += n_bytes
        return {"do_remote_decode": False, "do_remote_prefill": True,
                "remote_engine_id": self.engine_id,
                "remote_request_id": f"{self.engine_id}-{next(self._ids)}",
                "kv_tokens": prompt_tokens, "kv_bytes": n_bytes,
                "kv_bits": self.kv_bits or 16, "kv_prompt_digest": digest,
                "kv_expires_at": round(self.clock.wall() + HANDLE_TTL_S, 3)}

    def take(self, handoff: Handoff) -> None:
        """Use the handle up (HandleReused: it already was). No await may come between this
        and the check that admits the request, so two replays cannot pass together."""
        try:
            self.taken.take(handoff, self.clock.wall())
        except HandleReused:
            self.reused += 1
            raise

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
                "kv_bits": self.kv_bits or 16, "link_gbps": self.link.gbps,
                "handles_held": len(self.taken), "handles_reused": self.reused,
                "handles_evicted": self.taken.evicted}
