"""KIVI-style asymmetric min-max quantization (COMPANIONS.md §1.5).

q = clamp(round((x - min) / s), 0, 2^b - 1), s = (max - min) / (2^b - 1), with s and min stored
in fp16. The fp16 minimum is rounded toward -inf and the fp16 scale toward +inf, so every
element of a group lies inside [min16, min16 + (2^b - 1) s16]: nothing clamps and the
per-element error is at most s16 / 2 (the bound the property tests check).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from llmfabric.kvcompress.accounting import (
    BITS,
    FP16_BYTES,
    META_BYTES_PER_GROUP,
    packed_code_bytes,
)
from llmfabric.kvcompress.pack import pack, unpack

FP16_MAX = float(np.finfo(np.float16).max)
F16 = npt.NDArray[np.float16]
F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class QuantizedKV:
    """One quantized tensor as it travels. `kind` "key": groups run over tokens per channel
    (codes laid out group-major: (n_groups, group, channels)); "value": groups run over
    channels per token (codes (tokens, channels), groups of `group` columns)."""

    kind: str
    shape: tuple[int, int]
    bits: int
    group: int
    codes: npt.NDArray[np.uint8]  # packed
    scales: F16                   # (n_groups, channels) for keys, (tokens, groups) for values
    mins: F16
    tail: F16                     # keys only: the n mod G newest tokens in fp16

    @property
    def nbytes(self) -> int:
        """Bytes on the wire (equals accounting.key_bytes / value_bytes)."""
        return (self.codes.size + (self.scales.size + self.mins.size) * FP16_BYTES
                + self.tail.size * FP16_BYTES)

    @property
    def n_groups(self) -> int:
        return int(self.scales.size)

    def meta_bytes(self) -> int:
        return self.n_groups * META_BYTES_PER_GROUP


def _validate(x: npt.ArrayLike, bits: int, group: int) -> F32:
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
    if not isinstance(group, int) or isinstance(group, bool) or group < 1:
        raise ValueError(f"group must be a positive int, got {group!r}")
    a = np.asarray(x)
    if a.ndim != 2:
        raise ValueError(f"expected a (tokens, channels) array, got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.floating) and not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"expected numbers, got dtype {a.dtype}")
    a = a.astype(np.float32)
    if not np.all(np.isfinite(a)) or (a.size and float(np.abs(a).max()) > FP16_MAX):
        raise ValueError("KV values must be finite and within the fp16 range")
    return a


def _min_scale(lo: F32, hi: F32, bits: int) -> tuple[F16, F16]:
    """fp16 minimum (rounded down) and scale (rounded up) covering [lo, hi]."""
    mn = lo.astype(np.float16)
    too_high = mn.astype(np.float32) > lo
    mn = np.where(too_high, np.nextafter(mn, np.float16(-np.inf)), mn).astype(np.float16)
    levels = (1 << bits) - 1
    span = hi - mn.astype(np.float32)
    s = (span / levels).astype(np.float16)
    low = s.astype(np.float32) * levels < span
    s = np.where(low, np.nextafter(s, np.float16(np.inf)), s).astype(np.float16)
    return mn, s


def _codes(x: F32, mn: F16, s: F16, bits: int) -> npt.NDArray[np.uint8]:
    s32 = s.astype(np.float32)
    safe = np.where(s32 > 0, s32, 1.0)
    q = np.rint((x - mn.astype(np.float32)) / safe)
    q = np.where(s32 > 0, q, 0.0)
    return np.clip(q, 0, (1 << bits) - 1).astype(np.uint8)


def quantize_keys(k: npt.ArrayLike, bits: int = 4, group: int = 64) -> QuantizedKV:
    """Keys (tokens x channels): per channel, over groups of `group` consecutive tokens."""
    a = _validate(k, bits, group)
    n, c = a.shape
    full = n // group
    body = a[: full * group].reshape(full, group, c)
    mn, s = _min_scale(body.min(axis=1), body.max(axis=1), bits)   # (full, c)
    q = _codes(body, mn[:, None, :], s[:, None, :], bits)
    tail = a[full * group:].astype(np.float16)
    return QuantizedKV("key", (n, c), bits, group, pack(q, bits), s, mn, tail)


def quantize_values(v: npt.ArrayLike, bits: int = 4, group: int = 64) -> QuantizedKV:
    """Values (tokens x channels): per token, over groups of `group` channels."""
    a = _validate(v, bits, group)
    n, c = a.shape
    n_groups = -(-c // group)
    pad = n_groups * group - c
    padded = np.pad(a, ((0, 0), (0, pad)), mode="edge") if pad and c else a
    g = padded.reshape(n, n_groups, group) if c else padded.reshape(n, 0, group)
    mn, s = _min_scale(g.min(axis=2), g.max(axis=2), bits) if c else (
        np.zeros((n, 0), np.float16), np.zeros((n, 0), np.float16))
    q = _codes(g, mn[:, :, None], s[:, :, None], bits).reshape(n, n_groups * group)[:, :c]
    return QuantizedKV("value", (n, c), bits, group, pack(q, bits), s, mn,
                       np.zeros((0, c), np.float16))


def _check_record(t: QuantizedKV) -> None:
    """A record is what a prefill node sent: its header (kind, bits, group, shape) must be
    sane and every array exactly the size the header gives, fp16 metadata finite, before
    anything of the declared shape is built."""
    if t.kind not in ("key", "value"):
        raise ValueError(f"unknown tensor kind {t.kind!r}")
    if t.bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {t.bits!r}")
    g = t.group
    if not isinstance(g, int) or isinstance(g, bool) or g < 1:
        raise ValueError(f"group must be a positive int, got {g!r}")
    if len(t.shape) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                    for x in t.shape):
        raise ValueError(f"shape must be two counts >= 0, got {t.shape!r}")
    n, c = t.shape
    full = n // g
    if t.kind == "key":
        n_codes, meta, tail = full * g * c, (full, c), (n - full * g, c)
    else:
        n_codes, meta, tail = n * c, (n, -(-c // g)), (0, c)
    if t.codes.dtype != np.uint8 or t.codes.shape != (packed_code_bytes(n_codes, t.bits),):
        raise ValueError(f"a {t.kind} of shape {t.shape} at {t.bits} bits needs "
                         f"{packed_code_bytes(n_codes, t.bits)} code bytes, got {t.codes.shape}")
    for name, arr, want in (("scales", t.scales, meta), ("mins", t.mins, meta),
                            ("tail", t.tail, tail)):
        if arr.dtype != np.float16 or arr.shape != want:
            raise ValueError(f"{name} must be fp16 of shape {want}, got {arr.dtype} "
                             f"{arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be finite")


def dequantize(t: QuantizedKV) -> F32:
    """Back to float32 (tokens x channels); ValueError for a record that is not what its
    header says (hostile input: see _check_record)."""
    _check_record(t)
    n, c = t.shape
    if t.kind == "key":
        full = n // t.group
        q = unpack(t.codes, t.bits, full * t.group * c).reshape(full, t.group, c)
        body = (t.mins.astype(np.float32)[:, None, :]
                + q.astype(np.float32) * t.scales.astype(np.float32)[:, None, :])
        return np.concatenate([body.reshape(full * t.group, c),
                               t.tail.astype(np.float32)], axis=0)
    if t.kind == "value":
        qv = unpack(t.codes, t.bits, n * c).reshape(n, c).astype(np.float32)
        col_group = np.arange(c) // t.group
        out: F32 = (t.mins.astype(np.float32)[:, col_group]
                    + qv * t.scales.astype(np.float32)[:, col_group])
        return out
    raise ValueError(f"unknown tensor kind {t.kind!r}")
