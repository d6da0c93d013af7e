"""Node configuration: one validated model fed by defaults < config file < env vars < flags."""

from __future__ import annotations

import ipaddress
import os
import pathlib
import re
from collections.abc import Mapping
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from llmfabric.net.httpaddr import is_loopback


class ConfigError(ValueError):
    """The node configuration is invalid; the message names the field and what to change."""


def default_home() -> pathlib.Path:
    return pathlib.Path(os.environ.get("LLMFABRIC_HOME", "~/.llmfabric")).expanduser()


# An address other nodes connect to, for the examples of errors (--bootstrap).
DIAL_EXAMPLE = "node1.example.org:7946"
HTTP_DIAL_EXAMPLE = "node1.example.org:8090"  # (--public-http-addr)


def parse_hostport(value: str, *, default_host: str = "0.0.0.0",
                   example: str = "0.0.0.0:7946") -> tuple[str, int]:
    """'host:port', ':port' or 'port' -> (host, port); IPv6 as '[::1]:port'. `example` is
    the error's example: a listen address by default, a host to dial for addresses others
    connect to."""
    text = value.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":")
    elif ":" in text:
        host, _, port_text = text.rpartition(":")
    else:
        host, port_text = "", text
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{value!r} is not host:port (e.g. {example})") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"port {port} in {value!r} is out of range 0-65535")
    return (host or default_host, port)


# A host name in an address others dial (letters, digits, '-', '_', dots).
_HOST_NAME = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?\Z")


def parse_dial_addr(value: str, *, example: str = DIAL_EXAMPLE, in_url: bool = False
                    ) -> tuple[str, int]:
    """An address published for others to dial as given (--public-addr, --public-http-addr):
    'host:port' with a host name or IPv4 address, or '[v6]:port'; one address, no scheme, a
    port other than 0. Peers split a peer address at its last ':' (net/addressbook.py), so
    an IPv6 one may go without brackets ('$(POD_IP):7946' on Kubernetes); one that goes into
    a URL (`in_url`: http://ADDR) needs them. ConfigError says what to give (`example`: the
    error's example)."""
    text = value.strip()
    if "://" in text:  # (published as host:port: ingresses add the scheme themselves)
        raise ConfigError(f"{value!r}: give host:port without a scheme (e.g. {example})")
    if "," in text:
        raise ConfigError(f"{value!r}: give one host:port (e.g. {example})")
    host, port = parse_hostport(text, default_host="", example=example)
    if text.startswith("[") or ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(f"{value!r}: {host!r} is not an IPv6 address (e.g. "
                              f"[2001:db8::1]:{port})") from None
        if in_url and not text.startswith("["):
            raise ConfigError(f"{value!r}: put the IPv6 address in brackets, e.g. "
                              f"[{host}]:{port}")
    elif not _HOST_NAME.match(host):
        raise ConfigError(f"{value!r} is not host:port (e.g. {example})")
    if host in ("0.0.0.0", "::") or port == 0:
        raise ConfigError(f"{value!r} is a listen address, not one others can dial "
                          f"(e.g. {example})")
    return host, port


def _comma_list(value: Any) -> tuple[str, ...] | None:
    """A list option given as one string or a list of strings, each of which may be a
    comma-separated list (env vars, config files: "a:1,b:2"): the entries, stripped, empty
    ones dropped; None when VALUE is something else."""
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        return None
    return tuple(part.strip() for item in value for part in item.split(",") if part.strip())


class NodeConfig(BaseModel):
    # No NaN or infinity anywhere: a ready_timeout_s of NaN waited for an engine forever.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    home: pathlib.Path = Field(default_factory=default_home)
    listen: str = "0.0.0.0:7946"
    http_listen: str = "127.0.0.1:8090"
    public_addr: str | None = None
    bootstrap: tuple[str, ...] = ()
    relay: bool = False
    ingress: bool = False
    provider: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    tier: Literal["stable", "transient"] = "transient"
    preset: Literal["lan", "wan", "local"] = "lan"
    network: str = "default"
    network_secret: str | None = None
    # The secret from a file (mode 0600): line 1 the secret, optional line 2 the previous
    # one (accepted during a rotation); re-read on SIGHUP.
    network_secret_file: pathlib.Path | None = None
    network_secret_previous: str | None = None
    membership_cert: pathlib.Path | None = None
    operator_key: str | None = None  # base64 operator public key, with membership_cert
    # The operator-signed revocation list (certificate networks; identity/revocation.py):
    # read at start, re-read when the file changes (node/revocations.py); passed on to the
    # other nodes (node/revocations.py).
    revocation_list: pathlib.Path | None = None
    # Engine supervision (empty process = a bare node the scheduler may fill).
    process: tuple[str, ...] = ()
    engine_url: str | None = None
    engine_kind: str | None = None  # `--engine KIND` (agent/engines.py); None: detected
    model_ids: tuple[str, ...] = ()  # served model ids the engine does not list
    # Where the engine publishes KV-cache events (vLLM's --kv-events-config JSON) when its
    # command does not show it (a wrapper script, a config file); else read from the command.
    kv_events_config: str | None = None
    # The engine's main process exited: "restart" it (up to engine_restarts times, with
    # backoff, each under a new session) then leave, or "leave" at once (exit status 5).
    on_engine_exit: Literal["restart", "leave"] = "restart"
    engine_restarts: int = Field(default=3, ge=0)
    ready_timeout_s: float = Field(default=900.0, gt=0)
    health_interval_s: float = Field(default=2.0, gt=0)
    health_failures: int = Field(default=3, ge=1)
    # SIGTERM: DOWN at once, drain up to drain_timeout_s, LEFT, engine stop up to
    # engine_stop_timeout_s; the defaults fit inside Slurm's default KillWait (30 s).
    drain_timeout_s: float = Field(default=20.0, ge=0)
    engine_stop_timeout_s: float = Field(default=5.0, ge=0)
    aliases: dict[str, str] = Field(default_factory=dict)  # alias -> served model id
    accept_assignments: bool = False  # start engines the fleet controller assigns
    # Peer ids allowed to assign, release and flip roles (empty: any member); an ingress
    # follows PD routing plans only from these (empty: none; routing/pd_plan.py).
    controllers: tuple[str, ...] = ()
    # Ingress: names pinned to one model id (`--model-alias NAME=ID`): requests for NAME go to
    # replicas of ID only, whatever aliases members list (an alias several models list is
    # otherwise refused with 409; routing/filters.py).
    model_aliases: dict[str, str] = Field(default_factory=dict)
    # Ingress: also accept the API keys these ingresses publish (verified provider identities:
    # peer ids on PSK networks); accounts/grants.py.
    key_issuers: tuple[str, ...] = ()
    gpu: str | None = None
    gpu_count: int | None = Field(default=None, ge=0, le=1024)
    gpu_memory_gb: float | None = Field(default=None, gt=0)
    # Ingress options.
    policy: str = "random"
    max_retries: int = Field(default=2, ge=0, le=16)
    # Per-attempt forwarding timeouts (llmfabric.ingress.Timeouts), seconds.
    connect_timeout_s: float = Field(default=5.0, gt=0)
    first_byte_timeout_s: float = Field(default=300.0, gt=0)
    idle_timeout_s: float = Field(default=120.0, gt=0)
    total_timeout_s: float = Field(default=1800.0, gt=0)
    # Dead-peer detection on the direct path, both ends (TCP keepalive + TCP_USER_TIMEOUT;
    # kernel units: whole seconds): an ingress notices a provider that vanishes mid-stream,
    # and a provider an ingress that vanishes (closing the connection and the engine
    # request), after idle + interval * count seconds of silence, however long
    # `idle_timeout_s` is (net/tcp_keepalive.py).
    keepalive_idle_s: float = Field(default=5.0, ge=1, le=32767)
    keepalive_interval_s: float = Field(default=2.0, ge=1, le=32767)
    keepalive_count: int = Field(default=3, ge=1, le=127)
    db: str | None = None
    auth: bool = True
    # An ingress with API keys answers the fleet views (/v1/fabric/nodes, models, ...) only
    # to a valid key unless this is set (a public catalog).
    public_fleet_info: bool = False
    admin_key_file: pathlib.Path | None = None
    record_trace: pathlib.Path | None = None  # anonymized JSONL trace of served requests
    # Ingress: requests in flight at most; past it, fair queueing across owners
    # (accounts/fairqueue.py). None: no queue.
    max_inflight: int | None = Field(default=None, ge=1)
    fair_queue_max_wait_s: float = Field(default=30.0, gt=0)
    # Ingress: OpenAI's Batch API (llmfabric.batch), its files and batches kept here; None:
    # off. Lines in flight at once (all batches); its caps (`--batch-limit KEY=VALUE`:
    # BatchLimits field -> whole number, or a size such as 2GiB for a byte cap, over the
    # defaults: batch/limits.py LIMIT_KEYS); the largest input file (as
    # `max_file_bytes` there, which it may not be given with; None: that cap's default).
    # Each of them goes with batch_dir.
    batch_dir: pathlib.Path | None = None
    batch_concurrency: int = Field(default=4, ge=1)
    batch_limits: dict[str, int] = Field(default_factory=dict)
    batch_max_file_bytes: int | None = Field(default=None, ge=1)
    # Files, and batches that ended, are deleted this long after (seconds; in the config
    # file also 12h, 30d, 2w); None: kept until deleted or their own expiry.
    batch_retention_s: float | None = Field(default=None, gt=0)
    # How often the observed per-model demand may be republished in the record (scheduler input).
    demand_interval_s: float = Field(default=15.0, gt=0)
    # Seconds between rounds of link probes to peers (net/link_service.py); 0 = off.
    link_probe_interval_s: float = Field(default=60.0, ge=0)
    api_listen: str | None = None  # also serve the OpenAI routes on the lean HTTP/1.1 front
    dashboard: bool = True
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
    # HTTP address other hosts use for the direct forwarding path (docs/node.md); default:
    # derived from the bound HTTP host and the advertised peer address.
    public_http_addr: str | None = None
    # A node that cannot be dialled keeps registrations with at least this many relays.
    min_relays: int = Field(default=1, ge=1)
    # The data plane's HTTPS listener (direct path; same host as http_listen; 0 = any port,
    # told to ingresses in the signed session answer).
    dataplane_port: int = Field(default=0, ge=0, le=65535)
    # TLS for the HTTP listeners (HTTP API/dashboard and --api-listen); reloaded on SIGHUP.
    tls_cert: pathlib.Path | None = None
    tls_key: pathlib.Path | None = None
    # Let the engine command bind a non-loopback address (node/engine_link.py).
    allow_engine_public_bind: bool = False
    # Host names the HTTP listeners answer besides IP addresses, localhost, the machine's name
    # and the names in public_addr, public_http_addr and the listeners ("*": any; DNS
    # rebinding: front/host_check.py).
    allowed_hosts: tuple[str, ...] = ()
    # Limits of the lean fronts (HTTP port of an ingress, --api-listen): FrontLimits field ->
    # value over the defaults.
    front_limits: dict[str, float] = Field(default_factory=dict)
    # Walltime: Unix time the allocation ends (None: detected inside a Slurm job, else
    # unbounded); the node drains this long before it (launch/allocation.py).
    alloc_end: float | None = Field(default=None, gt=0)
    drain_lead_s: float = Field(default=120.0, ge=0)

    @field_validator("listen", "http_listen", "api_listen")
    @classmethod
    def _hostport(cls, value: str | None) -> str | None:
        if value is not None:
            parse_hostport(value)
        return value

    @field_validator("public_addr", "public_http_addr")
    @classmethod
    def _dial_addr(cls, value: str | None, info: ValidationInfo) -> str | None:
        """Checked as others will dial it, and published without surrounding spaces (the
        HTTP one goes into http:// URLs: IPv6 in brackets)."""
        if value is None:
            return None
        http = info.field_name == "public_http_addr"
        parse_dial_addr(value, example=HTTP_DIAL_EXAMPLE if http else DIAL_EXAMPLE,
                        in_url=http)
        return value.strip()

    @field_validator("bootstrap", mode="before")
    @classmethod
    def _bootstrap(cls, value: Any) -> Any:
        addrs = _comma_list(value)
        if addrs is None:
            return value  # the type check names the problem
        for addr in addrs:  # (addresses to dial: 0.0.0.0 is no example of one)
            parse_hostport(addr, default_host="127.0.0.1", example=DIAL_EXAMPLE)
        return addrs

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _allowed_hosts(cls, value: Any) -> Any:
        names = _comma_list(value)
        if names is None:
            return value  # the type check names the problem
        from llmfabric.front.host_check import allowed_names

        return allowed_names(names)  # (ValueError names the bad one)

    @field_validator("front_limits")
    @classmethod
    def _front_limits(cls, value: dict[str, float]) -> dict[str, float]:
        from llmfabric.front.front_limits import front_limits

        front_limits(value)  # raises ValueError naming the bad key
        return value

    @field_validator("policy")
    @classmethod
    def _policy(cls, value: str) -> str:
        from llmfabric.routing.policies import POLICIES

        if value not in POLICIES:  # (was a traceback from the ingress at start)
            raise ValueError(f"unknown routing policy {value!r}; choose one of: "
                             f"{', '.join(sorted(POLICIES))}")
        return value

    @field_validator("network_secret")
    @classmethod
    def _secret(cls, value: str | None) -> str | None:
        if value is not None and len(value.encode()) < 16:
            raise ValueError("the network secret must have at least 16 bytes; use a random "
                             "one, e.g. `openssl rand -hex 16`")
        return value

    @field_validator("engine_kind")
    @classmethod
    def _engine_kind(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from llmfabric.agent.engines import kind_named

        return kind_named(value).name

    @field_validator("kv_events_config")
    @classmethod
    def _kv_events_config(cls, value: str | None) -> str | None:
        if value is not None:
            from llmfabric.agent.kv_events_config import parse

            parse(value)  # (KvEventsConfigError is a ValueError: a clear config error)
        return value

    @field_validator("batch_retention_s", mode="before")
    @classmethod
    def _batch_retention(cls, value: Any) -> Any:
        if isinstance(value, str):
            from llmfabric.batch.retention import parse_retention

            return parse_retention(value)  # (a ValueError: a clear config error)
        return value

    @field_validator("batch_limits", mode="before")
    @classmethod
    def _batch_limits(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value  # the type check names the problem
        from llmfabric.batch.limits import batch_limits

        limits = batch_limits(value)  # (ValueError names the bad key or value)
        return {key: getattr(limits, key) for key in value}  # (2GiB -> bytes)

    @field_validator("aliases", "model_aliases")
    @classmethod
    def _aliases(cls, value: dict[str, str]) -> dict[str, str]:
        for alias, model in value.items():
            if not alias.strip() or not model.strip():
                raise ValueError(f"alias {alias!r}={model!r}: give ALIAS=MODEL, both non-empty")
        return value

    @model_validator(mode="after")
    def _auth_off_only_on_loopback(self) -> NodeConfig:
        if self.ingress and not self.auth:
            for addr in (self.http_listen, self.api_listen):
                if addr is None:
                    continue
                host, _ = parse_hostport(addr, default_host="127.0.0.1")
                if not is_loopback(host):
                    raise ValueError(
                        f"auth can be switched off (--no-auth) only for a local demo, but the "
                        f"API would listen on {addr}, which is not a loopback address: listen "
                        "on 127.0.0.1 (--http-listen/--api-listen 127.0.0.1:PORT) or keep API "
                        "keys on (drop --no-auth; `llmfabric keys create` makes keys)"
                    )
        return self

    @model_validator(mode="after")
    def _batch_options(self) -> NodeConfig:
        """The batch options go with batch_dir (they were ignored without it); the largest
        input file is set one way."""
        from llmfabric.batch.limits import batch_flags_refusal

        given = [flag for name, flag in _BATCH_OPTIONS if name in self.model_fields_set
                 and getattr(self, name) not in (None, {})]
        twice = self.batch_max_file_bytes is not None and "max_file_bytes" in self.batch_limits
        if (why := batch_flags_refusal(given, self.batch_dir is not None,
                                       "batch_max_file_bytes" if twice else None)) is not None:
            raise ValueError(why)
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> NodeConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        return self

    def has_credential(self) -> bool:
        return (bool(self.network_secret) or self.network_secret_file is not None
                or self.membership_cert is not None)


# NodeConfig's batch options, each with its flag: none is read without batch_dir.
_BATCH_OPTIONS = (("batch_concurrency", "--batch-concurrency"),
                  ("batch_limits", "--batch-limit"),
                  ("batch_max_file_bytes", "batch_max_file_bytes"),
                  ("batch_retention_s", "--batch-retention"))


def load_config_file(path: pathlib.Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of option: value")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _problem(err: Any) -> str:
    if err["type"] == "extra_forbidden":  # (pydantic's words: "Extra inputs are not permitted")
        return "unknown setting (the keys are the flags' names: docs/node.md, Configuration)"
    return str(err["msg"]).removeprefix("Value error, ")


def build_config(file_values: dict[str, Any], overrides: dict[str, Any]) -> NodeConfig:
    """Merge file values under explicit overrides (env vars and flags) and validate."""
    merged = {**file_values, **{k: v for k, v in overrides.items() if v is not None}}
    try:
        return NodeConfig(**merged)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {_problem(err)}"
            for err in exc.errors()
        )
        raise ConfigError(f"invalid node configuration: {problems}") from None
