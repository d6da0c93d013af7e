"""Exact wire bytes of quantized KV: packed codes + an fp16 scale and fp16 minimum per group
(+ the key tail in fp16). Whole groups cost bits/8 + 4/G bytes per element, the figure the
simulator's `kv_transfer_bytes` uses (4-bit, G = 64: 4.5 bits, a 16/4-bit ratio of 3.56)."""

from __future__ import annotations

import math
from typing import Any

BITS = (2, 3, 4, 8)
META_BYTES_PER_GROUP = 4  # fp16 scale + fp16 minimum
FP16_BYTES = 2


def _check(bits: int, group: int) -> None:
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
    if not isinstance(group, int) or group < 1:
        raise ValueError(f"group must be a positive int, got {group!r}")


def packed_code_bytes(n_codes: int, bits: int) -> int:
    return math.ceil(n_codes * bits / 8)


def bytes_per_element(bits: int, group: int) -> float:
    """Wire bytes per element of whole groups."""
    _check(bits, group)
    return bits / 8 + META_BYTES_PER_GROUP / group


def key_bytes(n_tokens: int, n_channels: int, bits: int, group: int) -> int:
    """Keys (tokens x channels), quantized per channel over groups of `group` tokens; the
    n_tokens mod group newest tokens travel in fp16 (KIVI's residual)."""
    _check(bits, group)
    if n_tokens < 0 or n_channels < 0:
        raise ValueError("token and channel counts must be >= 0")
    full = n_tokens // group
    tail = n_tokens - full * group
    return (packed_code_bytes(full * group * n_channels, bits)
            + full * n_channels * META_BYTES_PER_GROUP
            + tail * n_channels * FP16_BYTES)


def value_bytes(n_tokens: int, n_channels: int, bits: int, group: int) -> int:
    """Values (tokens x channels), quantized per token over groups of `group` channels (the
    last group of a row may be shorter; it still carries its scale and minimum)."""
    _check(bits, group)
    if n_tokens < 0 or n_channels < 0:
        raise ValueError("token and channel counts must be >= 0")
    groups_per_token = math.ceil(n_channels / group)
    return (packed_code_bytes(n_tokens * n_channels, bits)
            + n_tokens * groups_per_token * META_BYTES_PER_GROUP)


def model_kv_bytes(model: Any, n_tokens: int, bits: int, group: int) -> int:
    """Wire bytes of one request's whole KV cache: for every layer, its keys and its values
    (n_kv_heads x head_dim channels each), each tensor packed on its own."""
    channels = int(model.n_kv_heads * model.head_dim)
    per_layer = (key_bytes(n_tokens, channels, bits, group)
                 + value_bytes(n_tokens, channels, bits, group))
    return int(model.n_layers) * per_layer
