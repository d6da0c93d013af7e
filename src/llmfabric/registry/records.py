"""The value type of the registry G-Map: a node session's lifecycle state and metadata.

Only the owner writes its NodeRecord (signed with its node key, see registry.signing). The
lifecycle is a total order JOIN < SERVING < DOWN < LEFT; within a state the owner's
(incarnation, version) orders its updates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, StrEnum


class Lifecycle(IntEnum):
    JOIN = 0
    SERVING = 1
    DOWN = 2
    LEFT = 3


class ModelRole(StrEnum):
    BOTH = "both"
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True, slots=True)
class Hardware:
    gpu_model: str = "cpu"  # e.g. "H100-SXM", "A100-80GB", "cpu"
    gpu_count: int = 0
    gpu_memory_gb: float = 0.0  # per GPU
    interconnect: str = "none"  # "nvlink", "pcie", "none"
    cpu_count: int = 0
    memory_gb: float = 0.0


@dataclass(frozen=True, slots=True)
class ServedModel:
    id: str
    aliases: tuple[str, ...] = ()
    quantization: str = "bf16"  # "bf16", "fp16", "fp8", "int8", "awq-int4", ...
    quant_bits: int = 16
    max_context: int = 4096
    role: ModelRole = ModelRole.BOTH
    # LoRA adapters the engine has loaded (vLLM --lora-modules): requests name one as
    # "adapter" or "base:adapter" and go only to nodes that have it.
    adapters: tuple[str, ...] = ()

    def answers_to(self, name: str) -> bool:
        return name == self.id or name in self.aliases or (
            bool(self.adapters) and self.adapter_of(name) is not None)

    def adapter_of(self, name: str) -> str | None:
        """The adapter a request for `name` asks for ("adapter" or "id:adapter"), if any."""
        if name in self.adapters:
            return name
        for base in (self.id, *self.aliases):
            if name.startswith(base) and name[len(base):len(base) + 1] == ":":
                adapter = name[len(base) + 1:]
                if adapter in self.adapters:
                    return adapter
        return None

    def names(self) -> tuple[str, ...]:
        """Every name this model answers to (id, aliases, adapters and base:adapter)."""
        if not self.adapters:
            return (self.id, *self.aliases)
        return (self.id, *self.aliases, *self.adapters,
                *(f"{b}:{a}" for b in (self.id, *self.aliases) for a in self.adapters))

    def engine_name(self, name: str) -> str:
        """The model name the engine expects for a request that asked for `name`."""
        adapter = self.adapter_of(name) if self.adapters else None
        return adapter if adapter is not None else self.id


@dataclass(frozen=True, slots=True)
class LoadHints:
    inflight: int = 0  # requests the node's proxy has in flight
    queued: int = 0  # requests waiting in the engine's queue (engine metrics)
    tokens_per_s: float = 0.0
    running: int = 0  # requests the engine is running (engine metrics)
    kv_usage: float = 0.0  # fraction of the engine's KV cache in use, 0..1
    prefix_hit_rate: float = 0.0  # engine prefix-cache hit rate, 0..1


@dataclass(frozen=True, slots=True)
class ModelDemand:
    """What one ingress saw for one model over its recent window: the fleet controller sums
    these over all ingress nodes to get the fabric's observed workload."""

    model: str  # the name callers asked for (an id or an alias)
    rate: float  # requests per second
    mean_in: float  # prompt tokens (0: no usage reported yet)
    mean_out: float  # completion tokens (0: no usage reported yet)


@dataclass(frozen=True, slots=True)
class KeyGrant:
    """An API key an ingress vouches for, published in its record so that other ingresses
    that trust it as a key issuer accept the key too. Only the key's hash travels, never the
    secret; a revocation is the same grant with `revoked_at` set (accounts/grants.py)."""

    id: str  # the public part of the key, "k" + 15 hex chars
    hash: str  # sha256(plaintext), hex
    owner: str
    requests_per_min: int = 0  # 0: unlimited
    tokens_per_min: int = 0  # 0: unlimited
    revoked_at: float = 0.0  # 0: active


@dataclass(frozen=True, slots=True)
class NodeMeta:
    provider_id: str = ""
    # Where the node can be dialled: "host:port" of its peer (TLS) listener and of its HTTP API.
    peer_addrs: tuple[str, ...] = ()
    http_addr: str = ""
    # Peer ids of relays that hold an outbound connection from this node (empty if dialable).
    relays: tuple[str, ...] = ()
    hardware: Hardware = field(default_factory=Hardware)
    engine: str = ""  # "vllm", "sglang", "sim", ... ; "" for a bare node
    models: tuple[ServedModel, ...] = ()
    load: LoadHints = field(default_factory=LoadHints)
    labels: tuple[tuple[str, str], ...] = ()  # sorted (key, value) pairs: site, cluster, ...
    tier: str = "transient"  # "stable" (long-lived, e.g. ingress) or "transient" (Slurm job)
    roles: tuple[str, ...] = ()  # "ingress", "relay", "bootstrap"
    demand: tuple[ModelDemand, ...] = ()  # ingress nodes only: observed per-model workload
    # Walltime (launch/allocation.py): Unix time the node's allocation (Slurm job) ends, 0 if
    # unbounded; the node drains `drain_lead_s` before it, and routing sends it no request
    # expected to outlast that moment (routing/walltime.py).
    alloc_end: float = 0.0
    drain_lead_s: float = 0.0
    # The operator-signed membership certificate (JSON) on certificate networks: binds this
    # key to a provider identity, the models it may publish and its session cap
    # (identity.provider). "" on PSK networks, where a provider is its key fingerprint.
    cert: str = ""
    # Ingress nodes that issue keys for the fabric (`--key-issuer` elsewhere): the latest
    # grants and revocations, bounded (accounts/grants.py).
    keys: tuple[KeyGrant, ...] = ()
    # Bloom filter of the prefix blocks the node's engine holds or recently served
    # (registry/cache_sketch.py); b"" when the node publishes none.
    prefix_cache: bytes = b""
    # The PD controller only: its latest prefill/decode routing plan, an opaque bounded item
    # (routing/pd_plan.py validates it; ingresses trust it only from their --controller peers).
    pd_plan: bytes = b""
    # Ingress nodes with budgets: their spending this period per budget (hashed names),
    # an opaque bounded item (accounts/spend_share.py validates it).
    spend: bytes = b""
    # Certificate networks: which operator revocation list the node holds (its issue time
    # and `identity.revocation.list_digest`; 0 and b"" for none), so that peers holding an
    # older one fetch it from this node (node/revocations.py). A hint only: a fetched
    # list counts only if the operator's key signed it.
    revocations_at: float = 0.0
    revocations_digest: bytes = b""

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One session's owner-written state. `signature` covers every other field."""

    session_id: str
    peer_id: str
    public_key: bytes  # raw Ed25519 public key; peer_id must derive from it
    state: Lifecycle
    incarnation: int  # bumped by the owner to refute suspicion
    version: int  # bumped by the owner on every metadata change
    updated_at: float  # owner's wall clock, informational (GC uses the local clock)
    meta: NodeMeta
    signature: bytes = b""

    def order_key(self) -> tuple[int, int, int]:
        """Merge order among records of one session: lifecycle, then incarnation, then version."""
        return (int(self.state), self.incarnation, self.version)
