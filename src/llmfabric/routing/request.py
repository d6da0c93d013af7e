"""What routing needs to know about a request: the model, trust allowlist, QoS, prompt prefix.

The ingress builds a RouteRequest from the parsed body and headers once; policies and filters
only read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmfabric.routing.errors import InvalidConstraintError

# Keys of the request body's `metadata` object that routing consumes.
FABRIC_METADATA_KEYS = (
    "providers", "min_quant_bits", "gpu", "min_context", "session_id", "continuation")


@dataclass(frozen=True, slots=True)
class RouteRequest:
    model: str
    providers: frozenset[str] | None = None  # None: any provider; else the allowlist
    min_quant_bits: int | None = None
    gpus: tuple[str, ...] = ()  # accepted GPUs: catalog names/aliases or family tokens
    min_context: int | None = None
    prefix: str = ""  # prompt prefix, for prefix-affinity routing
    stream: bool = False
    # For prefix_bounded / session / cache_aware (routing/prefix.py): chain-hash keys of the
    # prompt's leading blocks, and the conversation key (body `user` or metadata.session_id).
    blocks: tuple[int, ...] = ()
    session: str = ""


def _split_names(value: Any, what: str) -> frozenset[str]:
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, list | tuple):
        items = [str(v) for v in value]
    else:
        raise InvalidConstraintError(
            f"{what} must be a comma-separated string or a list of strings"
        )
    return frozenset(s.strip() for s in items if s.strip())


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise InvalidConstraintError(f"{what} must be an integer")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidConstraintError(f"{what} must be an integer, got {value!r}") from None


def parse_allowlist(
    header: str | None, metadata: Mapping[str, Any] | None
) -> frozenset[str] | None:
    """The trusted providers: header `X-Fabric-Providers` and/or `metadata.providers`.

    When both are given the request may only go to providers named in BOTH (intersection), so
    neither list can be widened by the other.
    """
    allow: frozenset[str] | None = None
    if header is not None:
        allow = _split_names(header, "X-Fabric-Providers")
    if metadata is not None and "providers" in metadata:
        from_body = _split_names(metadata["providers"], "metadata.providers")
        allow = from_body if allow is None else allow & from_body
    return allow


def route_request(
    model: str,
    *,
    providers_header: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    prefix: str = "",
    stream: bool = False,
    blocks: tuple[int, ...] = (),
    session: str = "",
) -> RouteRequest:
    """Build a RouteRequest; raises InvalidConstraintError for malformed constraints."""
    min_bits = min_ctx = None
    gpus: tuple[str, ...] = ()
    if metadata:
        if metadata.get("min_quant_bits") is not None:
            min_bits = _int(metadata["min_quant_bits"], "metadata.min_quant_bits")
        if metadata.get("min_context") is not None:
            min_ctx = _int(metadata["min_context"], "metadata.min_context")
        if metadata.get("gpu") is not None:
            gpus = tuple(sorted(_split_names(metadata["gpu"], "metadata.gpu")))
    return RouteRequest(
        model=model,
        providers=parse_allowlist(providers_header, metadata),
        min_quant_bits=min_bits,
        gpus=gpus,
        min_context=min_ctx,
        prefix=prefix,
        stream=stream,
        blocks=blocks,
        session=session,
    )
