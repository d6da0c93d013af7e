"""W3C Trace Context (`traceparent`) parsing and formatting, and ids for new spans.

https://www.w3.org/TR/trace-context/: `version-traceid-parentid-flags`, lowercase hex.
A header that does not parse is ignored and a new trace starts (the spec's rule), so a
hostile client can never make the ingress fail or forward its garbage downstream: only a
header this module formatted itself ever leaves the ingress.
"""

from __future__ import annotations

from dataclasses import dataclass
from random import getrandbits as _rand

HEADER = "traceparent"
# Version 00 is exactly 55 characters; later versions may append "-..." fields. Anything
# longer than this is refused without being scanned.
MAX_HEADER_CHARS = 512
_HEX = frozenset("0123456789abcdef")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


@dataclass(frozen=True, slots=True)
class TraceParent:
    trace_id: str  # 32 lowercase hex, not all zero
    span_id: str  # 16 lowercase hex, not all zero (the caller's span: our parent)
    flags: int  # bit 0: sampled

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 1)

    def header(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"

    def child(self, span_id: str) -> TraceParent:
        """The same trace with `span_id` as the parent a downstream hop sees."""
        return TraceParent(self.trace_id, span_id, self.flags)


def _is_hex(s: str) -> bool:
    return all(c in _HEX for c in s)


def parse_traceparent(value: str | bytes | None) -> TraceParent | None:
    """The parsed header, or None for a missing, malformed or oversized one."""
    if value is None:
        return None
    if isinstance(value, bytes):
        if len(value) > MAX_HEADER_CHARS:
            return None
        value = value.decode("latin-1")
    v = value.strip(" \t")
    if len(v) > MAX_HEADER_CHARS or len(v) < 55:
        return None
    version = v[:2]
    if not _is_hex(version) or version == "ff":
        return None
    if version == "00" and len(v) != 55:
        return None
    if len(v) > 55 and v[55] != "-":  # a later version: more fields after a dash
        return None
    if v[2] != "-" or v[35] != "-" or v[52] != "-":
        return None
    trace_id, span_id, flags = v[3:35], v[36:52], v[53:55]
    if not (_is_hex(trace_id) and _is_hex(span_id) and _is_hex(flags)):
        return None
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return TraceParent(trace_id, span_id, int(flags, 16))


def new_trace_id() -> str:
    """128 random bits (not all zero). Python's PRNG, not os.urandom: ids must be unique,
    not secret, and a syscall per span would cost more than the rest of the trace."""
    return f"{_rand(128) or 1:032x}"


def new_span_id() -> str:
    return f"{_rand(64) or 1:016x}"
