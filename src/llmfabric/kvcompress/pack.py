"""Bit packing of quantization codes: code k occupies bits [k*b, (k+1)*b) of a little-endian
bit stream, so 4-bit codes pair up low nibble first and 2-bit codes fill a byte from bit 0."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from llmfabric.kvcompress.accounting import BITS, packed_code_bytes


def _check_bits(bits: int) -> None:
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")


def pack(codes: npt.ArrayLike, bits: int) -> npt.NDArray[np.uint8]:
    """Codes (any shape, each in [0, 2^bits)) -> ceil(n * bits / 8) bytes."""
    _check_bits(bits)
    c = np.asarray(codes).ravel()
    if c.size and (c.min() < 0 or c.max() >= 1 << bits):
        raise ValueError(f"codes must lie in [0, {1 << bits})")
    c = c.astype(np.uint8)
    if bits == 8:
        return c.copy()
    planes = (c[:, None] >> np.arange(bits, dtype=np.uint8)) & 1  # (n, bits), LSB first
    out = np.packbits(planes.ravel(), bitorder="little")
    assert out.size == packed_code_bytes(c.size, bits)
    return out


def unpack(buf: npt.ArrayLike, bits: int, n: int) -> npt.NDArray[np.uint8]:
    """The first `n` codes of a packed buffer."""
    _check_bits(bits)
    b = np.asarray(buf, dtype=np.uint8).ravel()
    if n < 0 or b.size < packed_code_bytes(n, bits):
        raise ValueError(f"{b.size} bytes cannot hold {n} codes of {bits} bits")
    if bits == 8:
        return b[:n].copy()
    stream = np.unpackbits(b, bitorder="little")[: n * bits].reshape(n, bits)
    weights = (1 << np.arange(bits)).astype(np.uint8)
    out: npt.NDArray[np.uint8] = (stream * weights).sum(axis=1).astype(np.uint8)
    return out
